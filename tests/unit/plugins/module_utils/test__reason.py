# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Why a GPU is not clean, in words (module_utils/_reason.py): the ladder of gpu_problem over GPUs
read off a simulated host, how GPUs and MIG instances are named, and that the names of processes,
units and device nodes - chosen by users - are printed escaped, on one line."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DriverHung
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import health_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import Holder


def read(host):
    return HostReader(SmiReader(SmiRunner(host.smi_path)), host.root).read()


def problem(gpu, remedy=''):
    """gpu_problem as the release asks it, from what the reader read and the GPU's health."""
    state = gpu_state(gpu)
    return _reason.gpu_problem(gpu, state == 'reset_required', state == 'orphaned_memory',
                               state in ('busy', 'idle_holding'), [_reason.reported(p) for p in gpu['processes']],
                               reset_remedy=remedy, health=health_facts(gpu, []))


def holder(pid=4242, uid=0, comm='python3', devices=('/dev/nvidia0',)):
    return Holder(pid, 1, uid, comm, comm + ' serve', '/usr/bin/' + comm, 100, 'S', pid, 1, list(devices))


def test_each_fault_of_a_simulated_host_gets_its_own_reason(gpuhost):
    gpuhost.fault('reset-required', gpu=1)
    gpuhost.fault('lost', gpu=2)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    job = gpuhost.hold(gpus=[4], mib=2048, name='train\x1b]0;x')
    gpuhost.fault('remap', gpu=5, pending=True)
    gpuhost.fault('remap', gpu=6, failure=True)
    gpus = read(gpuhost).gpus
    assert problem(gpus[0]) is None and problem(gpus[7]) is None
    assert problem(gpus[1], '; reset_orphaned resets it').startswith('GPU 1 needs a GPU reset (the driver says: GPU requires reset (for ')
    assert problem(gpus[1], '; reset_orphaned resets it').endswith('; reset_orphaned resets it)')
    assert problem(gpus[2]) == 'GPU 2 lost or unreadable (Unable to determine the device handle for GPU0000:3A:00.0: Unknown Error)'
    assert problem(gpus[3]) == 'GPU 3: 4097 MiB held with no process left (orphaned memory; only a GPU reset frees it)'
    assert problem(gpus[4]) == 'GPU 4: 2049 MiB used, held by pid %d (train\\x1b]0;x)' % job['pid']
    assert problem(gpus[5]) == 'GPU 5 needs a GPU reset (remapped rows pending)'
    assert problem(gpus[6]) == "GPU 6 needs a person (row remapping failed; NVIDIA's Xid catalogue asks for a look)"


def test_a_gpu_the_reader_does_not_list_is_named_by_its_pci_bus_id(gpuhost_factory):
    host = gpuhost_factory(gpus=4, fallen=[2])
    [missing] = read(host).missing
    assert problem(missing).startswith('GPU 00000000:3A:00.0 lost or unreadable (on the PCI bus (PCI ID 10de:2335) but no driver')


def test_the_ladder_puts_the_drivers_word_before_memory_and_memory_before_health():
    health = {'recovery_action': 'reboot', 'xid_events': []}
    gpu = {'index': 0, 'error': 'the driver says: GPU requires reset (for memory.used)', 'memory_used_mib': 900}
    assert _reason.gpu_problem(gpu, True, True, True, health=health).startswith('GPU 0 needs a GPU reset (the driver says')
    assert _reason.gpu_problem(gpu, False, True, True, health=health).startswith('GPU 0 lost or unreadable (')
    clean = dict(gpu, error=None)
    assert _reason.gpu_problem(clean, False, True, True, health=health).startswith('GPU 0: 900 MiB held with no process left')
    assert _reason.gpu_problem(clean, False, False, True, ['pid 7 (x)'], health=health) == 'GPU 0: 900 MiB used, held by pid 7 (x)'
    assert _reason.gpu_problem(clean, False, False, False, health=health) == 'GPU 0 needs a reboot (its health calls for reboot)'


