# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""README's simulator recipe, run as a reader would run it (in the checkout, nothing exported),
and what README says it prints compared with what it prints."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTION = '### Run the playbook against the simulator'
# The lines README shows that a run must print too: the GPUs' memory, the summary, the recap.
KEY_LINE_RE = re.compile(r'^(\s+"|\S+\s+: ok=|\d+, \d+ MiB$)')


def recipe():
    """(the shell block, the printed block) of README's simulator recipe."""
    with open(os.path.join(REPO, 'README.md')) as handle:
        text = handle.read()
    section = text[text.index(SECTION):]
    script = re.search(r'```sh\n(.*?)```', section, re.S).group(1)
    printed = re.search(r'It prints[^\n]*\n\n```\n(.*?)```', section, re.S).group(1)
    return script, printed


def normal(line):
    """A line with its times (1.505 s) and trailing blanks left out."""
    return re.sub(r'[0-9]+\.[0-9]+ s\b', 'N s', line.rstrip())


def test_simulator_recipe_prints_what_readme_shows(tmp_path):
    script, printed = recipe()
    script = script.replace('/tmp/gpusim', str(tmp_path / 'gpusim'))
    # Nothing that says where the collection is (ANSIBLE_HOME stays: Ansible's own files).
    env = dict(os.environ, ANSIBLE_NOCOLOR='1')
    for name in ('ANSIBLE_COLLECTIONS_PATH', 'ANSIBLE_CONFIG', 'PYTHONPATH'):
        env.pop(name, None)
    proc = subprocess.run(['bash', '-c', script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = [normal(line) for line in proc.stdout.splitlines()]
    shown = [normal(line) for line in printed.splitlines() if KEY_LINE_RE.match(line)]
    assert len(shown) >= 10
    missing = [line for line in shown if line not in out]
    assert not missing, '%s\n--- the run printed:\n%s' % ('\n'.join(missing), proc.stdout)
