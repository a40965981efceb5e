# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""MIG: a fault of the parent GPU reaches every instance, and a GPU reset with MIG (gpusim's
nvidia-smi -r applies the pending mode and drops the instances, as NVIDIA documents it)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from adhoc import run_module
from gpusim.state import is_alive as alive

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import verdict


def run_facts(host):
    return run_module('nvidia_gpu_facts', dict(nvidia_smi_path=host.smi_path, host_root=host.root,
                                               kernel_log=host.kernel_log, state_dir=host.state_dir))


def run_release(host, tmp_path, **options):
    args = dict(nvidia_smi_path=host.smi_path, host_root=host.root, kernel_log=host.kernel_log,
                state_dir=host.state_dir, lock_file=str(tmp_path / 'release.lock'), grace_period=0.3, timeout=30)
    args.update(options)
    return run_module(releasing_module(args), args)


def releasing_module(args):
    """nvidia_device_reset for a release that may reset (the release and its reset in one call)."""
    return 'nvidia_device_reset' if args.pop('reset_orphaned', False) else 'nvidia_device_release'


def instances_of(result, index):
    return result['ansible_facts']['nvidia_gpus'][index]['mig']['instances']


def test_an_xid_of_the_parent_marks_every_instance_and_the_reason_names_them(gpuhost):
    gpuhost.mig(3, ['1g.18gb', '2g.35gb'])
    gpuhost.fault('xid', gpu=3, code=95, gpu_instance=7)
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0, proc.stdout
    instances = instances_of(result, 3)
    assert [i['health']['recovery_action'] for i in instances] == ['reset_gpu', 'reset_gpu']
    assert all('Xid 95 since the last cure' in i['health']['parent_causes'] for i in instances)
    report = verdict('node1', facts=result)
    assert report['outcome'] == 'failed'
    assert 'GPU 3 needs a GPU reset (Xid 95 since the last cure' in report['reason']
    assert 'GPU 3 is the parent of MIG instance GI 3 CI 0, GI 7 CI 0, each affected (%s, %s)' % (
        instances[0]['uuid'], instances[1]['uuid']) in report['reason']


def test_a_pending_remap_and_the_drivers_recovery_action_mark_every_instance(gpuhost_factory):
    host = gpuhost_factory(driver_version='570.172.08')  # the driver's recovery action is read from 565 on
    host.mig(2, ['3g.71gb'])
    host.mig(5, ['1g.18gb'])
    host.fault('remap', gpu=2, pending=True, uncorrectable=1)
    host.fault('recovery', gpu=5, value='reboot')
    result, proc = run_facts(host)
    assert proc.returncode == 0, proc.stdout
    assert instances_of(result, 2)[0]['health'] == {'recovery_action': 'reset_gpu', 'parent_causes': ['remapped rows pending']}
    assert instances_of(result, 5)[0]['health']['recovery_action'] == 'reboot'


def test_a_lost_parent_marks_the_instances_the_driver_lists(gpuhost):
    gpuhost.mig(4, ['1g.18gb', '1g.18gb'])
    gpuhost.fault('lost', gpu=4, message='lost')
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0, proc.stdout
    lost = [gpu for gpu in result['ansible_facts']['nvidia_gpus'] if gpu['state'] == 'lost'][0]
    assert lost['mig']['mode_current'] is None
    instances = lost['mig']['instances']
    assert [(i['gpu_instance_id'], i['compute_instance_id'], i['uuid']) for i in instances] == [(7, 0, None), (8, 0, None)]
    assert all(i['health']['recovery_action'] == 'reboot' and 'GPU is lost' in ' '.join(i['health']['parent_causes'])
               for i in instances)
    assert all(len(i['device_nodes']) == 3 for i in instances)
    reason = verdict('node1', facts=result)['reason']
    assert reason.endswith('is the parent of MIG instance GI 7 CI 0, GI 8 CI 0, each affected')


