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

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Runner

# NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
# Some drivers print the function (.0) or leave out "PCI:". With MIG, the driver names the GPU
# instance (and compute instance) after the bus id: "Xid (PCI:0000:01:00 GPU-I:05): 94, ..."
# (open-gpu-kernel-modules kernel_rc.c: "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u").
XID_RE = re.compile(r'NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})'
                    r'(?:\.[0-7])?(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?\): (\d+),\s*(.*)$')
# A GPU that falls off the bus while the driver probes it is reported with no Xid, over three
# lines ("NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: 10de:26b5) installed in this
# system has" / "NVRM: fallen off the bus and is not responding to commands."), or on one line
# ("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.").
FALLEN_GPU_RE = re.compile(r'NVRM: (?:The NVIDIA GPU|GPU) (?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})'
                           r'(?:\.[0-7])?(:?)\s*(.*)$')
FALLEN_TEXT = 'fallen off the bus'
ISO_TIME_RE = re.compile(r'(?:^|\s)(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s')
SYSLOG_TIME_RE = re.compile(r'^([A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2})\s')
UPTIME_RE = re.compile(r'\[\s*(\d+\.\d+)\]')
# dmesg -T / --ctime: [Wed Jul 31 23:14:18 2024]
CTIME_RE = re.compile(r'\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]')
XID_154_RE = re.compile(r'to 0x([0-9A-Fa-f]+)')
XID_45_CAUSED_RE = re.compile(r'caused by previous Xid (\d+)')

# The commands that print the kernel log, tried in order. journalctl -k is this boot only.
KERNEL_LOG_COMMANDS = (
    ['journalctl', '-k', '-o', 'short-iso', '--no-pager', '-q'],
    ['dmesg', '--time-format', 'iso'],
)

RECOVERY_ACTIONS = ('none', 'restart_app', 'reset_gpu', 'reboot', 'inspect')
_SEVERITY = dict((action, rank) for rank, action in enumerate(RECOVERY_ACTIONS))

