# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_gpu_facts run through the ansible CLI against simulated hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

import pytest

from adhoc import run_module


def run_facts(host, **options):
    args = dict(nvidia_smi_path=host.smi_path, devices=[host.dev_glob])
    if 'host_root' not in options:
        # Found by its devices alone, the host keeps its state in its own directory, not the machine's.
        args['state_dir'] = host.state_dir
    args.update(options)
    return run_module('nvidia_gpu_facts', args)


def test_hung_job_facts(gpuhost):
    started = gpuhost.scenario('hung-job')
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0, proc.stdout
    facts = result['ansible_facts']
    assert facts['nvidia_gpu_count'] == 8
    assert facts['nvidia_gpu_backend'] == 'nvidia-smi'
    assert facts['nvidia_driver_version'] == '550.127.05'
    gpus = facts['nvidia_gpus']
    assert [gpu['index'] for gpu in gpus] == list(range(8))
    for gpu in gpus:
        assert gpu['memory_used_mib'] == 1 + 76113  # the idle reading and the rank's memory
        assert gpu['memory_reserved_mib'] == 515
        assert gpu['utilization_gpu_pct'] == 0
        assert gpu['state'] == 'idle_holding'
        assert gpu['error'] is None
        assert gpu['name'] == 'NVIDIA H200'
        assert len(gpu['processes']) == 1
        assert gpu['processes'][0]['used_memory_mib'] == 76113
    holders = dict((h['pid'], h) for h in facts['nvidia_device_holders'])
    daemon = [h for h in holders.values() if h['protected']]
    assert [h['comm'] for h in daemon] == ['nvidia-persiste']
    assert [h['name'] for h in daemon] == ['nvidia-persistenced']  # the kernel's comm, whole
    ranks = [h for h in holders.values() if not h['protected']]
    assert len(ranks) == 8
    assert set(gpu['processes'][0]['pid'] for gpu in gpus) == set(h['pid'] for h in ranks)
    assert all(os.path.join(gpuhost.root, 'dev', 'nvidiactl') in h['devices'] for h in holders.values())
    assert result['changed'] is False
    assert started


def test_the_kernel_modules_that_hold_the_driver_are_facts(gpuhost):
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset', refcnt=1)
    result, proc = run_facts(gpuhost, host_root=gpuhost.root, devices=['/dev/nvidia*'])
    assert proc.returncode == 0, proc.stdout
    assert result['ansible_facts']['nvidia_module_holders'] == [
        {'name': 'nvidia_modeset', 'refcnt': 0, 'via': None}, {'name': 'nvidia_uvm', 'refcnt': 0, 'via': None},
        {'name': 'nvidia_drm', 'refcnt': 1, 'via': 'nvidia_modeset'}]


def test_clean_host_is_free(gpuhost):
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0
    facts = result['ansible_facts']
    assert set(gpu['state'] for gpu in facts['nvidia_gpus']) == set(['free'])
    assert facts['nvidia_device_holders'] == []


def test_busy_orphaned_and_lost_states(gpuhost):
    gpuhost.hold(gpus='0', mib=2048, util=87)
    gpuhost.fault('stuck', gpu=1, mib=512)
    gpuhost.fault('lost', gpu=2)
    result, proc = run_facts(gpuhost, memory_threshold_mib=16)
    assert proc.returncode == 0, proc.stdout
    states = dict((gpu['index'], gpu['state']) for gpu in result['ansible_facts']['nvidia_gpus'])
    assert states == {0: 'busy', 1: 'orphaned_memory', 2: 'lost', 3: 'free', 4: 'free',
                      5: 'free', 6: 'free', 7: 'free'}
    lost = result['ansible_facts']['nvidia_gpus'][2]
    assert 'Unable to determine the device handle' in lost['error']
    assert lost['pci_bus_id'] == '00000000:3A:00.0'


def test_not_reported_fields_are_null(gpuhost):
    gpuhost.fault('na', field='temperature.gpu', value='[N/A]')
    gpuhost.fault('na', field='utilization.gpu', gpu=3, value='[Not Supported]')
    result, proc = run_facts(gpuhost)
    gpus = result['ansible_facts']['nvidia_gpus']
    assert all(gpu['temperature_c'] is None for gpu in gpus)
    assert gpus[3]['utilization_gpu_pct'] is None
    assert gpus[2]['utilization_gpu_pct'] == 0


@pytest.mark.parametrize('fault, message', [
    ('driver-not-loaded', 'exited with 9 (the NVIDIA driver is not loaded)'),
    ('mismatch', 'exited with 18'),
])
def test_driver_faults_fail_clearly(gpuhost, fault, message):
    gpuhost.fault(fault, True)
    result, proc = run_facts(gpuhost)
    assert proc.returncode != 0
    assert result['failed'] is True
    assert message in result['msg']
    assert 'Traceback' not in proc.stdout


