# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The release's rules for its options, apart from the release: the controller checks the
settings by them (the action, the Slurm hook) before any host is touched, without loading the
release's code (the collection loader compiles every module it imports, in every worker)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import signal

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, MIN_TIMEOUT_S, GpuopsError, check_seconds, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import GPU_FORMS, parse_gpu, split_gpus

DEFAULT_SIGNALS = ['TERM', 'KILL']

# A threshold above this is no test of idle memory (a whole GPU of the smallest data-centre kind).
MAX_MEMORY_THRESHOLD_MIB = 16384


# An entry of reset_stop_units: a unit name (systemd.unit(5)'s characters) with shell glob characters.
STOP_UNIT_RE = re.compile(r'^[A-Za-z0-9:_.@\\*?\[\]-]{1,255}\Z')


def seconds(value):
    """A duration for a message: 2.9994035 -> '3.0 s'."""
    return '%.1f s' % value


def check_release_options(devices, gpus=None, signals=None, grace_period=5.0, timeout=60.0,
                          memory_threshold_mib=32, protect=(), settle_time=None, expected_gpus=None):
    """(signals as (NAME, number) pairs, gpus sorted, each once) of valid options; GpuopsError,
    the message starting with the option's name, for the first one that is not."""
    for problem in (check_seconds('timeout', timeout, positive=True),
                    check_seconds('grace_period', grace_period),
                    check_seconds('settle_time', settle_time)):
        if problem:
            raise GpuopsError(problem)
    if timeout < MIN_TIMEOUT_S:
        raise GpuopsError('timeout must be at least %s (the GPUs are read at the start and at the end, each read '
                          'given at least %s), got %s' % (seconds(MIN_TIMEOUT_S), seconds(CALL_FLOOR_S), timeout))
    if not 0 <= memory_threshold_mib <= MAX_MEMORY_THRESHOLD_MIB:
        raise GpuopsError('memory_threshold_mib must be between 0 and %d MiB (idle GPUs read up to 8 MiB, '
                          'a CUDA context hundreds), got %s' % (MAX_MEMORY_THRESHOLD_MIB, memory_threshold_mib))
    parsed = _check_signals(DEFAULT_SIGNALS if signals is None else signals)
    for name in protect:
        if not name.strip('*?'):
            raise GpuopsError('extra_protect: %r matches every process, so nothing would ever be released; '
                              'name the programs to protect (e.g. my-daemon or my-daemon*)' % (name,))
    ladder = grace_period * (len(parsed) - 1)
    if ladder >= timeout:
        raise GpuopsError('signals %s with grace_period %s take %s before the last signal, which does not fit '
                          'in timeout %s; raise timeout or lower grace_period'
                          % ('[%s]' % ', '.join(name for name, dummy in parsed), seconds(grace_period),
                             seconds(ladder), seconds(timeout)))
    if not devices:
        raise GpuopsError('devices must name at least one device node glob, e.g. /dev/nvidia*')
    for pattern in devices:
        if not pattern or not os.path.isabs(pattern):
            raise GpuopsError('devices: %r is not an absolute path or glob (e.g. /dev/nvidia*)' % (pattern,))
    if expected_gpus is not None and expected_gpus < 0:
        raise GpuopsError('expected_gpus must be zero or more, got %s' % expected_gpus)
    return parsed, _check_gpus(gpus)


def check_escalation_options(bug_report_dir=None, bug_report_timeout=120.0, reset_stop_units=()):
    """GpuopsError, the message starting with the option's name, for the first option of the
    reset's escalation (the units stopped around it, the bug report after a failed one) that is
    not valid."""
    problem = check_seconds('bug_report_timeout', bug_report_timeout, positive=True)
    if problem:
        raise GpuopsError(problem)
    if bug_report_dir is not None and not os.path.isabs(bug_report_dir):
        raise GpuopsError('bug_report_dir: %r is not an absolute path' % (bug_report_dir,))
    for pattern in reset_stop_units or ():
        if not STOP_UNIT_RE.match(pattern) or not pattern.strip('*?'):
            raise GpuopsError('reset_stop_units: %r is no systemd unit name or glob of one (e.g. '
                              'nvidia-dcgm.service or nvsm*.service); a bare * would allow every unit' % (pattern,))


def _check_signals(signals):
    if not signals:
        raise GpuopsError('signals must name at least one signal, e.g. [TERM, KILL]')
    parsed = [parse_signal(name) for name in signals]
    if any(name == 'KILL' for name, dummy in parsed[:-1]):
        raise GpuopsError('signals: KILL must come last (%s): no process is left to get a signal after it'
                          % ', '.join(name for name, dummy in parsed))
    return parsed


def _check_gpus(gpus):
    if gpus is None:
        return None
    if not gpus:
        raise GpuopsError('gpus: name at least one GPU index, or leave gpus out for every GPU')
    parsed = [parse_gpu(value) for value in gpus]
    bad = [value for value, gpu in zip(gpus, parsed) if gpu is None]
    if bad:
        raise GpuopsError('gpus: %s is not %s' % (printable(repr(bad[0]), 100), GPU_FORMS))
    bad = [index for index in parsed if isinstance(index, int) and index < 0]
    if bad:
        raise GpuopsError('gpus: GPU indexes are zero or more, got %s' % bad[0])
    whole, instances = split_gpus(parsed)
    return sorted(set(whole)) + sorted(set(instances))


# Signals whose default action stops, continues or ignores a process: a ladder of them would
# leave the job (and its GPU memory) in place, frozen or untouched.
NOT_TERMINATING = ('STOP', 'TSTP', 'TTIN', 'TTOU', 'CONT', 'CHLD', 'URG', 'WINCH')


def parse_signal(value):
    """(NAME, number) for a terminating signal given as TERM, SIGTERM, term or 15."""
    text = str(value).strip()
    if text.isdigit():
        try:
            member = signal.Signals(int(text))
        except ValueError:
            raise GpuopsError('signals: %s is not a signal number on this host' % text)
    else:
        name = text.upper()
        if not name.startswith('SIG'):
            name = 'SIG' + name
        member = signal.Signals.__members__.get(name)
        if member is None:
            raise GpuopsError('signals: unknown signal %r (use names such as TERM, INT, KILL)' % (value,))
    name = member.name[3:]
    if name in NOT_TERMINATING:
        raise GpuopsError('signals: SIG%s does not end a process (by default it stops, continues or is '
                          'ignored); use terminating signals such as INT, TERM, KILL' % name)
    return name, int(member)
