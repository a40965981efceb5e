# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""meta/execution-environment.yml: ansible-builder create makes a valid build context."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess
import sys

import pytest
import yaml

pytest.importorskip('ansible_builder')
from packaging.specifiers import SpecifierSet  # noqa: E402  (a dependency of ansible-core)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFINITION = os.path.join(REPO, 'meta', 'execution-environment.yml')


def pins(path):
    """{lower-case name: version} of the name==version lines of a requirements file."""
    found = {}
    with open(path) as f:
        for line in f:
            match = re.match(r'^([A-Za-z0-9_.\-]+)==([^\s;#]+)', line.strip())
            if match:
                found[match.group(1).lower()] = match.group(2)
    return found


@pytest.fixture(scope='module')
def context(tmp_path_factory):
    out = tmp_path_factory.mktemp('ee') / 'context'
    proc = subprocess.run([sys.executable, '-m', 'ansible_builder', 'create', '--file', DEFINITION,
                           '--context', str(out), '--output-filename', 'Containerfile'],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_context_has_the_build_files(context):
    for name in ('Containerfile', '_build/requirements.txt', '_build/bindep.txt',
                 '_build/requirements.yml', '_build/scripts/assemble',
                 '_build/scripts/introspect.py', '_build/scripts/install-from-bindep'):
        assert (context / name).is_file(), name


def test_containerfile_installs_the_tested_ansible_core(context):
    containerfile = (context / 'Containerfile').read_text()
    tested = pins(os.path.join(REPO, 'requirements', 'test.txt'))['ansible-core']
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"', containerfile, re.M).group(1).split()
    assert 'ansible-core==%s' % tested in refs
    assert any(ref.startswith('ansible-runner==') for ref in refs)
    # ansible-core 2.19 needs Python 3.11 or newer.
    pycmd = re.search(r'^ARG PYCMD="([^"]*)"', containerfile, re.M).group(1)
    minor = int(re.search(r'python3\.(\d+)$', pycmd).group(1))
    assert minor >= 11
    assert re.search(r'^ARG EE_BASE_IMAGE="[^"]+"', containerfile, re.M)
    # Each stage the build needs is there, and the final image keeps the collections.
    for stage in ('AS base', 'AS galaxy', 'AS builder', 'AS final'):
        assert stage in containerfile
    assert 'COPY --from=galaxy /usr/share/ansible /usr/share/ansible' in containerfile


def test_context_installs_this_collection(context):
    with open(os.path.join(REPO, 'galaxy.yml')) as f:
        galaxy = yaml.safe_load(f)
    requirements = yaml.safe_load((context / '_build' / 'requirements.yml').read_text())
    wanted = '%s.%s' % (galaxy['namespace'], galaxy['name'])
    entries = [c for c in requirements['collections'] if c['name'] == wanted]
    assert len(entries) == 1, requirements
    assert galaxy['version'] in SpecifierSet(entries[0]['version'])


def test_context_python_requirements_match_the_tested_pins(context):
    generated = pins(str(context / '_build' / 'requirements.txt'))
    tested = pins(os.path.join(REPO, 'requirements', 'constraints.txt'))
    assert generated['nvidia-ml-py'] == tested['nvidia-ml-py']
    assert generated['jmespath'] == tested['jmespath']


def test_context_system_requirements_are_bindep(context):
    from bindep.depends import Depends

    depends = Depends((context / '_build' / 'bindep.txt').read_text())
    # The EE reaches the GPU hosts over SSH, on RPM and on Debian-based base images.
    assert depends.list_all_packages(depends.active_rules(['platform:rpm'])) == ['openssh-clients']
    assert depends.list_all_packages(depends.active_rules(['platform:dpkg'])) == ['openssh-client']
