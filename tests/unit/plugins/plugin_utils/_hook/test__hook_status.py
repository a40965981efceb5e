# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Slurm hook's exit statuses (plugin_utils/_hook/status.py): one meaning each within a mode,
never 1 (what a Python that crashes exits with), and read as they are by the shell hook."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess
import sys

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
SHELL_HOOK = os.path.join(REPO, 'roles', 'slurm_hooks', 'files', 'gpu-reset-hook.sh')
RUNNER = [0, _hook_status.RUNNER_SETTINGS_UNREADABLE, _hook_status.RUNNER_NEEDS_PLAYBOOK, _hook_status.RUNNER_DRAINED,
          _hook_status.RUNNER_NOT_DRAINED, _hook_status.RUNNER_BRAKE_HELD]
HEALTH = [0, _hook_status.RUNNER_SETTINGS_UNREADABLE, _hook_status.RUNNER_NEEDS_PLAYBOOK, _hook_status.RUNNER_DRAINED,
          _hook_status.RUNNER_NOT_DRAINED, _hook_status.HEALTH_UNREADABLE, _hook_status.HEALTH_RESUME_FAILED]


def test_each_status_of_a_mode_has_one_meaning_and_none_is_ones():
    assert len(set(RUNNER)) == len(RUNNER) and len(set(HEALTH)) == len(HEALTH)
    assert 1 not in RUNNER + HEALTH
    # The shell hook reads a status the same way in every mode: the health check's own are no runner's.
    assert set([_hook_status.HEALTH_UNREADABLE, _hook_status.HEALTH_RESUME_FAILED]).isdisjoint(RUNNER)


def test_a_python_that_cannot_import_the_collection_exits_with_no_status_of_the_hook(tmp_path):
    """1 reads as "the checks could not run", never as "drained with the reason"."""
    proc = subprocess.run([sys.executable, '-I', '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                           '--node', 'gpu07'], cwd=str(tmp_path), env={'PATH': os.environ.get('PATH', '/usr/bin:/bin')},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and 'ansible_collections' in proc.stderr, proc.stderr
    assert proc.returncode not in RUNNER + HEALTH


def test_the_shell_hook_passes_on_the_runners_statuses_as_they_are():
    with open(SHELL_HOOK) as handle:
        text = handle.read()
    # The statuses it passes on to its caller, whatever the runner; the rest are "could not check".
    passed = re.search(r'^    ([0-9 |]+)\) exit "\$rc" ;;$', text, re.MULTILINE).group(1)
    assert sorted(int(rc) for rc in passed.split('|')) == sorted([0, _hook_status.RUNNER_DRAINED, _hook_status.RUNNER_NOT_DRAINED,
                                                                  _hook_status.RUNNER_BRAKE_HELD, _hook_status.HEALTH_RESUME_FAILED,
                                                                  _hook_status.HEALTH_UNREADABLE])
    # The module runner's "needs the playbook" starts the playbook runner.
    assert '[ "$rc" -eq %d ]' % _hook_status.RUNNER_NEEDS_PLAYBOOK in text
    # The playbook runner's variables: a node drained (or not) because the job's GPUs cannot be told.
    assert 'case $rc in %d | %d) return "$rc"' % (_hook_status.RUNNER_DRAINED, _hook_status.RUNNER_NOT_DRAINED) in text
    # And what it makes of each for Slurm.
    for status, words in [(_hook_status.RUNNER_DRAINED, 'status=1 ;;'), (_hook_status.RUNNER_NOT_DRAINED, 'status=1 why='),
                          (_hook_status.RUNNER_BRAKE_HELD, 'status=0; echo "the fleet brake holds'),
                          (_hook_status.HEALTH_RESUME_FAILED, 'status=2 why="could not resume the node'),
                          (_hook_status.HEALTH_UNREADABLE, 'status=2 why="could not read Slurm\'s answers')]:
        assert re.search(r'^  %d\) %s' % (status, re.escape(words)), text, re.MULTILINE), status
