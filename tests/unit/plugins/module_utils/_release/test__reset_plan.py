# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which GPUs a release with reset_orphaned leaves due a reset, and why: read from a simulated host
(orphaned memory, the driver's health, the kernel log, MIG), less those MIG instances in use keep and
those their history holds for a person; and the reset_due entries nvidia_device_reset is given."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from gpusim import kmsg as _kmsg

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, Budget, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.observation import Observer
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions, ReleaseResult
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.reset_plan import (
    due_entries,
    due_from_entries,
    in_use,
    not_released,
    reset_plan,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History

HOUR, DAY = 3600.0, 86400.0
HUNG = ('NVRM: GPU %s: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
        '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ mem.c:178')


def observe(host, tmp_path, check_mode=False, **options):
    """(seen, snapshot, result) of one full reading of host, as a release with reset_orphaned has
    it when it plans: its state and history under tmp_path, the host's own kernel log."""
    options = ReleaseOptions([host.dev_glob], protect=DEFAULT_PROTECT, state_dir=str(tmp_path / 'state'),
                             kernel_log=host.kernel_log, reset_orphaned=True, **options)
    reader, dummy = select_reader('auto', host.smi_path, 10)
    seen = Observer(reader, options, check_mode=check_mode, clock=time.monotonic)
    deadline = time.monotonic() + 10
    seen.start(Budget('the test', 10, time.monotonic), deadline, deadline - 1)
    snapshot, dummy = seen.observe(force_read=True, full=True)
    result = ReleaseResult()
    result.orphaned_gpus = seen.orphaned(seen.scope(snapshot), [])
    return seen, snapshot, result


def plan(host, tmp_path, check_mode=False, **options):
    """(todo, result, seen) of reset_plan on a fresh reading of host."""
    seen, snapshot, result = observe(host, tmp_path, check_mode, **options)
    return reset_plan(seen, result, snapshot), result, seen


def history(tmp_path):
    """The history the plan reads, its state directory made first (as a release before this one would)."""
    (tmp_path / 'state').mkdir(mode=0o700, exist_ok=True)
    return History.for_host('/', str(tmp_path / 'state'))


def resets_before(tmp_path, host, index, kind, *ages):
    """Record a cure of kind on GPU index, ages seconds ago each (each for a fault of its own: the
    history counts a repeat of the same failure on its last event)."""
    for number, age in enumerate(ages):
        assert history(tmp_path).record([(uuid(host, index), index, 'fault %d' % number)], kind, when=time.time() - age)


def uuid(host, index):
    return host.state['gpus'][index]['uuid']


# -- which GPUs, and why -----------------------------------------------------------------------

def test_memory_held_with_no_process_left_is_due_a_reset_for_orphaned_memory(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=2048)
    todo, result, seen = plan(gpuhost, tmp_path)
    assert result.orphaned_gpus == [3]
    assert todo == {3: ['orphaned memory']}
    assert result.held == [] and result.failure is None and seen.warnings == []


@pytest.mark.parametrize('fault, because', [
    (dict(kind='remap', gpu=2, pending=True), 'remapped rows pending'),
    (dict(kind='retired', gpu=2, value=True), 'retired pages pending'),
    (dict(kind='xid', gpu=2, code=95), 'Xid 95 since the last cure'),
])
def test_a_gpu_whose_health_calls_for_a_reset_is_due_one_for_that_reason(gpuhost, tmp_path, fault, because):
    gpuhost.fault(fault.pop('kind'), **fault)
    todo, result, dummy = plan(gpuhost, tmp_path)
    assert result.orphaned_gpus == [] and todo == {2: [because]}


def test_an_orphaned_gpu_whose_health_also_calls_for_a_reset_has_both_reasons(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=5, mib=4096)
    gpuhost.fault('remap', gpu=5, pending=True)
    todo, dummy, dummy = plan(gpuhost, tmp_path)
    assert todo == {5: ['orphaned memory', 'remapped rows pending']}


def test_a_gpu_a_process_still_holds_is_left_to_the_release_whatever_its_health(gpuhost, tmp_path):
    gpuhost.hold(gpus=[4], mib=1000)
    gpuhost.fault('remap', gpu=4, pending=True)
    gpuhost.fault('remap', gpu=6, pending=True)
    todo, dummy, dummy = plan(gpuhost, tmp_path)
    assert todo == {6: ['remapped rows pending']}


def test_an_orphaned_gpu_the_kernel_log_says_the_driver_hung_on_is_not_reset(gpuhost, tmp_path):
    # A reset would hang in the driver too: only a reboot frees it. GPU 5, also orphaned, is not named there.
    gpuhost.fault('stuck', gpu=3, mib=2048)
    gpuhost.fault('stuck', gpu=5, mib=2048)
    bus = gpuhost.state['gpus'][3]['pci_bus_id'][4:].lower()
    _kmsg.append(gpuhost.paths.kmsg, [_kmsg.kernel(HUNG % bus, _kmsg.usec(time.time()))])
    todo, result, dummy = plan(gpuhost, tmp_path)
    assert result.orphaned_gpus == [3, 5]
    assert todo == {5: ['orphaned memory']}


def test_only_the_gpus_in_scope_are_planned(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=2048)
    gpuhost.fault('remap', gpu=5, pending=True)
    todo, dummy, dummy = plan(gpuhost, tmp_path, gpus=[5])
    assert todo == {5: ['remapped rows pending']}


def test_a_gpu_the_job_shares_with_other_jobs_is_never_planned(gpuhost, tmp_path):
    gpuhost.fault('remap', gpu=2, pending=True)
    gpuhost.fault('remap', gpu=3, pending=True)
    seen, snapshot, result = observe(gpuhost, tmp_path)
    seen.job_scoped = set([2])  # as the observer marks a shared GPU that others' processes are on
    assert reset_plan(seen, result, snapshot) == {3: ['remapped rows pending']}


# -- MIG ---------------------------------------------------------------------------------------

def test_a_mig_mode_change_waiting_on_an_idle_gpu_is_due_a_reset(gpuhost, tmp_path):
    gpuhost.mig(4, mode='disabled', pending='enabled')
    todo, result, dummy = plan(gpuhost, tmp_path)
    assert todo == {4: ['MIG mode disabled -> enabled pending']} and result.failure is None


def test_a_mig_instance_in_use_keeps_its_gpu_from_the_reset_and_says_so_in_the_failure(gpuhost, tmp_path):
    gpuhost.mig(2, profiles=['1g.18gb'])
    mig_uuid = gpuhost.state['gpus'][2]['mig']['instances'][0]['uuid']
    pid = gpuhost.hold(gpus=[2], mib=700, mig=(7, 0))['pid']
    gpuhost.fault('remap', gpu=2, pending=True)
    gpuhost.fault('remap', gpu=6, pending=True)
    todo, result, dummy = plan(gpuhost, tmp_path)
    assert todo == {6: ['remapped rows pending']}
    assert result.released is False
    assert result.failure == ('GPUs not released: GPU 2 needs a reset (remapped rows pending), not attempted: MIG '
                              'instance in use: GI 7 CI 0 (%s) [pid %d, 700 MiB used]' % (mig_uuid, pid))


def test_a_mig_mode_change_on_a_gpu_with_an_instance_in_use_is_only_warned(gpuhost, tmp_path):
    gpuhost.mig(2, profiles=['1g.18gb'], pending='disabled')
    pid = gpuhost.hold(gpus=[2], mib=700, mig=(7, 0))['pid']
    todo, result, seen = plan(gpuhost, tmp_path)
    assert todo == {} and result.failure is None
    [warning] = seen.warnings
    assert warning.startswith('GPU 2: MIG mode enabled -> disabled pending, not applied: MIG instance in use: GI 7 CI 0')
    assert warning.endswith('[pid %d, 700 MiB used]' % pid)


def test_with_no_time_left_to_read_mig_no_mode_change_is_planned_and_a_reset_planned_says_so(gpuhost, tmp_path):
    seen, snapshot, result = observe(gpuhost, tmp_path)
    seen.deadline = time.monotonic()  # the timeout spent: MIG is not read
    assert reset_plan(seen, result, snapshot) == {} and seen.warnings == []  # nothing planned: nothing to say
    gpuhost.fault('stuck', gpu=3, mib=2048)
    gpuhost.mig(4, mode='disabled', pending='enabled')
    seen, snapshot, result = observe(gpuhost, tmp_path)
    seen.deadline = time.monotonic()
    assert reset_plan(seen, result, snapshot) == {3: ['orphaned memory']}
    assert seen.warnings == ['MIG before the reset: no time left']


def test_in_use_names_the_instances_over_the_threshold_or_with_a_process():
    fact = {'instances': [
        {'gpu_instance_id': 1, 'compute_instance_id': 0, 'uuid': 'MIG-a', 'memory_used_mib': 16, 'processes': []},
        {'gpu_instance_id': 2, 'compute_instance_id': 0, 'uuid': 'MIG-b', 'memory_used_mib': 17, 'processes': []},
        {'gpu_instance_id': 3, 'compute_instance_id': 1, 'memory_used_mib': 0, 'processes': [{'pid': 42}]},
    ]}
    assert in_use(fact, 16) == ('MIG instance in use: GI 2 CI 0 (MIG-b) [17 MiB used], '
                                'GI 3 CI 1 (MIG UUID unknown) [pid 42]')
    assert in_use(fact, 17) == 'MIG instance in use: GI 3 CI 1 (MIG UUID unknown) [pid 42]'
    assert in_use(None, 16) == '' and in_use({'instances': fact['instances'][:1]}, 16) == ''


# -- the history: held for a person ------------------------------------------------------------

def test_a_fault_back_after_two_resets_within_the_window_is_held_and_recorded(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=2048)
    gpuhost.fault('stuck', gpu=5, mib=2048)
    resets_before(tmp_path, gpuhost, 3, 'reset', 2 * HOUR, HOUR)
    todo, result, dummy = plan(gpuhost, tmp_path)
    assert todo == {5: ['orphaned memory']}
    [held] = result.held
    assert (held['index'], held['uuid']) == (3, uuid(gpuhost, 3))
    assert held['reason'].startswith('GPU 3 (%s): needs a reset (orphaned memory), back after 2 cure(s) within 7 days'
                                     % uuid(gpuhost, 3))
    last = history(tmp_path).events(uuid(gpuhost, 3))[-1]
    assert (last['kind'], last['outcome'], last['reason']) == ('cure_failed', 'held', held['reason'])
    assert history(tmp_path).events(uuid(gpuhost, 5)) == []


def test_in_check_mode_a_gpu_held_is_said_but_its_history_is_left_as_it_was(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=2048)
    resets_before(tmp_path, gpuhost, 3, 'reset', 2 * HOUR, HOUR)
    before = history(tmp_path).events(uuid(gpuhost, 3))
    todo, result, dummy = plan(gpuhost, tmp_path, check_mode=True)
    assert todo == {} and [held['index'] for held in result.held] == [3]
    assert history(tmp_path).events(uuid(gpuhost, 3)) == before


def test_a_mig_mode_change_asked_for_is_no_fault_back_and_is_not_held_unless_its_budget_is_spent(gpuhost, tmp_path):
    """GPU 4's reset only applies the MIG mode a person asked for: two cures before do not hold it
    (no fault came back), a spent reset budget does. GPU 3's fault back after its cures is held."""
    gpuhost.mig(4, mode='disabled', pending='enabled')
    gpuhost.fault('stuck', gpu=3, mib=2048)
    resets_before(tmp_path, gpuhost, 4, 'reset', 2 * HOUR, HOUR)
    resets_before(tmp_path, gpuhost, 3, 'reset', 2 * HOUR, HOUR)
    todo, result, dummy = plan(gpuhost, tmp_path)
    assert todo == {4: ['MIG mode disabled -> enabled pending']}
    assert [held['index'] for held in result.held] == [3]
    todo, result, dummy = plan(gpuhost, tmp_path, reset_budget=2)
    assert todo == {} and [held['index'] for held in result.held] == [3, 4]
    assert 'its reset budget is spent' in result.held[1]['reason']


@pytest.mark.parametrize('window_days, held', [(7.0, False), (10.0, True)])
def test_only_resets_within_the_hold_window_count(gpuhost, tmp_path, window_days, held):
    gpuhost.fault('stuck', gpu=3, mib=2048)
    resets_before(tmp_path, gpuhost, 3, 'reset', 9 * DAY, 8 * DAY)
    todo, result, dummy = plan(gpuhost, tmp_path, hold_window_days=window_days)
    assert (todo == {}) is held and bool(result.held) is held


@pytest.mark.parametrize('budget, held', [(3, True), (4, False)])
def test_resets_that_failed_spend_the_reset_budget_and_a_spent_one_holds_the_gpu(gpuhost, tmp_path, budget, held):
    # Failed resets are no cure tried (hold_after_cures does not count them), but each spends the budget.
    gpuhost.fault('remap', gpu=2, pending=True)
    resets_before(tmp_path, gpuhost, 2, 'reset_failed', 3 * HOUR, 2 * HOUR, HOUR)
    todo, result, dummy = plan(gpuhost, tmp_path, reset_budget=budget)
    assert (todo == {}) is held
    if held:
        [entry] = result.held
        assert entry['reason'].startswith('GPU 2 (%s): needs a reset (remapped rows pending), its reset budget is '
                                          'spent: 3 reset(s) within 7 days' % uuid(gpuhost, 2))


def test_a_history_directory_others_can_write_is_not_used_and_the_plan_says_so(gpuhost, tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    shared.chmod(0o777)
    gpuhost.fault('stuck', gpu=3, mib=2048)
    todo, result, seen = plan(gpuhost, shared)
    assert todo == {3: ['orphaned memory']} and result.held == []
    assert any('is below %s, which every user can write' % shared in warning and
               'a fault that returns after its cures is not held for a person' in warning for warning in seen.warnings)


# -- reset_due, and the failure --------------------------------------------------------------

def test_reset_due_entries_are_by_index_and_read_back_as_the_plan():
    todo = {5: ['orphaned memory'], 1: ['remapped rows pending', 'MIG mode disabled -> enabled pending']}
    entries = due_entries(todo)
    assert [entry['index'] for entry in entries] == [1, 5]
    assert due_from_entries(entries) == todo
    entries[0]['reasons'].append('changed')
    assert todo[1] == ['remapped rows pending', 'MIG mode disabled -> enabled pending']  # a copy, not the plan's list


def test_a_gpu_named_twice_in_reset_due_has_each_reason_once():
    entries = [{'index': 2, 'reasons': ['orphaned memory']}, {'index': 2, 'reasons': ['orphaned memory', 'Xid 95']}]
    assert due_from_entries(entries) == {2: ['orphaned memory', 'Xid 95']}
    assert due_from_entries(None) == {} and due_from_entries([]) == {}


@pytest.mark.parametrize('entry', [
    {'reasons': ['orphaned memory']},
    {'index': -1, 'reasons': ['orphaned memory']},
    {'index': True, 'reasons': ['orphaned memory']},
    {'index': '3', 'reasons': ['orphaned memory']},
    {'index': 3.0, 'reasons': ['orphaned memory']},
    {'index': 3, 'reasons': []},
    {'index': 3},
])
def test_a_reset_due_entry_without_a_gpu_index_or_a_reason_is_refused(entry):
    with pytest.raises(GpuopsError, match=r'^reset_due: .* is no \{index, reasons\} of a GPU'):
        due_from_entries([{'index': 0, 'reasons': ['orphaned memory']}, entry])


def test_not_released_starts_the_failure_once_then_adds_to_it():
    result = ReleaseResult()
    result.released = True
    not_released(result, 'GPU 1 needs a reset (orphaned memory)')
    not_released(result, 'GPU 4 needs a reset (Xid 95)')
    assert result.released is False
    assert result.failure == 'GPUs not released: GPU 1 needs a reset (orphaned memory); GPU 4 needs a reset (Xid 95)'