def test_no_devices_is_zero_gpus_with_a_warning(gpuhost):
    gpuhost.fault('no-devices', True)
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0
    assert result['ansible_facts']['nvidia_gpu_count'] == 0
    assert '[WARNING]: nvidia-smi: No devices were found' in result['warning_text']


def test_hung_nvidia_smi_is_killed_at_the_timeout(gpuhost):
    gpuhost.fault('hang', seconds=60)
    started = time.monotonic()
    result, proc = run_facts(gpuhost, timeout=1)
    assert time.monotonic() - started < 30
    assert result['failed'] is True
    assert 'did not answer within 1.0 s' in result['msg']


def test_glob_matching_nothing_warns(gpuhost):
    result, proc = run_facts(gpuhost, devices=['/nonexistent/nvidia*'])
    assert proc.returncode == 0
    assert 'no device node matches /nonexistent/nvidia*' in result['warning_text']


@pytest.mark.parametrize('options, message', [
    (dict(timeout=0), 'timeout must be greater than zero'),
    (dict(timeout='soon'), "argument 'timeout' is of type"),
    (dict(memory_threshold_mib=-5), 'memory_threshold_mib must be zero or more'),
    (dict(backend='cuda'), 'value of backend must be one of'),
    (dict(devices=['dev/nvidia*']), 'not an absolute path'),
    (dict(nvidia_smi_path='/nonexistent/nvidia-smi'), 'nvidia-smi not found'),
])
def test_bad_options_fail_clearly(gpuhost, options, message):
    result, proc = run_facts(gpuhost, **options)
    assert result['failed'] is True
    assert message in result['msg']
    assert 'Traceback' not in proc.stdout


def test_gpu_that_fell_off_the_bus_at_boot_is_lost(gpuhost_factory):
    # Eight GPUs on the PCI bus; the one at 5D fell off at boot: the driver never attached it,
    # nvidia-smi lists seven, numbered 0-6 in bus order, and the kernel log has no Xid for it.
    host = gpuhost_factory(fallen=[3], minors=[6, 5, 4, 3, 2, 1, 0])
    result, proc = run_facts(host, host_root=host.root, kernel_log=host.kernel_log)
    assert proc.returncode == 0, proc.stdout
    facts = result['ansible_facts']
    gpus = facts['nvidia_gpus']
    assert facts['nvidia_gpu_count'] == 8
    assert [gpu['index'] for gpu in gpus] == [0, 1, 2, 3, 4, 5, 6, None]
    assert [gpu['minor_number'] for gpu in gpus] == [6, 5, 4, 3, 2, 1, 0, None]
    assert [gpu['state'] for gpu in gpus] == ['free'] * 7 + ['lost']
    lost = gpus[7]
    assert lost['pci_bus_id'] == '00000000:5D:00.0' and gpus[3]['pci_bus_id'] == '00000000:9A:00.0'
    assert 'on the PCI bus (PCI ID 10de:2335) but no driver is bound to it' in lost['error']
    # and the kernel log's probe message (as K06/K07) says so: as for Xid 79, a reboot
    assert lost['error'].endswith('; the kernel log says this GPU has fallen off the bus')
    assert lost['health']['recovery_action'] == 'reboot'
    assert 'GPU 00000000:5D:00.0 is lost' in result['warning_text']


def test_a_syslog_file_is_refused_and_a_users_kmsg_record_is_not_the_drivers(gpuhost, tmp_path):
    # /var/log/kern.log as rsyslog's default file template writes it: a user's `logger -t kernel -p
    # kern.err` line reads exactly as the kernel's own. Before: its Xid 79 made GPU 1 need a reboot.
    bus = dict((gpu['index'], gpu['pci_bus_id'][4:-2].lower()) for gpu in gpuhost.state['gpus'])
    log = tmp_path / 'kern.log'
    log.write_text("Dec  2 08:00:01 node01 kernel: NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has "
                   "fallen off the bus.\n" % bus[1])
    result, proc = run_facts(gpuhost, kernel_log=str(log))
    assert proc.returncode == 0, proc.stdout
    gpus = result['ansible_facts']['nvidia_gpus']
    assert [(gpu['state'], gpu['health']['xid_events'], gpu['health']['recovery_action']) for gpu in gpus] == [
        ('free', None, 'none')] * len(gpus)
    assert 'is not read: it does not hold /dev/kmsg records' in result['warning_text']
    # The host's kernel log (/dev/kmsg records): root's `echo '<3>NVRM: ...' > /dev/kmsg` is the user
    # facility; the kernel's own record (GPU 2, Xid 48) counts.
    gpuhost.write_kmsg("<3>NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." % bus[1])
    gpuhost.write_kmsg('<3>NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
                       '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844')
    gpuhost.fault('xid', gpu=2, code=48)
    result, proc = run_facts(gpuhost, kernel_log=gpuhost.kernel_log)
    gpus = result['ansible_facts']['nvidia_gpus']
    assert [(gpu['index'], gpu['health']['recovery_action']) for gpu in gpus if gpu['health']['recovery_action'] != 'none'] \
        == [(2, 'inspect')]
    assert [(event['code'], event['count']) for event in gpus[2]['health']['xid_events']] == [(48, 1)]
    assert result['ansible_facts']['nvidia_kernel_log'] == {'skipped_bytes': 0, 'host_events': []}


