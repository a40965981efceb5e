# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gather_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import start_time
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, boot_id, record_cure
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.modules import nvidia_device_release, nvidia_device_reset
from gpusim.state import is_alive as alive
from module_main import run_main

RETURN_KEYS = set(['changed', 'released', 'signalled', 'protected', 'survivors', 'orphaned_gpus',
                   'gpus_before', 'gpus_after', 'elapsed_s'])


# The options of the reset alone: a release given one is nvidia_device_reset's.
RESET_OPTIONS = set(['reset_reload_modules', 'bug_report_dir', 'bug_report_timeout', 'reset_stop_units'])


def run_module(capsys, host, tmp_path, **args):
    """Run main() in-process; return the JSON it printed. Without host_root, the host is given
    its own state directory (the kernel log's last read, the GPUs' cures), not the machine's.
    A release that may reset (reset_orphaned=True, or an option of the reset's) is the release
    followed by its reset in one call: nvidia_device_reset's main() without reset_due."""
    params = dict(nvidia_smi_path=host.smi_path, devices=[host.dev_glob],
                  lock_file=str(tmp_path / 'release.lock'))
    if 'host_root' not in args:
        params['state_dir'] = host.state_dir
    params.update(args)
    module = nvidia_device_release
    if params.get('reset_orphaned') or RESET_OPTIONS & set(params):
        module = nvidia_device_reset
        params.pop('reset_orphaned', None)
    return run_main(capsys, module, params)


@pytest.mark.parametrize('args, message', [
    (dict(signals=['TERM', 'BOGUS']), "unknown signal 'BOGUS'"),
    (dict(signals=[]), 'at least one signal'),
    (dict(timeout=-1), 'timeout must be more than 0 seconds'),
    (dict(grace_period=-2), 'grace_period must be zero or more'),
    (dict(devices=['nvidia*']), 'not an absolute path'),
    (dict(facts_after='maybe'), "argument 'facts_after' is of type"),
    (dict(gpus=[]), 'name at least one GPU index'),
    (dict(bug_report_timeout=0), 'bug_report_timeout must be more than 0 seconds'),
    (dict(bug_report_dir='evidence'), "bug_report_dir: 'evidence' is not an absolute path"),
    (dict(reset_stop_units=['*']), "reset_stop_units: '*' is no systemd unit name"),
    (dict(reset_stop_units=['dcgm.service; rm -rf /']), 'reset_stop_units: '),
    (dict(reset_stop_units=['']), "reset_stop_units: '' is no systemd unit name"),
])
def test_bad_options_fail_cleanly(capsys, gpuhost, tmp_path, args, message):
    result = run_module(capsys, gpuhost, tmp_path, **args)
    assert result['failed'] is True
    assert message in result['msg']
    assert 'exception' not in result and 'Traceback' not in result['msg']


def test_glob_matching_nothing_is_an_error(capsys, gpuhost, tmp_path):
    info = gpuhost.hold(gpus=[0], mib=512)
    result = run_module(capsys, gpuhost, tmp_path, devices=[os.path.join(gpuhost.root, 'none', 'nvidia*')])
    assert result['failed'] is True
    assert 'none/nvidia* matches no NVIDIA device node' in result['msg']
    assert 'nothing was signalled' in result['msg'] and alive(info['pid'])


def test_check_and_diff_mode(capsys, gpuhost, tmp_path):
    info = gpuhost.hold(gpus=[4], mib=512)
    starttime = start_time(info['pid'])
    result = run_module(capsys, gpuhost, tmp_path, _ansible_check_mode=True, _ansible_diff=True)
    assert RETURN_KEYS <= set(result)
    assert result['changed'] is True
    assert [entry['pid'] for entry in result['signalled']] == [info['pid']]
    assert str(info['pid']) in result['diff']['before']
    assert result['diff']['after'] == ''
    assert start_time(info['pid']) == starttime
    assert gpuhost.memory_used()[4] == 1 + 512


def test_release_then_nothing_to_do(capsys, gpuhost, tmp_path):
    info = gpuhost.hold(gpus=[1], mib=2048)
    result = run_module(capsys, gpuhost, tmp_path, grace_period=1)
    assert RETURN_KEYS <= set(result)
    assert result['changed'] is True and result['released'] is True
    assert result['signalled'][0]['pid'] == info['pid']
    assert result['signalled'][0]['signals_sent'] == ['TERM']
    again = run_module(capsys, gpuhost, tmp_path)
    assert again['changed'] is False and again['released'] is True


def test_the_release_proves_what_it_released_in_the_same_call(capsys, gpuhost, tmp_path):
    """Option probe: after a release that freed the GPUs, the simulated libcuda.so.1 allocates on
    each GPU in scope, from the release's last read (no read of its own); a GPU whose allocation
    fails is said in probe.failure, and the release stays released."""
    cuda = gpuhost.install_cuda()
    info = gpuhost.hold(gpus=[1], mib=2048)
    probe = dict(mib=64, cuda_library=cuda, timeout=20)
    result = run_module(capsys, gpuhost, tmp_path, grace_period=1, gpus=[0, 1], probe=probe)
    assert result['released'] is True and result['signalled'][0]['pid'] == info['pid']
    assert result['probe']['probed'] is True and result['probe']['failure'] is None
    assert [(gpu['index'], gpu['ok'], gpu['released']) for gpu in result['probe']['gpus']] == [(0, True, True), (1, True, True)]
    gpuhost.fault('cuda', gpu=1, code='ECC_UNCORRECTABLE')
    result = run_module(capsys, gpuhost, tmp_path, gpus=[0, 1], probe=probe)
    assert result['released'] is True and 'failed' not in result
    assert 'GPU 1' in result['probe']['failure'] and 'CUDA_ERROR_ECC_UNCORRECTABLE' in result['probe']['failure']