@pytest.mark.parametrize('action', [None, 'none', 'restart_app'])
def test_a_readable_idle_gpu_whose_health_asks_for_no_cure_has_no_problem(action):
    gpu = {'index': 2, 'error': None, 'memory_used_mib': 1}
    assert _reason.gpu_problem(gpu, False, False, False, health={'recovery_action': action}) is None
    assert _reason.gpu_problem(gpu, False, False, False) is None


def test_a_cure_without_a_named_cause_falls_back_to_what_the_health_calls_for():
    gpu = {'index': 2, 'error': None}
    health = {'recovery_action': 'reset_gpu', 'xid_events': []}
    assert _reason.needs_cure(gpu, health, '; allow it') == 'GPU 2 needs a GPU reset (its health calls for reset_gpu; allow it)'
    assert _reason.needs_cure(gpu, dict(health, recovery_action='inspect')) == (
        "GPU 2 needs a person (its health calls for inspect; NVIDIA's Xid catalogue asks for a look)")


def test_a_gpu_is_named_by_index_even_zero_else_by_bus_id_and_a_mig_instance_by_its_ids():
    assert _reason.gpu_name({'index': 0, 'pci_bus_id': '00000000:18:00.0'}) == 0
    assert _reason.gpu_name({'index': None, 'pci_bus_id': '00000000:18:00.0'}) == '00000000:18:00.0'
    instance = {'gpu_instance_id': 1, 'compute_instance_id': 0, 'uuid': 'MIG-5c7f'}
    assert _reason.gpu_name({'index': 3, 'mig_instance': instance}) == '3 MIG GI 1 CI 0 (MIG-5c7f)'
    assert _reason.instance_name(dict(instance, uuid=None)) == 'GI 1 CI 0 (MIG UUID unknown)'


def test_a_mig_parent_lists_its_instance_ids_before_their_uuids():
    assert _reason.parent_of_instances({'index': 2}) == ''
    assert _reason.parent_of_instances({'index': 2, 'mig': {'instances': []}}) == ''
    instances = [{'gpu_instance_id': 1, 'compute_instance_id': 0, 'uuid': 'MIG-a'},
                 {'gpu_instance_id': 2, 'compute_instance_id': 0}]
    assert _reason.parent_of_instances({'index': 2, 'mig': {'instances': instances}}) == (
        '; GPU 2 is the parent of MIG instance GI 1 CI 0, GI 2 CI 0, each affected (MIG-a)')
    assert _reason.parent_of_instances({'index': 2, 'mig': {'instances': instances[1:]}}).endswith('GI 2 CI 0, each affected')


def test_held_memory_says_how_much_or_that_the_driver_did_not_report_it():
    assert _reason.held({'index': 1, 'memory_used_mib': None}) == 'GPU 1: memory used not reported'
    assert _reason.held({'index': 1, 'memory_used_mib': 0}, ['pid 7 (a)', 'pid 8 (b)']) == 'GPU 1: 0 MiB used, held by pid 7 (a), pid 8 (b)'


def test_a_hung_driver_is_recognised_by_its_word_in_reasons_and_errors(gpuhost):
    text = _reason.driver_hung('nvidia-smi -r', 'pid 77 in D state')
    assert text == ('driver_hung: nvidia-smi -r hung in the NVIDIA driver past its deadline (pid 77 in D state); '
                    'only a reboot frees it')
    assert _reason.is_driver_hung('GPU 3 needs a reset; ' + text)
    assert not _reason.is_driver_hung(None) and not _reason.is_driver_hung('driver_hung without its colon')
    gpuhost.fault('hang-d', seconds=30)
    runner = SmiRunner(gpuhost.smi_path)
    runner.proc = os.path.join(gpuhost.root, 'proc')
    with pytest.raises(DriverHung) as caught:
        SmiReader(runner).read(timeout=2.0)
    assert _reason.is_driver_hung(caught.value)


