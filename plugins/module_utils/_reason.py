# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Why a GPU is not clean, in one vocabulary: the release module's message and the verdict's
reason (the report, the drain reason, the summary) say it in these words."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DRIVER_HUNG, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import NOT_CLEAN_ACTIONS, action_causes


# Why a holder was left alone although it is no protected daemon: a root or system process that
# the driver does not place on any GPU and that belongs to no job (a daemon handed a descriptor).
FOREIGN_HOLDER = 'foreign_holder'
# Why a GPU is reset: its memory stays held with no process left.
ORPHANED = 'orphaned memory'


def gpu_problem(gpu, reset_required, orphaned_memory, dirty, why=(), reset_remedy='', orphan_remedy='', health=None):
    """Why one GPU is not clean, or None: the one ladder of the release's message and the
    verdict's reason. reset_required: the driver's verdict is that it needs a reset;
    orphaned_memory: its memory is held with no process left; dirty: memory over the threshold,
    not reported, or processes on it (why: what holds it); health: its health (_health.health_facts,
    the facts' health), whose recovery action the facts module decides: a reset, a reboot or a
    person (NOT_CLEAN_ACTIONS) leaves it not clean."""
    if gpu.get('error') and reset_required:
        return needs_reset(gpu, reset_remedy)
    if gpu.get('error'):
        return unreadable(gpu)
    if orphaned_memory:
        return orphaned(gpu, orphan_remedy)
    if dirty:
        return held(gpu, why)
    if health and health.get('recovery_action') in NOT_CLEAN_ACTIONS:
        return needs_cure(gpu, health, reset_remedy)
    return None


# A GPU reset the platform refused (FLR blocked by the hypervisor or the firmware, as on AWS bare
# metal and EKS): no second try helps, the driver's modules reloaded or a reboot does.
RESET_REFUSED = 'reset_refused: the platform refused the GPU reset (FLR); a driver reload or a reboot is needed'


def reset_refused(gpu):
    """A GPU whose reset the platform refused: its recovery action is a reboot."""
    return 'GPU %s needs a reboot (%s)' % (gpu_name(gpu), RESET_REFUSED)


def driver_hung(what, how):
    """A call that hung in the driver past its deadline (what: the call; how: what shows it)."""
    return '%s: %s hung in the NVIDIA driver past its deadline (%s); only a reboot frees it' % (DRIVER_HUNG, what, how)


def is_driver_hung(text):
    """Whether a reason or an error names a hung driver (driver_hung)."""
    return (DRIVER_HUNG + ':') in str(text or '')


def needs_cure(gpu, health, reset_remedy=''):
    """A readable GPU whose health calls for a reset, a reboot or a person, and why."""
    action = health['recovery_action']
    why = '; '.join(action_causes(gpu, health)) or 'its health calls for %s' % action
    if action == 'reset_gpu':
        return needs_reset(gpu, reset_remedy, why=why)
    if action == 'reboot':
        return 'GPU %s needs a reboot (%s)' % (gpu_name(gpu), why)
    return "GPU %s needs a person (%s; NVIDIA's Xid catalogue asks for a look)" % (gpu_name(gpu), why)


def gpu_name(gpu):
    """A GPU as the reasons name it: its index, or its PCI bus id when it has none; a MIG instance
    in a release's scope by its GPU's index, its GPU and compute instance and its MIG UUID."""
    if gpu.get('mig_instance'):
        return '%s MIG %s' % (gpu.get('index'), instance_name(gpu['mig_instance']))
    return gpu.get('pci_bus_id') if gpu.get('index') is None else gpu.get('index')


def reset_failed(output):
    """The remedy part of a reason after a GPU reset that failed."""
    return ', and the reset failed: ' + printable(' '.join(str(output).split()))


def needs_reset(gpu, remedy='', why=None):
    """A GPU that needs a reset: the driver's words, or why (the causes its health gives)."""
    return 'GPU %s needs a GPU reset (%s%s)' % (gpu_name(gpu), gpu['error'] if why is None else why, remedy)


