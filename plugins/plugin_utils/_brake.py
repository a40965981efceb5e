# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The fleet brake, one decision for the Slurm hook and the action gpuops.nvidia.gpu_reset.

Before a node that is not clean is drained, the nodes Slurm already has out of service with a
gpu_reset reason are counted from Slurm itself (sinfo, on the node or the host: each node
decides alone, so no local state could see the others). Two rules hold the drain back:

- count: as many nodes as max_drained (N, or N% of the cluster's, at least 1) are out already;
- rate: as many nodes as the rate's N were drained by gpu_reset within its window (the time
  Slurm gives the reason). A fault that many nodes share (a driver update, a bug in the checks)
  drains them in a burst, after their next jobs; on a large cluster the count alone lets tens
  of nodes go first, and 5 in 10 minutes is more than genuine failures reach on any fleet.

A node where no job can run (a GPU lost, memory still held) is drained all the same, the brake
overridden. The report (brake) and the reason say which rule acted.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re
import time

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import PREFIXES
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import NODE_NAME_RE

DEFAULT_DRAIN_RATE = '5/10m'
MAX_DRAINED_RE = re.compile(r'^([0-9]{1,6})(%?)\Z')
DRAIN_RATE_RE = re.compile(r'^([0-9]{1,6})/([0-9]{1,6})([smh])\Z')
UNIT_S = {'s': 1, 'm': 60, 'h': 3600}
# Longer windows than a week say nothing about a burst: the count rule covers them.
MAX_WINDOW_S = 7 * 24 * 3600
# What a node's state reads as when it takes no jobs (sinfo's %t, lower case, its flags stripped).
OUT_OF_SERVICE = ('drain', 'drng', 'down', 'fail', 'failg')
STATE_FLAGS = '*~#!%$@^-'
# One node per line (once per partition): name, state, the reason's time, the reason (last: it
# may hold '|'). SLURM_TIME_FORMAT=%s makes the time seconds since the epoch, free of time zones.
SINFO_FORMAT = '%N|%t|%H|%E'
SINFO_ENV = {'SLURM_TIME_FORMAT': '%s'}
ISO_TIME_RE = re.compile(r'^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}$')


class BrakeUnreadable(Exception):
    """Slurm could not tell which nodes are out of service; the text says why."""


def max_drained_problem(text):
    """Why text is no max_drained (a number of nodes, or N%), or None."""
    if MAX_DRAINED_RE.match(str(text or '')):
        return None
    return '%r is neither a number of nodes nor a percentage (N%%)' % (text,)


def drain_rate_problem(text):
    """Why text is no drain rate (N/W: N nodes within W seconds, minutes or hours), or None."""
    match = DRAIN_RATE_RE.match(str(text or ''))
    if not match:
        return '%r is not NODES/WINDOW, such as 5/10m (s, m or h)' % (text,)
    if int(match.group(1)) < 1 or not 1 <= window_s(text) <= MAX_WINDOW_S:
        return '%r must be at least 1 node within 1 s to 7 days' % (text,)
    return None


def window_s(rate):
    """The window of a rate (5/10m -> 600)."""
    match = DRAIN_RATE_RE.match(rate)
    return int(match.group(2)) * UNIT_S[match.group(3)]


def brake_cap(max_drained, nodes):
    """How many nodes may be out of service for gpu_reset at once: max_drained (N, or N% of
    nodes, rounded up), at least 1."""
    number, percent = MAX_DRAINED_RE.match(max_drained).groups()
    return max(1, int(math.ceil(nodes * int(number) / 100.0)) if percent else int(number))


def sinfo_argv(sinfo):
    """The sinfo command the brake reads (run with SINFO_ENV)."""
    return [sinfo, '-h', '-N', '-o', SINFO_FORMAT]


def reason_time(text):
    """The reason's time as sinfo prints it, in seconds since the epoch; None when there is none."""
    if text.isdigit():
        return int(text)
    if ISO_TIME_RE.match(text):
        # A Slurm that ignores SLURM_TIME_FORMAT prints its local time.
        return time.mktime(time.strptime(text, '%Y-%m-%dT%H:%M:%S'))
    return None


def out_for_gpu_reset(state, reason):
    return state.rstrip(STATE_FLAGS).lower() in OUT_OF_SERVICE and reason.startswith(PREFIXES)


def parse_listing(text):
    """(the cluster's nodes, {node out of service with a gpu_reset reason: the reason's time or
    None}) of sinfo_argv's output; BrakeUnreadable when it lists no node."""
    nodes, drained = set(), {}
    for line in text.splitlines():
        parts = line.split('|', 3)
        if len(parts) < 4 or not NODE_NAME_RE.match(parts[0]):
            continue
        nodes.add(parts[0])
        if out_for_gpu_reset(parts[1], parts[3]):
            drained[parts[0]] = reason_time(parts[2].strip())
    if not nodes:
        raise BrakeUnreadable('sinfo listed no node')
    return nodes, drained


def cannot_run_jobs(result):
    """Whether a job cannot run on the node as it is: a GPU lost or unreadable, or memory still
    held on one (a process left, or memory no process holds). The brake gives way to these."""
    return bool(result.get('survivors')) or any(
        gpu.get('state') in ('lost', 'orphaned_memory', 'busy', 'idle_holding') for gpu in result.get('gpus') or [])


def rule_that_holds(brake, drained, drain_rate, now):
    """(rule, its words) of the first rule that holds the drain back, or (None, None)."""
    if len(drained) >= brake['cap']:
        return 'count', 'count: %d of %d nodes drained by gpu_reset already, at most %d' % (
            len(drained), brake['nodes'], brake['cap'])
    if not drain_rate:
        return None, None
    since = now - window_s(drain_rate)
    brake['recent_drains'] = len([at for at in drained.values() if at is not None and at >= since])
    if brake['recent_drains'] >= int(drain_rate.split('/')[0]):
        return 'rate', 'rate: %d nodes drained by gpu_reset within %d s, at most %s' % (
            brake['recent_drains'], window_s(drain_rate), drain_rate)
    return None, None


def brake_holds(result, node, read_listing, max_drained, drain_rate=None, now=None):
    """Whether the fleet brake keeps node in service although it is not clean (result: its
    report, whose brake and reason say what the brake did). read_listing(): sinfo_argv's output,
    or BrakeUnreadable; a listing that cannot be read is said, and the node drained as without
    a brake."""
    try:
        nodes, drained = parse_listing(read_listing())
    except BrakeUnreadable as exc:
        result['brake'] = {'held': False, 'why': 'the drained nodes could not be counted: %s' % exc}
        return False
    drained.pop(node, None)
    brake = result['brake'] = {'held': False, 'drained_nodes': len(drained), 'nodes': len(nodes),
                               'cap': brake_cap(max_drained, len(nodes))}
    if drain_rate:
        brake['rate'] = drain_rate
    rule, words = rule_that_holds(brake, drained, drain_rate, time.time() if now is None else now)
    if rule is None:
        return False
    brake['rule'] = rule
    if cannot_run_jobs(result):
        brake['overridden'] = True
        # First: the drain reason keeps its first characters (_drain.REASON_CHARS).
        result['reason'] = 'the brake (%s) is overridden, no job can run here: %s' % (words, result['reason'])
        return False
    brake['held'] = True
    result['reason'] = '%s; not drained: the brake holds (%s)' % (result['reason'], words)
    return True
