# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Each GPU's history, by GPU UUID, kept across reboots: the resets, the reboots asked for, the
cures, the failed cures and the probes' results, each with its time and reason.

It lives in /var/lib/gpuops (under host_root on a simulated host; in state_dir/history when a
state_dir is given), a directory kept as the state directory is (_state.StateDir: opened by
descriptor from /, created 0700, refused when it is a link, another user's or writable by others,
or below a directory another user could swap it in; files read and written through that
descriptor, atomically, never through a link; a file that is not what this module wrote is
ignored with a warning). Unlike /run/gpuops it survives a reboot, so a GPU
whose fault returns after every cure is seen to do so (hold_reason), and is held for a person.

Bounded: the newest MAX_EVENTS events of each GPU, the MAX_GPUS GPUs seen last; a probe that
passes again, or a hold said again, adds to the last such event (count) instead of a new one, so
that every job's probe cannot push the resets out.

An operator clears a GPU's history (or every GPU's) with
python -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook --clear-history UUID|all.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import tempfile
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir

HISTORY_DIR = '/var/lib/gpuops'
HISTORY = 'history.json'
# Per GPU: a GPU reset every day for a year would need 365; the escalation needs the last week.
MAX_EVENTS = 100
# GPUs kept (those with the newest events): a host has at most a few dozen.
MAX_GPUS = 256
# Events the facts and the report show per GPU (the newest).
SHOWN = 10
# The windows the facts and the report count events in.
WINDOWS = (('1d', 86400), ('7d', 7 * 86400), ('30d', 30 * 86400))
# What an event is: a GPU reset that worked, one that failed, a reboot asked for, a cure (how:
# reset or probe, as _state.record_cure records it), a fault that came back after the cures
# (cure_failed: the GPU is held for a person), a probe's result (result: pass or fail).
KINDS = ('reset', 'reset_failed', 'reboot_asked', 'cure', 'cure_failed', 'probe', 'not_attempted')
# What became of a cure tried or due (outcome, on each event of the kinds that say so): cured (the
# GPU read clean after it: proof says by what), cure_failed, not_attempted (why: the reason),
# escalated (to: what comes next, reboot), held (for a person).
OUTCOMES = ('cured', 'cure_failed', 'not_attempted', 'escalated', 'held')
# The cures counted by kind in a summary: a GPU reset that worked, a probe whose kernel checked
# every probed byte, a reboot asked for.
CURE_KINDS = ('reset', 'probe', 'reboot')
# What counts as a cure tried, for the escalation: the remedies, not the probes that follow them.
CURES_TRIED = ('reset', 'reboot_asked')
# Kinds whose repeat (same kind, reason and result as the last event) is counted on that event.
MERGED = ('probe', 'cure_failed', 'reset_failed', 'not_attempted')
# A fault that comes back after this many cures within HOLD_WINDOW_DAYS is not cured again: it
# goes to a person. Defaults from the field's anchors: NVSentinel sends a node remediated more
# than once in 7 days to a person; gpud escalates to hardware inspection after 2 reboots that did
# not cure an Xid (DefaultRebootThreshold = 2).
HOLD_AFTER_CURES = 2
HOLD_WINDOW_DAYS = 7.0
MAX_HOLD_AFTER_CURES = 100
MAX_HOLD_WINDOW_DAYS = 365.0
# The retry budgets within hold_window_days: GPU resets tried per GPU (worked or not), reboots
# asked for per node. Past them the GPU or the node is held for a person, whatever the cures did.
RESET_BUDGET = 3
REBOOT_BUDGET = 2
MAX_BUDGET = 100
# The kinds that spend each budget.
SPENDS = {'reset': ('reset', 'reset_failed'), 'reboot': ('reboot_asked',)}
UUID_RE = re.compile(r'^GPU-[0-9A-Fa-f-]{8,64}\Z')
REASON_CHARS = 300


def check_hold_options(hold_after_cures, hold_window_days, reset_budget=RESET_BUDGET, reboot_budget=REBOOT_BUDGET):
    """GpuopsError, the message starting with the option's name, when the escalation's threshold,
    window or budgets are not sane."""
    for name, cure, value in (('reset_budget', 'resets', reset_budget), ('reboot_budget', 'reboots', reboot_budget)):
        if value is None or isinstance(value, bool) or not 1 <= value <= MAX_BUDGET:
            raise GpuopsError('%s must be between 1 and %d (the %s tried within hold_window_days before a person '
                              'is asked), got %s' % (name, MAX_BUDGET, cure, value))
    if hold_after_cures is None or not 1 <= hold_after_cures <= MAX_HOLD_AFTER_CURES:
        raise GpuopsError('hold_after_cures must be between 1 and %d (the cures tried before a fault that returns '
                          'goes to a person), got %s' % (MAX_HOLD_AFTER_CURES, hold_after_cures))
    if hold_window_days is None or not 0 < hold_window_days <= MAX_HOLD_WINDOW_DAYS:
        raise GpuopsError('hold_window_days must be more than 0 and at most %d days, got %s'
                          % (MAX_HOLD_WINDOW_DAYS, hold_window_days))


