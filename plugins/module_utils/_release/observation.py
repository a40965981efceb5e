# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""What one release sees of the host: the GPUs in scope as the driver reports them, the processes
holding them (found on the host by device identity, placed on GPUs by what the driver reports) and
the role of each (a target, protected, foreign, another job's, read in part), their health and
history. The Observer reads; it signals nothing and resets nothing. Each observe() is a new reading
of the host; what the Observer keeps between readings is only what a later reading is judged by
(the processes seen clean before, those the driver reported twice, those already left alone).

The ladder (_ladder.Ladder) asks it, right before each signal, which of its targets must be left
alone now; the escalation (_cure.escalation.Escalation) reads and judges through it alone."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    CALL_FLOOR_S,
    GpuopsError,
    NoTimeLeft,
    PermanentReadError,
    printable,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import NOT_CLEAN_ACTIONS, health_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import (
    ancestors,
    cgroup,
    load_holder,
    real_and_effective_uid,
    scan_holders,
    uid_min,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import expand_devices
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import check_expected_gpus, gpu_nodes
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.jobs import JOBS_UNKNOWN, JobScope
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import read_xid_events
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig_scope import InstanceScope
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import blocks, gpus_in_scope, no_such_gpus, node_number
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, boot_id, load_cures

# /proc/uptime (when a target was signalled or seen gone) and a process's start time are read
# off the boot clock apart and rounded apart: they can disagree by a tick.
TICK_SKEW = 1
# With reset_orphaned, the longest the kernel log is read for the reasons to reset.
KERNEL_LOG_MAX_S = 10.0
# What only the release's first, full read of the GPUs has, for their health.
HEALTH_KEYS = ('remapped_rows_pending', 'remapped_rows_failure', 'retired_pages_pending', 'driver_recovery_action')


def process_key(holder):
    """What tells a process apart from a later one of the same pid: (pid, start time)."""
    return (holder.pid, holder.starttime)


def instance_of(gpu):
    """{'mig_instance': its GPU instance, compute instance and MIG UUID} of a MIG instance's view; {} of a GPU."""
    if 'mig_instance' not in gpu:
        return {}
    return {'mig_instance': dict((name, gpu['mig_instance'][name]) for name in ('gpu_instance_id', 'compute_instance_id', 'uuid'))}


def placements(snapshot):
    """{pid: GPU indexes} of the processes the driver reports."""
    found = {}
    for gpu in snapshot.gpus:
        for process in gpu.get('processes') or []:
            if process.get('pid') is not None:
                found.setdefault(process['pid'], set()).add(gpu.get('index'))
    return found


def _breaks_lines(pid, proc='/proc'):
    """Whether the name nvidia-smi prints for pid (its argv[0]) or its comm has a line break."""
    try:
        with open(os.path.join(proc, str(pid), 'cmdline'), 'rb') as handle:
            argv0 = handle.read(65536).split(b'\0', 1)[0]
        with open(os.path.join(proc, str(pid), 'comm'), 'rb') as handle:
            comm = handle.read(4096).rstrip(b'\n')
    except (IOError, OSError):
        return False
    return any(char in text for text in (argv0, comm) for char in (b'\r', b'\n'))


def is_system(holder, proc='/proc'):
    """True for a process whose real and effective uids are root's or a system account's."""
    uids = real_and_effective_uid(holder.pid, proc)
    return uids is not None and all(uid < uid_min() for uid in uids)


def boot_ticks():
    """Clock ticks since boot now, in the unit of a process's start time."""
    with open('/proc/uptime') as handle:
        return int(float(handle.read().split()[0]) * os.sysconf('SC_CLK_TCK'))


class Observer:
    """The readings of one release. reader: a GpuReader; options: release.ReleaseOptions.
    start() gives it the release's budget and deadlines before the first reading; ladder (set by
    the release) says which processes are its targets and what each was forked from."""

    def __init__(self, reader, options, check_mode=False, proc='/proc', clock=None, warnings=None):
        self.reader = reader
        self.options = options
        self.check_mode = check_mode
        self.proc = proc
        self.clock = clock
        self.warnings = warnings if warnings is not None else []
        self.ladder = None  # the release's _ladder.Ladder; None: a reading outside a release (nothing signalled)
        self.budget = None
        self.deadline = None
        self.signal_deadline = None
        self.due = None  # {index: [why]}: the GPUs a reset is for, named by an earlier release
        self.paths = []
        self.gpu_nodes = {}
        self.protected_seen = {}
        self.impersonators = set()
        self.foreign_seen = {}
        self.foreign_from_start = set()  # the foreign holders of the first observation
        self.reported_before = {}  # (pid, start time) -> the driver reported it on a scoped GPU
        self.last_keys = set()
        self.scan_incomplete = False
        self.last_scan = None  # the latest Scan: the one that says what holds the GPUs now
        self.clean_seen = {}  # pid -> start time of the processes read whole and holding nothing
        self.start_tick = boot_ticks()
        self.scan_s = 0.0  # how long the last scan of /proc took
        self.unread_may_hold = []  # the processes read in part that may hold the scope, as last seen
        self.unreadable = set()
        self.read_error = None
        self.read_error_permanent = False
        self.read_skipped = False  # the last read was not made: too little time was left for it
        # The GPUs only a reboot (or a driver reload) cures now: their reset the platform refused.
        self.reboot_only = set()
        self.last_snapshot = None
        self.observed = False
        self.first_snapshot = None  # the first observation's (the release's first, full read)
        # The kernel log's messages (Summary.events()), read once at the first need (False: not
        # yet; None: it could not be read).
        self.kernel_events = False
        self.own_session = os.getsid(0)
        self.own_cgroup = cgroup(os.getpid(), proc)
        self.jobs = JobScope(options.job, proc, own=ancestors(os.getpid(), proc)) if options.job else None
        self.other_jobs_seen = {}
        self.spared_pids = set()  # the holders the job's release leaves alone, and other jobs' pids, as last seen
        self.job_scoped = set()  # the shared GPUs judged for the job alone: others' processes are on them
        self.instance_scope = InstanceScope(options.instances, options.host_root) if options.instances else None

    def start(self, budget, deadline, signal_deadline):
        """Before the first reading: the release's budget and deadlines, and the device nodes in scope."""
        self.budget, self.deadline, self.signal_deadline = budget, deadline, signal_deadline
        self.paths = self._resolve_devices()
        self.gpu_nodes, problem = gpu_nodes(self.paths, self.options.host_root)
        if problem and self.options.gpus is not None:
            self.warn(problem)
        if self.options.gpus is not None:
            missing = [index for index in self.options.gpus if index not in self.gpu_nodes]
            if missing:
                self.warn('gpus: no device node nvidiaN among the matched devices for GPU %s; only the '
                          'processes the driver reports on it are released' % ', '.join(str(index) for index in missing))

    def warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)

    def _no_time_to_read(self):
        """None, noting why: a read is not started with less left than a call is given at least.
        The error of the last read that was tried says more than this, when there was one."""
        if self.read_error is None or self.read_skipped:
            self.read_error = 'no time was left to read the GPUs%s: %s; a read is given at least %.1f s' % (
                ' again' if self.last_snapshot is not None else '', self.budget.used(), CALL_FLOOR_S)
            self.read_skipped = True
        return None

    def read(self, final=False, full=False):
        # Every read ends by the deadline (a hung nvidia-smi must not make the release outlast its
        # timeout); those while signalling end by the signal deadline, which leaves the final read
        # of the state at the end its share.
        now = self.clock()
        left = (self.deadline if final or now >= self.signal_deadline else self.signal_deadline) - now
        if left < CALL_FLOOR_S:
            return self._no_time_to_read()
        tick = boot_ticks()
        try:
            snapshot = self.reader.read(timeout=left, full=full)
        except NoTimeLeft:  # a read of several calls, the last of them left short
            return self._no_time_to_read()
        except GpuopsError as exc:
            self.read_error = str(exc)
            self.read_error_permanent = isinstance(exc, PermanentReadError)
            self.read_skipped = False
            return None
        finally:
            self.budget.spend('reads of the GPUs', now)
        self.read_error = None
        self.read_error_permanent = False
        self.read_skipped = False
        snapshot.read_tick = tick
        self._read_instances(snapshot, final)
        snapshot.placements = placements(snapshot)
        snapshot.trusted = self._trusted_placements(snapshot)
        self.last_snapshot = snapshot
        for warning in snapshot.warnings:
            self.warn(warning)
        return snapshot

    def _read_instances(self, snapshot, final):
        """With MIG instances in scope: their MIG devices read onto snapshot, found on the first read,
        and their caps nodes added to the nodes scanned."""
        if self.instance_scope is None:
            return
        left = (self.deadline if final or self.clock() >= self.signal_deadline else self.signal_deadline) - self.clock()
        for warning in self.instance_scope.attach(self.reader, snapshot, max(left, CALL_FLOOR_S)):
            self.warn(warning)
        if self.instance_scope.keys is None:
            self.instance_scope.resolve(snapshot, self.gpu_nodes)
            self.paths = sorted(set(self.paths) | set(expand_devices(self.instance_scope.node_paths())))
            for key in self.instance_scope.unmapped():
                self.warn('gpus: the caps node of MIG instance %d:%s:%s (%s) cannot be read; only the processes the '
                          'driver places on it are released' % key)

    def instance_views(self, snapshot):
        return self.instance_scope.views(snapshot) if self.instance_scope is not None and snapshot is not None else []

    def _scope_indexes(self):
        """The indexes of the GPUs in scope, whole or by their MIG instances (gpus: set)."""
        return set(self.options.gpus) | (self.instance_scope.parents() if self.instance_scope is not None else set())

    def _trusted_placements(self, snapshot):
        """The placements that may add holders (the others only take holders out of the scope):
        nvidia-smi prints a process name raw, so a name with a line break forges lines, and a line
        it could not parse is the trace of one. Then only the pids with such a name are known to
        be the driver's, on no GPU that can be told. NVML gives structs."""
        if getattr(self.reader, 'backend', None) == 'nvml':
            return snapshot.placements
        forged = [pid for pid in snapshot.placements if _breaks_lines(pid, self.proc)]
        if forged or any('unreadable process line' in warning for warning in snapshot.warnings):
            self.warn('nvidia-smi\'s process list cannot be trusted (%s): a process name can forge its lines, so '
                      'it places no process on a GPU; holders are found by their device nodes only'
                      % ('pid %s has a line break in its name' % ', '.join(str(pid) for pid in sorted(forged))
                         if forged else 'a line did not parse'))
            return dict((pid, set()) for pid in forged)
        return snapshot.placements

    def scope(self, snapshot):
        # The GPUs the host has but the reader does not list (snapshot.missing) are lost GPUs of
        # the host: in scope for a release of every GPU (they have no index for gpus: to name).
        gpus = snapshot.gpus + list(getattr(snapshot, 'missing', [])) if snapshot is not None else []
        return gpus_in_scope(gpus, self.options.gpus) + self.instance_views(snapshot)

    def discover(self, snapshot):
        """The holders of the scope, found on the host by device identity and placed on GPUs by
        what the driver reports. When a holder vanished, the processes started during the scan
        are scanned too, so that a successor started behind it (at a lower pid) is not missed."""
        snapshot = snapshot or self.last_snapshot
        scan = self._scan()
        keys = set(process_key(holder) for holder in scan.holders)
        if self.last_keys - keys:
            scan.merge(self._scan(after=scan))
            self.scan_incomplete = not scan.complete
            self.last_scan = scan
            keys = set(process_key(holder) for holder in scan.holders)
        self.last_keys = keys
        placed = snapshot.placements if snapshot is not None else {}
        trusted = snapshot.trusted if snapshot is not None else {}
        holders = [holder for holder in scan.holders if self._holds_scope(holder, placed, trusted, snapshot)]
        holders += self._reported_only(snapshot, scan, trusted)
        holders += self._read_in_part_of_the_job(scan, holders)
        self._set_aside_for_job(holders, snapshot)
        self._mark_foreign(holders, trusted)
        return sorted(holders, key=lambda holder: holder.pid)

    def _read_in_part_of_the_job(self, scan, found):
        """The processes of the job (its cgroup, or its user's in no live job) whose descriptors
        could not all be read: targets, as holders of every node in scope (a descriptor may sit past
        any bound). The others of regular users in no other job are noted (unread_may_hold): never
        signalled, and the GPUs are not called released while one of them may hold them. (A system
        account's daemon with many descriptors is named in unreadable alone: it is no tenant.)"""
        taken, unread = [], []
        have = set(holder.pid for holder in found)
        own = ancestors(os.getpid(), self.proc)
        for entry in sorted(scan.partial):
            if entry.pid in have or entry.pid in own:
                continue
            holder = load_holder(entry.pid, self._scope_paths(), self.options.protect, own, self.proc)
            if holder is None or holder.protected:
                continue
            job = self.jobs.job_of(holder.pid) if self.jobs is not None else None
            if self.jobs is not None and self.jobs.is_own(holder, job):
                holder.job = job
                taken.append(holder)
            elif (self.jobs is None or not self.jobs.is_other(job)) and not is_system(holder, self.proc):
                unread.append(entry)
        self.unread_may_hold = unread
        return taken

    def _scope_paths(self):
        """The matched node paths of the scope: its GPUs' own nodes (gpus:), else every one."""
        if self.options.gpus is None:
            return list(self.paths)
        numbers = self._scope_nodes()
        paths = set(path for path in self.paths if node_number(path) in numbers)
        return sorted(paths | set(self.instance_scope.node_paths() if self.instance_scope else []))

    def _set_aside_for_job(self, holders, snapshot):
        """With job: mark protected the holders the job's release must leave alone (another live
        job's; on a shared GPU, any not the job's; an MPS daemon another job uses), and find the
        shared GPUs that are then judged for the job alone."""
        if self.jobs is None:
            return
        scope = self.scope(snapshot or self.last_snapshot)
        for holder in holders:
            holder.job = self.jobs.job_of(holder.pid)
        busy, self.spared_pids = self._shared_busy(scope, holders)
        for holder in holders:
            held = [gpu.get('index') for gpu in scope if self.blocks(holder, gpu)]
            why = None if holder.protected else self.jobs.why_left_alone(holder, holder.job, held, busy)
            if why:
                holder.protected = True
                holder.spared = why
                self.spared_pids.add(holder.pid)
        spared = [holder for holder in holders if holder.spared]
        self.job_scoped = set(gpu.get('index') for gpu in scope if gpu.get('index') in self.jobs.shared
                              if self._others_on(gpu, spared))

    def _shared_busy(self, scope, holders):
        """(the shared GPUs another job's process is on or holds, the pids of other jobs the driver
        places on the scope)."""
        others = [(gpu.get('index'), process.get('pid')) for gpu in scope for process in gpu.get('processes') or []
                  if self.jobs.is_other(self.jobs.job_of(process.get('pid')))]
        busy = set(index for index, dummy in others)
        busy.update(gpu.get('index') for gpu in scope for holder in holders
                    if self.jobs.is_other(holder.job) and self.blocks(holder, gpu))
        return busy & self.jobs.shared, set(pid for dummy, pid in others)

    def _others_on(self, gpu, spared):
        """Whether a process the job's release leaves alone is on gpu (the driver's list) or holds it."""
        return any(self.blocks_pid(pid, gpu) for pid in self.spared_pids) or \
            any(self.blocks(holder, gpu) for holder in spared)

    def _scan(self, after=None):
        started = self.clock()
        scan = scan_holders(self.paths, self.options.protect, self.proc, self.deadline, self.clock, after,
                            known=self.clean_seen)
        self.budget.spend('scans of /proc', started)
        self.scan_s = self.clock() - started
        # Only a process that was there before the release began is not read again: one started
        # since may be a holder's fork caught before it opened a node.
        old = dict((pid, tick) for pid, tick in scan.clean.items() if tick < self.start_tick - TICK_SKEW)
        if after is None:
            self.clean_seen = old
        else:
            self.clean_seen.update(old)
        self.unreadable.update(scan.unreadable)
        self.scan_incomplete = not scan.complete
        self.last_scan = scan
        return scan

    def _scope_nodes(self):
        return set(self.gpu_nodes[index] for index in self.options.gpus if index in self.gpu_nodes)

    def _holds_scope(self, holder, placed, trusted, snapshot=None):
        """Whether a process found on the host holds the scope: every holder without gpus:; with
        it, one that holds a scoped GPU's node, unless the driver places it only on other GPUs
        (NVML and CUDA open every GPU's node on hosts without device cgroups). A forged line can
        only take a process out of the scope this way, which leaves its memory to fail the release.
        A MIG instance in scope is held through its caps node (_mig_scope), never its parent's node."""
        if self.options.gpus is None:
            return True
        where = placed.get(holder.pid)
        if where and not where & self._scope_indexes():
            return False
        if blocks(holder.devices, None, self._scope_nodes(), []):
            return True
        if self.instance_scope is not None and self.instance_scope.holds(holder.devices):
            return True
        unmapped = [view for view in self.instance_views(snapshot) if view['mig_instance']['caps_node'] is None]
        if trusted.get(holder.pid) and InstanceScope.placed_on(holder.pid, unmapped):
            return True
        # A scoped GPU without a node among the matched devices: the driver's placement decides.
        unmapped = set(self.options.gpus) - set(self.gpu_nodes)
        return bool(trusted.get(holder.pid, set()) & unmapped)

    def _reported_only(self, snapshot, scan, trusted):
        """Processes the driver places on a scoped GPU that the scan did not find: those whose
        descriptors could not be read (not running as root), each admitted when two reads
        reported the same process, which started before the first of them. A process whose
        descriptors were read and hold no node of the scope is no holder of it, whatever the
        driver's list says (a pid in it may be forged or recycled)."""
        if self.options.gpus is None or not trusted:
            return []
        found = set(holder.pid for holder in scan.holders)
        admitted = []
        for pid, placed in sorted(trusted.items()):
            if pid in found or pid not in scan.unreadable_pids() or not (
                    placed & set(self.options.gpus) or InstanceScope.placed_on(pid, self.instance_views(snapshot))):
                continue
            holder = load_holder(pid, [], self.options.protect, ancestors(os.getpid(), self.proc), self.proc)
            if holder is None or holder.starttime >= snapshot.read_tick:
                continue  # gone, or a newcomer with a recycled pid
            first = self.reported_before.setdefault(process_key(holder), snapshot.read_tick)
            if first < snapshot.read_tick and not is_system(holder):
                admitted.append(holder)
        return admitted

    def _mark_foreign(self, holders, placements):
        """Leave alone (as foreign holders) the root and system processes that the driver places on
        no GPU and that share no session, cgroup or ancestry with a job's holder: a daemon that
        was handed a descriptor is no job. A process of the release's own session was started by
        whoever started the release, and is theirs to release; one whose name breaks the driver's
        list into lines is a job that tried to hide."""
        jobs = [holder for holder in holders if not holder.protected and self._is_job(holder, placements)]
        for holder in holders:
            if holder.protected or holder in jobs or self._belongs_to(holder, jobs) \
                    or (self.ladder is not None and self.ladder.relative(holder) is not None):
                continue
            holder.protected = True
            holder.foreign = True
            self.foreign_seen.setdefault(process_key(holder), holder)

    def _is_job(self, holder, placements):
        return any((holder.pid in placements, self.ladder is not None and self.ladder.has(holder), holder.session == self.own_session,
                    not is_system(holder, self.proc), _breaks_lines(holder.pid, self.proc)))

    def _belongs_to(self, holder, jobs):
        chain = ancestors(holder.ppid, self.proc) if holder.ppid else set()
        own = cgroup(holder.pid, self.proc)
        for job in jobs:
            if job.pid in chain or (holder.session and holder.session == job.session != self.own_session):
                return True
            if own and own not in ('/', self.own_cgroup) and own == cgroup(job.pid, self.proc):
                return True
        return False

    def observe(self, force_read=False, final=False, full=False):
        """(snapshot or None, holders). The GPUs are read when the scope or the check needs it;
        final: the read of the state at the end, which may take until the deadline; full: every
        value read again (see GpuReader.read), where the other reads read only memory and processes."""
        snapshot = None
        if force_read or self.options.gpus is not None:
            snapshot = self.read(final, full)
        holders = self.discover(snapshot)
        if not self.observed:
            self.observed = True
            self.first_snapshot = snapshot
            self.foreign_from_start = set(process_key(holder) for holder in holders if holder.foreign)
        for holder in holders:
            if holder.spared:
                self.other_jobs_seen[process_key(holder)] = holder
            elif holder.protected and not holder.foreign:
                self.protected_seen.setdefault(process_key(holder), holder)
            elif holder.impersonates and holder.pid not in self.impersonators:
                self.impersonators.add(holder.pid)
                self.warn('pid %d (user %s, executable %s) calls itself %s but is not the protected daemon '
                          '(its executable is not that root-owned program, or it runs as a regular user); '
                          'it is treated as a normal holder' % (holder.pid, holder.user,
                                                                printable(holder.exe or 'unknown'),
                                                                holder.impersonates))
        return snapshot, holders

    def gpu_clean(self, gpu):
        """Readable, at or below the threshold, and no process on it in the driver's list (one
        that is no holder on this host is named in the failure, never called gone). A shared GPU
        that other jobs use is judged for the job: readable, none of its processes left on it."""
        if gpu.get('index') in self.job_scoped:
            return not gpu.get('error') and not self.job_processes(gpu)
        used = gpu.get('memory_used_mib')
        return not gpu.get('error') and used is not None and used <= self.options.memory_threshold_mib \
            and not gpu.get('processes')

    def clean(self, snapshot, holders):
        """The scope read clean, nothing left to signal, no foreign holder or process of a job that
        cannot be told on it, and no process read in part that may hold it."""
        if snapshot is None or self.scan_incomplete or self.unread_may_hold \
                or any(not holder.protected or holder.foreign or holder.spared == JOBS_UNKNOWN for holder in holders):
            return False
        return all(self.gpu_clean(gpu) for gpu in self.scope(snapshot))

    def only_left_alone(self, holders):
        """True when waiting cannot help: nothing is left to signal, and a process that is never
        signalled keeps the scope from being called released: one read in part, or a foreign holder
        that held the scope before the release began. (One that turned up since may be a holder's
        respawn that the driver does not place yet: it is waited for.)"""
        if any(not holder.protected for holder in holders):
            return False
        return bool(self.unread_may_hold) or any(process_key(holder) in self.foreign_from_start
                                                 for holder in holders if holder.foreign)

    def spared_on(self, gpu):
        """The holders the job's release leaves alone that hold gpu, when it is judged as a whole."""
        if gpu.get('index') in self.job_scoped:
            return []
        return [holder for key, holder in sorted(self.other_jobs_seen.items())
                if holder.pid in self.spared_pids and self.blocks(holder, gpu)]

    def only_spared_left(self, snapshot, holders):
        """True when waiting cannot help: no holder is left to signal and every dirty GPU is held
        by a process the job's release leaves alone (another live job's)."""
        if snapshot is None or self.jobs is None or any(not holder.protected for holder in holders):
            return False
        dirty = [gpu for gpu in self.scope(snapshot) if not self.gpu_clean(gpu)]
        return bool(dirty) and all(self.spared_on(gpu) for gpu in dirty)

    def only_lost_left(self, snapshot, holders):
        """True when waiting cannot help: no holder is left and every dirty GPU is lost."""
        if snapshot is None or any(not holder.protected for holder in holders):
            return False
        dirty = [gpu for gpu in self.scope(snapshot) if not self.gpu_clean(gpu)]
        return bool(dirty) and all(gpu.get('error') for gpu in dirty)

    def check_gpus(self, snapshot):
        if snapshot is None:
            self.warn('the GPUs could not be read: %s' % self.read_error)
            return
        # A host short of GPUs fails as it is, before anything is signalled.
        check_expected_gpus(snapshot.gpus + snapshot.missing, self.options.expected_gpus)
        if self.instance_scope is not None:
            self.instance_scope.check()
        if self.options.gpus is not None:
            known = set(gpu.get('index') for gpu in snapshot.gpus)
            unknown = [index for index in self.options.gpus if index not in known]
            if unknown:
                raise GpuopsError('gpus: %s' % no_such_gpus(unknown, known))

    def states(self, snapshot):
        """Each GPU in scope as the release left it: its state, what the driver says of it, and the
        recovery action its health calls for (as nvidia_gpu_facts decides it)."""
        health = self.health(snapshot)
        return [dict({'index': gpu.get('index'), 'pci_bus_id': gpu.get('pci_bus_id'), 'uuid': gpu.get('uuid'),
                      'state': gpu_state(gpu, self.options.memory_threshold_mib),
                      'driver_recovery_action': gpu.get('driver_recovery_action'),
                      'recovery_action': 'reboot' if gpu.get('index') in self.reboot_only else
                      health[gpu['index']][1]['recovery_action'] if gpu.get('index') in health else None,
                      'memory_used_mib': gpu.get('memory_used_mib')}, **instance_of(gpu)) for gpu in self.scope(snapshot)]

    def memory(self, snapshot):
        return [dict({'index': gpu.get('index'), 'memory_used_mib': gpu.get('memory_used_mib')}, **instance_of(gpu))
                for gpu in self.scope(snapshot)]

    def history(self, snapshot):
        """{uuid: the newest events and counts per window} of the GPUs in scope."""
        history = History.for_host(self.options.host_root, self.options.state_dir)
        return dict((gpu['uuid'], history.summary(gpu['uuid'])) for gpu in self.scope(snapshot)
                    if gpu.get('uuid') and history.events(gpu['uuid']))

    def health(self, snapshot):
        """{index: (the GPU, its health_facts)} of the GPUs in scope, as nvidia_gpu_facts judges
        them: the kernel log (read once per release) since each GPU's last cure (read each time: a
        reset cures), and what only the first, full read has."""
        if self.kernel_events is False:
            self.kernel_events = None
            left = min(KERNEL_LOG_MAX_S, self.signal_deadline - self.clock())
            if left > 0:
                started = self.clock()
                self.kernel_events, warnings = read_xid_events(
                    self.options.kernel_log, left, boot=boot_id(),
                    state=StateDir.for_host(self.options.state_dir, self.options.host_root))
                self.budget.spend('reading the kernel log', started)
                for warning in warnings:
                    self.warn(warning)
        cures = load_cures(StateDir.for_host(self.options.state_dir, self.options.host_root), boot_id())
        first = dict((gpu.get('uuid'), gpu) for gpu in self.first_snapshot.gpus) if self.first_snapshot else {}
        found = {}
        for gpu in self.scope(snapshot) if snapshot is not None else ():
            if gpu.get('index') is None:
                continue
            # The light reads of the release leave out what only the first, full read has.
            known = dict(gpu)
            for key in HEALTH_KEYS:
                if known.get(key) is None:
                    known[key] = (first.get(gpu.get('uuid')) or {}).get(key)
            found[gpu['index']] = (known, health_facts(known, self.kernel_events, cures.get(gpu.get('uuid'))))
        return found

    def unhealthy(self, index, health):
        """Whether a GPU's health leaves it not clean after this release: a reset, a reboot or a
        person (_health.NOT_CLEAN_ACTIONS). With reset_orphaned, a reset is the escalation's to do
        and to judge (on a GPU other jobs do not use, and one of those due when they are named)."""
        action = health.get('recovery_action')
        if action == 'reset_gpu' and self.options.reset_orphaned and index not in self.job_scoped \
                and index not in self.instance_only() and (self.due is None or index in self.due):
            return False
        return action in NOT_CLEAN_ACTIONS

    def instance_only(self):
        """The GPUs in scope only through MIG instances: a reset of one would end its other instances."""
        if self.instance_scope is None:
            return set()
        return self.instance_scope.parents() - set(self.options.gpus or ())

    def orphaned(self, scope, survivors):
        """The indexes of the GPUs of scope with memory used and no process holding them (a MIG
        instance's memory is its parent's to reset: said, not reset, see _instance_only)."""
        return [gpu.get('index') for gpu in scope if gpu.get('index') not in self.job_scoped and 'mig_instance' not in gpu
                if gpu.get('memory_used_mib') is not None and not gpu.get('error')
                if gpu['memory_used_mib'] > self.options.memory_threshold_mib
                if not gpu.get('processes') and not any(self.blocks(holder, gpu) for holder in survivors)]

    def blocks(self, holder, gpu):
        if 'mig_instance' in gpu:
            return self.instance_scope.holds(holder.devices, gpu) or self.blocks_pid(holder.pid, gpu)
        node = self.gpu_nodes.get(gpu.get('index'))
        return blocks(holder.devices, holder.pid, set() if node is None else set([node]), [gpu])

    @staticmethod
    def blocks_pid(pid, gpu):
        return any(process.get('pid') == pid for process in gpu.get('processes') or [])

    def job_processes(self, gpu):
        """The processes the driver lists on gpu that the job's release does not leave alone."""
        return [process for process in gpu.get('processes') or [] if process.get('pid') not in self.spared_pids]

    def _resolve_devices(self):
        """The device node paths; a pattern that matches none, or a non-NVIDIA node, is an error."""
        paths = expand_devices(self.options.devices)
        unmatched = [pattern for pattern in self.options.devices if not expand_devices([pattern])]
        if unmatched:
            raise GpuopsError('devices: %s matches no NVIDIA device node (is the pattern spelled right, and '
                              'is the NVIDIA driver loaded?); nothing was signalled' % ', '.join(unmatched))
        return paths

    def left_alone_now(self, holders, ladder_holders):
        """{(pid, start time): why} of the holders (about to be signalled) that must be left alone,
        decided now, right before the signal: each one's job read again (its cgroup; slurmd's list,
        read again where it is used). One that is another job's now, or whose job cannot be told,
        is marked spared and never signalled. ladder_holders: every holder on the ladder."""
        if self.jobs is None or not holders:
            return {}
        problem = self.jobs.refresh()
        if problem:
            self.warn('scontrol listpids could not be read again before the signals (%s): a process in no job '
                      'cgroup that is not of the job\'s user is not signalled' % problem)
        scope = self.scope(self.last_snapshot)
        for holder in list(ladder_holders) + list(self.other_jobs_seen.values()):
            holder.job = self.jobs.job_of(holder.pid)
        busy, dummy = self._shared_busy(scope, list(ladder_holders) + list(self.other_jobs_seen.values()))
        spared = {}
        for holder in holders:
            held = [gpu.get('index') for gpu in scope if self.blocks(holder, gpu)]
            why = self.jobs.why_left_alone(holder, holder.job, held, busy)
            if why is None and problem and holder.job is None and holder.uid != self.jobs.uid:
                why = JOBS_UNKNOWN
            if why is None:
                continue
            holder.protected, holder.spared = True, why
            self.spared_pids.add(holder.pid)
            self.other_jobs_seen[process_key(holder)] = holder
            spared[process_key(holder)] = why
        return spared
