# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The checkout as a new user meets it: Ansible's commands find the collection from the
repository root and from examples/ with nothing exported (the ansible.cfg files say where)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def plain_env():
    """The environment of a shell that exported nothing that says where the collection is
    (ANSIBLE_HOME, where Ansible keeps its own files, stays)."""
    env = dict(os.environ)
    for name in ('ANSIBLE_COLLECTIONS_PATH', 'ANSIBLE_CONFIG', 'PYTHONPATH'):
        env.pop(name, None)
    return env


def installed_copy(home):
    """A copy of the collection installed where ansible-galaxy installs by default
    (~/.ansible/collections), its files linked to the checkout's."""
    root = home / '.ansible' / 'collections' / 'ansible_collections' / 'gpuops' / 'nvidia'
    root.mkdir(parents=True)
    for name in ('galaxy.yml', 'meta', 'plugins', 'roles', 'playbooks'):
        os.symlink(os.path.join(REPO, name), str(root / name))


@pytest.mark.parametrize('where', ['.', 'examples'])
def test_ansible_doc_finds_the_collection_with_nothing_exported(where, tmp_path):
    """From the checkout, its ansible.cfg files name the checkout before any installed copy."""
    installed_copy(tmp_path)
    env = dict(plain_env(), HOME=str(tmp_path))
    for args in (['gpuops.nvidia.nvidia_device_release'], ['-t', 'role', 'gpuops.nvidia.gpu_reset']):
        proc = subprocess.run([os.path.join(BIN, 'ansible-doc')] + args, cwd=os.path.join(REPO, where),
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0 and 'was not found' not in proc.stderr, proc.stderr
        assert os.path.join('.build', 'collections') in proc.stdout


def test_the_playbook_resolves_by_name_from_the_checkout():
    proc = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '--syntax-check', '-i', 'localhost,',
                           'gpuops.nvidia.reset_gpus'], cwd=REPO, env=plain_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
