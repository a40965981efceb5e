# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The services that block a GPU reset, stopped around it and started again.

The driver refuses a reset while any process holds the GPU's device node ("In use by another
client"), and the protected holders (DCGM's host engine, dcgm-exporter, NVSM, the MPS control
daemon) are never signalled. Before a reset, each protected holder of a GPU to be reset is
placed in its systemd unit (its cgroup, e.g. /system.slice/nvidia-dcgm.service); the units that
the operator allows (reset_stop_units, shell globs) are stopped with systemctl, and an MPS
control daemon that runs outside any service is asked to quit (``echo quit |
nvidia-cuda-mps-control``, NVIDIA's MPS guide) when the list names nvidia-cuda-mps-control.
After the reset, whatever it did, the units stopped are started again and checked with
``systemctl is-active``. DCGM's host engine, once active again, must answer ``dcgmi discovery
-l`` within a deadline, else its unit is restarted once and asked again; the report names it
either way (host_engines). A holder that no entry allows leaves the reset unattempted, and the
message names it. Nothing that the list does not name is ever stopped.

The restore always finishes: the stops and the reset end early enough to leave its worst case
(restore_reserve) within the release's deadline, and a reset that cannot leave it is not
started; a SIGTERM (a hook stopping the release) raises in the release, whose finally runs the
restore to its end (_run.sigterm_deferred) before the release exits.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import os
import re
import shutil
import stat
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, MIN_TIMEOUT_S, GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import is_gone, read_process
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reset import escalation
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import PROC_FILE_MAX, Runner, sigterm_deferred
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import system_log

MPS_CONTROL = 'nvidia-cuda-mps-control'
# The most read of a process's environment (the kernel allows a few MiB; the variables looked for
# are among the first a daemon's unit sets).
ENVIRON_MAX = 1024 * 1024

# The units NVIDIA ships for the clients that hold the GPUs, and the MPS control daemon.
DEFAULT_STOP_UNITS = [
    # DCGM's host engine, nv-hostengine: "A typical DCGM installation runs nv-hostengine as
    # nvidia-dcgm.service" (DCGM docs, "Customizing the systemd Service"); NVIDIA's MIG manager
    # stops it before a reset (mig-parted deployments/systemd/hooks.sh, real-samples holders/H04).
    'nvidia-dcgm.service',
    # dcgm-exporter as its package datacenter-gpu-manager-exporter installs it
    # (/usr/lib/systemd/system/nvidia-dcgm-exporter.service, NVIDIA/dcgm-exporter#606 and #671).
    'nvidia-dcgm-exporter.service',
    # dcgm-exporter as mig-parted's hooks.sh names it among the clients it stops (H04).
    'dcgm-exporter.service',
    # NVSM on DGX: nvsm.service in mig-parted's hooks.sh (H04), which starts further nvsm
    # services of its own (NVIDIA/deepops#633), hence the glob.
    'nvsm*.service',
    # NVIDIA's Kubernetes device plugin and GPU feature discovery run as pods of a DaemonSet
    # (NVIDIA/k8s-device-plugin), in a container's scope rather than a unit of their own, so no
    # unit of theirs is listed: such a holder is named in the refusal, with its cgroup.
    # The MPS control daemon started outside systemd (NVIDIA's MPS guide, "Common Tasks").
    MPS_CONTROL,
]


def stop_units_option():
    """The option reset_stop_units of nvidia_device_reset: the units that may be stopped around a reset."""
    return dict(type='list', elements='str', default=list(DEFAULT_STOP_UNITS))


# Daemons that hand the GPU over to nvidia-smi for a reset themselves and need no stopping: "two
# daemons that do handshake explicitly with nvidia-smi for GPU reset, namely nvidia-fabricmanager
# and nvidia-persistenced" (NVIDIA/deepops#633; the reset switches persistence mode off first).
COOPERATING = frozenset(['nvidia-persistenced', 'nvidia-fabricmanager', 'nv-fabricmanager'])

# Where systemd keeps its runtime units: present exactly when systemd runs the host
# (sd_booted(3)).
SYSTEMD_RUN_DIR = '/run/systemd/system'

# Starting the units again (one systemctl start of them all) is given this long at least, even
# when the release's deadline has passed; the release keeps it in reserve (restore_reserve).
RESTART_MIN_S = 15.0
# Then one systemctl is-active of them all (systemd answers from memory): this long at least.
ACTIVE_CHECK_S = 5.0
# A reset that stops units is started only with this long left before the reserve: the stops,
# persistence mode off and the reset itself, each a call.
RESET_FLOOR_S = MIN_TIMEOUT_S

# A systemd unit name (systemd.unit(5): letters, digits, ':', '-', '_', '.', '\\', one optional
# '@' of a template instance), at most 255 characters; only services are stopped.
SERVICE_RE = re.compile(r'^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.service\Z')
UNIT_NAME_MAX = 255
UNIT_RE = re.compile(r'\.(service|scope)$')

# How often the MPS control daemon is looked at while it quits.
MPS_POLL_S = 0.05

# DCGM's host engine (nv-hostengine) in the units NVIDIA's packages name it: nvidia-dcgm.service
# (above) and dcgm.service, the older packages' name. Once its unit is active again, `dcgmi
# discovery -l` (which connects to the host engine on localhost) must answer within
# HOST_ENGINE_ANSWER_S (asked again every HOST_ENGINE_POLL_S: a host engine that has just started
# needs a moment before it listens); one that does not is restarted once, given
# HOST_ENGINE_RESTART_S, and asked again. The restore's reserve holds the worst of it.
HOST_ENGINE = 'nv-hostengine'
HOST_ENGINE_UNITS = frozenset(['nvidia-dcgm.service', 'dcgm.service'])
DCGMI = 'dcgmi'
HOST_ENGINE_ANSWER_S = 5.0
HOST_ENGINE_POLL_S = 0.5
HOST_ENGINE_RESTART_S = 10.0


def systemd_cgroup(pid, proc='/proc'):
    """The cgroup path of pid in systemd's tree: the name=systemd hierarchy where there is one
    (cgroup v1 and hybrid hosts, whose kernels print an unused 0:: line too), else the unified
    one; None if unknown."""
    try:
        with open(os.path.join(proc, str(pid), 'cgroup')) as handle:
            lines = handle.read(PROC_FILE_MAX).splitlines()
    except (IOError, OSError):
        return None
    found = dict((parts[1], parts[2]) for parts in (line.split(':', 2) for line in lines) if len(parts) == 3)
    return found.get('name=systemd', found.get(''))


def systemd_unit(pid, proc='/proc'):
    """The unit of the service manager of this host (PID 1) that pid runs in, or None. Without a
    cgroup namespace (a container on cgroup v1) the paths start with the container's own cgroup,
    which PID 1's init.scope gives away."""
    path = systemd_cgroup(pid, proc)
    init = systemd_cgroup(1, proc) or ''
    root = init[:-len('/init.scope')] if init.endswith('/init.scope') else ''
    if path and root and path.startswith(root + '/'):
        path = path[len(root):]
    return unit_of(path)


def unit_of(cgroup_path):
    """The system unit a cgroup path belongs to: its first .service or .scope component (the
    units below it are a delegated subtree's), or None."""
    for part in (cgroup_path or '').split('/'):
        if UNIT_RE.search(part):
            return part
    return None


def valid_service(name):
    return bool(name) and len(name) <= UNIT_NAME_MAX and bool(SERVICE_RE.match(name)) and not name.startswith('-')


def allowed(name, patterns):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _names(indexes):
    return ', '.join(str(index) for index in indexes)


class Blocker:
    """A protected holder of GPUs to be reset, and what may be done about it."""

    def __init__(self, holder, gpus, unit):
        self.holder = holder
        self.gpus = sorted(gpus)
        self.unit = unit
        self.action = None  # 'stop' (its unit), 'quit' (MPS) or None
        self.why = None     # why nothing may be done, when action is None

    def describe(self):
        return 'pid %d (%s, unit %s)' % (self.holder.pid, printable(self.holder.name),
                                         printable(self.unit) if self.unit else 'none')

    def to_dict(self):
        return {'pid': self.holder.pid, 'comm': self.holder.comm, 'name': self.holder.name, 'unit': self.unit,
                'gpus': self.gpus, 'action': self.action}


class Quiesce:
    """The stops around one reset.

    blocking: [(holder, GPU indexes it blocks)] of the protected holders of the GPUs to be reset;
    patterns: reset_stop_units; deadline: by the release's clock; own: the pids of the release and
    its ancestors (their units are never stopped)."""

    def __init__(self, blocking, patterns, deadline, clock=time.monotonic, proc='/proc', own=(),
                 systemctl='systemctl', systemd_dir=SYSTEMD_RUN_DIR, log=system_log, sleep=time.sleep, dcgmi=DCGMI):
        self.patterns = list(patterns)
        self.deadline = deadline
        self.clock = clock
        self.proc = proc
        self.own = set(own)
        self.systemctl = systemctl
        self.systemd_dir = systemd_dir
        self.log = log
        self.sleep = sleep
        self.dcgmi = dcgmi
        self.own_units = set(systemd_unit(pid, proc) for pid in self.own) - set([None])
        self.blockers = [self._judge(Blocker(holder, gpus, systemd_unit(holder.pid, proc)))
                         for holder, gpus in blocking if holder.exe_name not in COOPERATING]
        self.units = []       # the units to stop, in the order found
        for blocker in self.blockers:
            if blocker.action == 'stop' and blocker.unit not in self.units:
                self.units.append(blocker.unit)
        self.stopped = []     # the units a stop was asked of
        self.started = []     # the units started again without an error
        self.active_after = {}
        self.host_engines = []  # after the restore: whether each DCGM host engine answers (host_engine_check)
        self.mps_quit = False
        self.problems = []
        self.time_refused = None  # why the reset was not started: the restore's reserve did not fit

    # -- what may be done ----------------------------------------------------------------
    def _judge(self, blocker):
        holder, unit = blocker.holder, blocker.unit
        if holder.pid in self.own or (unit and unit in self.own_units):
            blocker.why = 'the release itself runs there'
        elif unit and unit.endswith('.service'):
            if not valid_service(unit):
                blocker.why = 'its unit is no valid systemd service name'
            elif allowed(unit, self.patterns):
                blocker.action = 'stop'
            else:
                blocker.why = 'reset_stop_units does not allow its unit'
        elif holder.exe_name == MPS_CONTROL and allowed(MPS_CONTROL, self.patterns):
            blocker.action = 'quit'
        else:
            blocker.why = 'it runs in no service that reset_stop_units allows to be stopped'
        return blocker

    def refusal(self):
        """Why the reset cannot be attempted, or None."""
        stuck = [blocker for blocker in self.blockers if blocker.action is None]
        if stuck:
            return 'GPU %s not reset: held by %s, never stopped (%s; reset_stop_units lists what may be stopped ' \
                   'for a reset)' % (_names(sorted(set(gpu for blocker in stuck for gpu in blocker.gpus))),
                                     ', '.join(blocker.describe() for blocker in stuck),
                                     '; '.join(sorted(set(blocker.why for blocker in stuck))))
        if self.units:
            return self._no_systemd()
        return None

    def _no_systemd(self):
        if not os.path.isdir(self.systemd_dir):
            return 'GPU %s not reset: %s must be stopped for it, but systemd does not run this host (no %s); ' \
                   'nothing was stopped' % (self._gpus(), self._units_text(self.units), self.systemd_dir)
        if os.sep not in self.systemctl and shutil.which(self.systemctl) is None:
            return 'GPU %s not reset: %s must be stopped for it, but systemctl is not on PATH; nothing was ' \
                   'stopped' % (self._gpus(), self._units_text(self.units))
        return None

    def _gpus(self):
        return _names(sorted(set(gpu for blocker in self.blockers for gpu in blocker.gpus)))

    @staticmethod
    def _units_text(units):
        return ', '.join(printable(unit) for unit in units)

    # -- the time the restore needs -----------------------------------------------------
    def restore_reserve(self):
        """Seconds the restore may take at worst: one systemctl start of every unit to stop, one
        systemctl is-active of them, and the host engine's check (nothing when no unit is stopped)."""
        return RESTART_MIN_S + ACTIVE_CHECK_S + self._host_engine_reserve() if self.units else 0.0

    def _host_engine_reserve(self):
        """Seconds the check of the DCGM host engines to stop may take: asked, restarted, asked again."""
        return 2 * HOST_ENGINE_ANSWER_S + HOST_ENGINE_RESTART_S if self._host_engine_units(self.units) else 0.0

    def _host_engine_units(self, units):
        """The units of units that run DCGM's host engine: by their name, or by the holder found in them."""
        engines = set(blocker.unit for blocker in self.blockers if blocker.holder.exe_name == HOST_ENGINE)
        return [unit for unit in units if unit in HOST_ENGINE_UNITS or unit in engines]

    def work_deadline(self):
        """When the stops and the reset must end: the deadline less the restore's reserve."""
        return self.deadline - self.restore_reserve()

    def time_refusal(self):
        """Why the reset cannot be started with the restore's reserve kept, or None."""
        left = self.work_deadline() - self.clock()
        if not self.units or left >= RESET_FLOOR_S:
            return None
        self.time_refused = _reason.no_time_to_restore(self._gpus(), self._units_text(self.units), self.restore_reserve(),
                                                       self.deadline - self.clock(), RESET_FLOOR_S)
        return self.time_refused

    # -- acting ---------------------------------------------------------------------------
    def _left(self, restore=None):
        """Seconds left for a call: before the work deadline; restore 'start' or 'check': before
        the deadline (the start leaving the check its share), and at least their minimum."""
        if restore == 'start':
            return max(self.deadline - ACTIVE_CHECK_S - self._host_engine_reserve() - self.clock(), RESTART_MIN_S)
        if restore == 'check':
            return max(self.deadline - self._host_engine_reserve() - self.clock(), ACTIVE_CHECK_S)
        if restore == 'host_engine':
            return HOST_ENGINE_RESTART_S
        return self.work_deadline() - self.clock()

    def _systemctl(self, args, restore=None, raw=False):
        """(rc, output) of systemctl args within the deadline (raw: its standard output as it is);
        GpuopsError when it cannot run, does not answer, or there is no time left."""
        rc, stdout, stderr = Runner(self.systemctl).run(['--no-ask-password'] + list(args), timeout=self._left(restore))
        return rc, stdout if raw else ' '.join((stdout + ' ' + stderr).split())[:300]

    def stop(self):
        """Stop what the reset needs stopped; None when all of it stopped, else why not (the
        reset is then not attempted; restore() starts again what was stopped)."""
        for unit in self.units:
            self.stopped.append(unit)
            self.log('gpuops.nvidia: stopping %s for a GPU reset' % printable(unit))
            try:
                rc, said = self._systemctl(['stop', '--', unit])
            except GpuopsError as exc:
                return self._failed('systemctl stop %s: %s' % (printable(unit), exc))
            if rc != 0:
                return self._failed('systemctl stop %s failed (exit %d): %s' % (printable(unit), rc, printable(said)))
        for blocker in self.blockers:
            if blocker.action == 'quit':
                problem = self._quit_mps(blocker.holder)
                if problem:
                    return self._failed(problem)
        return None

    def _failed(self, problem):
        self.problems.append(problem)
        return 'GPU %s not reset: %s' % (self._gpus(), problem)

    def _quit_mps(self, holder):
        """Ask the MPS control daemon holder to quit, through its own pipe directory; None once it
        has exited, else why not."""
        self.log('gpuops.nvidia: quitting the MPS control daemon (pid %d) for a GPU reset' % holder.pid)
        env = {}
        pipe_dir = _environ(holder.pid, 'CUDA_MPS_PIPE_DIRECTORY', self.proc)
        if pipe_dir:
            env['CUDA_MPS_PIPE_DIRECTORY'] = pipe_dir
        fd, why = _open_program(holder, self.proc)
        if fd is None:
            return 'echo quit | %s: %s' % (MPS_CONTROL, why)
        try:
            # The file checked is the file run: through its open descriptor, never its path again.
            rc, stdout, stderr = Runner('/proc/self/fd/%d' % fd, name=MPS_CONTROL, env=env, pass_fds=(fd,)).run(
                [], timeout=max(self._left(), 0.1), input_text='quit\n')
        except GpuopsError as exc:
            return 'echo quit | %s: %s' % (MPS_CONTROL, exc)
        finally:
            os.close(fd)
        if rc != 0:
            return 'echo quit | %s failed (exit %d): %s' % (
                MPS_CONTROL, rc, printable(' '.join((stdout + ' ' + stderr).split())[:300]))
        while not _exited(holder, self.proc):
            if self._left() <= 0:
                return 'the MPS control daemon (pid %d) did not exit after quit within the timeout' % holder.pid
            self.sleep(MPS_POLL_S)
        self.mps_quit = True
        return None

    def restore(self):
        """Start again every unit a stop was asked of, whatever happened since; check them. A
        SIGTERM meanwhile waits until this is done (then raises _run.Terminated)."""
        if not self.stopped:
            return
        with sigterm_deferred():
            self.log('gpuops.nvidia: starting %s again after a GPU reset' % self._units_text(self.stopped))
            try:
                rc, said = self._systemctl(['start', '--'] + self.stopped, restore='start')
                if rc != 0:
                    self.problems.append('systemctl start %s failed (exit %d): %s' % (
                        self._units_text(self.stopped), rc, printable(said)))
            except GpuopsError as exc:
                self.problems.append('systemctl start %s: %s' % (self._units_text(self.stopped), exc))
            self._check_active()
            self._check_host_engines()

    def _check_active(self):
        """One systemctl is-active of every unit started again: it prints one state a line, in order."""
        try:
            dummy, out = self._systemctl(['is-active', '--'] + self.stopped, restore='check', raw=True)
            states = out.split()
            if len(states) != len(self.stopped):
                raise GpuopsError('systemctl is-active printed %d states for %d units' % (len(states), len(self.stopped)))
        except GpuopsError as exc:
            states = ['unknown (%s)' % exc] * len(self.stopped)
        for unit, said in zip(self.stopped, states):
            self.active_after[unit] = said or 'unknown'
            if said == 'active':
                self.started.append(unit)
            else:
                self.problems.append('%s is %s after the reset, not active' % (printable(unit), printable(said)))
        if self.problems:
            self.log('gpuops.nvidia: ' + '; '.join(self.problems))

    # -- DCGM's host engine, after the restore --------------------------------------------
    def _check_host_engines(self):
        """Ask each DCGM host engine started again whether it answers; restart once one that does not."""
        units = self._host_engine_units(self.started)
        if not units:
            return
        program = self.dcgmi if os.sep in self.dcgmi else shutil.which(self.dcgmi)
        if not program:
            self.host_engines = [host_engine_entry(unit, None, False, 'not checked: %s is not on PATH' % self.dcgmi)
                                 for unit in units]
            return
        self.host_engines = [self._host_engine(unit, program) for unit in units]

    def _host_engine(self, unit, program):
        """The host_engines entry of unit: asked, and when it does not answer, restarted once and asked again."""
        said = self._dcgmi_problem(program)
        if said is None:
            return host_engine_entry(unit, True, False, None)
        self.log('gpuops.nvidia: the DCGM host engine of %s does not answer after the GPU reset (%s); restarting it'
                 % (printable(unit), printable(said)))
        restart = self._restart(unit)
        said = restart or self._dcgmi_problem(program)
        if said is not None:
            self.problems.append('the DCGM host engine of %s does not answer dcgmi discovery -l after the GPU reset, '
                                 'and restarted once still does not (%s)' % (printable(unit), printable(said)))
        return host_engine_entry(unit, said is None, True, said)

    def _restart(self, unit):
        """None once systemctl restart unit succeeded, else why not."""
        try:
            rc, said = self._systemctl(['restart', '--', unit], restore='host_engine')
        except GpuopsError as exc:
            return 'systemctl restart: %s' % exc
        return None if rc == 0 else 'systemctl restart failed (exit %d): %s' % (rc, said)

    def _dcgmi_problem(self, program):
        """None once dcgmi discovery -l answers (exits 0) within HOST_ENGINE_ANSWER_S, else what it
        said last. Asked again every HOST_ENGINE_POLL_S, a bounded number of times."""
        end = self.clock() + HOST_ENGINE_ANSWER_S
        for dummy in range(int(HOST_ENGINE_ANSWER_S / HOST_ENGINE_POLL_S) + 1):
            said = self._dcgmi_once(program, max(end - self.clock(), CALL_FLOOR_S))
            if said is None or end - self.clock() < HOST_ENGINE_POLL_S:
                return said
            self.sleep(HOST_ENGINE_POLL_S)
        return said

    def _dcgmi_once(self, program, timeout):
        try:
            rc, stdout, stderr = Runner(program, name=DCGMI).run(['discovery', '-l'], timeout=timeout)
        except GpuopsError as exc:
            return str(exc)
        if rc == 0:
            return None
        return 'dcgmi discovery -l exited with %d: %s' % (rc, ' '.join((stderr + ' ' + stdout).split())[:300])

    # -- reporting ------------------------------------------------------------------------
    def report(self):
        """The quiesced entry of the escalation."""
        return {'held_by': [blocker.to_dict() for blocker in self.blockers], 'to_stop': list(self.units),
                'mps_to_quit': any(blocker.action == 'quit' for blocker in self.blockers),
                'refusal': self.refusal() or self.time_refused, 'stopped': list(self.stopped), 'started': list(self.started),
                'active_after': dict(self.active_after), 'host_engines': list(self.host_engines), 'mps_quit': self.mps_quit,
                'problems': list(self.problems)}


def host_engine_entry(unit, answers, restarted, said):
    """What the check of a DCGM host engine found: whether it answers (None: not checked), whether it
    was restarted for it, and what dcgmi (or systemctl) said last when it did not answer."""
    return {'unit': unit, 'answers': answers, 'restarted': restarted, 'said': said}


def _exited(holder, proc='/proc'):
    """Whether holder has exited (gone, a zombie, or its pid now another process's)."""
    info = read_process(holder.pid, proc)
    return is_gone(info) or info.starttime != holder.starttime


def _running_program(holder):
    """The absolute path holder runs from, as /proc/PID/exe named it, or None (deleted since)."""
    path = holder.exe
    if not path or not os.path.isabs(path) or path.endswith(' (deleted)'):
        return None
    return path


def _open_program(holder, proc='/proc'):
    """(fd, None): the MPS control program, open, to be run as /proc/self/fd/N; (None, why not).

    The file the daemon runs, when its path names that very file still, else
    nvidia-cuda-mps-control on PATH: opened without following a link, and the open file is what
    is checked (_program_problem) and run. Run as root, a path a user could swap (a directory
    above it they can write) would run the user's program; the descriptor cannot be swapped."""
    path = _running_program(holder)
    if path is not None:
        try:
            running = os.stat(os.path.join(proc, str(holder.pid), 'exe'))
        except OSError:
            running = None
        fd, why = _open_checked(path, running) if running is not None else (None, None)
        if fd is not None:
            return fd, None
    found = shutil.which(MPS_CONTROL)
    if found is None:
        return None, '%s not found on PATH' % MPS_CONTROL
    return _open_checked(os.path.realpath(found))


def _open_checked(path, running=None):
    """(fd, None) of path opened without following a link, when _program_problem finds nothing
    wrong with the open file; else (None, why)."""
    try:
        fd = os.open(path, getattr(os, 'O_PATH', os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return None, '%s cannot be opened (a link is not followed): %s' % (printable(path), exc.strerror)
    why = _program_problem(os.fstat(fd), running)
    if why:
        os.close(fd)
        return None, '%s not run: it %s' % (printable(path), why)
    return fd, None


def _program_problem(info, running=None):
    """Why the open file with stat info must not be run as root, or None."""
    if not stat.S_ISREG(info.st_mode):
        return 'is no regular file'
    if info.st_uid not in (0, os.geteuid()):
        return 'belongs to uid %d, not root' % info.st_uid
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return 'can be written by others (mode %04o)' % stat.S_IMODE(info.st_mode)
    if running is not None and (info.st_dev, info.st_ino) != (running.st_dev, running.st_ino):
        return 'is not the file the MPS control daemon runs (it was replaced since the daemon started)'
    return None


def _environ(pid, name, proc='/proc'):
    """The value of name in pid's environment (as it started), or None."""
    try:
        with open(os.path.join(proc, str(pid), 'environ'), 'rb') as handle:
            data = handle.read(ENVIRON_MAX + 1)
    except (IOError, OSError):
        return None
    entries = data.split(b'\0')
    if len(data) > ENVIRON_MAX:
        entries = data[:ENVIRON_MAX].split(b'\0')[:-1]  # the last one read is cut
    prefix = name.encode('ascii') + b'='
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix):].decode('utf-8', 'surrogateescape')
    return None


def quiesced_reset(quiesce, reset, todo):
    """The escalation entry of reset.run(todo) (a GpuReset) with the services that block it stopped
    around it, and started again in any case; the reset is not attempted when they cannot be."""
    refusal = quiesce.refusal() or quiesce.time_refusal()
    entry = None
    if refusal is None:
        try:
            refusal = quiesce.stop()
            if refusal is None:
                entry = reset.run(todo)
        finally:
            quiesce.restore()
    if entry is None:
        entry = escalation(sorted(todo), False, refusal, attempted=False, reasons=reset.reasons)
    if quiesce.problems and refusal is None:
        entry['message'] += '; ' + '; '.join(quiesce.problems)
    entry['quiesced'] = quiesce.report()
    return entry
