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

import os
import re
import select
import signal
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    DEFAULT_MEMORY_THRESHOLD_MIB,
    GpuopsError,
    PermanentReadError,
    check_seconds,
    holders_argument_spec,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._facts import gather_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._holders import (
    ancestors,
    cgroup,
    expand_devices,
    find_holders,
    load_holder,
    read_process,
    uninspectable_warning,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._host import check_expected_gpus, device_patterns, gpu_nodes
from ansible_collections.gpuops.nvidia.plugins.module_utils._scope import blocks, gpus_in_scope
from ansible_collections.gpuops.nvidia.plugins.module_utils._lock import ReleaseLock
from ansible_collections.gpuops.nvidia.plugins.module_utils._reset import GpuReset, would_reset
from ansible_collections.gpuops.nvidia.plugins.module_utils._signals import (
    NotPermittedError,
    ProcessRef,
    Signaller,
    parse_signal,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._smi import SmiRunner

DEFAULT_SIGNALS = ['TERM', 'KILL']

# How often one command line may come back (a supervisor restarting it) and be stopped
# again before it is left alone and reported as respawned.
RESPAWN_LIMIT = 1

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
# The last read of the GPUs, which reports the state at the end, may take this long after
# the signalling stops; the signalling stops that much before the timeout.
READ_MIN_S = 1.0
# After the last signals at the deadline, how long to wait for the processes to exit before
# the final reading.
FINAL_EXIT_S = 0.2
# Rescans of the frozen set before the final KILL: each finds processes forked before SIGSTOP landed.
FREEZE_RESCANS = 5

# With reset_orphaned, the share of the timeout kept for the reset: waiting for the driver to free
# memory that no process holds ends that much before the signalling would.
RESET_SHARE = 1.0 / 3

REGEX_HINT_RE = re.compile(r'\.[*+]|[\\^$+(){}|]')
REASONS = ('uninterruptible', 'zombie', 'respawned', 'ignored_signals', 'not_permitted')


def release_argument_spec():
    spec = dict(
        gpus=dict(type='list', elements='int'),
        signals=dict(type='list', elements='str', default=list(DEFAULT_SIGNALS)),
        grace_period=dict(type='float', default=5.0),
        wait=dict(type='bool', default=True),
        timeout=dict(type='float', default=60.0),
        settle_time=dict(type='float', default=DEFAULT_SETTLE_S),
        memory_threshold_mib=dict(type='int', default=DEFAULT_MEMORY_THRESHOLD_MIB),
        lock_file=dict(type='path'),
        facts_after=dict(type='bool', default=False),
        reset_orphaned=dict(type='bool', default=False),
    )
    spec.update(reader_argument_spec())
    spec.update(holders_argument_spec())
    return spec


def seconds(value):
    """A duration for a message: 2.9994035 -> '3.0 s'."""
    return '%.1f s' % value


class ReleaseOptions:
    """Validated options of a release."""

    def __init__(self, devices, gpus=None, signals=None, grace_period=5.0, protect=(),
                 wait=True, timeout=60.0, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB, lock_file=None,
                 facts_after=False, settle_time=DEFAULT_SETTLE_S, host_root='/', reset_orphaned=False,
                 nvidia_smi_path='nvidia-smi', expected_gpus=None):
        for problem in (check_seconds('timeout', timeout, positive=True),
                        check_seconds('grace_period', grace_period),
                        check_seconds('settle_time', settle_time)):
            if problem:
                raise GpuopsError(problem)
        if memory_threshold_mib < 0:
            raise GpuopsError('memory_threshold_mib must be zero or more, got %s' % memory_threshold_mib)
        signals = DEFAULT_SIGNALS if signals is None else signals
        if not signals:
            raise GpuopsError('signals must name at least one signal, e.g. [TERM, KILL]')
        parsed = [parse_signal(name) for name in signals]
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
        if gpus is not None:
            if not gpus:
                raise GpuopsError('gpus: name at least one GPU index, or leave gpus out for every GPU')
            bad = [index for index in gpus if index < 0]
            if bad:
                raise GpuopsError('gpus: GPU indexes are zero or more, got %s' % bad[0])
            gpus = sorted(set(gpus))
        check_expected_gpus(None, expected_gpus)
        # Device globs as found under host_root (a simulated host, or the host's /dev in a container).
        self.devices = device_patterns(devices, host_root)
        self.host_root = host_root
        self.gpus = gpus
        self.signals = parsed
        self.grace_period = grace_period
        self.protect = list(protect)
        self.wait = wait
        self.timeout = timeout
        self.settle_time = settle_time
        self.memory_threshold_mib = memory_threshold_mib
        self.lock_file = lock_file
        self.facts_after = facts_after
        self.reset_orphaned = reset_orphaned
        self.nvidia_smi_path = nvidia_smi_path
        self.expected_gpus = expected_gpus
        self.warnings = ['extra_protect: %r looks like a regular expression; protect names are exact names or '
                         'shell globs (e.g. python*), so it matches only a process named exactly that' % (name,)
                         for name in protect if REGEX_HINT_RE.search(name)]

    @classmethod
    def from_params(cls, params):
        return cls(params['devices'], params.get('gpus'), params['signals'], params['grace_period'],
                   list(params['protect']) + list(params.get('extra_protect') or []),
                   params['wait'], params['timeout'], params['memory_threshold_mib'],
                   params.get('lock_file'), params.get('facts_after', False),
                   params.get('settle_time', DEFAULT_SETTLE_S), params.get('host_root') or '/',
                   params.get('reset_orphaned', False), params.get('nvidia_smi_path') or 'nvidia-smi',
                   params.get('expected_gpus'))


class Target:
    """A holder that is (or would be) signalled, and where it stands on the ladder."""

    def __init__(self, holder, ref, cgroup_path):
        self.holder = holder
        self.ref = ref
        self.cgroup = cgroup_path
        self.signals_sent = []
        self.step = 0          # the index in the ladder of the next signal
        self.due = None        # when that signal (or, past the last one, the end of the wait) is due
        self.signalled_tick = None  # clock ticks since boot when the first signal went out
        self.gone_tick = None  # clock ticks since boot when it was first seen gone
        self.not_permitted = None  # the uid the kernel would not let us signal


def _key(holder):
    return (holder.pid, holder.starttime)


def _identity(holder):
    return (holder.uid, holder.comm, holder.cmdline)


def _describe(holder):
    return dict((name, value) for name, value in holder.to_dict().items() if name != 'protected')


def _holders_text(holders):
    lines = []
    for holder in holders:
        lines.append('%d %s %s [%s]%s\n' % (
            holder.pid, holder.user, holder.cmdline or holder.comm, ', '.join(holder.devices),
            ' (protected)' if holder.protected else ''))
    return ''.join(lines)


def boot_ticks():
    """Clock ticks since boot now, in the unit of a process's start time."""
    with open('/proc/uptime') as handle:
        return int(float(handle.read().split()[0]) * os.sysconf('SC_CLK_TCK'))


CONTAINER_RE = re.compile(r'(?:docker|cri-containerd|crio|libpod)-([0-9a-f]{12,64})\.scope$|^([0-9a-f]{64})$')


def supervisor(holder, proc='/proc'):
    """Who (re)started holder: its parent, and the systemd unit or container of its cgroup."""
    parent = read_process(holder.ppid, proc) if holder.ppid else None
    out = {'pid': holder.ppid, 'name': parent.comm if parent else None, 'unit': None, 'container': None}
    for part in (cgroup(holder.pid, proc) or '').split('/'):
        match = CONTAINER_RE.search(part)
        if match:
            out['container'] = match.group(1) or match.group(2)
        elif part.endswith('.service') or part.endswith('.scope'):
            out['unit'] = part
    return out


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
        self.elapsed_s = 0.0
        self.facts_after = None
        self.diff = {'before': '', 'after': ''}
        self.escalation = None
        self.failure = None
        self.warnings = []

    def dump(self, diff=False):
        out = dict(changed=self.changed, released=self.released, signalled=self.signalled,
                   protected=self.protected, survivors=self.survivors,
                   orphaned_gpus=self.orphaned_gpus, gpus_before=self.gpus_before,
                   gpus_after=self.gpus_after, escalation=self.escalation, elapsed_s=self.elapsed_s)
        if self.facts_after is not None:
            out['facts_after'] = self.facts_after
        if diff:
            out['diff'] = dict(self.diff, before_header='holders before', after_header='holders after')
        return out


class Release:
    """One release run. reader: a GpuReader; options: ReleaseOptions."""

    def __init__(self, reader, options, check_mode=False, signaller=None, proc='/proc',
                 clock=time.monotonic, sleep=time.sleep, smi_runner=None):
        self.reader = reader
        self.smi_runner = smi_runner
        self.options = options
        self.check_mode = check_mode
        self.signaller = signaller or Signaller()
        self.proc = proc
        self.clock = clock
        self.sleep = sleep
        self.deadline = None
        self.signal_deadline = None
        self.paths = []
        self.gpu_nodes = {}
        self.targets = {}
        self.left_alone = {}
        self.respawns = {}
        self.protected_seen = {}
        self.impersonators = set()
        self.unreadable = set()
        self.read_error = None
        self.read_error_permanent = False
        self.last_snapshot = None
        self.warnings = list(options.warnings)
        self.own_session = os.getsid(0)
        self.own_cgroup = cgroup(os.getpid(), proc)

    # -- observation ---------------------------------------------------------------------
    def _warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)

    def _read(self, final=False):
        # Every read ends by the deadline (a hung nvidia-smi must not make the release outlast its
        # timeout); those while signalling end by the signal deadline, which leaves the final read
        # of the state at the end its share.
        now = self.clock()
        left = (self.deadline if final or now >= self.signal_deadline else self.signal_deadline) - now
        if left <= 0:
            # The last read that was tried says more than this one, when there was one.
            self.read_error = self.read_error or 'no time was left within the timeout to read the GPUs'
            return None
        try:
            snapshot = self.reader.read(timeout=left)
        except GpuopsError as exc:
            self.read_error = str(exc)
            self.read_error_permanent = isinstance(exc, PermanentReadError)
            return None
        self.read_error = None
        self.read_error_permanent = False
        self.last_snapshot = snapshot
        for warning in snapshot.warnings:
            self._warn(warning)
        return snapshot

    def _scope(self, snapshot):
        return gpus_in_scope(snapshot.gpus if snapshot is not None else [], self.options.gpus)

    def _discover(self, snapshot):
        holders, unreadable = find_holders(self.paths, self.options.protect, self.proc)
        self.unreadable.update(unreadable)
        if self.options.gpus is None:
            return holders
        nodes = set(self.gpu_nodes[index] for index in self.options.gpus if index in self.gpu_nodes)
        scope = self._scope(snapshot)
        scoped = [holder for holder in holders if blocks(holder.devices, holder.pid, nodes, scope)]
        # A process the driver reports on a GPU in scope may hold none of the matched nodes.
        found = set(holder.pid for holder in holders)
        for gpu in scope:
            for process in gpu.get('processes') or []:
                pid = process.get('pid')
                if pid is not None and pid not in found:
                    found.add(pid)
                    holder = self._holder_for_pid(pid)
                    if holder is not None:
                        scoped.append(holder)
        return sorted(scoped, key=lambda holder: holder.pid)

    def _holder_for_pid(self, pid):
        """A process the driver reports on a GPU but that holds no matching node."""
        # None when it is gone, or lives in another pid namespace.
        return load_holder(pid, [], self.options.protect, ancestors(os.getpid(), self.proc), self.proc)

    def _observe(self, force_read=False, final=False):
        """(snapshot or None, holders). The GPUs are read when the scope or the check needs it;
        final: the read of the state at the end, which may take until the deadline."""
        snapshot = None
        if force_read or self.options.gpus is not None:
            snapshot = self._read(final)
        holders = self._discover(snapshot)
        for holder in holders:
            if holder.protected:
                self.protected_seen.setdefault(_key(holder), holder)
            elif holder.impersonates and holder.pid not in self.impersonators:
                self.impersonators.add(holder.pid)
                self._warn('pid %d (user %s, executable %s) calls itself %s but is not the protected daemon '
                           '(its executable is not that root-owned program, or it runs as a regular user); '
                           'it is treated as a normal holder' % (holder.pid, holder.user, holder.exe or 'unknown',
                                                                 holder.impersonates))
        if snapshot is None and not force_read and self.options.wait \
                and not any(not holder.protected for holder in holders):
            snapshot = self._read()
        return snapshot, holders

    def _gpu_clean(self, gpu):
        used = gpu.get('memory_used_mib')
        return not gpu.get('error') and used is not None and used <= self.options.memory_threshold_mib

    def _clean(self, snapshot, holders):
        return (snapshot is not None and not any(not holder.protected for holder in holders) and all(self._gpu_clean(gpu) for gpu in self._scope(snapshot)))

    def _only_lost_left(self, snapshot, holders):
        """True when waiting cannot help: no holder is left and every dirty GPU is lost."""
        if snapshot is None or any(not holder.protected for holder in holders):
            return False
        dirty = [gpu for gpu in self._scope(snapshot) if not self._gpu_clean(gpu)]
        return bool(dirty) and all(gpu.get('error') for gpu in dirty)

    # -- the ladder ----------------------------------------------------------------------
    def _relative(self, holder):
        """The target that holder was forked from or belongs with, or None.

        A descendant of a target is part of its job. So is a process that started before the
        target was seen gone and shares its session or cgroup, or runs as the same user and
        started after the target was first signalled: a fork racing the ladder, even one that
        called setsid() and lost its parent. A process that started after the target was seen
        gone is a successor (a respawn), not a fork.
        """
        chain = ancestors(holder.ppid, self.proc) if holder.ppid else set()
        holder_cgroup = None
        for target in self.targets.values():
            other = target.holder
            if other.pid in chain:
                return target
            if target.gone_tick is not None and holder.starttime > target.gone_tick:
                continue
            if holder.session and holder.session == other.session and holder.session != self.own_session:
                return target
            if holder.uid == other.uid and target.signalled_tick is not None \
                    and holder.starttime >= target.signalled_tick:
                return target
            if target.cgroup and target.cgroup not in ('/', self.own_cgroup):
                if holder_cgroup is None:
                    holder_cgroup = cgroup(holder.pid, self.proc) or ''
                if holder_cgroup == target.cgroup:
                    return target
        return None

    def _is_successor(self, holder):
        identity = _identity(holder)
        return any(_identity(target.holder) == identity and target.ref.exited() for target in self.targets.values())

    def _enlist(self, holders, now):
        """Make targets of the unprotected holders not yet on the ladder; True when any joined."""
        joined = False
        for holder in holders:
            key = _key(holder)
            if holder.protected or key in self.targets or key in self.left_alone:
                continue
            relative = self._relative(holder)
            if relative is None and self._is_successor(holder):
                identity = _identity(holder)
                count = self.respawns.get(identity, 0)
                if count >= RESPAWN_LIMIT:
                    self.left_alone[key] = holder
                    continue
                self.respawns[identity] = count + 1
            target = Target(holder, ProcessRef(holder.pid, holder.starttime, self.proc),
                            cgroup(holder.pid, self.proc))
            target.due = now
            if relative is not None:
                # Where its relative stands: the next signal at the same moment. (Sending again
                # the signal the relative got would only make a job that forks on it fork again.)
                last = len(self.options.signals) - 1
                target.step = min(relative.step, last)
                if relative.step <= last:
                    target.due = relative.due
            self.targets[key] = target
            joined = True
        return joined

    def _grace(self, now, remaining):
        """The wait before the next signal, squeezed so that the remaining ones fit the deadline."""
        left = max(self.signal_deadline - now, 0.0)
        return min(self.options.grace_period, left / max(remaining, 1))

    def _send(self, target, name, number):
        """Signal target; True when the signal went out. SIGSTOP, part of the final step, is
        logged but not listed in signals_sent, which lists the ladder's signals."""
        holder = target.holder
        try:
            sent = self.signaller.send(target.ref, name, number, holder.user,
                                       holder.cmdline or holder.comm, holder.devices)
        except NotPermittedError as exc:
            target.not_permitted = exc.uid if exc.uid is not None else holder.uid
            return False
        if sent and number != signal.SIGSTOP:
            target.signals_sent.append(name)
        if sent and target.signalled_tick is None:
            target.signalled_tick = boot_ticks()
        return sent

    def _advance(self, now):
        """Send every signal that is due; the final KILL goes to the whole set at once."""
        ladder = self.options.signals
        last = len(ladder) - 1
        final = []
        for target in list(self.targets.values()):
            if target.step > last or target.due > now or target.not_permitted is not None \
                    or target.ref.exited():
                continue
            if target.step == last and ladder[last][0] == 'KILL':
                final.append(target)
                continue
            name, number = ladder[target.step]
            self._send(target, name, number)
            target.step += 1
            target.due = now + self._grace(now, len(ladder) - target.step)
        if final:
            self._freeze_and_kill(final, now)

    def _freeze_and_kill(self, group, now):
        """SIGSTOP the group, then any process forked meanwhile, and SIGKILL them all.

        A stopped process cannot fork, so the set stops growing and the KILL reaches all of it.
        """
        frozen = [target for target in group if self._send(target, 'STOP', signal.SIGSTOP)]
        for dummy in range(FREEZE_RESCANS):
            holders = self._discover(None)
            fresh = [holder for holder in holders if not holder.protected and _key(holder) not in self.targets
                     if _key(holder) not in self.left_alone and self._relative(holder) is not None]
            if not fresh:
                break
            self._enlist(fresh, now)
            for holder in fresh:
                target = self.targets[_key(holder)]
                if self._send(target, 'STOP', signal.SIGSTOP):
                    frozen.append(target)
        for target in group + [target for target in frozen if target not in group]:
            self._send(target, 'KILL', signal.SIGKILL)
            target.step = len(self.options.signals)
            target.due = now + self._grace(now, 0)

    def _finish_ladders(self, now):
        """At the deadline: every target still alive gets the rest of its ladder at once.
        True when any signal went out."""
        sent = sum(len(target.signals_sent) for target in self.targets.values())
        for dummy in self.options.signals:
            for target in self.targets.values():
                target.due = min(target.due, now)
            self._advance(now)
        return sum(len(target.signals_sent) for target in self.targets.values()) > sent

    def _note_exits(self):
        tick = None
        for target in self.targets.values():
            if target.gone_tick is None and target.ref.exited():
                tick = boot_ticks() if tick is None else tick
                target.gone_tick = tick

    def _ladder_pending(self, now, holders):
        """True while a target may still get a signal or is within the wait after its last one,
        or a holder has yet to join the ladder."""
        for target in self.targets.values():
            if target.not_permitted is None and not target.ref.exited() and \
                    (target.step < len(self.options.signals) or target.due > now):
                return True
        return any(not holder.protected and _key(holder) not in self.targets and _key(holder) not in self.left_alone
                   for holder in holders)

    def _next_event(self, now, delay):
        """When the loop must look again: the next signal due, the next poll, or the deadline."""
        wake = now + delay
        for target in self.targets.values():
            if target.step < len(self.options.signals) and target.not_permitted is None:
                wake = min(wake, target.due)
        return min(wake, self.signal_deadline)

    def _pause(self, until):
        """Sleep until then, waking early when a target exits (pidfds)."""
        left = until - self.clock()
        if left <= 0:
            return
        pidfds = [target.ref.pidfd for target in self.targets.values()
                  if target.ref.pidfd is not None and not target.ref.exited()]
        if pidfds:
            poller = select.poll()
            for fd in pidfds:
                poller.register(fd, select.POLLIN)
            poller.poll(max(1, int(left * 1000)))
        else:
            self.sleep(left)

    # -- the run -------------------------------------------------------------------------
    def _resolve_devices(self):
        """The device node paths; a pattern that matches none, or a non-NVIDIA node, is an error."""
        paths = expand_devices(self.options.devices)
        unmatched = [pattern for pattern in self.options.devices if not expand_devices([pattern])]
        if unmatched:
            raise GpuopsError('devices: %s matches no NVIDIA device node (is the pattern spelled right, and '
                              'is the NVIDIA driver loaded?); nothing was signalled' % ', '.join(unmatched))
        return paths

    def run(self):
        started = self.clock()
        self.deadline = started + self.options.timeout
        self.signal_deadline = self.deadline - min(READ_MIN_S, self.options.timeout / 4)
        # The reset's share ends where the signalling would: the read after it keeps its own.
        self.orphan_deadline = self.signal_deadline - max(READ_MIN_S, self.options.timeout * RESET_SHARE) \
            if self.options.reset_orphaned else None
        result = ReleaseResult()
        self.paths = self._resolve_devices()
        self.gpu_nodes, problem = gpu_nodes(self.paths, self.options.host_root)
        if problem and self.options.gpus is not None:
            self._warn(problem)
        if self.options.gpus is not None:
            missing = [index for index in self.options.gpus if index not in self.gpu_nodes]
            if missing:
                self._warn('gpus: no device node nvidiaN among the matched devices for GPU %s; only the '
                           'processes the driver reports on it are released'
                           % ', '.join(str(index) for index in missing))
        lock = None
        try:
            if not self.check_mode:
                lock = ReleaseLock(self.options.lock_file)
                lock.acquire(self.deadline, self.clock, self.sleep)
            self._run(result)
        finally:
            if lock is not None:
                lock.release()
            for target in self.targets.values():
                target.ref.close()
        self._read_facts_after(result)
        result.elapsed_s = round(self.clock() - started, 3)
        warning = uninspectable_warning(self.unreadable, 'release')
        if warning:
            self._warn(warning)
        result.warnings = self.warnings
        return result

    def _read_facts_after(self, result):
        """The facts of nvidia_gpu_facts, read once more at the end, when asked for."""
        if not self.options.facts_after:
            return
        try:
            if self.last_snapshot is None or self.read_error:
                raise GpuopsError(self.read_error or 'the GPUs were not read')
            # The GPUs as the release read them last (within the timeout), the holders as they are now.
            facts, warnings = gather_facts(self.reader, self.options.devices, self.options.protect,
                                           self.options.memory_threshold_mib, self.deadline - self.clock(),
                                           holder_warnings=False, snapshot=self.last_snapshot)
        except GpuopsError as exc:
            self._warn('facts_after: the GPUs could not be read at the end: %s' % exc)
            return
        for warning in warnings:
            self._warn(warning)
        result.facts_after = facts

    def _check_gpus(self, snapshot):
        if snapshot is None:
            self._warn('the GPUs could not be read: %s' % self.read_error)
            return
        # A host short of GPUs fails as it is, before anything is signalled.
        check_expected_gpus(snapshot.gpus + snapshot.missing, self.options.expected_gpus)
        if self.options.gpus is not None:
            known = set(gpu.get('index') for gpu in snapshot.gpus)
            unknown = [index for index in self.options.gpus if index not in known]
            if unknown:
                raise GpuopsError('gpus: no GPU %s on this host (it has %s)' % (
                    ', '.join(str(index) for index in unknown),
                    ', '.join(str(index) for index in sorted(known)) or 'none'))

    def _memory(self, snapshot):
        return [{'index': gpu.get('index'), 'memory_used_mib': gpu.get('memory_used_mib')}
                for gpu in self._scope(snapshot)]

    def _run(self, result):
        snapshot, holders = self._observe(force_read=True)
        if self.read_error_permanent or (snapshot is None and self.options.expected_gpus is not None):
            # Waiting cannot fix it, and without a read nothing can be proved (nor how many GPUs
            # the host has): stop before any signal.
            raise GpuopsError('%s; nothing was signalled' % self.read_error)
        self._check_gpus(snapshot)
        result.gpus_before = self._memory(snapshot)
        result.diff['before'] = _holders_text(holders)
        if self.check_mode:
            would = [holder for holder in holders if not holder.protected]
            result.signalled = [dict(_describe(holder), signals_sent=[], exited=False) for holder in would]
            result.changed = bool(would)
            result.gpus_after = result.gpus_before
            result.released = self._clean(snapshot, holders)
            result.protected = [_describe(holder) for holder in holders if holder.protected]
            result.diff['after'] = _holders_text([holder for holder in holders if holder.protected])
            if self.options.wait and not would:
                result.orphaned_gpus = self._orphaned(self._scope(snapshot), [])
                if self.options.reset_orphaned and result.orphaned_gpus:
                    result.escalation = would_reset(result.orphaned_gpus)
                    result.changed = True
            return

        delay = POLL_MIN_S
        last_exit = None
        while True:
            now = self.clock()
            if self._enlist(holders, now):
                delay = POLL_MIN_S
            self._advance(now)
            if not self.targets and self._clean(snapshot, holders):
                break  # nothing to release
            if not self.options.wait and not self._ladder_pending(now, holders):
                break
            self._pause(self._next_event(self.clock(), delay))
            delay = min(delay * POLL_GROWTH, POLL_MAX_S)
            self._note_exits()
            snapshot, holders = self._observe()
            now = self.clock()
            if any(not holder.protected for holder in holders):
                last_exit = None
            elif last_exit is None:
                last_exit = now
                delay = POLL_MIN_S  # the driver frees the memory from now on: look again soon
            if self.options.wait and self._clean(snapshot, holders) and \
                    (not self.targets or now >= last_exit + self.options.settle_time):
                break
            if self._only_lost_left(snapshot, holders) or self._only_respawns_left(now, holders) \
                    or self.read_error_permanent or self._orphans_to_reset(now, snapshot, holders):
                break
            if now >= self.signal_deadline:
                if self._finish_ladders(now):
                    self._pause(min(self.deadline, self.clock() + FINAL_EXIT_S))
                    snapshot, holders = self._observe(force_read=True, final=True)
                break
        if snapshot is None:
            snapshot = self._read(final=True)
            if snapshot is None:
                self._warn('the GPUs could not be read: %s' % self.read_error)

        self._report(result, snapshot, holders)
        self._escalate(result, snapshot)

    def _orphans_to_reset(self, now, snapshot, holders):
        """True when the wait for orphaned memory is over and the reset's share of the timeout begins."""
        if self.orphan_deadline is None or now < self.orphan_deadline or snapshot is None \
                or any(not holder.protected for holder in holders):
            return False
        dirty = [gpu for gpu in self._scope(snapshot) if not self._gpu_clean(gpu)]
        # Lost GPUs no reset here can help are left as they are; the others must hold no process.
        return any(not gpu.get('error') for gpu in dirty) and not any(gpu.get('processes') for gpu in dirty)

    def _escalate(self, result, snapshot):
        """With reset_orphaned: reset the GPUs left with orphaned memory, then read everything again."""
        if not self.options.reset_orphaned or not result.orphaned_gpus:
            return
        if result.survivors:
            self._warn('reset_orphaned: GPU %s not reset: processes still hold the devices (%s)' % (
                ', '.join(str(index) for index in result.orphaned_gpus),
                ', '.join('pid %d' % survivor['pid'] for survivor in result.survivors)))
            return
        runner = self.smi_runner or SmiRunner(self.options.nvidia_smi_path)
        bus_ids = dict((gpu.get('index'), gpu.get('pci_bus_id')) for gpu in snapshot.gpus if gpu.get('index') is not None)
        # The reset ends when the signalling would: the read after it has the time left.
        reset = GpuReset(runner, bus_ids, result.orphaned_gpus, self.signal_deadline, self.clock)
        result.escalation = reset.run(result.orphaned_gpus)
        snapshot, holders = self._observe(force_read=True, final=True)
        result.failure = None
        self._report(result, snapshot, holders)
        result.changed = True
        if result.failure and not result.escalation['ok']:
            result.failure += '; the GPU reset failed: %s' % result.escalation['message']

    def _orphaned(self, scope, survivors):
        """The indexes of the GPUs of scope with memory used and no process holding them."""
        return [gpu.get('index') for gpu in scope
                if gpu.get('memory_used_mib') is not None and not gpu.get('error')
                if gpu['memory_used_mib'] > self.options.memory_threshold_mib
                if not gpu.get('processes') and not any(self._blocks(holder, gpu) for holder in survivors)]

    def _only_respawns_left(self, now, holders):
        """True when waiting cannot help: what holds the GPUs keeps being restarted."""
        unprotected = [holder for holder in holders if not holder.protected]
        return bool(unprotected) and all(_key(holder) in self.left_alone for holder in unprotected) \
            and not self._ladder_pending(now, [])

    def _reason(self, holder):
        if holder.state == 'D':
            return 'uninterruptible'
        if holder.state in ('Z', 'X') and holder.threads <= 1:
            return 'zombie'
        target = self.targets.get(_key(holder))
        if target is not None and target.not_permitted is not None:
            return 'not_permitted'
        if target is not None:
            return 'ignored_signals'
        return 'respawned'

    def _blocks(self, holder, gpu):
        node = self.gpu_nodes.get(gpu.get('index'))
        return blocks(holder.devices, holder.pid, set() if node is None else set([node]), [gpu])

    def _survivor(self, holder, scope):
        target = self.targets.get(_key(holder))
        out = dict(_describe(holder), reason=self._reason(holder),
                   signals_sent=list(target.signals_sent) if target else [],
                   gpus=[gpu.get('index') for gpu in scope if self._blocks(holder, gpu)])
        if out['reason'] == 'respawned':
            out['supervisor'] = supervisor(holder, self.proc)
        elif out['reason'] == 'not_permitted':
            out['uid'] = target.not_permitted
        return out

    def _report(self, result, snapshot, holders):
        scope = self._scope(snapshot)
        result.signalled = []
        for target in self.targets.values():
            result.signalled.append(dict(_describe(target.holder), signals_sent=list(target.signals_sent),
                                         exited=target.ref.exited()))
        result.changed = any(target.signals_sent for target in self.targets.values())
        result.protected = [_describe(holder) for key, holder in sorted(self.protected_seen.items())]
        survivors = [holder for holder in holders if not holder.protected]
        result.survivors = [self._survivor(holder, scope) for holder in survivors]
        result.gpus_after = self._memory(snapshot)
        result.diff['after'] = _holders_text(holders)
        result.released = self._clean(snapshot, holders)
        if self.options.wait:
            result.orphaned_gpus = self._orphaned(scope, survivors)
            if not result.released:
                result.failure = self._failure(snapshot, scope, result)

    @staticmethod
    def _why(survivor):
        text = 'pid %d (%s, %s' % (survivor['pid'], survivor['comm'], survivor['reason'])
        owner = survivor.get('supervisor')
        if owner:
            text += ' by pid %s %s' % (owner['pid'], owner['name'] or '')
            text += ''.join(', %s %s' % (kind, owner[kind]) for kind in ('unit', 'container') if owner[kind])
        if survivor['reason'] == 'not_permitted':
            text += ', uid %s' % survivor['uid']
        return text + ')'

    def _failure(self, snapshot, scope, result):
        problems = []
        if snapshot is None:
            problems.append('the GPUs could not be read: %s' % self.read_error)
        protected = dict((holder.pid, holder) for holder in self.protected_seen.values())
        blocking = set()
        for gpu in scope:
            index = gpu.get('index')
            holders = [survivor for survivor in result.survivors if index in survivor['gpus']]
            blocking.update(survivor['pid'] for survivor in holders)
            reported = [process for process in gpu.get('processes') or []
                        if not any(process.get('pid') == survivor['pid'] for survivor in holders)]
            used = gpu.get('memory_used_mib')
            if gpu.get('error'):
                problems.append('GPU %s could not be read (%s)' % (index, gpu['error']))
            elif index in result.orphaned_gpus:
                problems.append('GPU %s: %s MiB used with no process left (orphaned memory; only a GPU '
                                'reset frees it)' % (index, used))
            elif holders or reported or used is None or used > self.options.memory_threshold_mib:
                why = [self._why(survivor) for survivor in holders]
                why += ['protected pid %s (%s), which is never signalled' % (process.get('pid'), process.get('name'))
                        if process.get('pid') in protected else
                        'pid %s (%s, reported by the driver)' % (process.get('pid'), process.get('name'))
                        for process in reported]
                amount = 'memory used not reported' if used is None else '%s MiB used' % used
                problems.append('GPU %s: %s%s' % (index, amount, ', held by ' + ', '.join(why) if why else ''))
        for survivor in result.survivors:
            if survivor['pid'] not in blocking:
                problems.append('%s still holds %s' % (self._why(survivor), ', '.join(survivor['devices'])))
        if scope and all(gpu.get('error') or self._gpu_clean(gpu) for gpu in scope) and not result.survivors:
            return 'GPUs not released: %s' % '; '.join(problems)
        return 'GPUs not released within %s: %s' % (seconds(self.options.timeout), '; '.join(problems))


def release(reader, options, check_mode=False, signaller=None, proc='/proc'):
    """Run one release; returns a ReleaseResult."""
    return Release(reader, options, check_mode=check_mode, signaller=signaller, proc=proc).run()