def default_history_dir(host_root='/', euid=None):
    """/var/lib/gpuops for root (it survives a reboot, unlike /run); under host_root on a
    simulated host; another user's own directory in the temporary directory."""
    euid = os.geteuid() if euid is None else euid
    if host_root and os.path.normpath(host_root) != '/':
        return os.path.join(host_root, HISTORY_DIR.lstrip('/'))
    if euid == 0:
        return HISTORY_DIR
    return os.path.join(tempfile.gettempdir(), 'gpuops-history-%d' % euid)


def _valid_event(event):
    if not isinstance(event, dict):
        return False
    when = event.get('time')
    timed = isinstance(when, (int, float)) and not isinstance(when, bool)
    return timed and event.get('kind') in KINDS and isinstance(event.get('reason'), str)


def _valid_uuid(uuid):
    return isinstance(uuid, str) and bool(UUID_RE.match(uuid))


def _valid_events(events):
    """The valid events of a list of them, oldest first, the newest MAX_EVENTS."""
    kept = [event for event in events if _valid_event(event)] if isinstance(events, list) else []
    return sorted(kept, key=lambda event: event['time'])[-MAX_EVENTS:]


def parse_history(data):
    """({uuid: [events, oldest first]}, [the node's events]) of a history file's data: only what
    is valid (anything else, a file that is no history, gives nothing)."""
    data = data if isinstance(data, dict) else {}
    gpus = data.get('gpus') if isinstance(data.get('gpus'), dict) else {}
    found = dict((uuid, _valid_events(events)) for uuid, events in gpus.items() if _valid_uuid(uuid))
    return dict((uuid, events) for uuid, events in found.items() if events), _valid_events(data.get('node'))


class History:
    """The GPUs' history in a state directory (a _state.StateDir)."""

    def __init__(self, state):
        self.state = state

    @classmethod
    def for_host(cls, host_root='/', state_dir=None):
        """The history of the host (host_root); beside the state when a state_dir is given (its
        history directory: the user chose where the collection keeps its state)."""
        path = os.path.join(state_dir, 'history') if state_dir else default_history_dir(host_root)
        # A simulated host: its /var/lib may not exist yet.
        simulated = bool(host_root) and os.path.normpath(host_root) != '/'
        return cls(StateDir(path, parents=simulated))

    @property
    def warnings(self):
        found = list(self.state.warnings)
        unusable = self.state.unusable_warning('no GPU history is kept, and a fault that returns after its cures is '
                                               'not held for a person')
        return ([unusable] if unusable else []) + found

    def gpus(self):
        """{uuid: [events, oldest first]}, what is valid of the file."""
        return parse_history(self.state.load(HISTORY))[0]

    def events(self, uuid):
        return self.gpus().get(uuid, [])

    def uuid_at(self, pci_bus_id):
        """The UUID whose newest event was at pci_bus_id (a lost GPU's UUID cannot be read), or None."""
        found = [(events[-1]['time'], uuid) for uuid, events in self.gpus().items()
                 if pci_bus_id and any(event.get('pci_bus_id') == pci_bus_id for event in events)]
        return max(found)[1] if found else None

    def node_events(self):
        """[events, oldest first] of the node itself (reboots asked for, whatever GPU they were for)."""
        return parse_history(self.state.load(HISTORY))[1]

    def record(self, gpus, kind, when=None, **extra):
        """Add an event of kind to each GPU of gpus ([(uuid, index, reason[, pci_bus_id])]);
        extra: its other keys (how, result, outcome, why, to, duration_s, proof). False when it
        could not be written."""
        if extra.get('outcome') not in (None,) + OUTCOMES:
            raise GpuopsError('history: %r is no outcome (%s)' % (extra.get('outcome'), ', '.join(OUTCOMES)))
        gpus = [tuple(gpu) + (None,) * (4 - len(gpu)) for gpu in gpus if _valid_uuid(gpu[0])]
        if not gpus or not self.state.usable:
            return False
        when = round(time.time() if when is None else float(when), 3)
        known = self.gpus()
        for uuid, index, reason, bus in gpus:
            event = dict(extra, time=when, kind=kind, index=index, reason=printable(reason or '', REASON_CHARS))
            if bus:
                event['pci_bus_id'] = str(bus)
            _add(known.setdefault(uuid, []), event)
        return self._save(known, self.node_events())

    def record_node(self, kind, reason, when=None, **extra):
        """Add an event of kind to the node's own events. False when it could not be written."""
        if not self.state.usable:
            return False
        when = round(time.time() if when is None else float(when), 3)
        events = self.node_events()
        _add(events, dict(extra, time=when, kind=kind, index=None, reason=printable(reason or '', REASON_CHARS)))
        return self._save(self.gpus(), events)

    def _save(self, gpus, node_events):
        newest = sorted(gpus.items(), key=lambda item: item[1][-1]['time'], reverse=True)[:MAX_GPUS]
        return self.state.save(HISTORY, {'gpus': dict(newest), 'node': node_events[-MAX_EVENTS:]})

    def clear(self, uuid):
        """Forget uuid's history ('all': every GPU's, and the node's reboots); the UUIDs forgotten."""
        known, node = self.gpus(), self.node_events()
        gone = sorted(known) if uuid == 'all' else [uuid] if uuid in known else []
        for name in gone:
            del known[name]
        forgets_node = uuid == 'all' and bool(node)
        if (gone or forgets_node) and not self._save(known, [] if forgets_node else node):
            raise GpuopsError('the history in %s could not be written: %s' % (self.state.path, '; '.join(self.warnings)))
        return gone

    def summary(self, uuid, now=None):
        """What the facts and the report show of a GPU's history: its newest SHOWN events and how
        many events of each kind fell in each window (counts: {'7d': {'reset': 2}})."""
        return summarize(self.events(uuid), now)

    def hold_reason(self, uuid, index, fault, after=HOLD_AFTER_CURES, window_days=HOLD_WINDOW_DAYS, now=None):
        """Why the GPU, whose fault is back, goes to a person instead of another cure, or None: it
        was held before (until its history is cleared), or after cures were tried within window_days."""
        events = self.events(uuid)
        now = time.time() if now is None else now
        tried = [event for event in events if event['kind'] in CURES_TRIED and now - event['time'] <= window_days * 86400]
        held = [event for event in events if event['kind'] == 'cure_failed']
        if len(tried) < after and not held:
            return None
        tried = tried or [event for event in events if event['kind'] in CURES_TRIED][-after:]
        cures = ', '.join('%s %s' % (event['kind'].replace('_asked', ''), _stamp(event['time'])) for event in tried[-5:])
        return 'GPU %s (%s): %s, back after %d cure(s) within %g days (%s): not cured again, held for a person' % (
            index, uuid, fault, len(tried), window_days, cures or 'held before')


