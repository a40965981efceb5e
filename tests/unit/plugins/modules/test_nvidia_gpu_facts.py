# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_gpu_facts' main() in-process against a simulated host: its options checked before any read,
the reader's errors as a failed task. Through the ansible CLI, every fact and fault:
tests/integration/test_gpu_facts_module.py; the facts themselves: module_utils/_release/test__facts.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.modules import nvidia_gpu_facts
from module_main import run_main


def run_module(capsys, host, **args):
    """Run main() in-process; return the JSON it printed."""
    params = dict(nvidia_smi_path=host.smi_path, backend='nvidia-smi', devices=[host.dev_glob], state_dir=host.state_dir)
    params.update(args)
    return run_main(capsys, nvidia_gpu_facts, params)


def test_the_gpus_and_their_holders_are_facts_and_nothing_changes(capsys, gpuhost):
    holder = gpuhost.hold(gpus='0', mib=2048, util=87)
    gpuhost.fault('stuck', gpu=1, mib=512)
    result = run_module(capsys, gpuhost, memory_threshold_mib=16)
    assert result['changed'] is False and 'failed' not in result
    facts = result['ansible_facts']
    assert facts['nvidia_gpu_count'] == 8 and facts['nvidia_gpu_backend'] == 'nvidia-smi'
    assert [gpu['state'] for gpu in facts['nvidia_gpus']] == ['busy', 'orphaned_memory'] + ['free'] * 6
    assert [entry['pid'] for entry in facts['nvidia_device_holders']] == [holder['pid']]


@pytest.mark.parametrize('args, message', [
    (dict(timeout=0), 'timeout must be greater than zero, got 0.0'),
    (dict(memory_threshold_mib=-5), 'memory_threshold_mib must be zero or more'),
    (dict(expected_gpus=-1), 'expected_gpus must be zero or more'),
    (dict(nvidia_smi_path='/nonexistent/nvidia-smi'), 'nvidia-smi not found'),
    (dict(expected_gpus=9), 'expected_gpus: 9 GPUs expected, 8 seen'),
])
def test_bad_options_and_a_host_that_cannot_be_read_fail_the_task_without_a_traceback(capsys, gpuhost, args, message):
    result = run_module(capsys, gpuhost, **args)
    assert result['failed'] is True and message in result['msg'], result['msg']
    assert 'exception' not in result and 'Traceback' not in result['msg']
