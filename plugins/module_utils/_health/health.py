# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""GPU health: Xid errors from the kernel log, memory repair state, and what to do about them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import (
    DRIVER_HUNG as HUNG,
    FALLEN,
    FALLEN_TEXT,
    HUNG_TEXT,
    INIT_FAILED,
    parse_xid_events,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DRIVER_HUNG
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import bus_key

XID_154_RE = re.compile(r'to 0x([0-9A-Fa-f]+)')
XID_45_CAUSED_RE = re.compile(r'caused by previous Xid (\d+)')

RECOVERY_ACTIONS = ('none', 'restart_app', 'reset_gpu', 'reboot', 'inspect')
_SEVERITY = dict((action, rank) for rank, action in enumerate(RECOVERY_ACTIONS))

# Xid -> recovery action: the "Immediate Action" column of NVIDIA's Xid catalogue
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as generated on
# 2025-10-29 into leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go):
# RESTART_APP -> restart_app, RESET_GPU -> reset_gpu, RESTART_BM / RESTART_VM -> reboot,
# IGNORE -> none. CONTACT_SUPPORT, the WORKFLOW_* buckets and codes not listed give "inspect":
# a person has to follow NVIDIA's workflow. Xid 154 carries its own verdict (below). Xid 45 follows
# the catalogue's XID_45 workflow: one that names the Xid that caused it follows that Xid; alone it
# is the cleanup of a stopped application (restart it); beside another Xid of the same GPU it is
# IGNORE, the other Xid says what to do (NVIDIA/NVSentinel#1629: reading it as "inspect" drained
# 77 healthy nodes after one job crash).
XID_ACTIONS = {
    8: 'restart_app',     # GPU stopped processing (channel idle timeout)
    11: 'restart_app',    # invalid or corrupted push buffer stream
    13: 'restart_app',    # graphics engine exception
    31: 'restart_app',    # GPU memory page fault
    32: 'restart_app',    # invalid or corrupted push buffer stream (PBDMA)
    43: 'none',           # GPU stopped processing: a channel reset, the GPU is fine
    45: 'restart_app',    # preemptive cleanup: alone, the application was stopped (see xid_action)
    46: 'reset_gpu',      # GPU stopped processing (timeout)
    48: 'inspect',        # double bit ECC error: WORKFLOW_XID_48
    61: 'inspect',        # PMU breakpoint: contact support
    62: 'reset_gpu',      # PMU halt error
    63: 'none',           # row remapping / page retirement recorded (remapped_rows_pending says when to reset)
    64: 'reset_gpu',      # row remapping / page retirement failed
    74: 'inspect',        # NVLink error: WORKFLOW_NVLINK_ERR
    79: 'reboot',         # GPU has fallen off the bus
    92: 'none',           # excessive single bit ECC interrupts
    94: 'restart_app',    # contained ECC error: only the application that hit it is affected
    95: 'reset_gpu',      # uncontained ECC error
    109: 'reset_gpu',     # context switch timeout
    110: 'reset_gpu',     # security fault
    119: 'reset_gpu',     # GSP RPC timeout
    120: 'reset_gpu',     # GSP error
    136: 'reset_gpu',     # link training failure
    140: 'reset_gpu',     # unrecovered ECC error
    143: 'reset_gpu',     # GPU initialisation error
    144: 'inspect',       # NVLink SAW error: WORKFLOW_NVLINK5_ERR
    145: 'inspect',       # NVLink RLW error: WORKFLOW_NVLINK5_ERR
    149: 'inspect',       # NVLink NETIR error: WORKFLOW_NVLINK5_ERR
    151: 'reboot',        # key rotation error: RESTART_VM
    155: 'reset_gpu',     # NVLink software-defined error
    156: 'reset_gpu',     # resource retirement event
    158: 'reset_gpu',     # GPU fatal timeout
}

# Xid 154 carries the driver's own verdict, nvmlGpuRecoveryAction_t: "GPU recovery action
# changed from 0x0 (None) to 0x1 (GPU Reset Required)". NVIDIA, "Error Recovery and Response
# Flags" (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
# error-recovery-and-response-flags.html).
XID_154_ACTIONS = {0: 'none', 1: 'reset_gpu', 2: 'reboot', 3: 'inspect', 4: 'reset_gpu'}

