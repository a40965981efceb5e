# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Errors and option specs shared by the collection's modules."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re
import time


DEFAULT_DEVICES = ['/dev/nvidia*']

# NVIDIA's own daemons and the display servers: stopping them can wedge a GPU until a
# reboot (persistenced, fabric manager) or take down a desktop, so they are never signalled.
DEFAULT_PROTECT = [
    'nvidia-persistenced',
    'nvidia-fabricmanager',
    'nv-fabricmanager',
    'nv-hostengine',
    'dcgm-exporter',
    'nvidia-powerd',
    'nvidia-imex',
    'nvsm_core',                # NVIDIA System Management, holds every GPU on DGX (sample H01)
    'nvidia-device-plugin',     # Kubernetes device plugin (stopped by mig-parted's hooks, H04)
    'gpu-feature-discovery',    # Kubernetes GPU feature discovery (H04)
    'nvidia-cuda-mps-control',  # the MPS control daemon: NVIDIA's MPS guide stops it with `quit`
    'Xorg',
    'Xwayland',
    'gnome-shell',              # the display manager's session on a workstation (H01)
]

# The longest wait the kernel's poll() accepts, in seconds (milliseconds in a C int).
MAX_SECONDS = 2147483


# Memory used (MiB, allocated memory as nvidia-smi and NVML v2 report it, without what the
# driver reserves) at or below which a GPU with no process is free. Real idle GPUs are not at
# 0: the highest idle readings in real-samples/ are 7.8 MB on an A100 (NVML v2,
# smi_query_gpu/Q09_nvml_v1_used_idle.txt), 3.5 MiB on an H100 NVL (Q09) and 0-1 MiB on H100
# and H200 (Q08_idle_memory_tables.txt). A process that still holds a CUDA context holds a
# few hundred MiB (about 500 MiB on an H100), as do the smallest allocations of real holders
# (smi_compute_apps/A01: 185 MiB). 32 MiB is four times the highest idle reading and far below
# any CUDA context. NVML v1 `used` includes the reserved memory (Q09: 516 MiB on an idle A10)
# and cannot be judged with it; the NVML reader uses v2 and says so when it cannot.
DEFAULT_MEMORY_THRESHOLD_MIB = 32


# From the nvidia-smi man page, "RETURN VALUE". NVML's error codes share the numbers.
EXIT_CODES = {
    2: 'invalid argument or flag',
    3: 'the requested operation is not available on the target device',
    4: 'insufficient permissions',
    6: 'the query was unsuccessful',
    8: 'external power cables are not attached',
    9: 'the NVIDIA driver is not loaded',
    10: 'the NVIDIA kernel driver detected an interrupt issue with a GPU',
    12: 'the NVML shared library could not be found or loaded',
    13: 'the local NVML version does not implement this function',
    14: 'the infoROM is corrupted',
    15: 'a GPU has fallen off the bus or has otherwise become inaccessible',
    18: 'the driver and the NVML library versions do not match (reload the driver or reboot)',
    255: 'internal driver error',
}

# What the driver prints in place of a process name it cannot read (real-samples
# smi_compute_apps/A02): the name is null.
UNREPORTED_PROCESS_NAMES = frozenset(['[Not Found]', '[Insufficient Permissions]', '[N/A]', '[Unknown Error]'])


# Characters that must not reach a log line, a terminal or scontrol raw: C0 and C1 controls
# (newlines start forged lines, ESC and CSI/OSC drive terminals), DEL, and the Unicode line
# and bidirectional-override characters.
UNPRINTABLE_RE = re.compile(u'[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]')


def printable(text, limit=None, backslashes=True):
    """User-chosen text (a process name, a command line, a path) made safe to print on one line.

    Control characters become \\xNN or \\uNNNN escapes, and so does the backslash itself, so
    that what is printed cannot be mistaken for an escape that was there (backslashes=False for
    text made printable once already); limit caps the length, saying how much was left out."""
    if text is None:
        return None
    text = UNPRINTABLE_RE.sub(_escape, text.replace('\\', '\\\\') if backslashes else text)
    if limit is not None and len(text) > limit:
        return '%s...(%d more characters)' % (text[:limit], len(text) - limit)
    return text


def _escape(match):
    code = ord(match.group(0))
    return '\\x%02x' % code if code < 0x100 else '\\u%04x' % code


class GpuopsError(Exception):
    """An error with a message meant for the operator; modules turn it into fail_json."""


class PermanentReadError(GpuopsError):
    """The GPUs cannot be read and asking again will not help (no driver, no library, no
    nvidia-smi that runs): a caller stops retrying at once."""