def budget_spent(events, cure, budget, window_days, now=None):
    """Why the cure (reset, reboot) is not tried again, its budget spent by events (a GPU's, or the
    node's for reboots) within window_days, or None."""
    now = time.time() if now is None else now
    spent = [event for event in events if event['kind'] in SPENDS[cure] and now - event['time'] <= window_days * 86400]
    # A repeated failure is one event with its count (_add); each try spends the budget (its last
    # time in the window counts them all: a budget is spent early rather than late).
    tries = sum(event_count(event) for event in spent)
    if tries < budget:
        return None
    tried = ', '.join(_stamp(event['time']) for event in spent[-5:])
    return 'its %s budget is spent: %d %s(s) within %g days (%s), at most %d: not tried again, held for a person' % (
        cure, tries, cure, window_days, tried, budget)


def event_count(event):
    """How many times event happened: a repeat is counted on the last event (_add)."""
    return event['count'] if isinstance(event.get('count'), int) and event['count'] > 1 else 1


def _add(events, event):
    """event appended to events, or counted on the last one when it repeats it (MERGED kinds): the
    last one then says what the newest said (its time, error, outcome, duration)."""
    last = events[-1] if events else None
    if last and event['kind'] in MERGED and all(last.get(key) == event.get(key) for key in ('kind', 'reason', 'result', 'index')):
        count = event_count(last) + 1
        last.clear()
        last.update(event, count=count)
    else:
        events.append(event)
    del events[:-MAX_EVENTS]


def summarize(events, now=None):
    now = time.time() if now is None else now
    counts = {}
    for name, seconds in WINDOWS:
        counts[name] = {}
        for event in events:
            if now - event['time'] <= seconds:
                counts[name][event['kind']] = counts[name].get(event['kind'], 0) + event_count(event)
    cures = {}
    for event in events:
        how = 'reboot' if event['kind'] == 'reboot_asked' else event.get('how') if event['kind'] == 'cure' else None
        if how in CURE_KINDS:
            cures[how] = cures.get(how, 0) + event_count(event)
    return {'events': events[-SHOWN:], 'counts': counts, 'incidents': incidents(events), 'cures': cures}


def _is_fault(event):
    """An event that says the GPU was not well: a cure tried or due, a hold, a probe that failed."""
    return event['kind'] in ('reset', 'reset_failed', 'reboot_asked', 'cure_failed', 'not_attempted') or (
        event['kind'] == 'probe' and event.get('result') == 'fail')


def _is_cure(event):
    return event['kind'] == 'cure' or event.get('outcome') == 'cured'


def incidents(events):
    """The GPU's incidents in its history (events oldest first): each opens at the first fault
    event after the last cure (less the duration of the attempt it records) and closes at the
    next cure. {repair_s: [seconds from each closed incident's start to its cure], between_s:
    [seconds between the starts of consecutive incidents], open_since: the start of the incident
    still open, or None}."""
    repair, between, starts, opened = [], [], [], None
    for event in events:
        if opened is None and _is_fault(event):
            opened = event['time'] - float(event.get('duration_s') or 0)
            if starts:
                between.append(round(opened - starts[-1], 3))
            starts.append(opened)
        if opened is not None and _is_cure(event):
            repair.append(round(max(event['time'] - opened, 0.0), 3))
            opened = None
    return {'repair_s': repair, 'between_s': between, 'open_since': opened}


def _stamp(when):
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(when))
