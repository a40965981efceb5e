# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Which GPUs a release leaves needing a reset, and why (reset_orphaned): decided where the
release reads, so that the reset's own code (_escalation, module nvidia_device_reset) is loaded
only on a host that has such a GPU.

A GPU needs one when its memory stays held with no process holding it, when its health or the
driver calls for one, or when its MIG mode change waits for one. Not the GPUs the kernel log says
the driver hung on (a reset would hang in it too), those a MIG instance in use keeps (a reset
would end what runs there), nor those held for a person (their history).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import driver_hung, reset_causes
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History, budget_spent
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import instances_in_use, pending_change
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import ORPHANED, instance_name, reset_not_attempted


def reset_plan(seen, result, snapshot):
    """{index: [why]} of the GPUs in scope a reset is for, with no process left on them. Sets
    result.failure for a GPU a MIG instance in use keeps from its reset, and result.held for those
    held for a person (recorded in their history, except in check mode)."""
    hung = set(index for index, (dummy, health) in seen.health(snapshot).items() if driver_hung(health))
    todo = dict((index, [ORPHANED]) for index in result.orphaned_gpus if index not in hung)
    causes = {}
    for index, (known, health) in seen.health(snapshot).items():
        why = reset_causes(known, health)
        if why:
            causes[index] = why
    for gpu in seen.scope(snapshot):
        index = gpu.get('index')
        if index not in causes or gpu.get('processes') or index in seen.job_scoped or 'mig_instance' in gpu:
            continue
        todo[index] = todo.get(index, []) + causes[index]
    todo, asked = _mig_to_reset(seen, result, snapshot, todo, causes)
    return _hold(seen, result, snapshot, todo, asked)


def read_mig_before(seen, gpus):
    """({index: MIG fact} of gpus that have MIG, warnings), within what is left of the timeout."""
    left = seen.deadline - seen.clock()
    migs, warnings = seen.reader.read_mig(gpus, timeout=left) if left > CALL_FLOOR_S else ({}, ['no time left'])
    return dict((index, fact) for index, fact in migs.items() if fact), warnings


def in_use(mig_fact, memory_threshold_mib):
    """'MIG instance in use: GI 7 CI 0 (MIG-...) [pid 42, 700 MiB used]', or '' when no MIG
    instance of the GPU is in use."""
    used = instances_in_use(mig_fact, memory_threshold_mib)
    return 'MIG instance in use: %s' % ', '.join('%s [%s]' % (instance_name(instance), ', '.join(why))
                                                 for instance, why in used) if used else ''


def not_released(result, why):
    """result not released, why added to its failure."""
    result.released = False
    result.failure = '%s; %s' % (result.failure, why) if result.failure else 'GPUs not released: %s' % why


def _mig_to_reset(seen, result, snapshot, todo, causes):
    """(todo with the GPUs whose MIG mode change waits for a reset (idle, with no process), less
    those with a MIG instance in use (a process on it, or its memory over the threshold): a reset
    would end what runs there; the indexes whose reset only applies that change, which a person
    asked for and no fault needs). causes: {index: [why]} of those that need one for their health."""
    scope = [gpu for gpu in seen.scope(snapshot)
             if gpu.get('index') is not None and not gpu.get('error') and 'mig_instance' not in gpu]
    migs, warnings = read_mig_before(seen, scope)
    blocked, asked = [], set()
    for gpu in scope:
        index = gpu['index']
        pending, used = pending_change(migs.get(index)), in_use(migs.get(index), seen.options.memory_threshold_mib)
        why = todo.get(index) or causes.get(index)
        if used and why and index not in seen.job_scoped:
            todo.pop(index, None)
            blocked.append(reset_not_attempted(index, why, used))
        elif pending and used:
            seen.warn('GPU %s: %s, not applied: %s' % (index, pending, used))
        elif pending and not gpu.get('processes') and index not in seen.job_scoped:
            if index not in todo:
                asked.add(index)
            todo[index] = todo.get(index, []) + [pending]
    if blocked:
        not_released(result, '; '.join(blocked))
    for warning in warnings if todo else ():
        seen.warn('MIG before the reset: %s' % warning)
    return todo, asked


def _hold(seen, result, snapshot, todo, asked=()):
    """todo without the GPUs whose fault came back after hold_after_cures cures within
    hold_window_days, or whose reset_budget is spent within it (their history): those are held for
    a person (result.held), not reset. asked: the GPUs whose reset only applies a MIG mode change,
    no fault coming back; their reset budget still holds them."""
    history = History.for_host(seen.options.host_root, seen.options.state_dir)
    uuids = dict((gpu.get('index'), gpu.get('uuid')) for gpu in snapshot.gpus)
    result.held = []
    for index in sorted(todo):
        fault = 'needs a reset (%s)' % ', '.join(todo[index])
        why = None if index in asked else history.hold_reason(uuids.get(index), index, fault, seen.options.hold_after_cures,
                                                              seen.options.hold_window_days)
        spent = None if why else budget_spent(history.events(uuids.get(index)), 'reset', seen.options.reset_budget,
                                              seen.options.hold_window_days)
        if spent:
            why = 'GPU %s (%s): %s, %s' % (index, uuids.get(index), fault, spent)
        if why:
            result.held.append({'index': index, 'uuid': uuids.get(index), 'reason': why})
            del todo[index]
    if result.held and not seen.check_mode:
        history.record([(held['uuid'], held['index'], held['reason']) for held in result.held], 'cure_failed',
                       outcome='held')
    for warning in history.warnings:
        seen.warn(warning)
    return todo


def due_entries(todo):
    """The release's reset_due of todo ({index: [why]}): [{index, reasons}], by index."""
    return [{'index': index, 'reasons': list(why)} for index, why in sorted(todo.items())]


def due_from_entries(entries):
    """{index: [why]} of reset_due entries (the option of nvidia_device_reset); GpuopsError for
    an entry that names no GPU index or no reason."""
    todo = {}
    for entry in entries or ():
        index, reasons = entry.get('index'), entry.get('reasons')
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or not reasons:
            raise GpuopsError('reset_due: %r is no {index, reasons} of a GPU (the reset_due of '
                              'nvidia_device_release)' % (entry,))
        todo[index] = todo.get(index, []) + [reason for reason in reasons if reason not in todo.get(index, [])]
    return todo