# The verdict on a call that hangs in the driver past its deadline (a process in D state in
# nvidia's code, or the kernel log's full-chip reset): its words begin so (see _reason).
DRIVER_HUNG = 'driver_hung'


class DriverHung(PermanentReadError):
    """A call hung in the NVIDIA driver past its deadline: nothing but a reboot frees it, so no
    retry is made and nothing else is signalled. gpus: the indexes it is known to concern (none
    when the caller cannot tell which GPU: the host)."""

    def __init__(self, message, gpus=()):
        super(DriverHung, self).__init__(message)
        self.gpus = list(gpus)


# The least time a call to nvidia-smi, NVML, the CUDA driver or any other program is started
# with. A real nvidia-smi call with persistence mode on takes 50 to 150 ms; 0.5 s is over three
# times the slowest, room for a loaded host. A call given less would be killed before a healthy
# driver answers, and blamed on the driver: with less left, the call is not made.
CALL_FLOOR_S = 0.5
# The shortest timeout of a release or a probe: a read of the GPUs at the start and one at the end,
# each given at least CALL_FLOOR_S, with the time between for the work.
MIN_TIMEOUT_S = 4 * CALL_FLOOR_S
# The last read of the GPUs, which reports the state at the end, may take this long after
# the signalling stops; the signalling stops that much before the timeout. Twice a call's floor
# (CALL_FLOOR_S): the read starts a little after the signalling stops, and may be two calls.
READ_MIN_S = 2 * CALL_FLOOR_S


class NoTimeLeft(GpuopsError):
    """A call not made: less than CALL_FLOOR_S was left for it within the timeout."""


class Budget:
    """The timeout of a task, spent phase by phase: when a step finds less left than it needs,
    its message says where the rest went."""

    def __init__(self, task, timeout, clock=time.monotonic):
        self.task = task
        self.timeout = timeout
        self.clock = clock
        self.started = clock()
        self.spent = {}
        self.order = []

    def spend(self, phase, since):
        """Count the time from since (on clock) to now against phase."""
        if phase not in self.spent:
            self.spent[phase] = 0.0
            self.order.append(phase)
        self.spent[phase] += max(self.clock() - since, 0.0)

    def used(self):
        """'the release used 2.7 s of 3.0 s: scan of /proc 0.4 s, waiting for the holders to exit 2.3 s'."""
        phases = ', '.join('%s %.1f s' % (phase, self.spent[phase]) for phase in self.order if self.spent[phase] >= 0.05)
        return '%s used %.1f s of %.1f s%s' % (self.task, self.clock() - self.started, self.timeout,
                                               ': ' + phases if phases else '')


def check_time_left(what, left):
    """Raise NoTimeLeft when left (seconds) is less than a call of what is given at least."""
    if left < CALL_FLOOR_S:
        raise NoTimeLeft('no time was left within the timeout to %s (%.2f s left; a call is given at least %.1f s)'
                         % (what, max(left, 0.0), CALL_FLOOR_S))


def reader_argument_spec():
    """Options of the GPU state reader, shared by every module that reads the GPUs."""
    return dict(
        backend=dict(type='str', default='auto', choices=['auto', 'nvml', 'nvidia-smi']),
        nvidia_smi_path=dict(type='str', default='nvidia-smi'),
        host_root=dict(type='path', default='/'),
        expected_gpus=dict(type='int'),
        state_dir=dict(type='path'),
    )


def holders_argument_spec():
    """Options of holder discovery, shared by every module that looks for holders."""
    return dict(
        devices=dict(type='list', elements='str', default=list(DEFAULT_DEVICES)),
        protect=dict(type='list', elements='str', default=list(DEFAULT_PROTECT)),
        extra_protect=dict(type='list', elements='str', default=[]),
    )


def check_seconds(name, value, positive=False):
    """Return an error message when value is not a usable number of seconds, or None."""
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return '%s must be a finite number of seconds, got %s' % (name, value)
    if positive and value <= 0:
        return '%s must be more than 0 seconds, got %s' % (name, value)
    if value < 0:
        return '%s must be zero or more, got %s' % (name, value)
    if value > MAX_SECONDS:
        return '%s must be at most %d seconds, got %s' % (name, MAX_SECONDS, value)
    return None


def check_non_negative(params, names):
    """Return an error message for the first option in names that is negative, or None."""
    for name in names:
        value = params.get(name)
        if value is not None and value < 0:
            return '%s must be zero or more, got %s' % (name, value)
    return None
