# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Release of the GPUs: stop the processes holding them and prove the memory is free.

Order: discover holders, leave protected ones alone, walk every other holder through the
signal ladder, re-discover (children and newcomers get their own ladder, respawns are
chased a bounded number of times), then poll until no unprotected holder is left and every
GPU in scope reports memory at or below the threshold, or the timeout passes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re
import tempfile
import time

try:
    import fcntl
    HAS_FCNTL = True
except ImportError:  # not a POSIX host
    HAS_FCNTL = False

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    GpuopsError,
    check_non_negative,
    holders_argument_spec,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._facts import gather_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._holders import (
    ancestors,
    expand_devices,
    find_holders,
    load_holder,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._host import device_patterns, gpu_nodes
from ansible_collections.gpuops.nvidia.plugins.module_utils._signals import (
    ProcessRef,
    Signaller,
    parse_signal,
    wait_exited,
)

DEFAULT_SIGNALS = ['TERM', 'KILL']
LOCK_DIR = '/run/lock'
LOCK_NAME = 'gpuops-nvidia-release.lock'

# Rounds of signalling (the first holders, then children and newcomers found afterwards),
# and how often one command line may come back after it was stopped before it is left alone.
MAX_ROUNDS = 8
RESPAWN_LIMIT = 1

# Each poll scans /proc and reads every GPU: on a host with many processes that is not free,
# and a driver takes a fraction of a second or more to free the memory of a process that exited.
POLL_MIN_S = 0.05
POLL_MAX_S = 0.25
POLL_GROWTH = 2
# A read of the GPUs may outlast the deadline by this much, so that the state at the end
# can still be reported.
READ_MIN_S = 1.0

GPU_NODE_RE = re.compile(r'^nvidia([0-9]+)$')
REASONS = ('uninterruptible', 'zombie', 'respawned', 'ignored_signals')


def release_argument_spec():
    spec = dict(
        gpus=dict(type='list', elements='int'),
        signals=dict(type='list', elements='str', default=list(DEFAULT_SIGNALS)),
        grace_period=dict(type='float', default=5.0),
        wait=dict(type='bool', default=True),
        timeout=dict(type='float', default=60.0),
        memory_threshold_mib=dict(type='int', default=0),
        lock_file=dict(type='path'),
        facts_after=dict(type='bool', default=False),
    )
    spec.update(reader_argument_spec())
    spec.update(holders_argument_spec())
    return spec


class ReleaseOptions:
    """Validated options of a release."""

    def __init__(self, devices, gpus=None, signals=None, grace_period=5.0, protect=(),
                 wait=True, timeout=60.0, memory_threshold_mib=0, lock_file=None, facts_after=False,
                 host_root='/'):
        problem = check_non_negative(
            dict(grace_period=grace_period, timeout=timeout, memory_threshold_mib=memory_threshold_mib),
            ['grace_period', 'timeout', 'memory_threshold_mib'])
        if problem:
            raise GpuopsError(problem)
        signals = DEFAULT_SIGNALS if signals is None else signals
        if not signals:
            raise GpuopsError('signals must name at least one signal, e.g. [TERM, KILL]')
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
        # Device globs as found under host_root (a simulated host, or the host's /dev in a container).
        self.devices = device_patterns(devices, host_root)
        self.host_root = host_root
        self.gpus = gpus
        self.signals = [parse_signal(name) for name in signals]
        self.grace_period = grace_period
        self.protect = list(protect)
        self.wait = wait
        self.timeout = timeout
        self.memory_threshold_mib = memory_threshold_mib
        self.lock_file = lock_file
        self.facts_after = facts_after

    @classmethod
    def from_params(cls, params):
        return cls(params['devices'], params.get('gpus'), params['signals'], params['grace_period'],
                   list(params['protect']) + list(params.get('extra_protect') or []),
                   params['wait'], params['timeout'], params['memory_threshold_mib'],
                   params.get('lock_file'), params.get('facts_after', False), params.get('host_root') or '/')


def default_lock_file():
    if os.path.isdir(LOCK_DIR) and os.access(LOCK_DIR, os.W_OK):
        return os.path.join(LOCK_DIR, LOCK_NAME)
    return os.path.join(tempfile.gettempdir(), LOCK_NAME)


class ReleaseLock:
    """An exclusive flock on a file, so that releases on one host run one at a time."""

    def __init__(self, path):
        self.path = path
        self.fd = None

    def acquire(self, deadline, clock=time.monotonic, sleep=time.sleep):
        if not HAS_FCNTL:
            return
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            writable = True
        except OSError:
            # Created by another user (e.g. in a sticky temp dir): a read-only fd locks as well.
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                raise GpuopsError('cannot open lock file %s: %s (set lock_file)' % (self.path, exc.strerror))
            writable = False
        delay = 0.01
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    self.release()
                    raise GpuopsError('cannot lock %s: %s' % (self.path, exc.strerror))
            left = deadline - clock()
            if left <= 0:
                owner = self._owner()
                self.release()
                raise GpuopsError('another release%s still holds the lock file %s; gave up when the '
                                  'timeout passed' % (' (pid %s)' % owner if owner else '', self.path))
            sleep(min(delay, left))
            delay = min(delay * 2, 0.2)
        if writable:
            os.ftruncate(self.fd, 0)
            os.write(self.fd, ('%d\n' % os.getpid()).encode('ascii'))

    def _owner(self):
        try:
            with open(self.path) as handle:
                return handle.read().strip() or None
        except (IOError, OSError):
            return None

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing the last fd drops the flock
            self.fd = None


class Target:
    """A holder that is (or would be) signalled."""

    def __init__(self, holder, ref):
        self.holder = holder
        self.ref = ref
        self.signals_sent = []


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
        self.failure = None
        self.warnings = []

    def dump(self, diff=False):
        out = dict(changed=self.changed, released=self.released, signalled=self.signalled,
                   protected=self.protected, survivors=self.survivors,
                   orphaned_gpus=self.orphaned_gpus, gpus_before=self.gpus_before,
                   gpus_after=self.gpus_after, elapsed_s=self.elapsed_s)
        if self.facts_after is not None:
            out['facts_after'] = self.facts_after
        if diff:
            out['diff'] = dict(self.diff, before_header='holders before', after_header='holders after')
        return out


class Release:
    """One release run. reader: a GpuReader; options: ReleaseOptions."""

    def __init__(self, reader, options, check_mode=False, signaller=None, proc='/proc',
                 clock=time.monotonic, sleep=time.sleep):
        self.reader = reader
        self.options = options
        self.check_mode = check_mode
        self.signaller = signaller or Signaller()
        self.proc = proc
        self.clock = clock
        self.sleep = sleep
        self.deadline = None
        self.paths = []
        self.gpu_nodes = {}
        self.targets = {}
        self.left_alone = {}
        self.respawns = {}
        self.protected_seen = {}
        self.unreadable = 0
        self.read_error = None
        self.warnings = []

    # -- observation ---------------------------------------------------------------------
    def _warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)

    def _read(self):
        left = self.deadline - self.clock()
        try:
            snapshot = self.reader.read(timeout=max(left, READ_MIN_S))
        except GpuopsError as exc:
            self.read_error = str(exc)
            return None
        self.read_error = None
        for warning in snapshot.warnings:
            self._warn(warning)
        return snapshot

    def _scope(self, snapshot):
        gpus = snapshot.gpus if snapshot is not None else []
        if self.options.gpus is not None:
            gpus = [gpu for gpu in gpus if gpu.get('index') in self.options.gpus]
        return sorted(gpus, key=lambda gpu: gpu.get('index'))

    def _discover(self, snapshot):
        holders, unreadable = find_holders(self.paths, self.options.protect, self.proc)
        self.unreadable = max(self.unreadable, unreadable)
        if self.options.gpus is None:
            return holders
        nodes = set(self.gpu_nodes[index] for index in self.options.gpus if index in self.gpu_nodes)
        scoped = [holder for holder in holders if nodes.intersection(holder.devices)]
        by_pid = dict((holder.pid, holder) for holder in holders)
        for gpu in self._scope(snapshot):
            for process in gpu.get('processes') or []:
                pid = process.get('pid')
                if pid is None or any(holder.pid == pid for holder in scoped):
                    continue
                holder = by_pid.get(pid) or self._holder_for_pid(pid)
                if holder is not None:
                    scoped.append(holder)
        return sorted(scoped, key=lambda holder: holder.pid)

    def _holder_for_pid(self, pid):
        """A process the driver reports on a GPU but that holds no matching node."""
        # None when it is gone, or lives in another pid namespace.
        return load_holder(pid, [], self.options.protect, ancestors(os.getpid(), self.proc), self.proc)

    def _observe(self, force_read=False):
        """(snapshot or None, holders). The GPUs are read when the scope or the check needs it."""
        snapshot = None
        if force_read or self.options.gpus is not None:
            snapshot = self._read()
        holders = self._discover(snapshot)
        for holder in holders:
            if holder.protected:
                self.protected_seen.setdefault(_key(holder), holder)
        if snapshot is None and not force_read and self.options.wait \
                and not any(not holder.protected for holder in holders):
            snapshot = self._read()
        return snapshot, holders

    def _gpu_clean(self, gpu):
        used = gpu.get('memory_used_mib')
        return not gpu.get('error') and used is not None and used <= self.options.memory_threshold_mib

    def _clean(self, snapshot, holders):
        return (snapshot is not None and not any(not holder.protected for holder in holders)
                and all(self._gpu_clean(gpu) for gpu in self._scope(snapshot)))

    def _only_lost_left(self, snapshot, holders):
        """True when waiting cannot help: no holder is left and every dirty GPU is lost."""
        if snapshot is None or any(not holder.protected for holder in holders):
            return False
        dirty = [gpu for gpu in self._scope(snapshot) if not self._gpu_clean(gpu)]
        return bool(dirty) and all(gpu.get('error') for gpu in dirty)

    # -- signalling ----------------------------------------------------------------------
    def _predecessor_exited(self, identity):
        return any(_identity(target.holder) == identity and target.ref.exited()
                   for target in self.targets.values())

    def _fresh(self, holders):
        """Unprotected holders not yet signalled; respawns past the limit are left alone."""
        fresh = []
        for holder in holders:
            key = _key(holder)
            if holder.protected or key in self.targets or key in self.left_alone:
                continue
            identity = _identity(holder)
            if self._predecessor_exited(identity):
                count = self.respawns.get(identity, 0)
                if count >= RESPAWN_LIMIT:
                    self.left_alone[key] = holder
                    continue
                self.respawns[identity] = count + 1
            fresh.append(holder)
        return fresh

    def _ladder(self, holders):
        batch = []
        for holder in holders:
            target = Target(holder, ProcessRef(holder.pid, holder.starttime, self.proc))
            self.targets[_key(holder)] = target
            batch.append(target)
        for name, number in self.options.signals:
            alive = [target for target in batch if not target.ref.exited()]
            if not alive:
                break
            for target in alive:
                holder = target.holder
                try:
                    sent = self.signaller.send(target.ref, name, number, holder.user,
                                               holder.cmdline or holder.comm, holder.devices)
                except GpuopsError as exc:  # not permitted: report it and go on with the others
                    self._warn(str(exc))
                    continue
                if sent:
                    target.signals_sent.append(name)
            wait_exited([target.ref for target in alive], self.options.grace_period, self.clock)

    # -- the run -------------------------------------------------------------------------
    def run(self):
        started = self.clock()
        self.deadline = started + self.options.timeout
        result = ReleaseResult()
        self.paths = expand_devices(self.options.devices)
        if not self.paths:
            self._warn('devices: no device node matches %s; this host may have no NVIDIA GPU or '
                       'driver, nothing to release' % ', '.join(self.options.devices))
            result.released = True
            self._read_facts_after(result)
            result.elapsed_s = round(self.clock() - started, 3)
            result.warnings = self.warnings
            return result
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
                lock = ReleaseLock(self.options.lock_file or default_lock_file())
                lock.acquire(self.deadline, self.clock, self.sleep)
            self._run(result)
        finally:
            if lock is not None:
                lock.release()
            for target in self.targets.values():
                target.ref.close()
        self._read_facts_after(result)
        result.elapsed_s = round(self.clock() - started, 3)
        if self.unreadable:
            self._warn('%d process(es) could not be inspected for open device nodes (permission '
                       'denied); run with become: true to release every holder' % self.unreadable)
        result.warnings = self.warnings
        return result

    def _read_facts_after(self, result):
        """The facts of nvidia_gpu_facts, read once more at the end, when asked for."""
        if not self.options.facts_after:
            return
        try:
            facts, warnings = gather_facts(self.reader, self.options.devices, self.options.protect,
                                           self.options.memory_threshold_mib,
                                           max(self.deadline - self.clock(), READ_MIN_S),
                                           holder_warnings=False)
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
            return

        rounds = 0
        delay = POLL_MIN_S
        while True:
            fresh = self._fresh(holders)
            if fresh and rounds < MAX_ROUNDS:
                rounds += 1
                self._ladder(fresh)
                snapshot, holders = self._observe()
                delay = POLL_MIN_S
                continue
            if not self.options.wait or self._clean(snapshot, holders) \
                    or self._only_lost_left(snapshot, holders):
                break
            left = self.deadline - self.clock()
            if left <= 0:
                break
            self.sleep(min(delay, left))
            delay = min(delay * POLL_GROWTH, POLL_MAX_S)
            snapshot, holders = self._observe()
        if snapshot is None:
            snapshot = self._read()
            if snapshot is None:
                self._warn('the GPUs could not be read: %s' % self.read_error)

        self._report(result, snapshot, holders)

    def _reason(self, holder):
        if holder.state == 'D':
            return 'uninterruptible'
        if holder.state in ('Z', 'X'):
            return 'zombie'
        if _key(holder) in self.targets:
            return 'ignored_signals'
        return 'respawned'

    def _blocks(self, holder, gpu):
        node = self.gpu_nodes.get(gpu.get('index'))
        return (node is not None and node in holder.devices) or \
            any(process.get('pid') == holder.pid for process in gpu.get('processes') or [])

    def _report(self, result, snapshot, holders):
        scope = self._scope(snapshot)
        result.signalled = []
        for target in self.targets.values():
            result.signalled.append(dict(_describe(target.holder), signals_sent=list(target.signals_sent),
                                         exited=target.ref.exited()))
        result.changed = any(target.signals_sent for target in self.targets.values())
        result.protected = [_describe(holder) for key, holder in sorted(self.protected_seen.items())]
        survivors = [holder for holder in holders if not holder.protected]
        for holder in survivors:
            target = self.targets.get(_key(holder))
            result.survivors.append(dict(
                _describe(holder), reason=self._reason(holder),
                signals_sent=list(target.signals_sent) if target else [],
                gpus=[gpu.get('index') for gpu in scope if self._blocks(holder, gpu)]))
        result.gpus_after = self._memory(snapshot)
        result.diff['after'] = _holders_text(holders)
        result.released = self._clean(snapshot, holders)
        if self.options.wait:
            result.orphaned_gpus = [
                gpu.get('index') for gpu in scope
                if gpu.get('memory_used_mib') is not None and not gpu.get('error')
                and gpu['memory_used_mib'] > self.options.memory_threshold_mib
                and not gpu.get('processes') and not any(self._blocks(holder, gpu) for holder in survivors)]
            if not result.released:
                result.failure = self._failure(snapshot, scope, result)

    def _failure(self, snapshot, scope, result):
        problems = []
        if snapshot is None:
            problems.append('the GPUs could not be read: %s' % self.read_error)
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
                why = ['pid %d (%s, %s)' % (survivor['pid'], survivor['comm'], survivor['reason'])
                       for survivor in holders]
                why += ['pid %s (%s, reported by the driver)' % (process.get('pid'), process.get('name'))
                        for process in reported]
                amount = 'memory used not reported' if used is None else '%s MiB used' % used
                problems.append('GPU %s: %s%s' % (index, amount, ', held by ' + ', '.join(why) if why else ''))
        for survivor in result.survivors:
            if survivor['pid'] not in blocking:
                problems.append('pid %d (%s, %s) still holds %s' % (
                    survivor['pid'], survivor['comm'], survivor['reason'], ', '.join(survivor['devices'])))
        if scope and all(gpu.get('error') or self._gpu_clean(gpu) for gpu in scope) and not result.survivors:
            return 'GPUs not released: %s' % '; '.join(problems)
        return 'GPUs not released within %s s: %s' % (self.options.timeout, '; '.join(problems))


def release(reader, options, check_mode=False, signaller=None, proc='/proc'):
    """Run one release; returns a ReleaseResult."""
    return Release(reader, options, check_mode=check_mode, signaller=signaller, proc=proc).run()
