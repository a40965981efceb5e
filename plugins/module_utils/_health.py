# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""GPU health: Xid errors from the kernel log, memory repair state, and what to do about them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import signal
import subprocess

# NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
# Some drivers print the function (.0) or leave out "PCI:".
XID_RE = re.compile(r'NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})'
                    r'(?:\.[0-7])?\): (\d+),\s*(.*)$')
ISO_TIME_RE = re.compile(r'^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s')
SYSLOG_TIME_RE = re.compile(r'^([A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2})\s')
UPTIME_RE = re.compile(r'\[\s*(\d+\.\d+)\]')
XID_154_RE = re.compile(r'to 0x([0-9A-Fa-f]+)')

# The commands that print the kernel log, tried in order. journalctl -k is this boot only.
KERNEL_LOG_COMMANDS = (
    ['journalctl', '-k', '-o', 'short-iso', '--no-pager', '-q'],
    ['dmesg', '--time-format', 'iso'],
)

RECOVERY_ACTIONS = ('none', 'restart_app', 'reset_gpu', 'reboot', 'inspect')
_SEVERITY = dict((action, rank) for rank, action in enumerate(RECOVERY_ACTIONS))

# Xid -> recovery action, from the "Resolution Bucket (Immediate Action)" column of NVIDIA's
# Xid catalogue for Ampere and newer GPUs (https://docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html): RESTART_APP -> restart_app, RESET_GPU -> reset_gpu,
# RESTART_BM / RESTART_VM -> reboot. Codes not listed (and CONTACT_SUPPORT, CHECK_MECHANICALS,
# UPDATE_SW and the WORKFLOW_* buckets) give "inspect": a person has to look.
XID_ACTIONS = {
    8: 'restart_app',     # GPU stopped processing (channel idle timeout)
    11: 'restart_app',    # invalid or corrupted push buffer stream
    13: 'restart_app',    # graphics engine exception
    31: 'restart_app',    # GPU memory page fault
    43: 'restart_app',    # GPU stopped processing
    45: 'restart_app',    # preemptive cleanup, due to previous errors
    94: 'restart_app',    # contained ECC error: only the application that hit it is affected
    48: 'reset_gpu',      # double bit ECC error
    63: 'reset_gpu',      # row remapping / page retirement recorded, takes effect on reset
    64: 'reset_gpu',      # row remapping / page retirement failed
    74: 'reset_gpu',      # NVLink error
    95: 'reset_gpu',      # uncontained ECC error
    119: 'reset_gpu',     # GSP RPC timeout
    120: 'reset_gpu',     # GSP error
    140: 'reset_gpu',     # unrecovered ECC error
    79: 'reboot',         # GPU has fallen off the bus
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
    for pattern in (ISO_TIME_RE, SYSLOG_TIME_RE):
        match = pattern.match(prefix)
        if match:
            return match.group(1)
    match = UPTIME_RE.search(prefix)
    return match.group(1) if match else None


def parse_xid_events(lines):
    """Xid events in kernel log lines: dicts with bus (a bus_key), code, time, text."""
    events = []
    for line in lines:
        position = line.find('NVRM: Xid')
        if position < 0:
            continue
        match = XID_RE.search(line.rstrip('\n'))
        if not match:
            continue
        domain, bus, device, code, text = match.groups()
        events.append({
            'bus': (int(domain, 16), int(bus, 16), int(device, 16)),
            'code': int(code),
            'time': _line_time(line[:position]),
            'text': text.strip(),
        })
    return events


def _run(argv, timeout):
    env = dict(os.environ, LC_ALL='C', LANG='C', SYSTEMD_PAGER='', SYSTEMD_COLORS='0')
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, close_fds=True,
                                start_new_session=True)
    except OSError as exc:
        return None, '%s: %s' % (argv[0], exc.strerror or exc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        return None, '%s did not finish within %s s' % (argv[0], timeout)
    text = stdout.decode('utf-8', 'replace')
    if proc.returncode != 0 or not text.strip():
        said = stderr.decode('utf-8', 'replace').strip().splitlines()
        return None, '%s exited with %d%s' % (argv[0], proc.returncode, (': ' + said[0]) if said else '')
    return text.splitlines(), None


def read_xid_events(kernel_log=None, timeout=10.0, commands=KERNEL_LOG_COMMANDS):
    """(events, warnings). events is None when no kernel log could be read.

    kernel_log: a file to read instead of running journalctl -k, then dmesg.
    """
    if kernel_log:
        try:
            with open(kernel_log, 'rb') as f:
                lines = [line.decode('utf-8', 'replace') for line in f if b'NVRM: Xid' in line]
        except (IOError, OSError) as exc:
            return None, ['kernel_log: cannot read %s (%s); xid_events are unknown'
                          % (kernel_log, exc.strerror or exc)]
        return parse_xid_events(lines), []
    problems = []
    for argv in commands:
        lines, problem = _run(argv, timeout)
        if lines is not None:
            return parse_xid_events(lines), []
        problems.append(problem)
    return None, ['the kernel log could not be read (%s); xid_events are unknown. Run with '
                  'privilege escalation or set kernel_log' % '; '.join(problems)]


def recovery_action(xid_events, remapped_rows_pending=None, remapped_rows_failure=None,
                    retired_pages_pending=None, error=None):
    """The most severe action, in RECOVERY_ACTIONS order, that the GPU's state calls for.

    Row remapping and page retirement follow NVIDIA's memory error guidance
    (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ and .../dynamic-page-retirement/):
    a pending remapping or retirement takes effect at the next GPU reset; a remapping failure
    falls under the RMA policy, which a person has to look at.
    """
    actions = ['none']
    for event in xid_events or ():
        if event['code'] == 154:
            match = XID_154_RE.search(event['text'])
            actions.append(XID_154_ACTIONS.get(int(match.group(1), 16), 'inspect') if match else 'inspect')
        else:
            actions.append(XID_ACTIONS.get(event['code'], 'inspect'))
    if remapped_rows_pending or retired_pages_pending:
        actions.append('reset_gpu')
    if remapped_rows_failure:
        actions.append('inspect')
    if error:
        # nvidia-smi's own advice for a lost GPU is to reboot; any other unreadable GPU needs a look.
        actions.append('reboot' if 'GPU is lost' in error else 'inspect')
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