def test_a_pending_mode_change_is_reported_and_left_without_reset_orphaned(gpuhost, tmp_path):
    gpuhost.mig(1, [], mode='disabled', pending='enabled')
    result, proc = run_facts(gpuhost)
    assert proc.returncode == 0, proc.stdout
    assert 'GPU 1: MIG mode disabled -> enabled pending; it takes effect at the next GPU reset' in result['warning_text']
    result, proc = run_release(gpuhost, tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert result['released'] is True and result['escalation'] is None
    assert gpuhost.state['gpus'][1]['mig']['current'] == 'Disabled'


def test_a_reset_applies_the_pending_mode_and_says_what_it_did_to_the_instances(gpuhost, tmp_path):
    before = gpuhost.mig(3, ['1g.18gb', '2g.35gb'], pending='disabled')
    gpuhost.mig(6, [], mode='disabled', pending='enabled')
    result, proc = run_release(gpuhost, tmp_path, reset_orphaned=True)
    assert proc.returncode == 0, proc.stdout
    escalation = result['escalation']
    assert escalation['ok'] is True and escalation['gpus'] == [3, 6]
    assert [entry['reasons'] for entry in escalation['reasons']] == [['MIG mode enabled -> disabled pending'],
                                                                     ['MIG mode disabled -> enabled pending']]
    three, six = escalation['mig']
    gone = ', '.join('GI %d CI 0 (%s)' % (dev['gi'], dev['uuid']) for dev in before['instances'])
    assert three['changes'] == ['MIG mode enabled -> disabled', 'MIG instances gone: %s' % gone]
    assert three['after'] == {'mode_current': 'disabled', 'mode_pending': 'disabled', 'instances': []}
    assert [i['uuid'] for i in three['before']['instances']] == [dev['uuid'] for dev in before['instances']]
    assert six['changes'] == ['MIG mode disabled -> enabled'] and six['after']['instances'] == []
    assert 'GPU 3: MIG mode enabled -> disabled; MIG instances gone: ' in escalation['message']
    # The driver's word afterwards: nothing was recreated.
    assert [gpu['mig']['current'] for gpu in gpuhost.state['gpus'] if 'mig' in gpu] == ['Disabled', 'Enabled']
    report = verdict('node1', release=result, allow_gpu_reset=True)
    assert report['outcome'] == 'released' and report['escalation']['mig'] == escalation['mig']


def test_a_gpu_with_an_instance_in_use_is_never_reset(gpuhost, tmp_path):
    layout = gpuhost.mig(3, ['1g.18gb', '2g.35gb'], pending='disabled')
    gpuhost.fault('xid', gpu=3, code=95)
    daemon = gpuhost.hold(gpus=[3], mib=700, mig=7, name='nv-hostengine', daemon=True)
    result, proc = run_release(gpuhost, tmp_path, reset_orphaned=True, wait=False)
    assert proc.returncode != 0 and result['released'] is False
    on_seven = [dev for dev in layout['instances'] if dev['gi'] == 7][0]
    assert 'GPU 3 needs a reset (Xid 95 since the last cure), not attempted: MIG instance in use: GI 7 CI 0 (%s) ' \
           '[pid %d, 700 MiB used]' % (on_seven['uuid'], daemon['pid']) in result['msg']
    assert result['escalation'] is None and alive(daemon['pid'])
    assert gpuhost.state['gpus'][3]['mig']['current'] == 'Enabled'
    assert len(gpuhost.state['gpus'][3]['mig']['instances']) == 2


def test_the_mig_layout_around_a_reset_is_read_through_nvml_too(gpuhost, tmp_path):
    gpuhost.install_nvml()
    before = gpuhost.mig(2, ['3g.71gb'], pending='disabled')
    result, proc = run_module('nvidia_device_reset', dict(
        backend='nvml', nvidia_smi_path=gpuhost.smi_path, host_root=gpuhost.root, state_dir=gpuhost.state_dir,
        lock_file=str(tmp_path / 'release.lock'), timeout=30), env=gpuhost.env(nvml=True))
    assert proc.returncode == 0, proc.stdout
    entry = result['escalation']['mig'][0]
    assert (entry['index'], entry['before']['instances'][0]['uuid']) == (2, before['instances'][0]['uuid'])
    assert entry['changes'] == ['MIG mode enabled -> disabled', 'MIG instances gone: GI 1 CI 0 (%s)' % before['instances'][0]['uuid']]


def profiles(host, index):
    return sorted(dev['profile'] for dev in host.state['gpus'][index]['mig']['instances'])


def test_a_reset_makes_the_instances_it_ended_again_and_proves_each(gpuhost, tmp_path):
    before = gpuhost.mig(3, ['1g.18gb', '3g.71gb', '2g.35gb'])
    gpuhost.fault('xid', gpu=3, code=95)
    result, proc = run_release(gpuhost, tmp_path, reset_orphaned=True)
    assert proc.returncode == 0, proc.stdout
    assert result['released'] is True, result['msg']
    entry = result['escalation']['mig'][0]
    restored = entry['restored']
    assert restored['ok'] is True and restored['problems'] == [], restored
    # Made again largest first (as they fit), by profile; the driver gave new ids and MIG UUIDs.
    assert [name.split()[2] for name in restored['made']] == ['3g.71gb', '2g.35gb', '1g.18gb']
    assert profiles(gpuhost, 3) == ['1g.18gb', '2g.35gb', '3g.71gb']
    old = set(dev['uuid'] for dev in before['instances'])
    new = [instance['uuid'] for instance in restored['after']['instances']]
    assert len(new) == 3 and not old & set(new)
    assert entry['changes'][-1].startswith('MIG instances made again and proven: GI ')
    assert 'GPU 3: MIG instances made again and proven' in result['escalation']['message']
    # Their caps nodes are there for the next job (gres.conf names them).
    facts, proc = run_facts(gpuhost)
    assert [instance['uuid'] for instance in instances_of(facts, 3)] == new
    nodes = [node for instance in instances_of(facts, 3) for node in instance['device_nodes']]
    assert len(nodes) == 9 and all(os.path.exists(node) for node in nodes)


def test_compute_instances_smaller_than_their_gpu_instance_are_made_again_as_they_were(gpuhost, tmp_path):
    gpuhost.mig(2, ['3g.71gb'], cis_per_gi=3)
    gpuhost.fault('xid', gpu=2, code=95)
    log = str(tmp_path / 'smi.log')
    result, proc = run_release(gpuhost, tmp_path, reset_orphaned=True, nvidia_smi_path=gpuhost.counting_smi(log))
    assert proc.returncode == 0, proc.stdout
    assert result['escalation']['mig'][0]['restored']['ok'] is True
    assert profiles(gpuhost, 2) == ['1c.3g.71gb'] * 3
    commands = [line for line in gpuhost.smi_calls(log) if line[:1] == ['mig']]
    assert commands == [['mig', '-i', '2', '-cgi', '3g.71gb'], ['mig', '-i', '2', '-gi', '1', '-cci', '0,0,0']]


def test_a_layout_the_driver_will_not_make_again_fails_the_release_naming_the_gpu(gpuhost, tmp_path):
    gpuhost.mig(3, ['1g.18gb', '2g.35gb'])
    gpuhost.fault('xid', gpu=3, code=95)
    gpuhost.fault('mig-create', gpu=3, value='Insufficient Resources')
    result, proc = run_release(gpuhost, tmp_path, reset_orphaned=True)
    assert proc.returncode != 0 and result['released'] is False
    restored = result['escalation']['mig'][0]['restored']
    assert restored['ok'] is False and restored['made'] == []
    assert ('GPU 3 lost its MIG instances to the reset and they were not made again (GI 3 CI 0 (%s) 2g.35gb, '
            % result['escalation']['mig'][0]['before']['instances'][0]['uuid']) in result['msg']
    assert 'GPU instance 2g.35gb not made: nvidia-smi mig -i 3 -cgi 2g.35gb -C exited 255: Unable to create a GPU ' \
           'instance on GPU  3 using profile 2g.35gb: Insufficient Resources' in result['msg']
    # Its GPU reads clean now, with no instance: it is held for a person, so that no later run puts
    # it back in service so.
    uuid = result['escalation']['mig'][0]['uuid']
    held = 'GPU 3 (%s): its MIG instances were not made again after its reset, held for a person' % uuid
    assert [entry['reason'] for entry in result['held']] == [held]
    report = verdict('node1', release=result, allow_gpu_reset=True)
    assert report['outcome'] == 'failed' and report['reason'].startswith(held)
    assert 'GPU 3 lost its MIG instances' in report['reason']
    gpuhost.fault('mig-create', gpu=3, value='off')
    gpuhost.fault('xid', gpu=3, code=95)
    again, proc = run_release(gpuhost, tmp_path, reset_orphaned=True)
    assert again['released'] is False and again['escalation'] is None
    assert 'held for a person' in again['msg'], again['msg']


def test_instances_someone_made_after_the_reset_and_a_mode_turned_off_are_left_alone(gpuhost, tmp_path):
    gpuhost.mig(3, ['1g.18gb'], pending='disabled')
    gpuhost.fault('xid', gpu=3, code=95)
    log = str(tmp_path / 'smi.log')
    result, proc = run_release(gpuhost, tmp_path, reset_orphaned=True, nvidia_smi_path=gpuhost.counting_smi(log))
    assert proc.returncode == 0, proc.stdout
    assert 'restored' not in result['escalation']['mig'][0]
    assert not [line for line in gpuhost.smi_calls(log) if line[:1] == ['mig']]
    assert gpuhost.state['gpus'][3]['mig']['current'] == 'Disabled'


def test_the_layout_is_made_again_and_proven_through_nvml_too(gpuhost, tmp_path):
    gpuhost.install_nvml()
    gpuhost.mig(2, ['3g.71gb', '1g.18gb'])
    gpuhost.fault('xid', gpu=2, code=95)
    result, proc = run_module('nvidia_device_reset', dict(
        backend='nvml', nvidia_smi_path=gpuhost.smi_path, host_root=gpuhost.root, state_dir=gpuhost.state_dir,
        kernel_log=gpuhost.kernel_log, lock_file=str(tmp_path / 'release.lock'), timeout=30), env=gpuhost.env(nvml=True))
    assert proc.returncode == 0, proc.stdout
    restored = result['escalation']['mig'][0]['restored']
    assert restored['ok'] is True, restored
    assert sorted(i['profile'] for i in restored['after']['instances']) == ['1g.18gb', '3g.71gb']
