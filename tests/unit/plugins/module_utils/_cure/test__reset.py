# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GpuReset against scripted nvidia-smi answers that gpusim does not produce (NVLink peers,
a reset that hangs); the simulated host's own resets are tested through the module."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reset import GpuReset, flr_refused, would_reset
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiRunner

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                       'fixtures', 'real_samples')
BUS = {0: '00000000:18:00.0', 1: '00000000:2A:00.0', 2: '00000000:3A:00.0'}

# Persistence mode Enabled everywhere; a reset of GPU 0 alone is refused naming GPU 1 with it,
# as a driver that wants NVLink peers reset in the same command would.
PEERS = r'''
echo "$*" >> %(log)s
case "$*" in
  *--query-gpu=persistence_mode*) echo Enabled ;;
  *-pm*) echo "done" ;;
  "--gpu-reset -i 0")
    echo "The following GPUs could not be reset:"
    echo "  GPU 00000000:18:00.0: In use by another client"
    echo "  GPU 00000000:2A:00.0: In use by another client"
    exit 255 ;;
  "--gpu-reset -i 0,1") echo "GPU 00000000:18:00.0 was successfully reset."; echo "GPU 00000000:2A:00.0 was successfully reset."; echo "All done." ;;
  *--gpu-reset*) %(other)s ;;
esac
'''


def fake_smi(tmp_path, other='echo "GPU was successfully reset."'):
    log = tmp_path / 'calls.log'
    path = tmp_path / 'nvidia-smi'
    path.write_text('#!/bin/sh\n' + PEERS % dict(log=log, other=other))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return SmiRunner(str(path)), log


def calls(log):
    return log.read_text().splitlines()


def reset(runner, eligible, indexes, seconds=10.0):
    logged = []
    return GpuReset(runner, BUS, eligible, time.monotonic() + seconds, log=logged.append).run(indexes), logged


def test_the_peers_a_refusal_names_are_reset_with_the_gpu(tmp_path):
    runner, log = fake_smi(tmp_path)
    result, logged = reset(runner, [0, 1], [0, 1])
    assert result['attempted'] is True and result['ok'] is True and result['gpus'] == [0, 1]
    assert result['persistence_mode_off'] == [0, 1] and result['persistence_mode_restored'] is True
    assert 'GPU 0, 1 reset: GPU 00000000:18:00.0 was successfully reset.' in result['message']
    # Persistence off before each reset, back on after it, even after the refused one.
    assert [line for line in calls(log) if 'query' not in line] == [
        '-i 0 -pm 0', '--gpu-reset -i 0', '-i 0 -pm 1',
        '-i 0 -pm 0', '-i 1 -pm 0', '--gpu-reset -i 0,1', '-i 0 -pm 1', '-i 1 -pm 1']
    assert logged[-1] == 'gpuops.nvidia: resetting GPU 0, 1 (orphaned memory) with nvidia-smi --gpu-reset'


def test_a_peer_that_is_not_orphaned_in_scope_is_never_reset(tmp_path):
    runner, log = fake_smi(tmp_path)
    result, dummy = reset(runner, [0], [0])
    assert result['ok'] is False and result['gpus'] == [0]
    assert result['persistence_mode_off'] == [0] and result['persistence_mode_restored'] is True
    assert 'nvidia-smi --gpu-reset -i 0 refused (exit 255, internal driver error): The following GPUs could not be ' \
           'reset: GPU 00000000:18:00.0: In use by another client GPU 00000000:2A:00.0: In use' in result['message']
    assert 'names GPU 1 with it, which is not among the GPUs in scope that need a reset' in result['message']
    assert '--gpu-reset -i 0,1' not in calls(log)
    assert calls(log)[-1] == '-i 0 -pm 1'


def test_persistence_is_restored_when_the_reset_hangs(tmp_path):
    runner, log = fake_smi(tmp_path, other='sleep 30')
    started = time.monotonic()
    result, dummy = reset(runner, [2], [2], seconds=1.0)
    assert time.monotonic() - started < 4
    assert result['ok'] is False and 'nvidia-smi --gpu-reset -i 2 did not answer within' in result['message']
    assert calls(log)[-2:] == ['--gpu-reset -i 2', '-i 2 -pm 1']
    assert result['persistence_mode_off'] == [2] and result['persistence_mode_restored'] is True