def test_a_probe_size_the_probe_refuses_is_its_failure_not_the_release_s(capsys, gpuhost, tmp_path):
    result = run_module(capsys, gpuhost, tmp_path, probe=dict(mib=0, cuda_library=gpuhost.install_cuda()))
    assert result['released'] is True and 'failed' not in result
    assert result['probe']['probed'] is False and 'probe_mib' in result['probe']['failure'], result['probe']


def test_the_release_probes_no_gpu_other_jobs_share_and_nothing_in_check_mode(capsys, gpuhost, tmp_path):
    probe = dict(mib=64, cuda_library=gpuhost.install_cuda(), timeout=20)
    result = run_module(capsys, gpuhost, tmp_path, gpus=[0, 1], probe=probe, job=dict(id='7', shared_gpus=[1]))
    assert [gpu['index'] for gpu in result['probe']['gpus']] == [0]
    result = run_module(capsys, gpuhost, tmp_path, gpus=[1], probe=probe, job=dict(id='7', shared_gpus=[1]))
    assert result['probe'] == dict(probed=False, library_missing=False, gpus=[], duration_ms=None, verified={},
                                   failure=None)
    result = run_module(capsys, gpuhost, tmp_path, probe=probe, _ansible_check_mode=True)
    assert 'probe' not in result


def test_dirty_gpu_fails_with_every_field(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=7, mib=64)
    result = run_module(capsys, gpuhost, tmp_path, timeout=2, grace_period=0.1)
    assert result['failed'] is True
    assert 'GPU 7: 65 MiB held with no process left' in result['msg']
    assert RETURN_KEYS <= set(result)
    assert result['orphaned_gpus'] == [7] and result['released'] is False
    # the threshold decides what counts as clean (64 stuck + the 1 MiB idle reading)
    result = run_module(capsys, gpuhost, tmp_path, timeout=2, grace_period=0.1, memory_threshold_mib=65)
    assert 'failed' not in result and result['released'] is True


def test_facts_after_has_the_facts_shape(capsys, gpuhost, tmp_path):
    daemon = gpuhost.hold(gpus=[0, 1], mib=0, name='nvidia-persistenced', daemon=True)
    job = gpuhost.hold(gpus=[2, 3], mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, grace_period=1, facts_after=True)
    assert 'facts_after' not in run_module(capsys, gpuhost, tmp_path)
    facts = result['facts_after']
    assert set(facts) == set(['nvidia_gpus', 'nvidia_gpu_count', 'nvidia_driver_version',
                              'nvidia_gpu_backend', 'nvidia_device_holders', 'nvidia_module_holders',
                              'nvidia_kernel_log'])
    # read after the release: the job is gone, its memory free, the daemon still listed
    assert [gpu['memory_used_mib'] for gpu in facts['nvidia_gpus']] == [1] * 8
    assert [gpu['state'] for gpu in facts['nvidia_gpus']] == ['free'] * 8
    assert [holder['pid'] for holder in facts['nvidia_device_holders']] == [daemon['pid']]
    assert facts['nvidia_device_holders'][0]['protected'] is True
    assert job['pid'] not in [entry['pid'] for entry in facts['nvidia_device_holders']]


def test_facts_after_in_check_mode_is_the_state_as_it_is(capsys, gpuhost, tmp_path):
    job = gpuhost.hold(gpus=[5], mib=1024)
    result = run_module(capsys, gpuhost, tmp_path, facts_after=True, _ansible_check_mode=True)
    facts = result['facts_after']
    assert facts['nvidia_gpus'][5]['memory_used_mib'] == 1 + 1024
    assert [holder['pid'] for holder in facts['nvidia_device_holders']] == [job['pid']]


def test_facts_after_on_failure_and_on_unreadable_gpus(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=6, mib=32)
    result = run_module(capsys, gpuhost, tmp_path, timeout=2, grace_period=0.1, facts_after=True)
    assert result['failed'] is True and 'facts_after' in result, (result['msg'], result['warning_text'])
    assert result['facts_after']['nvidia_gpus'][6]['state'] == 'orphaned_memory'
    gpuhost.fault('driver-not-loaded')
    result = run_module(capsys, gpuhost, tmp_path, timeout=2, grace_period=0.1, facts_after=True)
    assert result['failed'] is True and 'facts_after' not in result
    assert 'nothing was signalled' in result['msg']


def persistence(host, index):
    return host.smi('-i', str(index), '--query-gpu=persistence_mode', '--format=csv,noheader').stdout.strip()


def holds(pid, path):
    fds = '/proc/%d/fd' % pid
    return any(os.path.realpath(os.path.join(fds, fd)) == os.path.realpath(path) for fd in os.listdir(fds))