def parent_of_instances(gpu):
    """What a fault of a GPU with MIG instances adds to its reason: each instance it is the fault of,
    by GPU instance, compute instance and MIG UUID ('' for a GPU without)."""
    instances = (gpu.get('mig') or {}).get('instances') or []
    if not instances:
        return ''
    # The ids first, the UUIDs after: a drain reason keeps only the start of the text.
    ids = ', '.join('GI %s CI %s' % (instance.get('gpu_instance_id'), instance.get('compute_instance_id')) for instance in instances)
    uuids = [instance['uuid'] for instance in instances if instance.get('uuid')]
    return '; GPU %s is the parent of MIG instance %s, each affected%s' % (
        gpu_name(gpu), ids, ' (%s)' % ', '.join(uuids) if uuids else '')


def unreadable(gpu):
    """A GPU the driver cannot read or has lost."""
    return 'GPU %s lost or unreadable (%s)' % (gpu_name(gpu), gpu['error'])


def orphaned(gpu, remedy=''):
    """Memory held with no process left."""
    return 'GPU %s: %s MiB held with no process left (orphaned memory; only a GPU reset frees it%s)' % (
        gpu_name(gpu), gpu.get('memory_used_mib'), remedy)


def held(gpu, why=()):
    """Memory used (or not reported), and what holds it."""
    used = gpu.get('memory_used_mib')
    amount = 'memory used not reported' if used is None else '%s MiB used' % used
    return 'GPU %s: %s%s' % (gpu_name(gpu), amount, ', held by ' + ', '.join(why) if why else '')


def reported(process):
    """A process the driver lists on a GPU."""
    return 'pid %s (%s)' % (process.get('pid'), printable(process.get('name') or 'no name'))


def still_holds(who, devices):
    """A holder left that holds no GPU in scope of its own, only device nodes."""
    return '%s still holds %s' % (who, ', '.join(printable(path) for path in devices or []))


def fabric_not_back(entry):
    """A reset GPU whose NVLink fabric registration did not come back (see _fabric)."""
    return 'GPU %s: the NVLink fabric is not back after the GPU reset (state %s, status %s: %s)' % (
        entry.get('index'), entry.get('state'), entry.get('status'), entry.get('note'))


def no_time_to_restore(gpus, units, reserve, left, floor):
    """A reset not started: the units it stops could not be started again within the timeout."""
    return ('GPU %s not reset: %s would be stopped for it, and starting them again may take %.0f s, which leaves '
            'less than the %.1f s a reset needs of the %.1f s left of the timeout; nothing was stopped (a longer '
            'timeout leaves the time)' % (gpus, units, reserve, floor, max(left, 0.0)))


def foreign_why(holder, unit=None):
    """Why a foreign holder (FOREIGN_HOLDER) is left alone, and what lets it go (unit: the systemd
    unit it runs in, _release.holders.supervisor)."""
    return ('pid %d (%s, user %s%s, holding %s; %s: a root or system process that the driver places on no GPU and '
            'that belongs to no job, never signalled; it lets go when %s)' % (
                holder.pid, printable(holder.name), holder.user, ', unit %s' % printable(unit) if unit else '',
                ', '.join(printable(path) for path in holder.devices) or 'no GPU node', FOREIGN_HOLDER,
                'unit %s stops or closes the descriptor' % printable(unit) if unit else
                'it closes the descriptor or exits: see what handed it one'))


def instance_name(instance):
    """A MIG device as the reasons name it: GPU instance, compute instance and MIG UUID."""
    return 'GI %s CI %s (%s)' % (instance.get('gpu_instance_id'), instance.get('compute_instance_id'),
                                 instance.get('uuid') or 'MIG UUID unknown')


def spared_why(holder):
    """Why the job's release leaves a holder alone: another job's, or one it may not touch."""
    job = 'job %s' % holder.job if holder.job else 'no job'
    return 'pid %d (%s, user %s, %s; %s)' % (holder.pid, printable(holder.name), holder.user, job, holder.spared)


def mig_not_restored(index, layout, problems):
    """A GPU whose MIG layout a reset ended and that was not made again, or not proven, after it."""
    return 'GPU %s lost its MIG instances to the reset and they were not made again (%s): %s' % (
        index, layout, '; '.join(problems))


def reset_not_attempted(index, why, because):
    """'GPU 3 needs a reset (orphaned memory), not attempted: <because>' (why: [reason])."""
    return 'GPU %s needs a reset (%s), not attempted: %s' % (index, ', '.join(why), because)
