# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_device_release run through the ansible CLI against simulated hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import subprocess

from adhoc import run_module
from gpusim.state import is_alive as alive


def run_release(host, tmp_path, *flags, **options):
    args = dict(nvidia_smi_path=host.smi_path, devices=[host.dev_glob],
                lock_file=str(tmp_path / 'release.lock'))
    args.update(options)
    return run_module('nvidia_device_release', args, *flags)


def test_hung_job_released_through_ansible(gpuhost, tmp_path):
    scenario = gpuhost.scenario('hung-job', release_delay=1.0)
    ranks = set(rank['pid'] for rank in scenario['ranks'])
    daemon = scenario['persistenced']['pid']

    result, proc = run_release(gpuhost, tmp_path, '--check', '--diff')
    assert proc.returncode == 0, proc.stdout
    assert result['changed'] is True
    assert set(entry['pid'] for entry in result['signalled']) == ranks
    assert all(alive(pid) for pid in ranks)
    assert 'train.py --local-rank 7' in proc.stdout  # the diff: holders before

    result, proc = run_release(gpuhost, tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert result['changed'] is True and result['released'] is True
    assert set(entry['pid'] for entry in result['signalled']) == ranks
    assert [entry['pid'] for entry in result['protected']] == [daemon]
    # Back to the idle reading (1 MiB, as real H200s), below the default threshold.
    assert result['gpus_after'] == [{'index': index, 'memory_used_mib': 1} for index in range(8)]
    assert gpuhost.memory_used() == dict((index, 1) for index in range(8))
    assert alive(daemon)
    assert not any(alive(pid) for pid in ranks)

    result, proc = run_release(gpuhost, tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert result['changed'] is False and result['signalled'] == []


def test_orphaned_memory_fails_the_task_naming_the_gpu(gpuhost, tmp_path):
    gpuhost.hold(gpus=[3], mib=8192, leak=True, ignore_term=True)
    result, proc = run_release(gpuhost, tmp_path, grace_period=0.3, timeout=2)
    assert proc.returncode != 0
    assert result['failed'] is True
    assert 'GPU 3: 8193 MiB used with no process left (orphaned memory' in result['msg']
    assert result['orphaned_gpus'] == [3]
    assert result['signalled'][0]['signals_sent'] == ['TERM', 'KILL']


def test_module_documentation_renders():
    proc = subprocess.run(['ansible-doc', 'gpuops.nvidia.nvidia_device_release'],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert 'grace_period' in proc.stdout and 'orphaned_gpus' in proc.stdout
    assert 'protect' in proc.stdout and 'nvidia_smi_path' in proc.stdout
    assert 'WARNING' not in proc.stderr, proc.stderr