def test_reset_orphaned_frees_stuck_memory_and_restores_persistence(capsys, gpuhost, tmp_path):
    scenario = gpuhost.scenario('hung-job')
    daemon = scenario['persistenced']['pid']
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, grace_period=0.3, timeout=6)
    assert result.get('failed') is not True, result
    assert result['changed'] is True and result['released'] is True
    assert result['orphaned_gpus'] == []
    escalation = result['escalation']
    assert escalation['attempted'] is True and escalation['gpus'] == [3] and escalation['ok'] is True
    assert escalation['persistence_mode_off'] == [3] and escalation['persistence_mode_restored'] is True
    assert 'GPU 00000000:5D:00.0 was successfully reset' in escalation['message']
    assert result['gpus_after'][3] == {'index': 3, 'memory_used_mib': 1}
    assert gpuhost.memory_used()[3] == 1
    # Persistence mode was switched off for the reset and back on; the daemon took the GPU back.
    assert persistence(gpuhost, 3) == 'Enabled'
    assert alive(daemon) and holds(daemon, gpuhost.dev_path(3))
    assert [entry['pid'] for entry in result['protected']] == [daemon]
    assert result['elapsed_s'] < 6  # once the reset freed it, before the timeout


def test_reset_orphaned_refused_is_reported_in_nvidia_smis_words(capsys, gpuhost, tmp_path):
    # A client that no scan of this host sees (another PID namespace) keeps the GPU open.
    gpuhost.fault('reset-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, grace_period=0.3, timeout=6)
    assert result['failed'] is True and result.get('released') is False, result
    escalation = result['escalation']
    assert escalation['attempted'] is True and escalation['gpus'] == [3] and escalation['ok'] is False
    # The refusal does not keep persistence mode off.
    assert escalation['persistence_mode_off'] == [3] and escalation['persistence_mode_restored'] is True
    assert 'nvidia-smi --gpu-reset -i 3 refused (exit 255' in escalation['message']
    assert 'GPU 00000000:5D:00.0: In use by another client' in escalation['message']
    assert 'the GPU reset failed: ' in result['msg'] and 'In use by another client' in result['msg']
    assert result['orphaned_gpus'] == [3] and gpuhost.memory_used()[3] == 4097
    assert persistence(gpuhost, 3) == 'Enabled'
    assert escalation['quiesced']['held_by'] == [] and escalation['quiesced']['stopped'] == []


def test_a_reset_the_platform_refuses_makes_the_gpus_recovery_action_reboot(capsys, gpuhost, tmp_path):
    """FLR blocked by the hypervisor (AWS bare metal, EKS): gpusim's nvidia-smi -r answers
    "Unknown Error" for the GPU, as the real one does there; no retry helps, a reboot does."""
    gpuhost.fault('reset-flr-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, grace_period=0.3, timeout=6)
    assert result['failed'] is True and result['released'] is False, result
    escalation = result['escalation']
    assert escalation['attempted'] is True and escalation['ok'] is False and escalation['flr_refused'] == [3]
    assert 'GPU 00000000:5D:00.0: Unknown Error' in escalation['message']
    line = 'GPU 3 needs a reboot (reset_refused: the platform refused the GPU reset (FLR); a driver reload or a reboot is needed)'
    assert escalation['problems'] == [line] and result['msg'].count('reset_refused') == 1, result['msg']
    assert [gpu['recovery_action'] for gpu in result['gpu_states'] if gpu['index'] == 3] == ['reboot']
    assert set(gpu['recovery_action'] for gpu in result['gpu_states'] if gpu['index'] != 3) == {'none'}
    assert persistence(gpuhost, 3) == 'Enabled'
    assert 'module_reload' not in escalation  # reset_reload_modules is off by default
    # The attempt in the GPU's history: failed, and a reboot next.
    uuid = [gpu['uuid'] for gpu in result['gpu_states'] if gpu['index'] == 3][0]
    [event] = History.for_host(gpuhost.root, gpuhost.state_dir).events(uuid)
    assert (event['kind'], event['outcome'], event['to']) == ('reset_failed', 'escalated', 'reboot'), event
    assert event['duration_s'] >= 0 and 'Unknown Error' in event['error']


def test_a_reset_the_platform_refuses_is_cured_by_a_module_reload_when_asked(capsys, gpuhost, tmp_path):
    """reset_reload_modules: the driver's modules unloaded and loaded again instead of a reboot,
    on gpusim's /sys/module, modprobe and rmmod (no kernel module can be loaded in a container)."""
    gpuhost.fault('reset-flr-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, host_root=gpuhost.root, devices=['/dev/nvidia*'], reset_orphaned=True,
                        reset_reload_modules=True, grace_period=0.3, timeout=30)
    assert result.get('failed') is not True and result['released'] is True, result
    escalation = result['escalation']
    assert escalation['ok'] is True and escalation['flr_refused'] == []
    assert '; kernel modules nvidia_modeset, nvidia_uvm, nvidia unloaded and loaded again; device nodes made again: ' \
        '/dev/nvidia-uvm; containers started before the reload' in escalation['message']
    reload = escalation['module_reload']
    assert reload['ok'] is True and reload['flr_refused'] == [3] and reload['gpus'] == list(range(8))
    assert reload['unloaded'] == ['nvidia_modeset', 'nvidia_uvm', 'nvidia'] and reload['loaded'] == ['nvidia', 'nvidia_uvm', 'nvidia_modeset']
    assert [entry['index'] for entry in escalation['fabric']] == list(range(8))
    assert set(gpu['recovery_action'] for gpu in result['gpu_states']) == {'none'}
    assert gpuhost.memory_used()[3] == 1 and persistence(gpuhost, 3) == 'Enabled'


def test_a_module_reload_is_refused_while_another_gpu_is_in_use_and_a_reboot_is_asked(capsys, gpuhost, tmp_path):
    gpuhost.fault('reset-flr-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    job = gpuhost.hold(gpus=[5], mib=2048)
    result = run_module(capsys, gpuhost, tmp_path, host_root=gpuhost.root, devices=['/dev/nvidia*'], gpus=[3],
                        reset_orphaned=True, reset_reload_modules=True, grace_period=0.3, timeout=30)
    assert result['failed'] is True and result['released'] is False, result
    reload = result['escalation']['module_reload']
    assert reload['attempted'] is False and reload['unloaded'] == []
    assert reload['message'] == 'kernel modules not reloaded: every GPU of the host must be idle, and GPU 5 (pid %d) is not' % job['pid']
    assert result['escalation']['flr_refused'] == [3] and result['msg'].count('reset_refused') == 1, result['msg']
    assert [gpu['recovery_action'] for gpu in result['gpu_states'] if gpu['index'] == 3] == ['reboot']
    assert alive(job['pid'])
    assert sorted(os.listdir(os.path.join(gpuhost.root, 'sys', 'module'))) == ['nvidia', 'nvidia_modeset', 'nvidia_uvm']


def test_a_module_reload_in_check_mode_is_said_and_not_done(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, host_root=gpuhost.root, devices=['/dev/nvidia*'], reset_orphaned=True,
                        reset_reload_modules=True, _ansible_check_mode=True)
    reload = result['escalation']['module_reload']
    assert reload['attempted'] is False and reload['modules'] == ['nvidia_modeset', 'nvidia_uvm', 'nvidia']
    assert reload['message'].startswith('check mode: if the platform refuses the GPU reset (FLR), the kernel modules ')
    assert gpuhost.memory_used()[3] == 4097


def test_a_gpu_in_use_is_refused_as_in_use_before_the_platform_is_asked(capsys, gpuhost, tmp_path):
    gpuhost.fault('reset-flr-refused', gpu=3, value='Not Supported')
    gpuhost.fault('reset-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, grace_period=0.3, timeout=6)
    assert result['failed'] is True and result['escalation']['flr_refused'] == [], result
    assert 'In use by another client' in result['escalation']['message'] and 'reset_refused' not in result['msg']


def test_a_reset_refused_while_a_kernel_module_holds_the_driver_names_the_modules(capsys, gpuhost, tmp_path):
    """An idle nvidia_drm (through nvidia_modeset) makes the simulated nvidia-smi refuse the reset,
    as it makes the real one: no process holds the GPU, and the failure names the modules."""
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset', refcnt=0, blocks_reset=True)
    gpuhost.load_module('nvidia_peermem', refcnt=0)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, host_root=gpuhost.root, devices=['/dev/nvidia*'],
                        reset_orphaned=True, grace_period=0.3, timeout=6)
    assert result['failed'] is True and result['released'] is False, result
    escalation = result['escalation']
    assert escalation['attempted'] is True and escalation['ok'] is False
    assert escalation['module_holders'] == [
        {'name': 'nvidia_modeset', 'refcnt': 0, 'via': None}, {'name': 'nvidia_peermem', 'refcnt': 0, 'via': None},
        {'name': 'nvidia_uvm', 'refcnt': 0, 'via': None}, {'name': 'nvidia_drm', 'refcnt': 0, 'via': 'nvidia_modeset'}]
    assert escalation['message'].endswith(
        '; kernel modules that hold nvidia: nvidia_modeset (used by 0), nvidia_peermem (used by 0), '
        'nvidia_uvm (used by 0), nvidia_drm (through nvidia_modeset, used by 0)'), escalation['message']
    assert 'nvidia_drm (through nvidia_modeset' in result['msg']


def test_reset_orphaned_held_by_a_daemon_in_no_unit_is_not_attempted(capsys, gpuhost, tmp_path):
    # A protected daemon that runs in no systemd service cannot be stopped for the reset: the reset
    # is not tried, and the message names the daemon.
    hostengine = gpuhost.hold(gpus=[3], mib=0, name='nv-hostengine', daemon=True)['pid']
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, grace_period=0.3, timeout=6)
    assert result['failed'] is True and result.get('released') is False, result
    escalation = result['escalation']
    assert escalation['attempted'] is False and escalation['ok'] is False and escalation['persistence_mode_off'] == []
    assert 'GPU 3 not reset: held by pid %d (nv-hostengine, unit none), never stopped' % hostengine in escalation['message']
    assert 'the GPU reset failed: GPU 3 not reset: held by pid %d' % hostengine in result['msg']
    assert escalation['quiesced']['held_by'] == [
        {'pid': hostengine, 'comm': 'nv-hostengine', 'name': 'nv-hostengine', 'unit': None, 'gpus': [3],
         'action': None}]
    assert escalation['quiesced']['stopped'] == [] and escalation['quiesced']['refusal'] == escalation['message']
    assert gpuhost.memory_used()[3] == 4097 and persistence(gpuhost, 3) == 'Enabled'
    assert alive(hostengine)


def test_reset_orphaned_in_check_mode_says_what_would_be_reset(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=5, mib=2048)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, _ansible_check_mode=True)
    assert result['changed'] is True and result['orphaned_gpus'] == [5]
    assert result['escalation'] == {'attempted': False, 'gpus': [5], 'ok': None, 'message': result['escalation']['message'],
                                    'reasons': [{'index': 5, 'reasons': ['orphaned memory']}],
                                    'persistence_mode_off': [], 'persistence_mode_restored': None,
                                    'flr_refused': [], 'gpus_reset': [], 'quiesced': result['escalation']['quiesced']}
    assert result['escalation']['quiesced']['to_stop'] == [] and result['escalation']['quiesced']['refusal'] is None
    assert 'GPU 5 would be reset' in result['escalation']['message']
    assert gpuhost.memory_used()[5] == 2049 and persistence(gpuhost, 5) == 'Enabled'


def test_reset_orphaned_is_not_attempted_while_a_holder_remains(capsys, gpuhost, tmp_path):
    stubborn = gpuhost.hold(gpus=[2], mib=1024, ignore_term=True)['pid']
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, signals=['TERM'], timeout=4)
    assert result['failed'] is True
    assert result['escalation'] is None and result['orphaned_gpus'] == [3]
    assert 'reset_orphaned: GPU 3 not reset: processes still hold the devices (pid %d)' % stubborn in result['warning_text']
    assert gpuhost.memory_used()[3] == 4097 and persistence(gpuhost, 3) == 'Enabled'


