# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_device_reset given the reset_due of a release: each GPU read again at the reset, and
reset only if it still needs it; nothing signalled. (Without reset_due, the release and its reset
in one call, are tested with the release: test_nvidia_device_release.py.)"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.modules import nvidia_device_release, nvidia_device_reset
from gpusim.state import is_alive as alive
from module_main import run_main

ORPHANED = [{'index': 3, 'reasons': ['orphaned memory']}]


def run(capsys, module, host, tmp_path, **args):
    params = dict(nvidia_smi_path=host.smi_path, devices=[host.dev_glob], state_dir=host.state_dir,
                  lock_file=str(tmp_path / 'release.lock'), grace_period=0.3, timeout=10)
    params.update(args)
    return run_main(capsys, module, params)


def test_the_release_names_the_gpu_that_needs_a_reset_and_the_reset_resets_it(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    release = run(capsys, nvidia_device_release, gpuhost, tmp_path, reset_orphaned=True)
    assert release['failed'] is True and release['released'] is False and release['escalation'] is None
    assert release['reset_due'] == ORPHANED and release['orphaned_gpus'] == [3]
    assert 'GPU 3 needs a reset (orphaned memory)' in release['msg']
    assert gpuhost.memory_used()[3] == 4097  # the release resets nothing itself

    reset = run(capsys, nvidia_device_reset, gpuhost, tmp_path, reset_due=release['reset_due'])
    assert reset.get('failed') is not True, reset
    assert reset['released'] is True and reset['changed'] is True and reset['signalled'] == []
    assert reset['escalation']['gpus'] == [3] and reset['escalation']['ok'] is True
    assert reset['escalation']['reasons'] == ORPHANED
    assert gpuhost.memory_used()[3] == 1


def test_a_gpu_whose_memory_was_freed_since_is_not_reset(capsys, gpuhost, tmp_path):
    reset = run(capsys, nvidia_device_reset, gpuhost, tmp_path, reset_due=[{'index': 1, 'reasons': ['orphaned memory']}])
    assert reset.get('failed') is not True, reset
    assert reset['released'] is True and reset['changed'] is False and reset['escalation'] is None


def test_a_gpu_a_process_holds_at_the_reset_is_neither_reset_nor_signalled(capsys, gpuhost, tmp_path):
    # A job started on the GPU between the release and its reset: read again, it keeps the GPU.
    job = gpuhost.hold(gpus=[3], mib=1024)['pid']
    reset = run(capsys, nvidia_device_reset, gpuhost, tmp_path, reset_due=ORPHANED)
    assert reset['failed'] is True and reset['released'] is False and reset['escalation'] is None
    assert reset['signalled'] == [] and alive(job)
    assert 'reset_due: GPU 3 not reset: the driver places a process on it now' in reset['warning_text']
    assert 'pid %d' % job in reset['msg']


def test_check_mode_says_what_would_be_reset_and_does_nothing(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    reset = run(capsys, nvidia_device_reset, gpuhost, tmp_path, reset_due=ORPHANED, _ansible_check_mode=True)
    assert reset['escalation']['gpus'] == [3] and reset['escalation']['attempted'] is False
    assert gpuhost.memory_used()[3] == 4097


@pytest.mark.parametrize('due, words', [
    ([{'index': -1, 'reasons': ['orphaned memory']}], 'reset_due: '),
    ([{'index': 3, 'reasons': []}], 'reset_due: '),
    ([{'reasons': ['orphaned memory']}], 'index'),
])
def test_a_reset_due_that_names_no_gpu_fails_cleanly(capsys, gpuhost, tmp_path, due, words):
    reset = run(capsys, nvidia_device_reset, gpuhost, tmp_path, reset_due=due)
    assert reset['failed'] is True and words in reset['msg'] and 'Traceback' not in reset['msg']
    assert reset.get('changed') is not True
