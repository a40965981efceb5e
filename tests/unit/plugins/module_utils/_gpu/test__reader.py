# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The reader interface both backends share (module_utils/_gpu/reader.py): the state of a GPU
(gpu_state) as a simulated host's faults make it, the driver's verdicts recorded on a GPU
(driver_error, recovery_verdict, parse_recovery_action, driver_branch), the base of a light read
(light_base, light_gpu), and the Snapshot and GpuReader it defines."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import (
    DRIVER_RECOVERY_ACTIONS,
    GPU_STATES,
    GpuReader,
    Snapshot,
    driver_branch,
    driver_error,
    gpu_state,
    light_base,
    light_gpu,
    parse_recovery_action,
    recovery_verdict,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner


def read(host):
    return HostReader(SmiReader(SmiRunner(host.smi_path)), host.root).read()


def test_every_state_is_what_a_simulated_hosts_faults_make_of_its_gpus(gpuhost_factory):
    host = gpuhost_factory(driver_version='565.57.01')
    host.hold(gpus=[1], mib=1024, util=50)
    host.hold(gpus=[2], mib=1024, util=0)
    host.fault('stuck', gpu=3, mib=4096)
    host.fault('reset-required', gpu=4)
    host.fault('lost', gpu=5)
    host.fault('recovery', gpu=6, value='drain-p2p')
    host.fault('recovery', gpu=7, value='drain-and-reset')
    gpus = read(host).gpus
    assert [gpu_state(gpu) for gpu in gpus] == [
        'free', 'busy', 'idle_holding', 'orphaned_memory', 'reset_required', 'lost', 'lost', 'reset_required']
    assert set(gpu_state(gpu) for gpu in gpus) == set(GPU_STATES)
    assert [gpu['driver_recovery_action'] for gpu in gpus[6:]] == ['drain_p2p', 'drain_and_reset']


def test_memory_left_without_a_process_is_orphaned_only_above_the_threshold(gpuhost):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    gpus = read(gpuhost).gpus
    assert gpus[3]['memory_used_mib'] == 4097 and gpus[0]['memory_used_mib'] == 1
    assert (gpu_state(gpus[3]), gpu_state(gpus[0])) == ('orphaned_memory', 'free')
    assert [gpu_state(gpus[3], threshold) for threshold in (4096, 4097, 8192)] == ['orphaned_memory', 'free', 'free']


@pytest.mark.parametrize('utilization, used, state', [
    (0, 900, 'idle_holding'), (0, None, 'idle_holding'), (37, 900, 'busy'),
    # Utilisation not reported: the processes may be working, not the deadlock signature.
    (None, 900, 'busy'),
])
def test_processes_make_a_gpu_busy_or_idle_holding_by_its_utilisation(utilization, used, state):
    gpu = {'error': None, 'memory_used_mib': used, 'utilization_gpu_pct': utilization, 'processes': [{'pid': 7}]}
    assert gpu_state(gpu) == state


@pytest.mark.parametrize('gpu, state', [
    ({'error': 'the driver says: GPU requires reset (for memory.used)', 'reset_required': True}, 'reset_required'),
    ({'error': 'the driver says: GPU requires reset; GPU is lost', 'reset_required': True}, 'lost'),
    ({'error': 'GPU has fallen off the bus', 'reset_required': True}, 'lost'),
    ({'error': 'x', 'reset_required': True, 'driver_recovery_action': 'reboot'}, 'lost'),
    ({'error': 'x', 'reset_required': True, 'driver_recovery_action': 'drain_and_reset'}, 'reset_required'),
    ({'error': 'the driver says: Unknown Error (for memory.used)'}, 'lost'),
    # Memory not reported and no process: the state follows from what is reported.
    ({'error': None, 'memory_used_mib': None, 'processes': []}, 'free'),
])
def test_an_error_is_reset_required_only_where_a_reset_cures_it(gpu, state):
    assert gpu_state(gpu) == state


def test_the_drivers_words_are_recorded_sorted_after_an_error_there_was():
    gpu = {'index': 0, 'error': 'nvidia-smi -i 0 timed out'}
    said = {'gpu requires RESET': ['memory.used', 'memory.free'], 'Unknown Error': ['temperature.gpu']}
    assert driver_error(gpu, said) is gpu
    assert gpu['error'] == ('nvidia-smi -i 0 timed out; the driver says: Unknown Error (for temperature.gpu); '
                            'gpu requires RESET (for memory.used, memory.free)')
    assert gpu['reset_required'] is True and gpu_state(gpu) == 'reset_required'


def test_words_that_ask_for_no_reset_leave_the_gpu_lost_and_nothing_said_leaves_it_alone():
    gpu = driver_error({'index': 0}, {'Insufficient Permissions': ['memory.used']})
    assert gpu == {'index': 0, 'error': 'the driver says: Insufficient Permissions (for memory.used)'}
    assert gpu_state(gpu) == 'lost'
    assert driver_error({'index': 1}, {}) == {'index': 1}


@pytest.mark.parametrize('action, error, state', [
    (None, None, 'free'),
    ('none', None, 'free'),
    ('reset_gpu', "the driver's GPU recovery action is reset_gpu", 'reset_required'),
    ('drain_and_reset', "the driver's GPU recovery action is drain_and_reset", 'reset_required'),
    ('reboot', "the driver's GPU recovery action is reboot", 'lost'),
    ('drain_p2p', "the driver's GPU recovery action is drain_p2p", 'lost'),
    ('unknown', "the driver's GPU recovery action is unknown", 'lost'),
])
def test_a_recovery_action_other_than_none_is_an_error_that_a_reset_cures_or_not(action, error, state):
    gpu = recovery_verdict({'index': 0, 'error': None, 'memory_used_mib': 1, 'processes': []}, action)
    assert (gpu['driver_recovery_action'], gpu['error'], gpu_state(gpu)) == (action, error, state)
    both = recovery_verdict({'error': 'earlier'}, 'reboot')
    assert both['error'] == "earlier; the driver's GPU recovery action is reboot" and 'reset_required' not in both