def test_a_hung_driver_line_naming_no_gpu_is_the_hosts_and_convicts_no_gpu(gpuhost):
    gpuhost.fault('driver-hung', count=3)
    result, proc = run_facts(gpuhost, kernel_log=gpuhost.kernel_log)
    assert proc.returncode == 0, proc.stdout
    facts = result['ansible_facts']
    assert [gpu['health']['recovery_action'] for gpu in facts['nvidia_gpus']] == ['none'] * 8
    [event] = facts['nvidia_kernel_log']['host_events']
    assert (event['kind'], event['count']) == ('driver_hung', 12) and 'NV_ERR_GPU_IN_FULLCHIP_RESET' in event['text']
    assert 'without naming a GPU: no GPU is held at fault for it' in result['warning_text']


def test_expected_gpus_fails_naming_the_gpus_seen(gpuhost_factory):
    host = gpuhost_factory(fallen=[3])
    result, proc = run_facts(host, host_root=host.root, expected_gpus=7)
    assert proc.returncode == 0, proc.stdout
    result, proc = run_facts(host, host_root=host.root, expected_gpus=8)
    assert result['failed'] is True
    assert result['msg'].startswith('expected_gpus: 8 GPUs expected, 7 seen (00000000:18:00.0, 00000000:2A:00.0, ')
    assert '; lost: 00000000:5D:00.0 (on the PCI bus' in result['msg']
    # Without the PCI bus (a container without /sys) the shortfall is still caught.
    result, proc = run_facts(host, expected_gpus=8)
    assert result['failed'] is True and result['msg'].startswith('expected_gpus: 8 GPUs expected, 7 seen')


@pytest.mark.skipif(os.geteuid() != 0, reason='the module as root')
def test_root_gets_no_permission_warning(gpuhost):
    # Root with CAP_SYS_PTRACE reads every descriptor it may; what a sandbox hides even from it
    # (its init's) no setting would show, so no warning tells the operator to change one.
    gpuhost.scenario('hung-job')
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0, proc.stdout
    assert 'could not be inspected' not in result['warning_text']
    assert len(result['ansible_facts']['nvidia_device_holders']) == 9


def test_mig_instances_are_facts_with_their_jobs_and_nodes(gpuhost):
    gpuhost.mig(3, ['1g.18gb', '2g.35gb'])
    job = gpuhost.hold(gpus='3', mib=3000, mig=7, name='tenant-a')
    result, proc = run_facts(gpuhost, host_root=gpuhost.root, devices=['/dev/nvidia*', '/dev/nvidia-caps/nvidia-cap*'])
    assert proc.returncode == 0, proc.stdout
    gpus = result['ansible_facts']['nvidia_gpus']
    assert [gpu['mig']['mode_current'] for gpu in gpus] == ['disabled'] * 3 + ['enabled'] + ['disabled'] * 4
    instances = gpus[3]['mig']['instances']
    assert [(i['gpu_instance_id'], i['profile']) for i in instances] == [(3, '2g.35gb'), (7, '1g.18gb')]
    tenant = instances[1]
    assert tenant['uuid'].startswith('MIG-') and tenant['memory_used_mib'] == 3000
    assert [p['pid'] for p in tenant['processes']] == [job['pid']] and instances[0]['processes'] == []
    # The holder found over /proc holds exactly the instance's nodes, beside the driver's own.
    holder = [h for h in result['ansible_facts']['nvidia_device_holders'] if h['pid'] == job['pid']][0]
    assert set(tenant['device_nodes']) <= set(holder['devices']) and len(tenant['device_nodes']) == 3
    assert gpus[3]['utilization_gpu_pct'] is None and gpus[3]['state'] == 'busy'