def test_a_refused_or_failed_reset_says_what_comes_next_on_one_line():
    assert _reason.reset_refused({'index': 3}) == 'GPU 3 needs a reboot (%s)' % _reason.RESET_REFUSED
    assert _reason.reset_failed('Unable to reset GPU 00000000:18:00.0\n  because it is in use.\r\n') == (
        ', and the reset failed: Unable to reset GPU 00000000:18:00.0 because it is in use.')
    # What nvidia-smi printed lands in a reason on one line, its control characters escaped.
    assert _reason.reset_failed('refused \x1b[2J') == ', and the reset failed: refused \\x1b[2J'
    assert _reason.reset_not_attempted(3, ['orphaned memory', 'remapped rows pending'], 'check mode') == (
        'GPU 3 needs a reset (orphaned memory, remapped rows pending), not attempted: check mode')


def test_a_reported_process_name_is_escaped():
    assert _reason.reported({'pid': 7, 'name': 'evil\n\x1b[2Jname'}) == 'pid 7 (evil\\x0a\\x1b[2Jname)'
    # The driver may list a process without a name.
    assert _reason.reported({'pid': 7, 'name': None}) == 'pid 7 (no name)'


def test_a_foreign_holder_says_what_lets_it_go_with_its_names_escaped():
    foreign = holder(comm='dcgm\x07d', devices=['/dev/nvidia0', '/dev/nvidia\n1'])
    assert _reason.foreign_why(foreign) == (
        'pid 4242 (dcgm\\x07d, user root, holding /dev/nvidia0, /dev/nvidia\\x0a1; foreign_holder: a root or system '
        'process that the driver places on no GPU and that belongs to no job, never signalled; it lets go when it '
        'closes the descriptor or exits: see what handed it one)')
    in_unit = _reason.foreign_why(holder(devices=[]), 'x\x1b.service')
    assert 'user root, unit x\\x1b.service, holding no GPU node;' in in_unit
    assert in_unit.endswith('it lets go when unit x\\x1b.service stops or closes the descriptor)')


def test_a_spared_holder_names_its_job_or_none_and_why():
    spared = holder(pid=9, uid=3999999)
    spared.spared = 'another_job'
    assert _reason.spared_why(spared) == 'pid 9 (python3, user 3999999, no job; another_job)'
    spared.job = '1234'
    assert _reason.spared_why(spared) == 'pid 9 (python3, user 3999999, job 1234; another_job)'


def test_what_is_left_after_a_reset_is_said_with_its_numbers():
    assert _reason.still_holds('pid 5 (x)', ['/dev/nvidiactl', '/dev/nvidia-uvm']) == 'pid 5 (x) still holds /dev/nvidiactl, /dev/nvidia-uvm'
    # A device path is escaped as every other path in a reason.
    assert _reason.still_holds('pid 5 (x)', ['/dev/nvidia0\n\x1b[2J']) == 'pid 5 (x) still holds /dev/nvidia0\\x0a\\x1b[2J'
    assert _reason.fabric_not_back({'index': 4, 'state': 'in_progress', 'status': 'Success', 'note': 'waited 5 s'}) == (
        'GPU 4: the NVLink fabric is not back after the GPU reset (state in_progress, status Success: waited 5 s)')
    assert _reason.mig_not_restored(1, '2 x 3g.71gb', ['GI 1 not made', 'GI 2 not made']) == (
        'GPU 1 lost its MIG instances to the reset and they were not made again (2 x 3g.71gb): GI 1 not made; GI 2 not made')


def test_a_reset_without_time_to_restore_its_units_rounds_the_seconds_and_never_says_less_than_none_left():
    text = _reason.no_time_to_restore('2, 3', 'nvidia-dcgm.service', 29.6, -4.0, 12.0)
    assert text.startswith('GPU 2, 3 not reset: nvidia-dcgm.service would be stopped for it, and starting them again may take 30 s')
    assert 'less than the 12.0 s a reset needs of the 0.0 s left of the timeout; nothing was stopped' in text
    assert 'of the 7.5 s left' in _reason.no_time_to_restore('2', 'u', 1.0, 7.49, 3.0)