def test_every_recovery_action_reads_back_from_its_name_and_nvidia_smis_words():
    assert [parse_recovery_action(name) for name in DRIVER_RECOVERY_ACTIONS.values()] == list(DRIVER_RECOVERY_ACTIONS.values())
    words = ['None', 'Reset', 'Node Reboot', 'Drain P2P', 'Drain  and\tReset', 'System Reboot', 'Bus Reset', 'Recover IMEX Domain']
    assert [parse_recovery_action(text) for text in words] == [
        'none', 'reset_gpu', 'reboot', 'drain_p2p', 'drain_and_reset', 'system_reboot', 'bus_reset', 'recover_imex_domain']
    assert [parse_recovery_action(text) for text in (None, '', '  ', 'Quarantine')] == [None, None, None, 'unknown']


@pytest.mark.parametrize('version, branch', [
    ('550.127.05', 550), (' 565.57.01\n', 565), ('570', 570), (565, 565),
    (None, None), ('', None), ('[N/A]', None), ('v550.1', None), ('-1.0', None),
    # Digits of other scripts, which str.isdigit() takes and int() does not.
    ('\u00b2', None), ('550\u00b2.1', None), ('\u0665\u0665\u0660.1', None),
])
def test_the_driver_branch_is_the_major_number_of_a_version_or_none(version, branch):
    assert driver_branch(version) == branch


def test_a_snapshot_keeps_its_own_copy_of_the_warnings_and_starts_with_nothing_missing():
    warnings = ['first']
    snapshot = Snapshot([{'index': 0}], '550.127.05', warnings)
    warnings.append('later')
    assert (snapshot.warnings, snapshot.missing, snapshot.full) == (['first'], [], True)
    assert Snapshot([], None, full=False).warnings == [] and Snapshot([], None, full=False).full is False


def test_the_reader_interface_reads_nothing_itself_and_tells_no_mig():
    reader = GpuReader()
    with pytest.raises(NotImplementedError):
        reader.read()
    assert reader.read_mig([{'index': 0}]) == ({}, [])
    assert (reader.backend, reader.driver_hint, reader.close()) == (None, None, None)


def test_the_base_of_a_light_read_copies_each_gpu_without_its_processes(gpuhost):
    gpuhost.hold(gpus=[2], mib=1024)
    gpuhost.fault('reset-required', gpu=5)
    snapshot = read(gpuhost)
    base = light_base(snapshot)
    assert sorted(base) == list(range(8)) and base[2]['processes'] == []
    assert len(snapshot.gpus[2]['processes']) == 1 and base[2]['memory_used_mib'] == 1025
    assert base[5]['error'] == snapshot.gpus[5]['error'] and base[5]['reset_required'] is True
    base[2]['memory_used_mib'] = 0
    assert snapshot.gpus[2]['memory_used_mib'] == 1025


def test_there_is_no_light_base_when_a_gpu_could_not_be_read_or_placed(gpuhost):
    gpuhost.fault('lost', gpu=3)
    assert light_base(read(gpuhost)) is None
    gpu = {'index': 0, 'uuid': 'GPU-a', 'error': None}
    assert light_base(Snapshot([gpu], None)) == {0: dict(gpu, processes=[])}
    assert light_base(Snapshot([dict(gpu, index=None)], None)) is None
    assert light_base(Snapshot([dict(gpu, uuid=None)], None)) is None
    # An error in place of an answer, though the GPU is placed; the driver's own verdict is an answer.
    assert light_base(Snapshot([dict(gpu, error='nvidia-smi -i 0 timed out')], None)) is None
    assert light_base(Snapshot([dict(gpu, error='the driver says: Unknown Error (for memory.used)')], None)) is not None


def test_a_light_gpu_takes_only_the_light_values_and_leaves_the_base_alone():
    base = {0: {'index': 0, 'uuid': 'GPU-a', 'error': None, 'memory_used_mib': 1, 'memory_free_mib': 99,
                'utilization_gpu_pct': 0, 'temperature_c': 30, 'processes': []}}
    gpu = light_gpu(base, 0, 'GPU-a', {'memory_used_mib': 60, 'utilization_gpu_pct': 12, 'temperature_c': 80}, False)
    assert (gpu['memory_used_mib'], gpu['memory_free_mib'], gpu['utilization_gpu_pct'], gpu['temperature_c']) == (60, None, 12, 30)
    assert base[0]['memory_used_mib'] == 1 and base[0]['memory_free_mib'] == 99


def test_a_light_read_that_says_something_new_gets_no_gpu():
    base = {0: {'index': 0, 'uuid': 'GPU-a', 'error': None},
            1: {'index': 1, 'uuid': 'GPU-b', 'error': 'the driver says: GPU requires reset (for memory.used)'}}
    assert light_gpu(base, 2, 'GPU-c', {}, False) is None
    assert light_gpu(base, 0, 'GPU-b', {}, False) is None
    assert light_gpu(base, 0, 'GPU-a', {}, True) is None
    assert light_gpu(base, 1, 'GPU-b', {}, True)['error'] == base[1]['error']