def test_nothing_is_run_when_no_time_is_left(tmp_path):
    runner, log = fake_smi(tmp_path)
    result, dummy = reset(runner, [2], [2], seconds=-1)
    assert result['ok'] is False and 'no time was left within the timeout to run nvidia-smi' in result['message']
    assert not log.exists()
    # Nothing was switched off, so there is nothing to restore.
    assert result['persistence_mode_off'] == [] and result['persistence_mode_restored'] is None


def test_check_mode_entry_names_the_gpus():
    entry = would_reset({3: ['Xid 95 since the last cure'], 1: ['orphaned memory']})
    assert entry['attempted'] is False and entry['gpus'] == [1, 3] and entry['ok'] is None
    assert entry['reasons'] == [{'index': 1, 'reasons': ['orphaned memory']},
                                {'index': 3, 'reasons': ['Xid 95 since the last cure']}]
    assert entry['persistence_mode_off'] == [] and entry['persistence_mode_restored'] is None
    assert entry['message'].startswith('check mode: GPU 1, 3 would be reset')


def test_persistence_mode_off_only_where_it_was_on(tmp_path):
    runner, log = fake_smi(tmp_path)
    script = tmp_path / 'nvidia-smi'
    script.write_text(script.read_text().replace('*--query-gpu=persistence_mode*) echo Enabled ;;',
                                                 '*--query-gpu=persistence_mode*) echo Disabled ;;'))
    result, dummy = reset(runner, [2], [2])
    assert result['ok'] is True and result['gpus'] == [2]
    assert result['persistence_mode_off'] == [] and result['persistence_mode_restored'] is None
    assert not any('-pm' in line for line in calls(log))


def test_persistence_that_cannot_be_restored_is_reported(tmp_path):
    runner, log = fake_smi(tmp_path)
    script = tmp_path / 'nvidia-smi'
    script.write_text(script.read_text().replace('  *-pm*) echo "done" ;;',
                                                 '  *"-pm 1"*) echo "Insufficient Permissions"; exit 4 ;;\n  *-pm*) echo "done" ;;'))
    result, dummy = reset(runner, [2], [2])
    assert result['ok'] is False and result['gpus'] == [2]
    assert result['persistence_mode_off'] == [2] and result['persistence_mode_restored'] is False
    assert 'persistence mode of GPU 2 not restored' in result['message']


def test_the_platforms_refusal_is_told_from_a_client_that_holds_the_gpu():
    """The refusal's form is that of the real sample smi_errors/E10 (NVSentinel#1690); the words
    in place of "In use by another client" are what AWS bare metal gives (Unknown Error) and
    NVML's strings for a reset the device or the VM does not allow."""
    text = 'The following GPUs could not be reset:\n  GPU 00000000:18:00.0: %s\n'
    for words in ('Unknown Error', 'Not Supported', 'Insufficient Permissions'):
        assert flr_refused(text % words) == ['00000000:18:00.0'], words
    assert flr_refused(text % 'In use by another client') == []
    sample = open(os.path.join(SAMPLES, 'smi_errors', 'E10_reset_refused_nvsentinel1690.txt')).read()
    assert flr_refused(sample) == []


def test_a_reset_the_platform_refuses_names_the_gpu_in_flr_refused(tmp_path):
    runner, log = fake_smi(tmp_path, other='echo "The following GPUs could not be reset:"; '
                                           'echo "  GPU 00000000:3A:00.0: Unknown Error"; exit 255')
    result, logged = reset(runner, [2], [2])
    assert result['ok'] is False and result['gpus'] == [2] and result['flr_refused'] == [2]
    assert 'GPU 00000000:3A:00.0: Unknown Error' in result['message']
    # Persistence mode comes back all the same.
    assert result['persistence_mode_restored'] is True


def test_a_refusal_for_a_client_names_no_gpu_in_flr_refused(tmp_path):
    runner, log = fake_smi(tmp_path, other='echo "The following GPUs could not be reset:"; '
                                           'echo "  GPU 00000000:3A:00.0: In use by another client"; exit 255')
    result, logged = reset(runner, [2], [2])
    assert result['ok'] is False and result['flr_refused'] == []
