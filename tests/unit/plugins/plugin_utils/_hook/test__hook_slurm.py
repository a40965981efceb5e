# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Slurm's commands as the hook runs them (plugin_utils/_hook/slurm.py): argv never through a
shell, each within its time, and what cannot be run or does not answer is SlurmUnreadable."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import slurm as _hook_slurm
from processes import gone, read_pid


def test_a_slurm_command_gets_its_arguments_as_they_are_never_through_a_shell(tmp_path):
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!%s\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\nsys.stderr.write("said\\n")\nsys.exit(3)\n'
                        % sys.executable)
    scontrol.chmod(0o755)
    argv = [str(scontrol), 'show', 'node', 'gpu07; touch %s' % (tmp_path / 'injected'), '$(touch %s)' % (tmp_path / 'too')]
    rc, stdout, stderr = _hook_slurm.slurm_call(argv, 5)
    assert (rc, json.loads(stdout), stderr) == (3, argv[1:], 'said\n')
    assert not (tmp_path / 'injected').exists() and not (tmp_path / 'too').exists()


def test_a_slurm_command_that_cannot_run_is_unreadable(tmp_path):
    with pytest.raises(_hook_slurm.SlurmUnreadable, match='no-scontrol'):
        _hook_slurm.slurm_call([str(tmp_path / 'no-scontrol'), 'show', 'node', 'gpu07'], 5)


def test_a_slurm_command_that_does_not_answer_in_time_is_stopped_and_unreadable(tmp_path):
    squeue = tmp_path / 'squeue'
    squeue.write_text('#!/bin/sh\necho "$$" > %s\nexec sleep 60\n' % (tmp_path / 'pid'))
    squeue.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(_hook_slurm.SlurmUnreadable):
        _hook_slurm.slurm_call([str(squeue), '-h', '-w', 'gpu07'], 1)
    assert time.monotonic() - started < 10
    assert gone(read_pid(str(tmp_path / 'pid')))


@pytest.mark.parametrize('scontrol, name, expected', [
    ('/opt/slurm/bin/scontrol', 'squeue', '/opt/slurm/bin/squeue'),
    ('./scontrol', 'sinfo', './sinfo'),
    ('scontrol', 'sinfo', 'sinfo'),
])
def test_slurms_other_commands_are_beside_scontrol_when_it_is_a_path(scontrol, name, expected):
    assert _hook_slurm.slurm_command(scontrol, name) == expected