# Xid -> recovery action: the "Immediate Action" column of NVIDIA's Xid catalogue
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as generated on
# 2025-10-29 into leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go):
# RESTART_APP -> restart_app, RESET_GPU -> reset_gpu, RESTART_BM / RESTART_VM -> reboot,
# IGNORE -> none. CONTACT_SUPPORT, the WORKFLOW_* buckets and codes not listed give "inspect":
# a person has to follow NVIDIA's workflow. Xid 154 carries its own verdict (below); Xid 45 that
# names the Xid that caused it follows that Xid, as the catalogue's XID_45 workflow says.
XID_ACTIONS = {
    8: 'restart_app',     # GPU stopped processing (channel idle timeout)
    11: 'restart_app',    # invalid or corrupted push buffer stream
    13: 'restart_app',    # graphics engine exception
    31: 'restart_app',    # GPU memory page fault
    32: 'restart_app',    # invalid or corrupted push buffer stream (PBDMA)
    43: 'none',           # GPU stopped processing: a channel reset, the GPU is fine
    45: 'inspect',        # preemptive cleanup: WORKFLOW_XID_45 (see recovery_action)
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


def bus_key(bus_id):
    """(domain, bus, device) of a PCI bus id in any of the driver's spellings, or None."""
    if not bus_id:
        return None
    match = re.match(r'^(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})', bus_id.strip())
    if not match:
        return None
    return tuple(int(part, 16) for part in match.groups())


def _line_time(prefix):
    match = SYSLOG_TIME_RE.match(prefix) or ISO_TIME_RE.search(prefix) or CTIME_RE.search(prefix)
    if match:
        return match.group(1)
    match = UPTIME_RE.search(prefix)
    return match.group(1) if match else None


def parse_xid_events(lines):
    """Xid events in kernel log lines: dicts with bus (a bus_key), code, time, text, gpu_instance.

    code is None for a GPU the driver reports as fallen off the bus without an Xid number (see
    FALLEN_GPU_RE); gpu_instance is the MIG GPU instance the driver names, or None.
    """
    events = []
    pending = None
    for line in lines:
        line = line.rstrip('\r\n')
        position = line.find('NVRM: ')
        if position < 0:
            continue
        match = XID_RE.search(line, position)
        if match:
            pending = None
            domain, bus, device, gpu_instance, dummy, code, text = match.groups()
            events.append({
                'bus': (int(domain, 16), int(bus, 16), int(device, 16)),
                'code': int(code),
                'time': _line_time(line[:position]),
                'text': text.strip(),
                'gpu_instance': None if gpu_instance is None else int(gpu_instance),
            })
            continue
        match = FALLEN_GPU_RE.search(line, position)
        if match:
            pending = {'bus': bus_key(match.group(1)), 'time': _line_time(line[:position]),
                       'text': [line[position + 6:].strip()], 'left': 2}
        elif pending is not None:
            pending['text'].append(line[position + 6:].strip())
            pending['left'] -= 1
        else:
            continue
        if FALLEN_TEXT in line:
            events.append({'bus': pending['bus'], 'code': None, 'time': pending['time'],
                           'text': ' '.join(pending['text']), 'gpu_instance': None})
            pending = None
        elif pending['left'] <= 0:
            pending = None
    return events


def fallen_off_bus(events):
    """{bus_key: text} of the GPUs that the events say have fallen off the bus (Xid 79, or the
    driver's message without an Xid); the last message of each GPU."""
    return dict((event['bus'], event['text']) for event in events or ()
                if event['code'] is None or event['code'] == 79)


def parse_fallen_off_bus(lines):
    """{bus_key: text} of the GPUs that kernel log lines report as fallen off the bus."""
    return fallen_off_bus(parse_xid_events(lines))


def _run(argv, timeout):
    """(lines, None) of what argv printed, or (None, why not)."""
    runner = Runner(argv[0], timeout, env=dict(SYSTEMD_PAGER='', SYSTEMD_COLORS='0'))
    try:
        rc, stdout, stderr = runner.run(argv[1:])
    except CommandTimeout:
        return None, '%s did not finish within %s s' % (argv[0], timeout)
    except GpuopsError as exc:
        return None, str(exc)
    if rc != 0 or not stdout.strip():
        said = stderr.strip().splitlines()
        return None, '%s exited with %d%s' % (argv[0], rc, (': ' + said[0]) if said else '')
    return stdout.splitlines(), None


def read_xid_events(kernel_log=None, timeout=10.0, commands=KERNEL_LOG_COMMANDS):
    """(events, warnings). events is None when no kernel log could be read.

    kernel_log: a file to read instead of running journalctl -k, then dmesg.
    """
    if kernel_log:
        try:
            with open(kernel_log, 'rb') as f:
                lines = [line.decode('utf-8', 'replace') for line in f if b'NVRM: ' in line]
        except (IOError, OSError) as exc:
            return None, ['kernel_log: cannot read %s (%s); xid_events are unknown'
                          % (kernel_log, exc.strerror or exc)]
        return parse_xid_events(lines), []
    if timeout is not None and timeout <= 0:
        return None, ['no time was left within the timeout to read the kernel log; xid_events are unknown']
    problems = []
    for argv in commands:
        lines, problem = _run(argv, timeout)
        if lines is not None:
            return parse_xid_events(lines), []
        problems.append(problem)
    return None, ['the kernel log could not be read (%s); xid_events are unknown. Run with '
                  'privilege escalation or set kernel_log' % '; '.join(problems)]


# The driver's own recovery action (_reader.DRIVER_RECOVERY_ACTIONS) in this vocabulary.
DRIVER_ACTIONS = {'none': 'none', 'reset_gpu': 'reset_gpu', 'drain_and_reset': 'reset_gpu', 'reboot': 'reboot',
                  'system_reboot': 'reboot'}


def recovery_action(xid_events, remapped_rows_pending=None, remapped_rows_failure=None,
                    retired_pages_pending=None, error=None, reset_required=False, driver_action=None):
    """The most severe action, in RECOVERY_ACTIONS order, that the GPU's state calls for.

    Row remapping and page retirement follow NVIDIA's memory error guidance
    (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ and .../dynamic-page-retirement/):
    a pending remapping or retirement takes effect at the next GPU reset; a remapping failure
    falls under the RMA policy, which a person has to look at.
    """
    actions = ['none']
    for event in xid_events or ():
        if event['code'] is None:
            # Fallen off the bus without an Xid: as Xid 79.
            actions.append(XID_ACTIONS[79])
        elif event['code'] == 45 and XID_45_CAUSED_RE.search(event['text']):
            # "caused by previous Xid N": the catalogue says to follow that Xid.
            cause = int(XID_45_CAUSED_RE.search(event['text']).group(1))
            actions.append(XID_ACTIONS.get(cause, 'inspect') if cause != 45 else 'inspect')
        elif event['code'] == 154:
            match = XID_154_RE.search(event['text'])
            actions.append(XID_154_ACTIONS.get(int(match.group(1), 16), 'inspect') if match else 'inspect')
        else:
            actions.append(XID_ACTIONS.get(event['code'], 'inspect'))
    if remapped_rows_pending or retired_pages_pending:
        actions.append('reset_gpu')
    if remapped_rows_failure:
        actions.append('inspect')
    if driver_action is not None:
        # The driver's word: what it names, and a person for what it asks beyond a reset or a reboot.
        actions.append(DRIVER_ACTIONS.get(driver_action, 'inspect'))
    if error:
        # nvidia-smi's own advice for a lost GPU is to reboot, as NVIDIA's for one that has fallen
        # off the bus (Xid 79); a GPU the driver says requires a reset needs one; any other
        # unreadable GPU needs a look.
        actions.append('reboot' if 'GPU is lost' in error or FALLEN_TEXT in error else
                       'reset_gpu' if reset_required else 'inspect')
    return max(actions, key=lambda action: _SEVERITY[action])


def health_facts(gpu, xid_events):
    """The health dict of one GPU. xid_events: every event on the host, or None if unknown."""
    key = bus_key(gpu.get('pci_bus_id'))
    if xid_events is None:
        events = None
    else:
        events = [dict(code=e['code'], time=e['time'], text=e['text'])
                  for e in xid_events if key is not None and e['bus'] == key]
    return {
        'xid_events': events,
        'remapped_rows_pending': gpu.get('remapped_rows_pending'),
        'remapped_rows_failure': gpu.get('remapped_rows_failure'),
        'retired_pages_pending': gpu.get('retired_pages_pending'),
        'recovery_action': recovery_action(events, gpu.get('remapped_rows_pending'),
                                           gpu.get('remapped_rows_failure'),
                                           gpu.get('retired_pages_pending'), gpu.get('error')),
    }
