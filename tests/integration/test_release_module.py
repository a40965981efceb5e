# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_device_release run through the ansible CLI against simulated hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import subprocess
import time

from adhoc import run_module
from gpusim.state import is_alive as alive


def run_release(host, tmp_path, *flags, **options):
    args = dict(nvidia_smi_path=host.smi_path, devices=[host.dev_glob],
                lock_file=str(tmp_path / 'release.lock'))
    if 'host_root' not in options:
        # Found by its devices alone, the host keeps its state in its own directory, not the machine's.
        args['state_dir'] = host.state_dir
    args.update(options)
    # A release that may reset is the release and its reset in one call.
    module = 'nvidia_device_reset' if args.pop('reset_orphaned', False) else 'nvidia_device_release'
    return run_module(module, args, *flags)


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
    result, proc = run_release(gpuhost, tmp_path, grace_period=0.3, timeout=3)
    assert proc.returncode != 0
    assert result['failed'] is True
    assert 'GPU 3: 8193 MiB held with no process left (orphaned memory' in result['msg']
    assert result['orphaned_gpus'] == [3]
    assert result['signalled'][0]['signals_sent'] == ['TERM', 'KILL']


def test_orphaned_memory_fails_within_seconds_not_the_timeout(gpuhost, tmp_path):
    job = gpuhost.hold(gpus=[2], mib=4096, leak=True)
    started = time.monotonic()
    result, proc = run_release(gpuhost, tmp_path, host_root=gpuhost.root, devices=['/dev/nvidia*'], timeout=60)
    # The driver frees a dead process's memory within seconds (ORPHAN_WAIT_S, 5 s): before, the
    # release waited out the whole timeout. The release's own time is bounded tightly; the whole
    # run's (Ansible's start-up with it, slower beside the other tests) far from the 60 s timeout.
    assert result['elapsed_s'] < 10, result['elapsed_s']
    assert time.monotonic() - started < 30
    assert proc.returncode != 0 and result['failed'] is True and result['released'] is False
    assert result['orphaned_gpus'] == [2] and not alive(job['pid'])
    assert result['msg'].startswith('GPUs not released: GPU 2: 4097 MiB held with no process left (orphaned memory')
    assert 'set reset_orphaned' in result['msg']


def test_orphaned_memory_is_reset_when_asked(gpuhost, tmp_path):
    scenario = gpuhost.scenario('hung-job')
    daemon = scenario['persistenced']['pid']
    gpuhost.fault('stuck', gpu=3, mib=8192)
    # The reset's share is a third of the timeout: room for its nvidia-smi calls on a loaded machine.
    result, proc = run_release(gpuhost, tmp_path, grace_period=0.3, timeout=9, reset_orphaned=True)
    assert proc.returncode == 0, proc.stdout
    assert result['released'] is True and result['orphaned_gpus'] == []
    assert result['escalation']['gpus'] == [3] and result['escalation']['ok'] is True
    assert gpuhost.memory_used() == dict((index, 1) for index in range(8))
    assert gpuhost.smi('-i', '3', '--query-gpu=persistence_mode', '--format=csv,noheader').stdout.strip() == 'Enabled'
    assert alive(daemon)


def test_a_refused_reset_is_cured_by_a_module_reload_through_ansible(gpuhost, tmp_path):
    """reset_reload_modules on gpusim's /sys/module, with its modprobe and rmmod beside its
    nvidia-smi: no kernel module can be loaded in a container."""
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset')
    gpuhost.fault('reset-flr-refused', gpu=3, value='Insufficient Permissions')
    gpuhost.fault('stuck', gpu=3, mib=8192)
    result, proc = run_release(gpuhost, tmp_path, grace_period=0.3, timeout=30, reset_orphaned=True,
                               reset_reload_modules=True, host_root=gpuhost.root, devices=['/dev/nvidia*'])
    assert proc.returncode == 0, proc.stdout
    assert result['released'] is True and result['escalation']['ok'] is True and result['escalation']['flr_refused'] == []
    reload = result['escalation']['module_reload']
    assert reload['flr_refused'] == [3] and reload['loaded'] == ['nvidia', 'nvidia_modeset', 'nvidia_drm', 'nvidia_uvm']
    assert gpuhost.memory_used() == dict((index, 1) for index in range(8))
    assert gpuhost.smi('-i', '3', '--query-gpu=persistence_mode', '--format=csv,noheader').stdout.strip() == 'Enabled'


def test_module_documentation_renders():
    proc = subprocess.run(['ansible-doc', 'gpuops.nvidia.nvidia_device_release'],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert 'grace_period' in proc.stdout and 'orphaned_gpus' in proc.stdout
    assert 'protect' in proc.stdout and 'nvidia_smi_path' in proc.stdout
    assert 'reset_orphaned' in proc.stdout and 'escalation' in proc.stdout
    assert 'WARNING' not in proc.stderr, proc.stderr


def test_gpus_scope_follows_minor_numbers_not_indexes(gpuhost_factory, tmp_path):
    # The driver numbered the GPUs in another order than the bus: GPU 0 is /dev/nvidia1 and
    # GPU 1 is /dev/nvidia0. The default devices glob is resolved under host_root.
    host = gpuhost_factory(minors=[1, 0, 2, 3, 4, 5, 6, 7])
    on_gpu0 = host.hold(gpus=[0], mib=4096, name='job-a')['pid']
    on_gpu1 = host.hold(gpus=[1], mib=4096, name='job-b')['pid']
    assert host.dev_path(0).endswith('/dev/nvidia1')
    result, proc = run_module('nvidia_device_release', dict(
        nvidia_smi_path=host.smi_path, host_root=host.root, gpus=[0], grace_period=1,
        lock_file=str(tmp_path / 'release.lock')))
    assert proc.returncode == 0, proc.stdout
    assert [entry['pid'] for entry in result['signalled']] == [on_gpu0]
    assert result['signalled'][0]['devices'] == sorted([host.dev_path(0), host.root + '/dev/nvidia-uvm',
                                                        host.root + '/dev/nvidiactl'])
    assert alive(on_gpu1) and not alive(on_gpu0)
    assert result['gpus_after'] == [{'index': 0, 'memory_used_mib': 1}]  # the idle reading
    assert 'cannot be read' not in result['warning_text']


def test_expected_gpus_fails_before_anything_is_signalled(gpuhost_factory, tmp_path):
    host = gpuhost_factory(fallen=[3])
    job = host.hold(gpus=[0], mib=4096)['pid']
    result, proc = run_module('nvidia_device_release', dict(
        nvidia_smi_path=host.smi_path, host_root=host.root, expected_gpus=8,
        lock_file=str(tmp_path / 'release.lock')))
    assert result['failed'] is True
    assert result['msg'].startswith('expected_gpus: 8 GPUs expected, 7 seen (00000000:18:00.0, ')
    assert 'lost: 00000000:5D:00.0 (on the PCI bus (PCI ID 10de:2335) but no driver is bound to it' in result['msg']
    assert alive(job)