def test_orphaned_memory_is_not_reset_unless_asked(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = run_module(capsys, gpuhost, tmp_path, grace_period=0.3, timeout=3)
    assert result['failed'] is True and result['escalation'] is None
    assert gpuhost.memory_used()[3] == 4097


def test_a_hung_nvidia_smi_cannot_make_the_release_outlast_its_timeout(capsys, gpuhost, tmp_path):
    gpuhost.hold(gpus=[0], mib=1024)
    gpuhost.fault('hang', seconds=3600)
    result = run_module(capsys, gpuhost, tmp_path, timeout=3, grace_period=0.5, facts_after=True)
    assert result['failed'] is True
    # Each read ends by the deadline: the release's own clock stays within its timeout.
    assert result['elapsed_s'] <= 4, result
    assert 'did not answer within' in result['msg'], result['msg']
    assert 'facts_after' not in result


def test_expected_gpus_are_checked_by_the_releases_first_read(capsys, gpuhost, tmp_path):
    job = gpuhost.hold(gpus=[0], mib=1024)['pid']
    gpuhost.fault('hang', seconds=3600)
    result = run_module(capsys, gpuhost, tmp_path, timeout=3, grace_period=0.5, expected_gpus=8)
    # Nothing proves how many GPUs the host has: nothing is signalled.
    assert result['failed'] is True and 'nothing was signalled' in result['msg'], result
    assert alive(job)
    gpuhost.fault('clear')
    gpuhost.fault('lost', gpu=5)
    result = run_module(capsys, gpuhost, tmp_path, timeout=3, grace_period=0.5, expected_gpus=8)
    assert result['failed'] is True and result['msg'].startswith('expected_gpus: 8 GPUs expected, 7 seen'), result
    assert alive(job)


def test_a_gpu_that_requires_a_reset_is_not_released(capsys, gpuhost, tmp_path):
    # Before: its [GPU requires reset] cells read as null, and the release said released: true.
    gpuhost.fault('reset-required', gpu=3)
    result = run_module(capsys, gpuhost, tmp_path, gpus=[3], timeout=3, grace_period=0.3)
    assert result['failed'] is True and result['released'] is False
    assert 'GPU 3 needs a GPU reset (the driver says: GPU requires reset (for utilization.gpu' in result['msg']
    assert result['escalation'] is None


def test_reset_orphaned_resets_a_gpu_that_requires_it_and_records_the_cure(capsys, gpuhost, tmp_path):
    gpuhost.fault('xid', gpu=3, code=95, when=time.time() - 60)
    gpuhost.fault('reset-required', gpu=3)
    result = run_module(capsys, gpuhost, tmp_path, reset_orphaned=True, timeout=5, grace_period=0.3,
                        facts_after=True, host_root=gpuhost.root, devices=['/dev/nvidia*'])
    assert result.get('failed') is not True, result
    assert result['released'] is True and result['escalation']['gpus'] == [3] and result['escalation']['ok'] is True
    cures = json.load(open(os.path.join(gpuhost.state_dir, 'cures.json')))['gpus']
    uuid = gpuhost.state['gpus'][3]['uuid']
    assert list(cures) == [uuid] and cures[uuid]['how'] == 'reset'
    # The facts of the host now: the Xid before the reset is history, not the GPU's health.
    reader = SmiReader(SmiRunner(gpuhost.smi_path))
    facts, dummy = gather_facts(reader, [gpuhost.dev_glob], [], kernel_log=gpuhost.kernel_log,
                                state=StateDir(gpuhost.state_dir))
    gpu = facts['nvidia_gpus'][3]
    assert gpu['state'] == 'free' and gpu['health']['recovery_action'] == 'none' and gpu['health']['last_cure']
    assert [(e['code'], e['count'], e['since_cure']) for e in gpu['health']['xid_events']] == [(95, 1, False)]


def test_gpus_the_reader_does_not_list_are_never_released(capsys, gpuhost_factory, tmp_path):
    # Before: 8 GPUs on the PCI bus, 6 listed, and the release said released: true (a warning only).
    host = gpuhost_factory(gpus=8, fallen=(2, 5))
    result = run_module(capsys, host, tmp_path, timeout=3, grace_period=0.3, host_root=host.root,
                        devices=['/dev/nvidia*'])
    assert result['failed'] is True and result['released'] is False
    assert 'GPU 00000000:3A:00.0 lost or unreadable (on the PCI bus (PCI ID 10de:2335) but no driver is bound' in result['msg']
    assert 'still seen at %s/sys/bus/pci/devices/0000:3a:00.0' % host.root in result['msg']
    assert [gpu['index'] for gpu in result['gpus_after']] == [0, 1, 2, 3, 4, 5, None, None]


def reset_run(capsys, host, tmp_path, **args):
    """A release with reset_orphaned that reads the host's own kernel log and keeps its state
    (the GPUs' cures) in tmp_path."""
    params = dict(reset_orphaned=True, host_root=host.root, devices=['/dev/nvidia*'], kernel_log=host.kernel_log,
                  state_dir=str(tmp_path / 'state'), grace_period=0.3, timeout=6)
    params.update(args)
    return run_module(capsys, host, tmp_path, **params)


@pytest.mark.parametrize('fault, because', [
    (dict(kind='xid', gpu=2, code=95), 'Xid 95 since the last cure'),
    (dict(kind='xid', gpu=2, code=119), 'Xid 119 since the last cure'),
    (dict(kind='xid', gpu=2, code=154, text='GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)'),
     'Xid 154 since the last cure'),
    (dict(kind='remap', gpu=2, pending=True), 'remapped rows pending'),
    (dict(kind='retired', gpu=2, value=True), 'retired pages pending'),
    (dict(kind='reset-required', gpu=2),
     'the driver says: GPU requires reset (for utilization.gpu, temperature.gpu, retired_pages.pending)'),
])
def test_every_reason_the_driver_gives_triggers_a_reset(capsys, gpuhost, tmp_path, fault, because):
    gpuhost.fault(fault.pop('kind'), **fault)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is True and result['changed'] is True, result
    escalation = result['escalation']
    assert escalation['ok'] is True and escalation['gpus'] == [2]
    assert escalation['reasons'] == [{'index': 2, 'reasons': [because]}]
    # The GPU reads as nothing needs a reset any more, and the Xid is history: nothing to do again.
    again = reset_run(capsys, gpuhost, tmp_path)
    assert again['escalation'] is None and again['changed'] is False, again


def test_the_drivers_recovery_action_of_reset_triggers_one(capsys, gpuhost_factory, tmp_path):
    host = gpuhost_factory(driver_version='570.124.06')
    host.fault('recovery', gpu=4, value='reset')
    result = reset_run(capsys, host, tmp_path)
    assert result['released'] is True and result['escalation']['gpus'] == [4], result
    assert result['escalation']['reasons'] == [{'index': 4, 'reasons': ["the driver's GPU recovery action is reset_gpu"]}]


@pytest.mark.parametrize('code', [48, 79])
def test_an_xid_that_a_reset_does_not_cure_is_left_to_a_person(capsys, gpuhost, tmp_path, code):
    # Xid 48 (double bit ECC) follows NVIDIA's workflow; Xid 79 (fallen off the bus) needs a reboot.
    gpuhost.fault('xid', gpu=1, code=code)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['escalation'] is None, result


def test_an_xid_that_calls_for_a_reset_leaves_the_gpu_not_released_without_reset_orphaned(capsys, gpuhost, tmp_path):
    # Before: released true, while nvidia_gpu_facts on the same host said reset_gpu.
    gpuhost.fault('xid', gpu=2, code=95)
    result = reset_run(capsys, gpuhost, tmp_path, reset_orphaned=False)
    assert result['released'] is False and result['escalation'] is None and result['changed'] is False
    assert 'GPU 2 needs a GPU reset (Xid 95 since the last cure; reset_orphaned resets it)' in result['msg']
    assert [(gpu['index'], gpu['recovery_action']) for gpu in result['gpu_states'] if gpu['index'] in (1, 2)] == [
        (1, 'none'), (2, 'reset_gpu')]
    assert 'probe' not in result


@pytest.mark.parametrize('code, words', [
    (79, 'GPU 1 needs a reboot (Xid 79 since the last cure)'),
    (48, "GPU 1 needs a person (Xid 48 since the last cure; NVIDIA's Xid catalogue asks for a look)"),
])
def test_an_xid_that_calls_for_a_reboot_or_a_person_leaves_the_gpu_not_released(capsys, gpuhost, tmp_path, code, words):
    # Before: an Xid 79 in the kernel's own words left the GPU released, its recovery action unknown.
    gpuhost.fault('xid', gpu=1, code=code)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is False and result['escalation'] is None, result
    assert words in result['msg']
    assert [gpu['recovery_action'] for gpu in result['gpu_states'] if gpu['index'] == 1] == [
        'reboot' if code == 79 else 'inspect']


def test_a_hung_full_chip_reset_that_names_no_gpu_convicts_none_by_itself(capsys, gpuhost, tmp_path):
    # Before: the driver's assertions, which name no bus id, made every GPU need a reboot.
    gpuhost.fault('stuck', gpu=6, mib=1024)
    gpuhost.fault('driver-hung', count=20)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is True and result['escalation']['gpus'] == [6], result
    assert set(gpu['recovery_action'] for gpu in result['gpu_states']) == set(['none'])
    assert 'the kernel log says the NVIDIA driver hung (NV_ERR_GPU_IN_FULLCHIP_RESET; 80 lines this boot' in result['warning_text']
    assert 'no GPU is held at fault for it unless its own reads say so' in result['warning_text']


def test_a_hung_full_chip_reset_is_driver_hung_where_the_gpus_own_read_bears_it_out(capsys, gpuhost, tmp_path):
    # The driver says GPU 6 requires a reset: with the hang in the kernel log, a reset would hang in
    # it too; GPU 6 needs the reboot, and no GPU is reset.
    gpuhost.fault('reset-required', gpu=6)
    gpuhost.fault('driver-hung', count=20)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is False and result['escalation'] is None, result
    assert [(gpu['index'], gpu['recovery_action']) for gpu in result['gpu_states'] if gpu['recovery_action'] != 'none'] == [
        (6, 'reboot')]


def test_an_xid_older_than_the_last_cure_is_no_reason(capsys, gpuhost, tmp_path):
    gpuhost.fault('xid', gpu=1, code=79, when=time.time() - 60)
    record_cure(StateDir(str(tmp_path / 'state')), [gpuhost.state['gpus'][1]['uuid']], time.time() - 30, 'probe', boot_id())
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is True and result.get('failed') is not True, result
    assert [gpu['recovery_action'] for gpu in result['gpu_states'] if gpu['index'] == 1] == ['none']


def test_a_syslog_file_is_no_source_and_a_users_line_there_changes_nothing(capsys, gpuhost, tmp_path):
    # What rsyslog's default file template writes for `logger -t kernel -p kern.err 'NVRM: ...'` run
    # by any user reads exactly as the kernel's own line. Before: a user's Xid 79 there made GPU 1
    # need a reboot, an Xid 119 reset GPU 2, and one hung-driver line convicted every GPU.
    bus = dict((gpu['index'], gpu['pci_bus_id'][4:].lower()) for gpu in gpuhost.state['gpus'])
    log = tmp_path / 'kern.log'
    log.write_text('\n'.join([
        "Dec  2 08:00:01 node01 kernel: NVRM: Xid (PCI:%s): 79, GPU has fallen off the bus." % bus[1][:-2],
        "Dec  2 08:00:02 node01 kernel: [  123.456789] NVRM: Xid (PCI:%s): 119, pid='<unknown>', name=<unknown>, "
        "Timeout after 6s of waiting for RPC response from GPU2 GSP!" % bus[2][:-2],
        'Dec  2 08:00:03 node01 kernel: NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
        '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844', '']))
    result = reset_run(capsys, gpuhost, tmp_path, kernel_log=str(log))
    assert result['released'] is True and result['escalation'] is None and result['changed'] is False, result
    assert [gpu['recovery_action'] for gpu in result['gpu_states']] == ['none'] * len(result['gpu_states'])
    assert 'kernel_log: %s is not read: it does not hold /dev/kmsg records' % log in result['warning_text']


def test_what_roots_userspace_writes_to_kmsg_is_not_the_drivers(capsys, gpuhost, tmp_path):
    # `echo '<3>NVRM: ...' > /dev/kmsg` is filed as the user facility: only the kernel's record
    # (GPU 2, Xid 119) counts.
    bus = dict((gpu['index'], gpu['pci_bus_id'][4:-2].lower()) for gpu in gpuhost.state['gpus'])
    gpuhost.write_kmsg("<3>NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." % bus[1])
    gpuhost.write_kmsg("<3>NVRM: Xid (PCI:%s): 119, pid='<unknown>', name=<unknown>, Timeout" % bus[3])
    gpuhost.write_kmsg('<3>NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
                       '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844')
    gpuhost.fault('xid', gpu=2, code=119)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is True and result['escalation']['gpus'] == [2], result
    assert result['escalation']['reasons'] == [{'index': 2, 'reasons': ['Xid 119 since the last cure']}]
    assert [gpu['recovery_action'] for gpu in result['gpu_states']] == ['none'] * len(result['gpu_states'])


def test_check_mode_says_why_each_gpu_would_be_reset(capsys, gpuhost, tmp_path):
    gpuhost.fault('xid', gpu=2, code=95)
    gpuhost.fault('stuck', gpu=5, mib=2048)
    result = reset_run(capsys, gpuhost, tmp_path, _ansible_check_mode=True)
    assert result['escalation']['attempted'] is False
    assert result['escalation']['reasons'] == [{'index': 2, 'reasons': ['Xid 95 since the last cure']},
                                               {'index': 5, 'reasons': ['orphaned memory']}]


def test_a_failed_reset_for_an_xid_leaves_the_gpu_not_released(capsys, gpuhost, tmp_path):
    gpuhost.fault('reset-refused', gpu=2)
    gpuhost.fault('xid', gpu=2, code=95)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['failed'] is True and result['released'] is False, result
    assert 'GPU 2 needs a GPU reset (Xid 95 since the last cure)' in result['msg']
    assert 'the GPU reset failed' in result['msg']


def test_a_reset_not_attempted_changes_nothing_and_makes_no_bug_report(capsys, gpuhost, tmp_path):
    # A protected daemon outside any unit the rule allows to stop: the reset is not tried.
    hostengine = gpuhost.hold(gpus=[2], mib=0, name='nv-hostengine', daemon=True)['pid']
    gpuhost.fault('xid', gpu=2, code=95)
    result = reset_run(capsys, gpuhost, tmp_path, bug_report_dir=str(tmp_path / 'evidence'))
    assert result['failed'] is True and result['escalation']['attempted'] is False, result
    assert result['changed'] is False and 'bug_report' not in result['escalation']
    assert 'GPU 2 needs a GPU reset (Xid 95 since the last cure)' in result['msg'] and alive(hostengine)
    assert not os.path.exists(str(tmp_path / 'evidence'))


def test_the_fabric_is_waited_for_after_a_reset(capsys, gpuhost, tmp_path):
    gpuhost.fault('fabric', value='on', seconds=1.5)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    started = time.monotonic()
    result = reset_run(capsys, gpuhost, tmp_path, timeout=20)
    assert result['released'] is True, (result.get('msg'), result['escalation'])
    assert result['escalation']['fabric'] == [{'index': 3, 'state': 'Completed', 'status': 'Success', 'ok': True}]
    assert time.monotonic() - started >= 1.5


@pytest.mark.parametrize('value, words', [
    ('stuck', 'state In Progress, status N/A: the GPU did not register with the NVLink fabric in time'),
    ('Insufficient Resources', 'state Completed, status Insufficient Resources: the fabric registration completed'),
])
def test_a_fabric_that_does_not_come_back_is_not_clean(capsys, gpuhost, tmp_path, value, words):
    gpuhost.fault('fabric', value='on', seconds=0.2)
    gpuhost.fault('fabric', gpu=3, value=value)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['failed'] is True and result['released'] is False, result
    assert result['escalation']['ok'] is True and result['escalation']['fabric'][0]['ok'] is False
    assert 'GPU 3: the NVLink fabric is not back after the GPU reset (%s' % words in result['msg']
    # The memory was freed: only the fabric says the GPU is not ready.
    assert gpuhost.memory_used()[3] == 1


def test_a_host_without_fabric_is_not_waited_for(capsys, gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result = reset_run(capsys, gpuhost, tmp_path)
    assert result['released'] is True
    assert result['escalation']['fabric'] == [{'index': 3, 'state': '[N/A]', 'status': '[N/A]', 'ok': True,
                                               'note': 'no NVLink fabric'}]


def test_a_failed_reset_leaves_a_bug_report_in_a_root_only_directory(capsys, gpuhost, tmp_path):
    gpuhost.fault('reset-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    reports = tmp_path / 'evidence'
    result = reset_run(capsys, gpuhost, tmp_path, bug_report_dir=str(reports))
    assert result['failed'] is True and result['escalation']['ok'] is False
    report = result['escalation']['bug_report']
    assert report['ok'] is True and os.path.dirname(report['path']) == str(reports), report
    assert report['path'].endswith('.log.gz') and os.path.getsize(report['path']) > 0
    assert os.stat(str(reports)).st_mode & 0o777 == 0o700


def test_a_bug_report_that_hangs_is_cut_off(capsys, gpuhost, tmp_path):
    gpuhost.fault('reset-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    gpuhost.fault('bug-report-hang', seconds=60)
    started = time.monotonic()
    result = reset_run(capsys, gpuhost, tmp_path, bug_report_dir=str(tmp_path / 'evidence'), bug_report_timeout=1)
    assert time.monotonic() - started < 12
    report = result['escalation']['bug_report']
    assert report['ok'] is False and report['path'] is None
    assert 'nvidia-bug-report.sh was not run to the end' in report['message']
    assert 'bug_report_dir: nvidia-bug-report.sh was not run to the end' in result['warning_text']


def test_a_bug_report_directory_below_one_others_can_write_is_refused(capsys, gpuhost, tmp_path):
    # Another user could swap evidence for a link between the check and the report's writes.
    gpuhost.fault('reset-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    shared = tmp_path / 'shared'
    shared.mkdir()
    os.chmod(str(shared), 0o777)
    result = reset_run(capsys, gpuhost, tmp_path, bug_report_dir=str(shared / 'evidence'))
    report = result['escalation']['bug_report']
    assert report['ok'] is False and report['path'] is None, report
    assert 'is below %s, which every user can write (mode 0777)' % shared in report['message'], report['message']
    assert os.listdir(str(shared)) == []  # nothing is created there


def test_a_bug_report_directory_others_can_read_is_refused(capsys, gpuhost, tmp_path):
    gpuhost.fault('reset-refused', gpu=3)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    shared = tmp_path / 'shared'
    shared.mkdir(mode=0o755)
    os.chmod(str(shared), 0o755)
    result = reset_run(capsys, gpuhost, tmp_path, bug_report_dir=str(shared))
    report = result['escalation']['bug_report']
    assert report['ok'] is False and 'must belong to uid' in report['message'] and 'mode 0700' in report['message']
    assert os.listdir(str(shared)) == []