# The driver's recovery action (nvidia-smi's and NVML's words) in the vocabulary of the GPUs' health
# (recovery_action).
DRIVER_ACTIONS = {'none': 'none', 'reset_gpu': 'reset_gpu', 'drain_and_reset': 'reset_gpu', 'reboot': 'reboot',
                  'system_reboot': 'reboot'}


def fallen_off_bus(events):
    """{bus_key: text} of the GPUs that the events say have fallen off the bus (Xid 79, or the
    driver's message without an Xid); the last message of each GPU."""
    return dict((event['bus'], event['text']) for event in events or ()
                if event.get('kind') == FALLEN or event['code'] == 79)


def parse_fallen_off_bus(lines):
    """{bus_key: text} of the GPUs that kernel log lines report as fallen off the bus."""
    return fallen_off_bus(parse_xid_events(lines))


def xid_action(event, codes=()):
    """What one message calls for; codes: the Xid codes of every message of that GPU."""
    code = event['code']
    if event.get('kind') == HUNG:
        # The driver hung: only a reboot frees it.
        return 'reboot'
    if event.get('kind') == INIT_FAILED:
        # The driver could not initialise the GPU: the catalogue's Xid 143 (GPU_INIT_ERROR).
        return XID_ACTIONS[143]
    if code is None:
        # Fallen off the bus without an Xid: as Xid 79.
        return XID_ACTIONS[79]
    if code == 45:
        caused = XID_45_CAUSED_RE.search(event['text'])
        if caused:
            cause = int(caused.group(1))
            return XID_ACTIONS.get(cause, 'inspect') if cause != 45 else 'inspect'
        return 'none' if set(codes) - set([45]) else XID_ACTIONS[45]
    if code == 154:
        match = XID_154_RE.search(event['text'])
        return XID_154_ACTIONS.get(int(match.group(1), 16), 'inspect') if match else 'inspect'
    return XID_ACTIONS.get(code, 'inspect')


def recovery_action(xid_events, remapped_rows_pending=None, remapped_rows_failure=None,
                    retired_pages_pending=None, error=None, reset_required=False, driver_action=None):
    """The most severe action, in RECOVERY_ACTIONS order, that the GPU's state calls for.

    Row remapping and page retirement follow NVIDIA's memory error guidance
    (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ and .../dynamic-page-retirement/):
    a pending remapping or retirement takes effect at the next GPU reset; a remapping failure
    falls under the RMA policy, which a person has to look at.
    """
    events = list(xid_events or ())
    codes = set(event['code'] for event in events)
    actions = ['none'] + [xid_action(event, codes) for event in events]
    if remapped_rows_pending or retired_pages_pending:
        actions.append('reset_gpu')
    if remapped_rows_failure:
        actions.append('inspect')
    if driver_action is not None:
        # The driver's word: what it names, and a person for what it asks beyond a reset or a reboot.
        actions.append(DRIVER_ACTIONS.get(driver_action, 'inspect'))
    if error and driver_action in (None, 'none'):
        # nvidia-smi's own advice for a lost GPU is to reboot, as NVIDIA's for one that has fallen
        # off the bus (Xid 79), and a reboot is all that frees a driver hung on it (driver_hung); a GPU the driver says requires a reset needs one; any other
        # unreadable GPU needs a look.
        actions.append('reboot' if 'GPU is lost' in error or FALLEN_TEXT in error or error.startswith(DRIVER_HUNG) else
                       'reset_gpu' if reset_required else 'inspect')
    return max(actions, key=lambda action: _SEVERITY[action])


# The recovery actions after which a GPU is not clean, whatever its memory reads: a job that
# starts there meets the fault (restart_app is the job's own, and the release ended the job).
NOT_CLEAN_ACTIONS = ('reset_gpu', 'reboot', 'inspect')


def reset_causes(gpu, health):
    """Why a GPU reset is what the GPU needs, in words for the result: [] unless a reset is the
    most severe action its health calls for (a GPU that needs a reboot or a person is left to them).
    gpu: the GPU as the reader read it; health: its health_facts."""
    if health.get('recovery_action') != 'reset_gpu':
        return []
    return action_causes(gpu, health)


