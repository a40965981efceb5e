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
import resource
import select
import signal
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    CALL_FLOOR_S,
    DEFAULT_MEMORY_THRESHOLD_MIB,
    READ_MIN_S,
    Budget,
    GpuopsError,
    NoTimeLeft,
    PermanentReadError,
    holders_argument_spec,
    printable,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._facts import gather_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._health import NOT_CLEAN_ACTIONS, health_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._kernel_log import read_xid_events
from ansible_collections.gpuops.nvidia.plugins.module_utils._holders import (
    ancestors,
    cgroup,
    expand_devices,
    load_holder,
    named_unread,
    partial_warning,
    real_and_effective_uid,
    scan_holders,
    supervisor,
    uid_min,
    uninspectable_warning,
    unread_processes,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._host import check_expected_gpus, device_patterns, gpu_nodes
from ansible_collections.gpuops.nvidia.plugins.module_utils._jobs import JOBS_UNKNOWN, JobScope, check_job
from ansible_collections.gpuops.nvidia.plugins.module_utils._scope import blocks, gpus_in_scope, no_such_gpus, node_number, split_gpus
from ansible_collections.gpuops.nvidia.plugins.module_utils._mig_scope import InstanceScope
from ansible_collections.gpuops.nvidia.plugins.module_utils._lock import ReleaseLock
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import (
    DEFAULT_SIGNALS,
    check_escalation_options,
    check_release_options,
    seconds,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import RELEASE_PROBE_SPEC, probe_after_release, probe_scope
from ansible_collections.gpuops.nvidia.plugins.module_utils._reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._reset_plan import due_entries, not_released, reset_plan
from ansible_collections.gpuops.nvidia.plugins.module_utils._state import StateDir, boot_id, load_cures
from ansible_collections.gpuops.nvidia.plugins.module_utils._history import (
    HOLD_AFTER_CURES, HOLD_WINDOW_DAYS, History, check_hold_options)
from ansible_collections.gpuops.nvidia.plugins.module_utils._signals import (
    NotPermittedError,
    ProcessRef,
    Signaller,
)

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
# While memory that no process holds waits for the driver, nothing on the host can free it sooner:
# the reads grow further apart, up to this.
UNHELD_POLL_MAX_S = 1.0
# After the last signals at the deadline, how long to wait for the processes to exit before
# the final reading.
FINAL_EXIT_S = 0.2
# /proc/uptime (when a target was signalled or seen gone) and a process's start time are read
# off the boot clock apart and rounded apart: they can disagree by a tick.
TICK_SKEW = 1
# Rescans of the frozen set before the final KILL: each finds processes forked before SIGSTOP landed.
FREEZE_RESCANS = 5

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

# With reset_orphaned, the longest the kernel log is read for the reasons to reset.
KERNEL_LOG_MAX_S = 10.0
# What only the release's first, full read of the GPUs has, for their health.
HEALTH_KEYS = ('remapped_rows_pending', 'remapped_rows_failure', 'retired_pages_pending', 'driver_recovery_action')

REGEX_HINT_RE = re.compile(r'\.[*+]|[\\^$+(){}|]')
REASONS = ('uninterruptible', 'zombie', 'respawned', 'ignored_signals', 'not_permitted')
# Why released is false although the GPUs read clean: the settle window did not fit in the timeout.
NOT_SETTLED = 'not_settled'

# Descriptors kept free for nvidia-smi's pipes, the lock and /proc reads when pidfds pile up.
FD_RESERVE = 64


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


# The reset's own options (nvidia_device_reset's, _escalation.reset_argument_spec), carried by the
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
        check_hold_options(values['hold_after_cures'], values['hold_window_days'])
        self.hold_after_cures, self.hold_window_days = values['hold_after_cures'], values['hold_window_days']
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


def _instance_of(gpu):
    """{'mig_instance': its GPU instance, compute instance and MIG UUID} of a MIG instance's view; {} of a GPU."""
    if 'mig_instance' not in gpu:
        return {}
    return {'mig_instance': dict((key, gpu['mig_instance'][key]) for key in ('gpu_instance_id', 'compute_instance_id', 'uuid'))}


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
            comm = handle.read().rstrip(b'\n')
    except (IOError, OSError):
        return False
    return any(char in text for text in (argv0, comm) for char in (b'\r', b'\n'))


def is_system(holder, proc='/proc'):
    """True for a process whose real and effective uids are root's or a system account's."""
    uids = real_and_effective_uid(holder.pid, proc)
    return uids is not None and all(uid < uid_min() for uid in uids)


def _identity(holder):
    return (holder.uid, holder.comm, holder.cmdline)


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


def boot_ticks():
    """Clock ticks since boot now, in the unit of a process's start time."""
    with open('/proc/uptime') as handle:
        return int(float(handle.read().split()[0]) * os.sysconf('SC_CLK_TCK'))


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
    """One release run. reader: a GpuReader; options: ReleaseOptions."""

    def __init__(self, reader, options, check_mode=False, signaller=None, proc='/proc',
                 clock=time.monotonic, sleep=time.sleep, smi_runner=None, escalation=None):
        self.reader = reader
        # The reset of the GPUs reset_orphaned finds needing one (_escalation.Escalation, module
        # nvidia_device_reset); None: they are named in reset_due, for that module.
        self.escalation = escalation
        self.due = None  # {index: [why]}: the GPUs the reset is for, named by an earlier release
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
        self.settled = True
        self.last_exit = None
        self.fd_limit = FD_RESERVE * 2
        self.impersonators = set()
        self.foreign_seen = {}
        self.reported_before = {}  # (pid, start time) -> the driver reported it on a scoped GPU
        self.last_keys = set()
        self.scan_incomplete = False
        self.last_scan = None  # the latest Scan: the one that says what holds the GPUs now
        self.clean_seen = {}  # pid -> start time of the processes read whole and holding nothing
        self.start_tick = boot_ticks()
        self.scan_s = 0.0  # how long the last scan of /proc took
        self.unread_may_hold = []  # the processes read in part that may hold the scope, as last seen
        self.foreign_now = []  # the foreign holders of the scope at the end
        self.foreign_from_start = set()  # the foreign holders of the first observation
        self.unreadable = set()
        self.read_error = None
        self.read_error_permanent = False
        self.read_skipped = False  # the last read was not made: too little time was left for it
        # The GPUs only a reboot (or a driver reload) cures now: their reset the platform refused.
        self.reboot_only = set()
        self.budget = None
        self.last_snapshot = None
        self.first_snapshot = None
        # The kernel log's messages (Summary.events()), read once at the first need (False: not
        # yet; None: it could not be read).
        self.kernel_events = False
        self.reset_deadline = None
        self.unheld_since = None  # when a read first found the memory held by no process
        self.orphans_waited = False
        self.warnings = list(options.warnings)
        self.own_session = os.getsid(0)
        self.own_cgroup = cgroup(os.getpid(), proc)
        self.jobs = JobScope(options.job, proc, own=ancestors(os.getpid(), proc)) if options.job else None
        self.other_jobs_seen = {}
        self.spared_pids = set()  # the holders the job's release leaves alone, and other jobs' pids, as last seen
        self.job_scoped = set()  # the shared GPUs judged for the job alone: others' processes are on them
        self.instance_scope = InstanceScope(options.instances, options.host_root) if options.instances else None

    # -- observation ---------------------------------------------------------------------
    def _warn(self, text):
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

    def _read(self, final=False, full=False):
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
            self._warn(warning)
        return snapshot

    def _read_instances(self, snapshot, final):
        """With MIG instances in scope: their MIG devices read onto snapshot, found on the first read,
        and their caps nodes added to the nodes scanned."""
        if self.instance_scope is None:
            return
        left = (self.deadline if final or self.clock() >= self.signal_deadline else self.signal_deadline) - self.clock()
        for warning in self.instance_scope.attach(self.reader, snapshot, max(left, CALL_FLOOR_S)):
            self._warn(warning)
        if self.instance_scope.keys is None:
            self.instance_scope.resolve(snapshot, self.gpu_nodes)
            self.paths = sorted(set(self.paths) | set(expand_devices(self.instance_scope.node_paths())))
            for key in self.instance_scope.unmapped():
                self._warn('gpus: the caps node of MIG instance %d:%s:%s (%s) cannot be read; only the processes the '
                           'driver places on it are released' % key)

    def _instance_views(self, snapshot):
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
            self._warn('nvidia-smi\'s process list cannot be trusted (%s): a process name can forge its lines, so '
                       'it places no process on a GPU; holders are found by their device nodes only'
                       % ('pid %s has a line break in its name' % ', '.join(str(pid) for pid in sorted(forged))
                          if forged else 'a line did not parse'))
            return dict((pid, set()) for pid in forged)
        return snapshot.placements

    def _scope(self, snapshot):
        # The GPUs the host has but the reader does not list (snapshot.missing) are lost GPUs of
        # the host: in scope for a release of every GPU (they have no index for gpus: to name).
        gpus = snapshot.gpus + list(getattr(snapshot, 'missing', [])) if snapshot is not None else []
        return gpus_in_scope(gpus, self.options.gpus) + self._instance_views(snapshot)

    def _discover(self, snapshot):
        """The holders of the scope, found on the host by device identity and placed on GPUs by
        what the driver reports. When a holder vanished, the processes started during the scan
        are scanned too, so that a successor started behind it (at a lower pid) is not missed."""
        snapshot = snapshot or self.last_snapshot
        scan = self._scan()
        keys = set(_key(holder) for holder in scan.holders)
        if self.last_keys - keys:
            scan.merge(self._scan(after=scan))
            self.scan_incomplete = not scan.complete
            self.last_scan = scan
            keys = set(_key(holder) for holder in scan.holders)
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
        scope = self._scope(snapshot or self.last_snapshot)
        for holder in holders:
            holder.job = self.jobs.job_of(holder.pid)
        busy, self.spared_pids = self._shared_busy(scope, holders)
        for holder in holders:
            held = [gpu.get('index') for gpu in scope if self._blocks(holder, gpu)]
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
                    if self.jobs.is_other(holder.job) and self._blocks(holder, gpu))
        return busy & self.jobs.shared, set(pid for dummy, pid in others)

    def _confirm_jobs(self, due):
        """The targets of due that may still be signalled, decided now, right before the signal:
        each one's job read again (its cgroup; slurmd's list, read again where it is used). One that
        is another job's now, or whose job cannot be told, leaves the ladder, never signalled."""
        if self.jobs is None or not due:
            return due
        problem = self.jobs.refresh()
        if problem:
            self._warn('scontrol listpids could not be read again before the signals (%s): a process in no job '
                       'cgroup that is not of the job\'s user is not signalled' % problem)
        scope = self._scope(self.last_snapshot)
        holders = [target.holder for target in self.targets.values()] + list(self.other_jobs_seen.values())
        for holder in holders:
            holder.job = self.jobs.job_of(holder.pid)
        busy, dummy = self._shared_busy(scope, holders)
        kept = []
        for target in due:
            holder = target.holder
            held = [gpu.get('index') for gpu in scope if self._blocks(holder, gpu)]
            why = self.jobs.why_left_alone(holder, holder.job, held, busy)
            if why is None and problem and holder.job is None and holder.uid != self.jobs.uid:
                why = JOBS_UNKNOWN
            if why is None:
                kept.append(target)
                continue
            holder.protected, holder.spared = True, why
            self.spared_pids.add(holder.pid)
            self.other_jobs_seen[_key(holder)] = holder
            target.ref.close()
            del self.targets[_key(holder)]
        return kept

    def _others_on(self, gpu, spared):
        """Whether a process the job's release leaves alone is on gpu (the driver's list) or holds it."""
        return any(self._blocks_pid(pid, gpu) for pid in self.spared_pids) or \
            any(self._blocks(holder, gpu) for holder in spared)

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
        unmapped = [view for view in self._instance_views(snapshot) if view['mig_instance']['caps_node'] is None]
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
                    placed & set(self.options.gpus) or InstanceScope.placed_on(pid, self._instance_views(snapshot))):
                continue
            holder = load_holder(pid, [], self.options.protect, ancestors(os.getpid(), self.proc), self.proc)
            if holder is None or holder.starttime >= snapshot.read_tick:
                continue  # gone, or a newcomer with a recycled pid
            key = _key(holder)
            first = self.reported_before.setdefault(key, snapshot.read_tick)
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
                    or self._relative(holder) is not None:
                continue
            holder.protected = True
            holder.foreign = True
            self.foreign_seen.setdefault(_key(holder), holder)

    def _is_job(self, holder, placements):
        return any((holder.pid in placements, _key(holder) in self.targets, holder.session == self.own_session,
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

    def _observe(self, force_read=False, final=False, full=False):
        """(snapshot or None, holders). The GPUs are read when the scope or the check needs it;
        final: the read of the state at the end, which may take until the deadline; full: every
        value read again (see GpuReader.read), where the other reads read only memory and processes."""
        snapshot = None
        if force_read or self.options.gpus is not None:
            snapshot = self._read(final, full)
        holders = self._discover(snapshot)
        for holder in holders:
            if holder.spared:
                self.other_jobs_seen[_key(holder)] = holder
            elif holder.protected and not holder.foreign:
                self.protected_seen.setdefault(_key(holder), holder)
            elif holder.impersonates and holder.pid not in self.impersonators:
                self.impersonators.add(holder.pid)
                self._warn('pid %d (user %s, executable %s) calls itself %s but is not the protected daemon '
                           '(its executable is not that root-owned program, or it runs as a regular user); '
                           'it is treated as a normal holder' % (holder.pid, holder.user,
                                                                 printable(holder.exe or 'unknown'),
                                                                 holder.impersonates))
        if snapshot is None and not force_read and self.options.wait \
                and not any(not holder.protected for holder in holders) and self._read_due():
            snapshot = self._read()
        return snapshot, holders

    def _quiet_read_due(self):
        """When the GPUs are worth reading after the last holder exited: the release cannot end
        before the settle window has passed, so a read before then would prove nothing (unless
        the orphan wait is shorter)."""
        exited = self.last_exit if self.last_exit is not None else self.clock()
        return exited + min(self.options.settle_time, ORPHAN_WAIT_S)

    def _read_due(self):
        return not self.targets or self.clock() >= self._quiet_read_due()

    def _gpu_clean(self, gpu):
        """Readable, at or below the threshold, and no process on it in the driver's list (one
        that is no holder on this host is named in the failure, never called gone). A shared GPU
        that other jobs use is judged for the job: readable, none of its processes left on it."""
        if gpu.get('index') in self.job_scoped:
            return not gpu.get('error') and not self._job_processes(gpu)
        used = gpu.get('memory_used_mib')
        return not gpu.get('error') and used is not None and used <= self.options.memory_threshold_mib \
            and not gpu.get('processes')

    def _clean(self, snapshot, holders):
        """The scope read clean, nothing left to signal, no foreign holder or process of a job that
        cannot be told on it, and no process read in part that may hold it."""
        if snapshot is None or self.scan_incomplete or self.unread_may_hold \
                or any(not holder.protected or holder.foreign or holder.spared == JOBS_UNKNOWN for holder in holders):
            return False
        return all(self._gpu_clean(gpu) for gpu in self._scope(snapshot))

    def _only_left_alone(self, holders):
        """True when waiting cannot help: nothing is left to signal, and a process that is never
        signalled keeps the scope from being called released: one read in part, or a foreign holder
        that held the scope before the release began. (One that turned up since may be a holder's
        respawn that the driver does not place yet: it is waited for.)"""
        if any(not holder.protected for holder in holders):
            return False
        return bool(self.unread_may_hold) or any(_key(holder) in self.foreign_from_start
                                                 for holder in holders if holder.foreign)

    def _spared_on(self, gpu):
        """The holders the job's release leaves alone that hold gpu, when it is judged as a whole."""
        if gpu.get('index') in self.job_scoped:
            return []
        return [holder for key, holder in sorted(self.other_jobs_seen.items())
                if holder.pid in self.spared_pids and self._blocks(holder, gpu)]

    def _only_spared_left(self, snapshot, holders):
        """True when waiting cannot help: no holder is left to signal and every dirty GPU is held
        by a process the job's release leaves alone (another live job's)."""
        if snapshot is None or self.jobs is None or any(not holder.protected for holder in holders):
            return False
        dirty = [gpu for gpu in self._scope(snapshot) if not self._gpu_clean(gpu)]
        return bool(dirty) and all(self._spared_on(gpu) for gpu in dirty)

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
            if target.gone_tick is not None and holder.starttime > target.gone_tick + TICK_SKEW:
                continue
            if holder.session and holder.session == other.session and holder.session != self.own_session:
                return target
            if holder.uid == other.uid and target.signalled_tick is not None \
                    and holder.starttime >= target.signalled_tick - TICK_SKEW:
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
            target = Target(holder, ProcessRef(holder.pid, holder.starttime, self.proc, use_pidfd=self._pidfd_room()),
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

    def _pidfd_room(self):
        """None (a pidfd where the kernel has them) while descriptors are left for one, else False:
        a target is then pinned by its start time alone, so that a thousand targets cannot leave
        nvidia-smi without the descriptors it needs to start."""
        open_pidfds = sum(1 for target in self.targets.values() if target.ref.pidfd is not None)
        return None if open_pidfds + FD_RESERVE < self.fd_limit else False

    def _grace(self, now, remaining):
        """The wait before the next signal, squeezed so that the remaining ones fit the deadline."""
        left = max(self.signal_deadline - now, 0.0)
        return min(self.options.grace_period, left / max(remaining, 1))

    def _send(self, target, name, number):
        """Signal target; True when the signal went out. SIGSTOP, part of the final step, is
        logged but not listed in signals_sent, which lists the ladder's signals."""
        holder = target.holder
        # Read before the signal goes out: a process it makes the target fork starts after it.
        tick = boot_ticks() if target.signalled_tick is None else target.signalled_tick
        try:
            sent = self.signaller.send(target.ref, name, number, holder.user,
                                       holder.cmdline or holder.name, holder.devices)
        except NotPermittedError as exc:
            target.not_permitted = exc.uid if exc.uid is not None else holder.uid
            return False
        if sent and number != signal.SIGSTOP:
            target.signals_sent.append(name)
        if sent:
            target.signalled_tick = tick
        return sent

    def _advance(self, now):
        """Send every signal that is due; the final KILL goes to the whole set at once."""
        ladder = self.options.signals
        last = len(ladder) - 1
        final = []
        due = [target for target in self.targets.values() if self._due(target, now)]
        for target in self._confirm_jobs(due):
            if target.step == last and ladder[last][0] == 'KILL':
                final.append(target)
                continue
            name, number = ladder[target.step]
            self._send(target, name, number)
            target.step += 1
            target.due = now + self._grace(now, len(ladder) - target.step)
        if final:
            self._freeze_and_kill(final, now)

    def _due(self, target, now):
        """Whether target's next signal is due now: it has one left, it is alive, and may be signalled."""
        return target.step < len(self.options.signals) and target.due <= now and \
            target.not_permitted is None and not target.ref.exited()

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
        """Note the targets seen gone; when every target is gone, when that was seen (clock)."""
        tick = None
        for target in self.targets.values():
            if target.gone_tick is None and target.ref.exited():
                tick = boot_ticks() if tick is None else tick
                target.gone_tick = tick
                target.ref.close()
        if self.targets and all(target.gone_tick is not None for target in self.targets.values()):
            return self.clock()
        return None

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
            if target.step < len(self.options.signals) and target.not_permitted is None \
                    and not target.ref.exited():
                wake = min(wake, target.due)
        if self.last_exit is not None and self.targets and self._quiet_read_due() > now:
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
        alive = [target for target in self.targets.values() if not target.ref.exited()]
        pidfds = [target.ref.pidfd for target in alive if target.ref.pidfd is not None]
        if pidfds:
            poller = select.poll()
            for fd in pidfds:
                poller.register(fd, select.POLLIN)
            poller.poll(max(1, int(left * 1000)))
        else:
            self.sleep(left)
        self.budget.spend('waiting for the holders to exit' if alive else 'waiting for the driver to free memory', started)

    # -- the run -------------------------------------------------------------------------
    def _resolve_devices(self):
        """The device node paths; a pattern that matches none, or a non-NVIDIA node, is an error."""
        paths = expand_devices(self.options.devices)
        unmatched = [pattern for pattern in self.options.devices if not expand_devices([pattern])]
        if unmatched:
            raise GpuopsError('devices: %s matches no NVIDIA device node (is the pattern spelled right, and '
                              'is the NVIDIA driver loaded?); nothing was signalled' % ', '.join(unmatched))
        return paths

    def run(self, due=None):
        """The release; with due ({index: [why]}, the reset_due of an earlier release): only the
        reset of those GPUs that still need it, read again now, nothing signalled."""
        started = self.clock()
        self.due = due
        self.budget = Budget('the release', self.options.timeout, self.clock)
        self.deadline = started + self.options.timeout
        self.signal_deadline = self.deadline - READ_MIN_S
        # The reset's share ends where the signalling would: the read after it keeps its own.
        self.reset_deadline = self.signal_deadline - max(READ_MIN_S, self.options.timeout * RESET_SHARE) \
            if self.options.reset_orphaned else None
        result = ReleaseResult()
        self.fd_limit = raise_fd_limit()
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
                self.budget.spend('waiting for the lock', started)
            if due is None:
                self._run(result)
            else:
                self._reset_only(result, due)
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
        if self.scan_incomplete:
            self._warn('the scan of /proc for holders did not finish within the timeout: processes it did not '
                       'reach are unknown, so the GPUs cannot be called released')
        if self.last_scan is not None:
            result.unreadable = unread_processes(self.last_scan)
            warning = partial_warning(self.last_scan)
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
                                           kernel_log=self.options.kernel_log,
                                           holder_warnings=False, snapshot=self.last_snapshot,
                                           state=StateDir.for_host(self.options.state_dir, self.options.host_root),
                                           history=History.for_host(self.options.host_root, self.options.state_dir))
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
        if self.instance_scope is not None:
            self.instance_scope.check()
        if self.options.gpus is not None:
            known = set(gpu.get('index') for gpu in snapshot.gpus)
            unknown = [index for index in self.options.gpus if index not in known]
            if unknown:
                raise GpuopsError('gpus: %s' % no_such_gpus(unknown, known))

    def _states(self, snapshot):
        """Each GPU in scope as the release left it: its state, what the driver says of it, and the
        recovery action its health calls for (as nvidia_gpu_facts decides it)."""
        health = self._health(snapshot)
        return [dict({'index': gpu.get('index'), 'pci_bus_id': gpu.get('pci_bus_id'), 'uuid': gpu.get('uuid'),
                      'state': gpu_state(gpu, self.options.memory_threshold_mib),
                      'driver_recovery_action': gpu.get('driver_recovery_action'),
                      'recovery_action': 'reboot' if gpu.get('index') in self.reboot_only else
                      health[gpu['index']][1]['recovery_action'] if gpu.get('index') in health else None,
                      'memory_used_mib': gpu.get('memory_used_mib')}, **_instance_of(gpu)) for gpu in self._scope(snapshot)]

    def _memory(self, snapshot):
        return [dict({'index': gpu.get('index'), 'memory_used_mib': gpu.get('memory_used_mib')}, **_instance_of(gpu))
                for gpu in self._scope(snapshot)]

    def _run(self, result):
        snapshot, holders = self._observe(force_read=True, full=True)
        self.first_snapshot = snapshot
        self.foreign_from_start = set(_key(holder) for holder in holders if holder.foreign)
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
            result.gpu_states = self._states(snapshot)
            result.released = self._clean(snapshot, holders) and not any(
                self._unhealthy(index, health) for index, (dummy, health) in self._health(snapshot).items())
            result.protected = [_describe(holder) for holder in holders
                                if holder.protected and not holder.foreign and not holder.spared]
            result.foreign_holders = [self._foreign(holder) for holder in holders if holder.foreign]
            result.other_jobs = [self._other_job(holder, self._scope(snapshot)) for holder in holders if holder.spared]
            result.diff['after'] = _holders_text([holder for holder in holders if holder.protected])
            if self.options.wait and not would:
                result.orphaned_gpus = self._orphaned(self._scope(snapshot), [])
                self._would_escalate(result, snapshot)
            return

        delay = POLL_MIN_S
        self.last_exit = None
        self._orphaned_for_good(self.clock(), snapshot, holders)  # the wait for the driver starts with this read
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
            delay = min(delay * POLL_GROWTH, POLL_MAX_S if self.unheld_since is None else UNHELD_POLL_MAX_S)
            exited_at = self._note_exits()
            snapshot, holders = self._observe()
            now = self.clock()
            if any(not holder.protected for holder in holders):
                self.last_exit = None
            elif self.last_exit is None:
                # When the last target was seen gone, before the scan that found no holder left:
                # on a host of many processes a scan takes a while, and the window counts from the exit.
                self.last_exit = now if exited_at is None else exited_at
                delay = POLL_MIN_S  # the driver frees the memory from now on: look again soon
            if self.options.wait and self._clean(snapshot, holders) and \
                    (not self.targets or now >= self.last_exit + self.options.settle_time):
                break
            if self._only_lost_left(snapshot, holders) or self._only_respawns_left(now, holders) \
                    or self._only_spared_left(snapshot, holders) or self._only_left_alone(holders) \
                    or self.read_error_permanent or self._orphaned_for_good(now, snapshot, holders):
                break
            if now >= self.signal_deadline and self._only_settling_left(holders):
                continue
            if now >= self.signal_deadline:
                if self._finish_ladders(now):
                    self._pause(min(self.deadline, self.clock() + FINAL_EXIT_S))
                    snapshot, holders = self._observe(force_read=True, final=True)
                    if any(not holder.protected for holder in holders):
                        self.last_exit = None
                    elif self.last_exit is None:
                        self.last_exit = self.clock()
                break
        if snapshot is None:
            snapshot = self._read(final=True)
            if snapshot is None:
                self._warn('the GPUs could not be read: %s' % self.read_error)

        self._report(result, snapshot, holders)
        self._escalate(result, snapshot)

    def _only_settling_left(self, holders):
        """True while every target is gone and the settle window, not yet over, is all that is left,
        and it ends early enough for a scan and a read after it within the timeout: the signalling is
        over, so the share kept for the last read is free for the window (a host of many processes
        reaches it late). Once the window is over the loop ends, clean or not."""
        if not self.targets or self.last_exit is None or any(not holder.protected for holder in holders):
            return False
        settled = self.last_exit + self.options.settle_time
        return self.clock() < settled and settled + self.scan_s + CALL_FLOOR_S <= self.deadline

    def _orphaned_for_good(self, now, snapshot, holders):
        """True when memory that no process holds has stayed held for ORPHAN_WAIT_S (longer than a
        driver takes to free a dead process's memory), or the reset's share of the timeout begins."""
        if any(not holder.protected for holder in holders):
            self.unheld_since = None
            return False
        if snapshot is None:
            return False  # not read this time: nothing new
        dirty = [gpu for gpu in self._scope(snapshot) if not self._gpu_clean(gpu)]
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
        todo = reset_plan(self, result, snapshot)
        if self.escalation is not None:
            self.escalation(self).run(result, snapshot, todo)
        elif todo:
            result.reset_due = due_entries(todo)
            not_released(result, '; '.join('GPU %s needs a reset (%s)' % (index, ', '.join(why))
                                           for index, why in sorted(todo.items())))

    def _would_escalate(self, result, snapshot):
        """Check mode with reset_orphaned: what the escalation would do, or which GPUs it would be for."""
        if not self.options.reset_orphaned:
            return
        todo = reset_plan(self, result, snapshot)
        if self.escalation is not None:
            self.escalation(self).preview(result, snapshot, todo)
        else:
            result.reset_due = due_entries(todo)

    def _reset_only(self, result, due):
        """The reset of the GPUs due that still need it: the host read again now, nothing signalled
        (a holder of the job still there keeps its GPU from the reset)."""
        snapshot, holders = self._observe(force_read=True, full=True)
        self.first_snapshot = snapshot
        if snapshot is None:
            raise GpuopsError('%s; nothing was reset' % self.read_error)
        self._check_gpus(snapshot)
        result.gpus_before = self._memory(snapshot)
        result.diff['before'] = _holders_text(holders)
        self._report(result, snapshot, holders)
        if self.check_mode:
            self.escalation(self).preview(result, snapshot, due)
        else:
            self.escalation(self).run(result, snapshot, due)

    def _history(self, snapshot):
        """{uuid: the newest events and counts per window} of the GPUs in scope."""
        history = History.for_host(self.options.host_root, self.options.state_dir)
        return dict((gpu['uuid'], history.summary(gpu['uuid'])) for gpu in self._scope(snapshot)
                    if gpu.get('uuid') and history.events(gpu['uuid']))

    def _health(self, snapshot):
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
                    self._warn(warning)
        cures = load_cures(StateDir.for_host(self.options.state_dir, self.options.host_root), boot_id())
        first = dict((gpu.get('uuid'), gpu) for gpu in self.first_snapshot.gpus) if self.first_snapshot else {}
        found = {}
        for gpu in self._scope(snapshot) if snapshot is not None else ():
            if gpu.get('index') is None:
                continue
            # The light reads of the release leave out what only the first, full read has.
            known = dict(gpu)
            for key in HEALTH_KEYS:
                if known.get(key) is None:
                    known[key] = (first.get(gpu.get('uuid')) or {}).get(key)
            found[gpu['index']] = (known, health_facts(known, self.kernel_events, cures.get(gpu.get('uuid'))))
        return found

    def _unhealthy(self, index, health):
        """Whether a GPU's health leaves it not clean after this release: a reset, a reboot or a
        person (_health.NOT_CLEAN_ACTIONS). With reset_orphaned, a reset is the escalation's to do
        and to judge (on a GPU other jobs do not use, and one of those due when they are named)."""
        action = health.get('recovery_action')
        if action == 'reset_gpu' and self.options.reset_orphaned and index not in self.job_scoped \
                and index not in self._instance_only() and (self.due is None or index in self.due):
            return False
        return action in NOT_CLEAN_ACTIONS

    def _instance_only(self):
        """The GPUs in scope only through MIG instances: a reset of one would end its other instances."""
        if self.instance_scope is None:
            return set()
        return self.instance_scope.parents() - set(self.options.gpus or ())

    def _orphaned(self, scope, survivors):
        """The indexes of the GPUs of scope with memory used and no process holding them (a MIG
        instance's memory is its parent's to reset: said, not reset, see _instance_only)."""
        return [gpu.get('index') for gpu in scope if gpu.get('index') not in self.job_scoped and 'mig_instance' not in gpu
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
        if 'mig_instance' in gpu:
            return self.instance_scope.holds(holder.devices, gpu) or self._blocks_pid(holder.pid, gpu)
        node = self.gpu_nodes.get(gpu.get('index'))
        return blocks(holder.devices, holder.pid, set() if node is None else set([node]), [gpu])

    @staticmethod
    def _blocks_pid(pid, gpu):
        return any(process.get('pid') == pid for process in gpu.get('processes') or [])

    def _job_processes(self, gpu):
        """The processes the driver lists on gpu that the job's release does not leave alone."""
        return [process for process in gpu.get('processes') or [] if process.get('pid') not in self.spared_pids]

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
        result.foreign_holders = [self._foreign(holder) for key, holder in sorted(self.foreign_seen.items())]
        result.other_jobs = [self._other_job(holder, scope) for key, holder in sorted(self.other_jobs_seen.items())]
        self.foreign_now = [holder for holder in holders if holder.foreign]
        survivors = [holder for holder in holders if not holder.protected]
        result.survivors = [self._survivor(holder, scope) for holder in survivors]
        result.gpus_after = self._memory(snapshot)
        result.gpu_states = self._states(snapshot)
        result.diff['after'] = _holders_text(holders)
        clean = self._clean(snapshot, holders)
        if any(not holder.protected for holder in holders):
            self.last_exit = None
        settle_end = None if self.last_exit is None else self.last_exit + self.options.settle_time
        self.settled = not self.targets or (settle_end is not None and self.clock() >= settle_end)
        healthy = not any(self._unhealthy(index, health) for index, (dummy, health) in self._health(snapshot).items())
        result.released = clean and self.settled and healthy
        if self.options.wait:
            result.orphaned_gpus = self._orphaned(scope, survivors)
            if not result.released:
                result.failure = self._failure(snapshot, scope, result)

    def _foreign(self, holder):
        return dict(_describe(holder), reason=_reason.FOREIGN_HOLDER, unit=supervisor(holder, self.proc)['unit'])

    def _other_job(self, holder, scope):
        return dict(_describe(holder), job_id=holder.job, why=holder.spared,
                    gpus=[gpu.get('index') for gpu in scope if self._blocks(holder, gpu)])

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
            problems.append('the GPUs could not be read: %s' % self.read_error)
        if self.scan_incomplete:
            problems.append('the scan of /proc for holders did not finish in time (%s)' % self.budget.used())
        unread = unread_processes(self.last_scan) if self.last_scan is not None else []
        may_hold = [entry for entry in unread if entry['pid'] in set(part.pid for part in self.unread_may_hold)]
        if may_hold:
            problems.append('the descriptors of %s could not all be read: it may hold a GPU in scope, and is never '
                            'signalled (it is no process of the job); see what it is' % named_unread(may_hold))
        elif unread and not all(self._gpu_clean(gpu) for gpu in scope):
            problems.append('the descriptors of %s could not all be read' % named_unread(unread))
        protected = dict((holder.pid, holder) for holder in self.protected_seen.values())
        blocking = set()
        healths = self._health(snapshot)
        for gpu in scope:
            index = gpu.get('index')
            holders = [survivor for survivor in result.survivors if index in survivor['gpus']]
            blocking.update(survivor['pid'] for survivor in holders)
            reported = [process for process in self._job_processes(gpu)
                        if not any(process.get('pid') == survivor['pid'] for survivor in holders)]
            used = gpu.get('memory_used_mib')
            why = [self._why(survivor) for survivor in holders]
            why += ['protected pid %s (%s), which is never signalled' % (process.get('pid'), printable(process.get('name')))
                    if process.get('pid') in protected else
                    'pid %s (%s, reported by the driver)' % (process.get('pid'), printable(process.get('name')))
                    for process in reported]
            foreign = [holder for holder in self.foreign_now if self._blocks(holder, gpu)]
            why += [_reason.foreign_why(holder, self.proc) for holder in foreign]
            why += [_reason.spared_why(holder) for holder in self._spared_on(gpu)]
            health = healths.get(index, (None, None))[1]
            problem = _reason.gpu_problem(
                gpu, gpu_state(gpu) == 'reset_required', index in result.orphaned_gpus,
                bool(holders or reported or foreign or used is None or used > self.options.memory_threshold_mib), why,
                reset_remedy='; reset_orphaned resets it',
                health=health if health is not None and self._unhealthy(index, health) else None)
            if problem:
                problems.append(problem)
        for survivor in result.survivors:
            if survivor['pid'] not in blocking:
                problems.append(_reason.still_holds(self._why(survivor), survivor['devices']))
        if not problems and self.targets and not self.settled:
            problems.append('%s: the GPUs read clean, but not for settle_time (%s) after the last holder exited, '
                            'before the timeout; a holder may come back (raise timeout)'
                            % (NOT_SETTLED, seconds(self.options.settle_time)))
        if self.orphans_waited and result.orphaned_gpus and not self.options.reset_orphaned:
            problems.append("it stayed held by no process for %s, longer than a driver takes to free a dead "
                            "process's memory (set reset_orphaned to reset such GPUs)" % seconds(ORPHAN_WAIT_S))
        lost_or_clean = scope and all(gpu.get('error') or self._gpu_clean(gpu) for gpu in scope)
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
    if releaser.last_snapshot is not None:
        result.history = releaser._history(releaser.last_snapshot)
    if options.probe and result.released and not check_mode:
        shared = (options.job or {}).get('shared_gpus')
        result.probe, warnings = probe_after_release(reader, options, options.probe,
                                                     probe_scope(options.gpus, shared, result.gpus_after),
                                                     releaser.last_snapshot)
        result.warnings.extend(warnings)
    return result
