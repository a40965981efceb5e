# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Release of the GPUs: stop the processes holding them and prove the memory is free.

Order: discover holders, leave protected ones alone, walk every other holder through the
signal ladder. Processes that appear meanwhile join the ladder: at the step their relative
(parent, session or cgroup) has reached, or from the first step when unrelated. The last
step, when it is KILL, stops the whole set with SIGSTOP first, so that no fork can escape
it. Poll until no unprotected holder is left and every GPU in scope reports memory at or
below the threshold, then watch for a settle window that nothing comes back. Everything,
grace periods included, fits in the timeout.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import resource
import select
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    CALL_FLOOR_S,
    DEFAULT_MEMORY_THRESHOLD_MIB,
    READ_MIN_S,
    Budget,
    GpuopsError,
    holders_argument_spec,
    printable,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gather_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import (
    named_unread,
    partial_warning,
    supervisor,
    uninspectable_warning,
    unread_processes,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import device_patterns
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.jobs import check_job
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.ladder import FD_RESERVE, Ladder
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.lock import ReleaseLock
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.observation import Observer, process_key
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import (
    DEFAULT_SIGNALS,
    check_escalation_options,
    check_release_options,
    seconds,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import RELEASE_PROBE_SPEC, probe_after_release, probe_scope
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.reset_plan import due_entries, not_released, reset_plan
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import split_gpus
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import (
    HOLD_AFTER_CURES, HOLD_WINDOW_DAYS, RESET_BUDGET, History, check_hold_options)
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import Signaller

# After the GPUs read clean, how long to watch that no holder comes back, counted from the
# moment the last holder exited so that it overlaps the driver's own release of the memory.
# systemd restarts a unit after RestartSec=100ms by default; supervisors that restart a job
# within a second (the restart delay plus the start of a process that opens the devices early)
# are caught; slower ones are the next release's business.
DEFAULT_SETTLE_S = 1.0

# Each poll scans /proc and reads every GPU: on a host with many processes that is not free,
# and a driver takes a fraction of a second or more to free the memory of a process that exited.
POLL_MIN_S = 0.05
POLL_MAX_S = 0.25
POLL_GROWTH = 2
# While memory that no process holds waits for the driver, nothing on the host can free it sooner:
# the reads grow further apart, up to this.
UNHELD_POLL_MAX_S = 1.0
# After the last signals at the deadline, how long to wait for the processes to exit before
# the final reading.
FINAL_EXIT_S = 0.2

# With reset_orphaned, the share of the timeout kept for the reset: waiting for the driver to free
# memory that no process holds ends that much before the signalling would, at the latest.
RESET_SHARE = 1.0 / 3
# How long memory that no process holds is waited for before it is called orphaned. The driver
# frees a process's memory as the process exits: its /dev/nvidia* descriptors are closed in
# do_exit (sgl-project/sglang#36589), where a killed server's 29 GiB were gone by the next poll
# of a GPU-idle gate, 2 s later. Memory that outlives its process in public reports stays for
# minutes, or until a reset or a reboot (PaddlePaddle/PaddleOCR#2074, dbolya/yolact#332,
# qizhou000/VisEdit#5); none shows a driver slower than that poll. gpusim's benchmarks give the
# driver a 1 s release delay. 5 s is more than twice the 2 s observed. Counted from the first
# read that finds the memory held by no process.
ORPHAN_WAIT_S = 5.0


REGEX_HINT_RE = re.compile(r'\.[*+]|[\\^$+(){}|]')
REASONS = ('uninterruptible', 'zombie', 'respawned', 'ignored_signals', 'not_permitted')
# Why released is false although the GPUs read clean: the settle window did not fit in the timeout.
NOT_SETTLED = 'not_settled'


def release_argument_spec():
    spec = dict(
        gpus=dict(type='list', elements='raw'),
        signals=dict(type='list', elements='str', default=list(DEFAULT_SIGNALS)),
        grace_period=dict(type='float', default=5.0),
        wait=dict(type='bool', default=True),
        timeout=dict(type='float', default=60.0),
        settle_time=dict(type='float', default=DEFAULT_SETTLE_S),
        memory_threshold_mib=dict(type='int', default=DEFAULT_MEMORY_THRESHOLD_MIB),
        lock_file=dict(type='path'),
        facts_after=dict(type='bool', default=False),
        reset_orphaned=dict(type='bool', default=False),
        hold_after_cures=dict(type='int', default=HOLD_AFTER_CURES),
        hold_window_days=dict(type='float', default=HOLD_WINDOW_DAYS),
        reset_budget=dict(type='int', default=RESET_BUDGET),
        kernel_log=dict(type='path'),
        job=dict(type='dict', options=dict(
            id=dict(type='str', required=True),
            uid=dict(type='int'),
            shared_gpus=dict(type='list', elements='int', default=[]),
            live_jobs=dict(type='dict'),
            scontrol=dict(type='str'),
        )),
        probe=dict(type='dict', options=RELEASE_PROBE_SPEC),
    )
    spec.update(reader_argument_spec())
    spec.update(holders_argument_spec())
    return spec


# The reset's own options (nvidia_device_reset's, _cure.escalation.reset_argument_spec), carried by the
# release's options for its escalation; None: the reset's defaults.
RESET_OPTIONS = ('reset_reload_modules', 'bug_report_dir', 'bug_report_timeout', 'reset_stop_units')


class ReleaseOptions:
    """Validated options of a release, by the names of release_argument_spec (and RESET_OPTIONS);
    an option not given takes the spec's default."""

    def __init__(self, devices, **given):
        spec = release_argument_spec()
        unknown = sorted(set(given) - set(spec) - set(RESET_OPTIONS))
        if unknown:
            raise TypeError('ReleaseOptions: no option %s' % ', '.join(unknown))
        values = dict((name, option.get('default')) for name, option in spec.items())
        values.update(dict.fromkeys(RESET_OPTIONS))
        values.update(given)
        protect = list(values['protect'] or ()) + list(values['extra_protect'] or ())
        check_hold_options(values['hold_after_cures'], values['hold_window_days'], values['reset_budget'])
        self.hold_after_cures, self.hold_window_days = values['hold_after_cures'], values['hold_window_days']
        self.reset_budget = values['reset_budget']
        self.signals, gpus = check_release_options(devices, values['gpus'], values['signals'], values['grace_period'],
                                                   values['timeout'], values['memory_threshold_mib'], protect,
                                                   values['settle_time'], values['expected_gpus'])
        check_escalation_options(values['bug_report_dir'], values['bug_report_timeout'], values['reset_stop_units'])
        self.job = check_job(values['job'])
        self.probe = values['probe']
        # Device globs as found under host_root (a simulated host, or the host's /dev in a container).
        self.host_root = values['host_root'] or '/'
        self.devices = device_patterns(devices, self.host_root)
        # Whole GPUs by index (None: every GPU), and the MIG instances named (N:G, N:G:C, MIG UUIDs).
        self.gpus, self.instances = split_gpus(gpus)
        self.protect = protect
        for name in ('grace_period', 'wait', 'timeout', 'settle_time', 'memory_threshold_mib', 'lock_file', 'facts_after',
                     'reset_orphaned', 'expected_gpus', 'state_dir', 'kernel_log') + RESET_OPTIONS:
            setattr(self, name, values[name])
        self.nvidia_smi_path = values['nvidia_smi_path'] or 'nvidia-smi'
        self.warnings = ['extra_protect: %r looks like a regular expression; protect names are exact names or '
                         'shell globs (e.g. python*), so it matches only a process named exactly that' % (name,)
                         for name in protect if REGEX_HINT_RE.search(name)]

    @classmethod
    def from_params(cls, params):
        """The options of a module's parameters (its own, such as reset_due, left out)."""
        names = set(release_argument_spec()) | set(RESET_OPTIONS)
        return cls(params['devices'], **dict((name, value) for name, value in params.items()
                                             if name in names and name != 'devices'))


def _describe(holder):
    return dict((name, value) for name, value in holder.to_dict().items() if name != 'protected')


def _holders_text(holders):
    lines = []
    for holder in holders:
        lines.append('%d %s %s [%s]%s\n' % (
            holder.pid, holder.user, printable(holder.cmdline or holder.name, 200), ', '.join(holder.devices),
            ' (%s)' % holder.spared if holder.spared else ' (foreign)' if holder.foreign
            else ' (protected)' if holder.protected else ''))
    return ''.join(lines)


def raise_fd_limit():
    """Raise this process's open files limit to its hard limit; return the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class ReleaseResult:

    def __init__(self):
        self.changed = False
        self.released = False
        self.signalled = []
        self.protected = []
        self.survivors = []
        self.orphaned_gpus = []
        self.gpus_before = []
        self.gpus_after = []
        self.gpu_states = []
        self.elapsed_s = 0.0
        self.facts_after = None
        self.diff = {'before': '', 'after': ''}
        self.escalation = None
        self.failure = None
        self.warnings = []
        self.foreign_holders = []
        self.other_jobs = []
        self.unreadable = []
        # What the probe the release ran found (option probe); None when it ran none.
        self.probe = None
        # The GPUs held for a person (_history.History.hold_reason): {index, uuid, reason}.
        self.held = []
        # {uuid: _history.summarize} of the GPUs in scope; None when not read.
        self.history = None
        # The GPUs that need a reset, for nvidia_device_reset: [{index, reasons}].
        self.reset_due = []

    def dump(self, diff=False):
        out = dict(changed=self.changed, released=self.released, signalled=self.signalled,
                   protected=self.protected, foreign_holders=self.foreign_holders, other_jobs=self.other_jobs,
                   survivors=self.survivors,
                   orphaned_gpus=self.orphaned_gpus, gpus_before=self.gpus_before,
                   gpus_after=self.gpus_after, gpu_states=self.gpu_states, escalation=self.escalation,
                   elapsed_s=self.elapsed_s, unreadable=self.unreadable)
        if self.facts_after is not None:
            out['facts_after'] = self.facts_after
        if self.probe is not None:
            out['probe'] = self.probe
        out['held'] = self.held
        out['reset_due'] = self.reset_due
        if self.history is not None:
            out['history'] = self.history
        if diff:
            out['diff'] = dict(self.diff, before_header='holders before', after_header='holders after')
        return out


class Release:
    """One release run. reader: a GpuReader; options: ReleaseOptions. What it reads is its
    Observer's (seen), what it signals its Ladder's; the loop here decides when to look again
    and when to stop, and reports."""

    def __init__(self, reader, options, check_mode=False, signaller=None, proc='/proc',
                 clock=time.monotonic, sleep=time.sleep, smi_runner=None, escalation=None):
        self.options = options
        self.check_mode = check_mode
        self.proc = proc
        self.clock = clock
        self.sleep = sleep
        # The reset of the GPUs reset_orphaned finds needing one (_cure.escalation.Escalation, module
        # nvidia_device_reset); None: they are named in reset_due, for that module.
        self.escalation = escalation
        self.smi_runner = smi_runner
        self.warnings = list(options.warnings)
        self.seen = Observer(reader, options, check_mode, proc, clock, self.warnings)
        self.ladder = Ladder(options, signaller or Signaller(), self.seen, FD_RESERVE * 2)
        self.seen.ladder = self.ladder
        self.budget = None
        self.deadline = None
        self.signal_deadline = None
        self.reset_deadline = None
        self.settled = True
        self.last_exit = None
        self.foreign_now = []  # the foreign holders of the scope at the end
        self.unheld_since = None  # when a read first found the memory held by no process
        self.orphans_waited = False

    def _escalation(self):
        """The escalation (reset) of this release, on its seam: the observer, and a way to read
        everything again and report it."""
        return self.escalation(self.seen, self._reread, smi_runner=self.smi_runner, sleep=self.sleep)

    def _reread(self, result):
        """Read everything again (after a reset) and report it in result; the snapshot."""
        snapshot, holders = self.seen.observe(force_read=True, final=True, full=True)
        result.failure = None
        self._report(result, snapshot, holders)
        return snapshot

    def _observe(self):
        """(snapshot or None, holders) of a reading in the loop: the GPUs read when the scope
        needs it, or once nothing is left to signal and a read can prove something."""
        snapshot, holders = self.seen.observe()
        if snapshot is None and self.options.wait and not any(not holder.protected for holder in holders) \
                and self._read_due():
            snapshot = self.seen.read()
        return snapshot, holders

    def _quiet_read_due(self):
        """When the GPUs are worth reading after the last holder exited: the release cannot end
        before the settle window has passed, so a read before then would prove nothing (unless
        the orphan wait is shorter)."""
        exited = self.last_exit if self.last_exit is not None else self.clock()
        return exited + min(self.options.settle_time, ORPHAN_WAIT_S)

    def _read_due(self):
        return not self.ladder.targets or self.clock() >= self._quiet_read_due()

    def _next_event(self, now, delay):
        """When the loop must look again: the next signal due, the next poll, or the deadline."""
        wake = self.ladder.next_due(now + delay)
        if self.last_exit is not None and self.ladder.targets and self._quiet_read_due() > now:
            wake = min(wake, self._quiet_read_due())
        if self.unheld_since is not None and self._orphans_due() > now:
            wake = min(wake, self._orphans_due())
        # Past the signal deadline only the settle window is waited for (_only_settling_left).
        return min(wake, self.signal_deadline if now < self.signal_deadline else self.deadline)

    def _pause(self, until):
        """Sleep until then, waking early when a target exits (pidfds)."""
        started = self.clock()
        left = until - started
        if left <= 0:
            return
        alive = any(not target.ref.exited() for target in self.ladder.targets.values())
        pidfds = self.ladder.pidfds()
        if pidfds:
            poller = select.poll()
            for fd in pidfds:
                poller.register(fd, select.POLLIN)
            poller.poll(max(1, int(left * 1000)))
        else:
            self.sleep(left)
        self.budget.spend('waiting for the holders to exit' if alive else 'waiting for the driver to free memory', started)

    def run(self, due=None):
        """The release; with due ({index: [why]}, the reset_due of an earlier release): only the
        reset of those GPUs that still need it, read again now, nothing signalled."""
        started = self.clock()
        self.seen.due = due
        self.budget = Budget('the release', self.options.timeout, self.clock)
        self.deadline = started + self.options.timeout
        self.signal_deadline = self.deadline - READ_MIN_S
        # The reset's share ends where the signalling would: the read after it keeps its own.
        self.reset_deadline = self.signal_deadline - max(READ_MIN_S, self.options.timeout * RESET_SHARE) \
            if self.options.reset_orphaned else None
        result = ReleaseResult()
        self.ladder.fd_limit = raise_fd_limit()
        self.seen.start(self.budget, self.deadline, self.signal_deadline)
        lock = None
        try:
            if not self.check_mode:
                lock = ReleaseLock(self.options.lock_file)
                lock.acquire(self.deadline, self.clock, self.sleep)
                self.budget.spend('waiting for the lock', started)
            if due is None:
                self._run(result)
            else:
                self._reset_only(result, due)
        finally:
            if lock is not None:
                lock.release()
            self.ladder.close()
        self._read_facts_after(result)
        result.elapsed_s = round(self.clock() - started, 3)
        warning = uninspectable_warning(self.seen.unreadable, 'release')
        if warning:
            self.seen.warn(warning)
        if self.seen.scan_incomplete:
            self.seen.warn('the scan of /proc for holders did not finish within the timeout: processes it did not '
                           'reach are unknown, so the GPUs cannot be called released')
        if self.seen.last_scan is not None:
            result.unreadable = unread_processes(self.seen.last_scan)
            warning = partial_warning(self.seen.last_scan)
            if warning:
                self.seen.warn(warning)
        result.warnings = self.warnings
        return result

    def _read_facts_after(self, result):
        """The facts of nvidia_gpu_facts, read once more at the end, when asked for."""
        if not self.options.facts_after:
            return
        try:
            if self.seen.last_snapshot is None or self.seen.read_error:
                raise GpuopsError(self.seen.read_error or 'the GPUs were not read')
            # The GPUs as the release read them last (within the timeout), the holders as they are now.
            facts, warnings = gather_facts(self.seen.reader, self.options.devices, self.options.protect,
                                           self.options.memory_threshold_mib, self.deadline - self.clock(),
                                           kernel_log=self.options.kernel_log,
                                           holder_warnings=False, snapshot=self.seen.last_snapshot,
                                           state=StateDir.for_host(self.options.state_dir, self.options.host_root),
                                           history=History.for_host(self.options.host_root, self.options.state_dir))
        except GpuopsError as exc:
            self.seen.warn('facts_after: the GPUs could not be read at the end: %s' % exc)
            return
        for warning in warnings:
            self.seen.warn(warning)
        result.facts_after = facts

    def _run(self, result):
        snapshot, holders = self.seen.observe(force_read=True, full=True)
        if self.seen.read_error_permanent or (snapshot is None and self.options.expected_gpus is not None):
            # Waiting cannot fix it, and without a read nothing can be proved (nor how many GPUs
            # the host has): stop before any signal.
            raise GpuopsError('%s; nothing was signalled' % self.seen.read_error)
        self.seen.check_gpus(snapshot)
        result.gpus_before = self.seen.memory(snapshot)
        result.diff['before'] = _holders_text(holders)
        if self.check_mode:
            would = [holder for holder in holders if not holder.protected]
            result.signalled = [dict(_describe(holder), signals_sent=[], exited=False) for holder in would]
            result.changed = bool(would)
            result.gpus_after = result.gpus_before
            result.gpu_states = self.seen.states(snapshot)
            result.released = self.seen.clean(snapshot, holders) and not any(
                self.seen.unhealthy(index, health) for index, (dummy, health) in self.seen.health(snapshot).items())
            result.protected = [_describe(holder) for holder in holders
                                if holder.protected and not holder.foreign and not holder.spared]
            result.foreign_holders = [self._foreign(holder) for holder in holders if holder.foreign]
            result.other_jobs = [self._other_job(holder, self.seen.scope(snapshot)) for holder in holders if holder.spared]
            result.diff['after'] = _holders_text([holder for holder in holders if holder.protected])
            if self.options.wait and not would:
                result.orphaned_gpus = self.seen.orphaned(self.seen.scope(snapshot), [])
                self._would_escalate(result, snapshot)
            return

        delay = POLL_MIN_S
        self.last_exit = None
        self._orphaned_for_good(self.clock(), snapshot, holders)  # the wait for the driver starts with this read
        while True:
            now = self.clock()
            if self.ladder.enlist(holders, now):
                delay = POLL_MIN_S
            self.ladder.advance(now)
            if not self.ladder.targets and self.seen.clean(snapshot, holders):
                break  # nothing to release
            if not self.options.wait and not self.ladder.pending(now, holders):
                break
            self._pause(self._next_event(self.clock(), delay))
            delay = min(delay * POLL_GROWTH, POLL_MAX_S if self.unheld_since is None else UNHELD_POLL_MAX_S)
            exited_at = self.ladder.note_exits(self.clock)
            snapshot, holders = self._observe()
            now = self.clock()
            if any(not holder.protected for holder in holders):
                self.last_exit = None
            elif self.last_exit is None:
                # When the last target was seen gone, before the scan that found no holder left:
                # on a host of many processes a scan takes a while, and the window counts from the exit.
                self.last_exit = now if exited_at is None else exited_at
                delay = POLL_MIN_S  # the driver frees the memory from now on: look again soon
            if self.options.wait and self.seen.clean(snapshot, holders) and \
                    (not self.ladder.targets or now >= self.last_exit + self.options.settle_time):
                break
            if self.seen.only_lost_left(snapshot, holders) or self._only_respawns_left(now, holders) \
                    or self.seen.only_spared_left(snapshot, holders) or self.seen.only_left_alone(holders) \
                    or self.seen.read_error_permanent or self._orphaned_for_good(now, snapshot, holders):
                break
            if now >= self.signal_deadline and self._only_settling_left(holders):
                continue
            if now >= self.signal_deadline:
                if self.ladder.finish(now):
                    self._pause(min(self.deadline, self.clock() + FINAL_EXIT_S))
                    snapshot, holders = self.seen.observe(force_read=True, final=True)
                    if any(not holder.protected for holder in holders):
                        self.last_exit = None
                    elif self.last_exit is None:
                        self.last_exit = self.clock()
                break
        if snapshot is None:
            snapshot = self.seen.read(final=True)
            if snapshot is None:
                self.seen.warn('the GPUs could not be read: %s' % self.seen.read_error)

        self._report(result, snapshot, holders)
        self._escalate(result, snapshot)

    def _only_settling_left(self, holders):
        """True while every target is gone and the settle window, not yet over, is all that is left,
        and it ends early enough for a scan and a read after it within the timeout: the signalling is
        over, so the share kept for the last read is free for the window (a host of many processes
        reaches it late). Once the window is over the loop ends, clean or not."""
        if not self.ladder.targets or self.last_exit is None or any(not holder.protected for holder in holders):
            return False
        settled = self.last_exit + self.options.settle_time
        return self.clock() < settled and settled + self.seen.scan_s + CALL_FLOOR_S <= self.deadline

    def _orphaned_for_good(self, now, snapshot, holders):
        """True when memory that no process holds has stayed held for ORPHAN_WAIT_S (longer than a
        driver takes to free a dead process's memory), or the reset's share of the timeout begins."""
        if any(not holder.protected for holder in holders):
            self.unheld_since = None
            return False
        if snapshot is None:
            return False  # not read this time: nothing new
        dirty = [gpu for gpu in self.seen.scope(snapshot) if not self.seen.gpu_clean(gpu)]
        # Lost GPUs no reset here can help are left as they are; the others must hold no process.
        if not any(not gpu.get('error') for gpu in dirty) or any(gpu.get('processes') for gpu in dirty):
            self.unheld_since = None
            return False
        if self.unheld_since is None:
            self.unheld_since = now
        self.orphans_waited = now >= self._orphans_due()
        return self.orphans_waited

    def _orphans_due(self):
        due = self.unheld_since + ORPHAN_WAIT_S
        return due if self.reset_deadline is None else min(due, self.reset_deadline)

    def _escalate(self, result, snapshot):
        """With reset_orphaned: the GPUs that need a reset (_reset_plan), reset by the escalation
        when the release has one, else named in result.reset_due and not released."""
        if not self.options.reset_orphaned or snapshot is None:
            return
        todo = reset_plan(self.seen, result, snapshot)
        if self.escalation is not None:
            self._escalation().run(result, snapshot, todo)
        elif todo:
            result.reset_due = due_entries(todo)
            not_released(result, '; '.join('GPU %s needs a reset (%s)' % (index, ', '.join(why))
                                           for index, why in sorted(todo.items())))

    def _would_escalate(self, result, snapshot):
        """Check mode with reset_orphaned: what the escalation would do, or which GPUs it would be for."""
        if not self.options.reset_orphaned:
            return
        todo = reset_plan(self.seen, result, snapshot)
        if self.escalation is not None:
            self._escalation().preview(result, snapshot, todo)
        else:
            result.reset_due = due_entries(todo)

    def _reset_only(self, result, due):
        """The reset of the GPUs due that still need it: the host read again now, nothing signalled
        (a holder of the job still there keeps its GPU from the reset)."""
        snapshot, holders = self.seen.observe(force_read=True, full=True)
        if snapshot is None:
            raise GpuopsError('%s; nothing was reset' % self.seen.read_error)
        self.seen.check_gpus(snapshot)
        result.gpus_before = self.seen.memory(snapshot)
        result.diff['before'] = _holders_text(holders)
        self._report(result, snapshot, holders)
        if self.check_mode:
            self._escalation().preview(result, snapshot, due)
        else:
            self._escalation().run(result, snapshot, due)

    def _only_respawns_left(self, now, holders):
        """True when waiting cannot help: what holds the GPUs keeps being restarted."""
        unprotected = [holder for holder in holders if not holder.protected]
        return bool(unprotected) and all(process_key(holder) in self.ladder.left_alone for holder in unprotected) \
            and not self.ladder.pending(now, [])

    def _reason(self, holder):
        if holder.state == 'D':
            return 'uninterruptible'
        if holder.state in ('Z', 'X') and holder.threads <= 1:
            return 'zombie'
        target = self.ladder.target(holder)
        if target is not None and target.not_permitted is not None:
            return 'not_permitted'
        if target is not None:
            return 'ignored_signals'
        return 'respawned'

    def _survivor(self, holder, scope):
        target = self.ladder.target(holder)
        out = dict(_describe(holder), reason=self._reason(holder),
                   signals_sent=list(target.signals_sent) if target else [],
                   gpus=[gpu.get('index') for gpu in scope if self.seen.blocks(holder, gpu)])
        if out['reason'] == 'respawned':
            out['supervisor'] = supervisor(holder, self.proc)
        elif out['reason'] == 'not_permitted':
            out['uid'] = target.not_permitted
        return out

    def _report(self, result, snapshot, holders):
        scope = self.seen.scope(snapshot)
        result.signalled = []
        for target in self.ladder.targets.values():
            result.signalled.append(dict(_describe(target.holder), signals_sent=list(target.signals_sent),
                                         exited=target.ref.exited()))
        result.changed = any(target.signals_sent for target in self.ladder.targets.values())
        result.protected = [_describe(holder) for key, holder in sorted(self.seen.protected_seen.items())]
        result.foreign_holders = [self._foreign(holder) for key, holder in sorted(self.seen.foreign_seen.items())]
        result.other_jobs = [self._other_job(holder, scope) for key, holder in sorted(self.seen.other_jobs_seen.items())]
        self.foreign_now = [holder for holder in holders if holder.foreign]
        survivors = [holder for holder in holders if not holder.protected]
        result.survivors = [self._survivor(holder, scope) for holder in survivors]
        result.gpus_after = self.seen.memory(snapshot)
        result.gpu_states = self.seen.states(snapshot)
        result.diff['after'] = _holders_text(holders)
        clean = self.seen.clean(snapshot, holders)
        if any(not holder.protected for holder in holders):
            self.last_exit = None
        settle_end = None if self.last_exit is None else self.last_exit + self.options.settle_time
        self.settled = not self.ladder.targets or (settle_end is not None and self.clock() >= settle_end)
        healthy = not any(self.seen.unhealthy(index, health) for index, (dummy, health) in self.seen.health(snapshot).items())
        result.released = clean and self.settled and healthy
        if self.options.wait:
            result.orphaned_gpus = self.seen.orphaned(scope, survivors)
            if not result.released:
                result.failure = self._failure(snapshot, scope, result)

    def _foreign(self, holder):
        return dict(_describe(holder), reason=_reason.FOREIGN_HOLDER, unit=supervisor(holder, self.proc)['unit'])

    def _other_job(self, holder, scope):
        return dict(_describe(holder), job_id=holder.job, why=holder.spared,
                    gpus=[gpu.get('index') for gpu in scope if self.seen.blocks(holder, gpu)])

    @staticmethod
    def _why(survivor):
        text = 'pid %d (%s, %s' % (survivor['pid'], printable(survivor.get('name') or survivor['comm']), survivor['reason'])
        owner = survivor.get('supervisor')
        if owner:
            text += ' by pid %s %s' % (owner['pid'], printable(owner['name'] or ''))
            text += ''.join(', %s %s' % (kind, owner[kind]) for kind in ('unit', 'container') if owner[kind])
        if survivor['reason'] == 'not_permitted':
            text += ', uid %s' % survivor['uid']
        return text + ')'

    def _failure(self, snapshot, scope, result):
        problems = []
        if snapshot is None:
            problems.append('the GPUs could not be read: %s' % self.seen.read_error)
        if self.seen.scan_incomplete:
            problems.append('the scan of /proc for holders did not finish in time (%s)' % self.budget.used())
        unread = unread_processes(self.seen.last_scan) if self.seen.last_scan is not None else []
        may_hold = [entry for entry in unread if entry['pid'] in set(part.pid for part in self.seen.unread_may_hold)]
        if may_hold:
            problems.append('the descriptors of %s could not all be read: it may hold a GPU in scope, and is never '
                            'signalled (it is no process of the job); see what it is' % named_unread(may_hold))
        elif unread and not all(self.seen.gpu_clean(gpu) for gpu in scope):
            problems.append('the descriptors of %s could not all be read' % named_unread(unread))
        protected = dict((holder.pid, holder) for holder in self.seen.protected_seen.values())
        blocking = set()
        healths = self.seen.health(snapshot)
        for gpu in scope:
            index = gpu.get('index')
            holders = [survivor for survivor in result.survivors if index in survivor['gpus']]
            blocking.update(survivor['pid'] for survivor in holders)
            reported = [process for process in self.seen.job_processes(gpu)
                        if not any(process.get('pid') == survivor['pid'] for survivor in holders)]
            used = gpu.get('memory_used_mib')
            why = [self._why(survivor) for survivor in holders]
            why += ['protected pid %s (%s), which is never signalled' % (process.get('pid'), printable(process.get('name')))
                    if process.get('pid') in protected else
                    'pid %s (%s, reported by the driver)' % (process.get('pid'), printable(process.get('name')))
                    for process in reported]
            foreign = [holder for holder in self.foreign_now if self.seen.blocks(holder, gpu)]
            why += [_reason.foreign_why(holder, supervisor(holder, self.proc)['unit']) for holder in foreign]
            why += [_reason.spared_why(holder) for holder in self.seen.spared_on(gpu)]
            health = healths.get(index, (None, None))[1]
            problem = _reason.gpu_problem(
                gpu, gpu_state(gpu) == 'reset_required', index in result.orphaned_gpus,
                bool(holders or reported or foreign or used is None or used > self.options.memory_threshold_mib), why,
                reset_remedy='; reset_orphaned resets it',
                health=health if health is not None and self.seen.unhealthy(index, health) else None)
            if problem:
                problems.append(problem)
        for survivor in result.survivors:
            if survivor['pid'] not in blocking:
                problems.append(_reason.still_holds(self._why(survivor), survivor['devices']))
        if not problems and self.ladder.targets and not self.settled:
            problems.append('%s: the GPUs read clean, but not for settle_time (%s) after the last holder exited, '
                            'before the timeout; a holder may come back (raise timeout)'
                            % (NOT_SETTLED, seconds(self.options.settle_time)))
        if self.orphans_waited and result.orphaned_gpus and not self.options.reset_orphaned:
            problems.append("it stayed held by no process for %s, longer than a driver takes to free a dead "
                            "process's memory (set reset_orphaned to reset such GPUs)" % seconds(ORPHAN_WAIT_S))
        lost_or_clean = scope and all(gpu.get('error') or self.seen.gpu_clean(gpu) for gpu in scope)
        if self.orphans_waited or (lost_or_clean and not result.survivors):
            return 'GPUs not released: %s' % '; '.join(problems)
        return 'GPUs not released within %s: %s' % (seconds(self.options.timeout), '; '.join(problems))


def release(reader, options, check_mode=False, signaller=None, proc='/proc', escalation=None, due=None):
    """Run one release (with due: only the reset of those GPUs, Release.run), then (options.probe)
    the probe of the GPUs it released; returns a ReleaseResult. A failed probe is said in
    result.probe, not as the release's failure."""
    releaser = Release(reader, options, check_mode=check_mode, signaller=signaller, proc=proc, escalation=escalation)
    result = releaser.run(due)
    if result.held:
        result.released = False
        result.failure = '; '.join([held['reason'] for held in result.held] + ([result.failure] if result.failure else []))
    if releaser.seen.last_snapshot is not None:
        result.history = releaser.seen.history(releaser.seen.last_snapshot)
    if options.probe and result.released and not check_mode:
        shared = (options.job or {}).get('shared_gpus')
        result.probe, warnings = probe_after_release(reader, options, options.probe,
                                                     probe_scope(options.gpus, shared, result.gpus_after),
                                                     releaser.seen.last_snapshot)
        result.warnings.extend(warnings)
    return result