def action_causes(gpu, health):
    """Why the GPU's health calls for its recovery_action (the most severe), in words: the driver's
    word, the memory repair state, the kernel log's messages since the last cure. [] for none.
    gpu: the GPU as the reader read it; health: its health_facts."""
    wanted = health.get('recovery_action')
    if wanted in (None, 'none'):
        return []
    causes = []
    action = health.get('driver_recovery_action')
    if wanted == 'reset_gpu' and gpu.get('error') and gpu.get('reset_required'):
        # The reader's words: [GPU requires reset], NVML's RESET_REQUIRED or the recovery action.
        causes.append(gpu['error'])
    elif action is not None and action != 'none' and DRIVER_ACTIONS.get(action, 'inspect') == wanted:
        causes.append("the driver's GPU recovery action is %s" % action)
    if wanted == 'reset_gpu':
        causes.extend(name for key, name in (('remapped_rows_pending', 'remapped rows pending'),
                                             ('retired_pages_pending', 'retired pages pending')) if health.get(key))
    if wanted == 'inspect' and health.get('remapped_rows_failure'):
        causes.append('row remapping failed')
    events = [event for event in health.get('xid_events') or () if event['since_cure']]
    codes = set(event['code'] for event in events)
    called = [event for event in events if xid_action(event, codes) == wanted]
    xids = sorted(set(event['code'] for event in called if event['code'] is not None))
    if xids:
        causes.append('Xid %s since the last cure' % ', '.join(str(code) for code in xids))
    if any(event.get('kind') == INIT_FAILED for event in called):
        causes.append('the driver could not initialise it')
    if any(event.get('kind') == FALLEN for event in called):
        causes.append('fallen off the bus since the last cure')
    if any(event.get('kind') == HUNG for event in called):
        causes.append(HUNG_CAUSE)
    return causes


def driver_hung(health):
    """Whether the kernel log says the driver hung since the GPU's last cure: a reset would only
    hang in it too; a reboot is what frees it. health: the GPU's health_facts."""
    return any(event.get('kind') == HUNG and event['since_cure'] for event in health.get('xid_events') or ())


# The words of _reason.driver_hung, for the kernel log's word (_reason imports this module).
HUNG_CAUSE = '%s: the kernel log says the NVIDIA driver hung (%s) since the last cure; only a reboot frees it' % (
    DRIVER_HUNG, HUNG_TEXT)


def _fact_event(event, cured_at):
    """One entry of health.xid_events: a message of the GPU, summarised (see _kernel_log.Summary)."""
    last = event.get('last_epoch')
    return {
        'code': event['code'], 'kind': event.get('kind', 'xid'), 'count': event.get('count', 1),
        'first_time': event.get('first_time', event['time']), 'time': event['time'], 'text': event['text'],
        'texts': list(event.get('texts') or [event['text']]),
        # Older than the GPU's last cure: history, not counted. A time that cannot be told counts.
        'since_cure': cured_at is None or last is None or last > cured_at,
    }


def own_fault(gpu):
    """Whether the GPU's own reads say the driver is stuck on it: a read that hung in the driver
    (driver_hung), the driver's word that it requires a reset, its recovery action."""
    hung = str(gpu.get('error') or '').startswith(DRIVER_HUNG)
    return bool(gpu.get('reset_required') or hung or gpu.get('driver_recovery_action') not in (None, 'none'))


def health_facts(gpu, xid_events, cured_at=None):
    """The health dict of one GPU. xid_events: every message on the host (summarised), or None
    if unknown; cured_at: when the GPU was last cured in this boot (epoch seconds), or None."""
    key = bus_key(gpu.get('pci_bus_id'))
    if xid_events is None:
        events = None
    else:
        # The driver's hang that names no GPU (_kernel_log.HOST_BUS) is a GPU's only where the
        # GPU's own reads bear it out: a line alone, whoever wrote it, convicts no GPU.
        host = own_fault(gpu)
        events = [_fact_event(e, cured_at) for e in xid_events
                  if (key is not None and e['bus'] == key) or (host and e['bus'] is None and e.get('kind') == HUNG)]
    counted = [event for event in events or () if event['since_cure']]
    return {
        'xid_events': events,
        'remapped_rows_pending': gpu.get('remapped_rows_pending'),
        'remapped_rows_failure': gpu.get('remapped_rows_failure'),
        'retired_pages_pending': gpu.get('retired_pages_pending'),
        'driver_recovery_action': gpu.get('driver_recovery_action'),
        'last_cure': _iso(cured_at),
        'recovery_action': recovery_action(counted, gpu.get('remapped_rows_pending'),
                                           gpu.get('remapped_rows_failure'), gpu.get('retired_pages_pending'),
                                           gpu.get('error'), gpu.get('reset_required'),
                                           gpu.get('driver_recovery_action')),
    }


def _iso(seconds):
    if seconds is None:
        return None
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(seconds))
