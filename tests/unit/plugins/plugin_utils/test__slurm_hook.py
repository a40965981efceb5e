# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Slurm hook's entry (plugin_utils/_slurm_hook.py): its arguments, and the exit statuses of
settings or arguments it cannot read. Its modes are tested in the files named after them
(test__hook_job.py, test__hook_reset.py, test__hook_health.py, ...)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status


def test_a_node_is_required_but_to_clear_the_history(capsys):
    with pytest.raises(SystemExit) as info:
        _slurm_hook.parse_args(['--vars-file', '/nonexistent', '--gpus', '0'])
    assert info.value.code == _hook_status.RUNNER_SETTINGS_UNREADABLE
    assert 'the following arguments are required: --node' in capsys.readouterr().err
    args = _slurm_hook.parse_args(['--clear-history', 'all'])
    assert (args.node, args.clear_history, args.deadline, args.scontrol) == (None, 'all', 60, 'scontrol')
    args = _slurm_hook.parse_args(['--node', 'gpu07', '--gpus', '0-2,5', '--max-drained', '10%', '--max-drain-rate', '5/10m'])
    assert (args.gpus, args.max_drained, args.max_drain_rate, args.reboot_stamp) == (
        [0, 1, 2, 5], '10%', '5/10m', _slurm_hook.REBOOT_STAMP)


def test_settings_that_cannot_be_read_are_an_error_of_their_own(tmp_path):
    path = tmp_path / 'vars.yml'
    path.write_text('gpu_reset_grace_period: [\n')
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(path)]) == _hook_status.RUNNER_SETTINGS_UNREADABLE
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(tmp_path / 'missing.yml')]) == \
        _hook_status.RUNNER_SETTINGS_UNREADABLE


def test_garbage_gpus_are_a_settings_error_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as info:
        _slurm_hook.main(['--node', 'n1', '--gpus', '0-2000000'])
    assert info.value.code == _hook_status.RUNNER_SETTINGS_UNREADABLE
    err = capsys.readouterr().err
    assert 'argument --gpus: SLURM_JOB_GPUS: GPU 2000000 is past the 64 GPUs' in err and 'Traceback' not in err


def test_without_a_cap_a_job_s_run_has_the_action_s_default():
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import job as _hook_job
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import SETTINGS_SPEC

    args = _slurm_hook.parse_args(['--node', 'gpu07'])
    assert args.max_drained is None
    assert _hook_job.max_drained(args) == SETTINGS_SPEC['max_drained']['default']
    assert _hook_job.max_drained(_slurm_hook.parse_args(['--node', 'gpu07', '--max-drained=3'])) == '3'


@pytest.mark.parametrize('text', ['', '10 %', '%', '5%%', '-1', '1e3', 'ten'])
def test_a_cap_that_is_neither_a_number_nor_a_percentage_is_refused(text, capsys):
    with pytest.raises(SystemExit):
        _slurm_hook.parse_args(['--node', 'gpu07', '--max-drained', text])
    assert 'GPU_RESET_MAX_DRAINED: %r is neither a number of nodes nor a percentage' % text in capsys.readouterr().err


@pytest.mark.parametrize('text', ['', '5', '5/10', '5/10d', '0/10m', '5/0m', '5/200h', '-5/10m', '5 /10m', '5/10m;x'])
def test_a_rate_that_is_not_nodes_per_window_is_refused_naming_the_variable(text, capsys):
    with pytest.raises(SystemExit):
        _slurm_hook.parse_args(['--node', 'gpu07', '--max-drained', '10%', '--max-drain-rate=' + text])
    err = capsys.readouterr().err
    assert 'error: argument --max-drain-rate: GPU_RESET_MAX_DRAIN_RATE: %r ' % text in err.strip().splitlines()[-1], err
