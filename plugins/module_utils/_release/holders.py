# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Holder discovery: the one place that decides which processes hold the GPU device nodes.

A holder is a process that has a matching device node open (a file descriptor) or mapped
(/proc/PID/maps): what ``fuser -v /dev/nvidia*`` lists, found in pure Python so that
callers can filter before anything is signalled.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fnmatch
import os
import pwd
import re
import stat
import time
from collections import namedtuple

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import PROC_FILE_MAX
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import NodeSet, node_identity

COMM_LEN = 15  # the kernel truncates /proc/PID/comm to 15 characters
NAME_MAX = 255  # the longest file name: a longer argv[0] names no program

# Accounts below this uid are system accounts (Debian's and Red Hat's UID_MIN).
DEFAULT_UID_MIN = 1000

ProcInfo = namedtuple('ProcInfo', 'ppid uid comm cmdline exe starttime state session threads')


def _basename(path):
    """The last part of path, without the ' (deleted)' an upgrade leaves on /proc/PID/exe, as text
    (bytes that are no UTF-8 become U+FFFD, as in comm and cmdline); '' for none."""
    if not path:
        return ''
    if path.endswith(' (deleted)'):
        path = path[:-len(' (deleted)')]
    return os.path.basename(path).encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')


def display_name(comm, exe=None, argv0=None):
    """The name to show for a process whose /proc/PID/comm is comm.

    The kernel keeps 15 bytes of a name (nvidia-persistenced reads nvidia-persiste): a comm that
    long may have been cut, and then the basename of its executable (exe, /proc/PID/exe), else of
    its argv[0], is shown when it starts with comm. Both are the process's or its user's choice:
    either is trusted for no more than that it starts with comm (and is no longer than a file
    name), else comm is shown. Every other comm is shown as it is. The name is what the process
    calls itself, for messages only: callers quote it with printable()."""
    if not comm or len(comm.encode('utf-8', 'replace')) < COMM_LEN:
        return comm
    for path in (exe, argv0):
        name = _basename(path)
        if name.startswith(comm) and len(name) <= NAME_MAX:
            return name
    return comm


def _argv0(cmdline):
    """argv[0] of a command line as read_process joins it (arguments separated by spaces)."""
    return cmdline.split(' ', 1)[0] if cmdline else ''


class Holder:
    """A process holding device nodes, identified by (pid, starttime)."""

    def __init__(self, pid, ppid, uid, comm, cmdline, exe, starttime, state, session, threads, devices):
        self.pid = pid
        self.ppid = ppid
        self.uid = uid
        self.comm = comm
        self.cmdline = cmdline
        self.exe = exe
        self.name = display_name(comm, exe, _argv0(cmdline))  # comm, whole where the kernel cut it
        self.starttime = starttime
        self.state = state
        self.session = session
        self.threads = threads
        self.devices = devices
        self.protected = False
        self.foreign = False
        self.impersonates = None
        self.job = None  # the Slurm job it belongs to, when the release runs for a job
        self.spared = None  # why a job's release leaves it alone (_jobs: another_job, ...)

    @property
    def user(self):
        try:
            return pwd.getpwuid(self.uid).pw_name
        except (KeyError, TypeError):
            return str(self.uid)

    @property
    def exe_name(self):
        """The basename of the executable, without the ' (deleted)' an upgrade leaves."""
        if not self.exe:
            return None
        path = self.exe[:-len(' (deleted)')] if self.exe.endswith(' (deleted)') else self.exe
        return os.path.basename(path)

    def names(self):
        """Every name this process goes by: comm, argv[0] and executable basenames."""
        names = set([self.comm])
        for name in (os.path.basename(_argv0(self.cmdline)), self.exe_name):
            if name:
                names.add(name)
        return names

    def claimed_name(self, patterns):
        """The first protect pattern that one of this process's names matches, or None.

        Every name counts here, comm compared as the kernel keeps it: these are the names the
        process chose for itself, so a match only says what it claims to be.
        """
        own = self.names()
        for pattern in patterns:
            if any(fnmatch.fnmatchcase(name, pattern) for name in own) or \
                    fnmatch.fnmatchcase(self.comm, pattern[:COMM_LEN]):
                return pattern
        return None

    def to_dict(self):
        out = {
            'pid': self.pid,
            'user': self.user,
            'comm': self.comm,
            'name': self.name,
            'cmdline': self.cmdline,
            'devices': list(self.devices),
            'protected': self.protected,
        }
        if self.impersonates:
            out['impersonates'] = self.impersonates
        return out


def _stat_fields(raw):
    # comm sits in parentheses and may itself contain spaces or parentheses.
    return raw[raw.index('(') + 1:raw.rindex(')')], raw[raw.rindex(')') + 2:].split()


def read_process(pid, proc='/proc'):
    """The ProcInfo of pid, or None when it is gone."""
    base = os.path.join(proc, str(pid))
    try:
        with open(os.path.join(base, 'stat'), 'rb') as handle:
            raw = handle.read(PROC_FILE_MAX).decode('utf-8', 'replace')
        uid = os.stat(base).st_uid
        with open(os.path.join(base, 'cmdline'), 'rb') as handle:
            cmdline = handle.read(PROC_FILE_MAX).rstrip(b'\0').replace(b'\0', b' ').decode('utf-8', 'replace')
    except (IOError, OSError):
        return None
    comm, fields = _stat_fields(raw)
    try:
        exe = os.readlink(os.path.join(base, 'exe'))
    except OSError:
        exe = None
    return ProcInfo(int(fields[1]), uid, comm, cmdline, exe, int(fields[19]), fields[0],
                    int(fields[3]), int(fields[17]))


def start_time(pid, proc='/proc'):
    """The start time (clock ticks since boot) of pid, or None when pid does not exist."""
    info = read_process(pid, proc)
    return info.starttime if info else None


def is_gone(info):
    """True for a process that has exited: a zombie whose every thread has exited too.

    A thread-group leader that exited while other threads run is a zombie in /proc/PID/stat,
    but the process lives on and may still hold the devices.
    """
    return info is None or (info.state in ('Z', 'X') and info.threads <= 1)


def _thread_dirs(pid, proc):
    """/proc/PID/task/TID of every thread but the leader (for a leader that has exited)."""
    base = os.path.join(proc, str(pid), 'task')
    try:
        return [os.path.join(base, tid) for tid in os.listdir(base) if tid != str(pid)]
    except OSError:
        return []


class OutOfDescriptors(GpuopsError):
    """This process has no file descriptor left (EMFILE, ENFILE): /proc cannot be read."""


def _check_fds_left(exc, what):
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        raise OutOfDescriptors('out of file descriptors while reading %s (%s): the holders cannot be '
                               'known; raise the open files limit (ulimit -n)' % (what, exc.strerror))


# Why a process was read only in part (Partial.why).
TOO_MANY_DESCRIPTORS = 'too_many_descriptors'
TOO_MANY_MAPPINGS = 'too_many_mappings'
DEADLINE = 'deadline'

# The descriptors read of one process, at most: the usual soft limit of open files (ulimit -n), so
# only a process that raised its own limit has more. Each costs a stat that resolves the descriptor
# in the kernel (about 5 us): a process is read in 5 ms at most, and 50 tenants of 20,000 each cost
# 0.25 s, not 5 s. The rest is no blind spot for a GPU job: the driver's nodes are opened at CUDA's
# start, among the first descriptors (read in ascending order), and they are mapped too (the maps
# are read whole). A process read in part is named (Scan.partial), never taken for clean.
DESCRIPTORS_READ_AT_MOST = 1024
# Beyond that, a pass reads at most this many more descriptors in all, for whichever processes
# come first (about 0.1 s): an application that raised its own limit is read whole, a flood of
# descriptors is not. What is left unread is still named (Scan.partial).
SPARE_DESCRIPTORS = 65536
# The clock is read once per this many descriptors: about a millisecond of stat calls.
CLOCK_EVERY_DESCRIPTORS = 256
# /proc/PID/maps is read in chunks of this size, the clock read after each, up to the bound: far
# above a CUDA job's (a few thousand mappings of ~100 bytes), below vm.max_map_count's 65530 lines.
MAPS_CHUNK = 65536
MAPS_READ_AT_MOST = 4 << 20


class _Deadline:
    """The scan's deadline (None: none) on its clock, and the descriptors it may still read past
    each process's DESCRIPTORS_READ_AT_MOST."""

    def __init__(self, deadline, clock):
        self.deadline = deadline
        self.clock = clock
        self.spare_descriptors = SPARE_DESCRIPTORS

    def passed(self):
        return self.deadline is not None and self.clock() >= self.deadline


def _fd_nodes(fd_dir, nodes, deadline):
    """(matched nodes open in fd_dir, whether it has any descriptor, why not all were read or None),
    or None when it cannot be read (permission)."""
    try:
        dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        _check_fds_left(exc, fd_dir)
        return None if exc.errno in (errno.EACCES, errno.EPERM) else (set(), False, None)
    try:
        return _walk_fds(dir_fd, fd_dir, nodes, deadline)
    finally:
        os.close(dir_fd)


def _walk_fds(dir_fd, fd_dir, nodes, deadline):
    found = set()
    count = 0
    try:
        with os.scandir(dir_fd) as entries:
            for count, entry in enumerate(entries, 1):
                if count > DESCRIPTORS_READ_AT_MOST:
                    if deadline.spare_descriptors <= 0:
                        return found, True, TOO_MANY_DESCRIPTORS
                    deadline.spare_descriptors -= 1
                if count % CLOCK_EVERY_DESCRIPTORS == 0 and deadline.passed():
                    return found, True, DEADLINE
                try:
                    identity = node_identity(os.stat(entry.name, dir_fd=dir_fd))
                except OSError as exc:
                    _check_fds_left(exc, fd_dir)
                    if exc.errno in (errno.EACCES, errno.EPERM):
                        return None
                    continue  # closed meanwhile
                if identity in nodes.by_identity:
                    found.add(nodes.by_identity[identity])
    except OSError as exc:  # the listing itself: the process exited meanwhile
        _check_fds_left(exc, fd_dir)
    return found, count > 0, None


def _open_nodes(pid, proc, nodes, deadline):
    """(matched nodes pid has open, why not all were read or None), or None when its descriptors
    cannot be read (permission).

    When the thread-group leader has exited, its own fd table is empty while its threads
    still hold theirs: those are read instead.
    """
    read = _fd_nodes(os.path.join(proc, str(pid), 'fd'), nodes, deadline)
    if read is None:
        # A zombie's descriptors read as permission denied even for root: it has none left.
        return (set(), None) if is_gone(read_process(pid, proc)) else None
    found, any_open, why = read
    if any_open:
        return found, why
    for task in _thread_dirs(pid, proc):
        found_there, dummy, why_there = _fd_nodes(os.path.join(task, 'fd'), nodes, deadline) or (set(), False, None)
        found |= found_there
        why = why or why_there
    return found, why


def _read_maps(path, deadline):
    """(the text of the maps file at path, why not all of it was read or None)."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError as exc:
        _check_fds_left(exc, path)
        return b'', None
    chunks = []
    size = 0
    why = None
    try:
        while why is None:
            chunk = os.read(handle, MAPS_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            why = TOO_MANY_MAPPINGS if size >= MAPS_READ_AT_MOST else DEADLINE if deadline.passed() else None
    except OSError as exc:
        _check_fds_left(exc, path)
    finally:
        os.close(handle)
    return b''.join(chunks), why


def _mapped_nodes(pid, proc, nodes, deadline):
    """(matched nodes pid maps, why not all its maps were read or None)."""
    maps, why = _read_maps(os.path.join(proc, str(pid), 'maps'), deadline)
    if not maps:  # a leader that has exited maps nothing: its threads share one address space
        for task in _thread_dirs(pid, proc)[:1]:
            maps, why = _read_maps(os.path.join(task, 'maps'), deadline)
    return nodes.mapped(maps), why


def _pids(proc):
    try:
        return sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError as exc:
        _check_fds_left(exc, proc)
        raise GpuopsError('cannot list %s: %s' % (proc, exc.strerror))


# A process read only in part: its descriptors past DESCRIPTORS_READ_AT_MOST, its maps past
# MAPS_READ_AT_MOST, or the rest of either when the deadline came (why), with its uid.
Partial = namedtuple('Partial', 'pid comm why uid')


class Scan:
    """One pass over /proc: the holders found, (pid, process_name) of the processes whose descriptors
    could not be read (kernel threads, which hold no device, left out), and the Partial of those
    read only in part (holders among them too, when what was read holds a node).

    complete is False when the pass stopped at its deadline: what it did not reach is unknown.
    A process read in part leaves the pass complete: it is named, and the GPUs' own reading says
    whether anything still holds them."""

    def __init__(self):
        self.holders = []
        self.unreadable = []
        self.partial = []
        self.complete = True
        self.listed = set()  # the pids the pass went through
        self.clean = {}  # pid -> start time of the processes read whole that hold no node

    def merge(self, later):
        """Add what a later pass over other processes (scan_holders' after) found."""
        self.holders = sorted(self.holders + later.holders, key=lambda holder: holder.pid)
        self.unreadable += later.unreadable
        self.partial += later.partial
        self.complete = self.complete and later.complete
        self.listed |= later.listed
        self.clean.update(later.clean)

    def unreadable_pids(self):
        """The processes whose descriptors could not all be read, for any reason."""
        return set(pid for pid, dummy in self.unreadable) | set(entry.pid for entry in self.partial)


def _holdings(pid, proc, nodes, deadline):
    """(matched nodes pid holds, why not all could be read or None), or None when its descriptors
    cannot be read (permission). The maps first: they hold a CUDA process's nodes however many
    descriptors it has."""
    mapped, why = _mapped_nodes(pid, proc, nodes, deadline)
    opened = _open_nodes(pid, proc, nodes, deadline)
    if opened is None:
        return None
    return mapped | opened[0], why or opened[1]


def scan_holders(devices, protect=(), proc='/proc', deadline=None, clock=time.monotonic, after=None, known=None):
    """A Scan of every process holding one of the device paths (by identity), sorted by pid;
    after (a Scan): only of the processes that scan did not list (started since); known (a Scan.clean
    of an earlier pass of the same release): its processes are not read again while they are the
    same processes (same start time), so that a rescan costs what changed, not the whole host.

    Processes with a verified protected identity (see verify_protected), and this process with
    its ancestors, are marked protected. With a deadline the pass stops there, incomplete; the
    deadline is looked at inside each process's descriptors too, so that no process can hold the
    pass past it.
    """
    scan = Scan()
    if not devices:
        return scan
    nodes = NodeSet(devices)  # empty when none can be looked at: the processes are still counted
    own = ancestors(os.getpid(), proc)
    timer = _Deadline(deadline, clock)
    pids = [pid for pid in _pids(proc) if after is None or pid not in after.listed]
    scan.listed = set(pids)
    known = known or {}
    for pid in pids:
        if timer.passed():
            scan.complete = False
            break
        started = _start_tick(pid, proc)
        if started is not None and known.get(pid) == started:
            scan.clean[pid] = started
            continue
        read = _holdings(pid, proc, nodes, timer)
        if read is None:
            if not _kernel_thread(pid, proc):
                scan.unreadable.append((pid, process_name(pid, proc)))
            continue
        held, why = read
        if why is not None:
            scan.partial.append(Partial(pid, _comm(pid, proc), why, process_uid(pid, proc)))
        if held:
            holder = load_holder(pid, held, protect, own, proc)
            if holder is not None:
                scan.holders.append(holder)
        elif why is None and started is not None:
            scan.clean[pid] = started
    return scan


def _start_tick(pid, proc):
    """pid's start time (clock ticks since boot) from its stat, read alone; None when gone."""
    try:
        with open(os.path.join(proc, str(pid), 'stat'), 'rb') as handle:
            return int(handle.read(4096).rsplit(b')', 1)[1].split()[19])
    except (IOError, OSError, IndexError, ValueError):
        return None


def process_uid(pid, proc='/proc'):
    """The uid that owns pid, or None when it is gone."""
    try:
        return os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return None


def _user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return str(uid)


def unread_processes(scan):
    """{pid, user, comm, why} of each process that scan read only in part, by pid."""
    return [dict(pid=entry.pid, user=_user_name(entry.uid), comm=entry.comm, why=entry.why)
            for entry in sorted(scan.partial)]


def named_unread(entries):
    """The processes of unread_processes, named for a message (at most NAMED_AT_MOST)."""
    named = ', '.join('pid %d (user %s, %s: %s)' % (entry['pid'], entry['user'], printable(entry['comm']), entry['why'])
                      for entry in entries[:NAMED_AT_MOST])
    if len(entries) > NAMED_AT_MOST:
        named += ' and %d more' % (len(entries) - NAMED_AT_MOST)
    return named


def partial_warning(scan):
    """The warning about the processes that scan read only in part, or None."""
    entries = unread_processes(scan)
    if not entries:
        return None
    return ('%d process(es) were read only in part (more than %d descriptors or %d MiB of mappings, or the '
            'deadline came first): %s; what they hold beyond that is seen only in the GPUs\' memory'
            % (len(entries), DESCRIPTORS_READ_AT_MOST, MAPS_READ_AT_MOST >> 20, named_unread(entries)))


def find_holders(devices, protect=(), proc='/proc'):
    """(holders, unreadable): every process holding one of the device paths, and (pid, name) of
    the processes whose descriptors could not be inspected (permission denied; see
    uninspectable_warning). See scan_holders."""
    scan = scan_holders(devices, protect, proc)
    return scan.holders, scan.unreadable


# PF_KTHREAD in the flags of /proc/PID/stat: a kernel thread, which holds no device node.
PF_KTHREAD = 0x00200000


def _kernel_thread(pid, proc='/proc'):
    try:
        with open(os.path.join(proc, str(pid), 'stat'), 'rb') as handle:
            fields = handle.read(PROC_FILE_MAX).rsplit(b')', 1)[1].split()
    except (IOError, OSError, IndexError):
        return False
    return len(fields) > 6 and int(fields[6]) & PF_KTHREAD != 0


def _comm(pid, proc='/proc'):
    try:
        with open(os.path.join(proc, str(pid), 'comm'), errors='replace') as handle:
            return handle.read(PROC_FILE_MAX).strip()
    except (IOError, OSError):
        return '?'


ARGV0_READ_AT_MOST = 4096  # PATH_MAX: a longer argv[0] is no program's path


def process_name(pid, proc='/proc'):
    """The display_name of pid, read from /proc for itself (a process whose descriptors cannot be
    read): its comm, its executable where that can be read, and its argv[0] (4 KiB at most)."""
    comm = _comm(pid, proc)
    if len(comm.encode('utf-8', 'replace')) < COMM_LEN:
        return comm
    base = os.path.join(proc, str(pid))
    try:
        exe = os.readlink(os.path.join(base, 'exe'))
    except OSError:
        exe = None
    try:
        with open(os.path.join(base, 'cmdline'), 'rb') as handle:
            head = handle.read(ARGV0_READ_AT_MOST + 1)
    except (IOError, OSError):
        head = b''
    argv0, end, dummy = head.partition(b'\0')
    if not end and len(head) > ARGV0_READ_AT_MOST:
        argv0 = b''
    return display_name(comm, exe, argv0.decode('utf-8', 'replace'))


# CAP_SYS_PTRACE lets root read every process's descriptors (linux/capability.h).
CAP_SYS_PTRACE = 19
NAMED_AT_MOST = 5


def can_inspect_every_process(status='/proc/self/status'):
    """Whether this process runs as root with CAP_SYS_PTRACE: what reading any process's
    descriptors takes. What it still cannot read is hidden from it by the kernel (another
    namespace's init, a security module), and no setting of the collection would change that."""
    if os.geteuid() != 0:
        return False
    try:
        with open(status) as handle:
            found = re.search(r'^CapEff:\s*([0-9a-fA-F]+)', handle.read(PROC_FILE_MAX), re.M)
    except (IOError, OSError):
        return False
    return bool(found) and bool(int(found.group(1), 16) >> CAP_SYS_PTRACE & 1)


def uninspectable_warning(unreadable, purpose='see', status='/proc/self/status'):
    """The warning about the processes whose descriptors could not be read ((pid, name) pairs),
    naming them and the remedy; None when there is none or when no remedy exists (root with
    CAP_SYS_PTRACE). purpose: what the remedy allows, 'see' or 'release' (every holder)."""
    unreadable = sorted(set(unreadable))
    if not unreadable or can_inspect_every_process(status):
        return None
    named = ', '.join('pid %s (%s)' % (pid, printable(name)) for pid, name in unreadable[:NAMED_AT_MOST])
    if len(unreadable) > NAMED_AT_MOST:
        named += ' and %d more' % (len(unreadable) - NAMED_AT_MOST)
    if os.geteuid() == 0:
        remedy = 'give this root the capability CAP_SYS_PTRACE (a container: --cap-add SYS_PTRACE)'
    else:
        remedy = 'run as root (become: true)'
    return ('%d process(es) could not be inspected for open device nodes (permission denied): %s; '
            '%s to %s every holder' % (len(unreadable), named, remedy, purpose))


def load_holder(pid, devices, protect, own, proc='/proc'):
    """The Holder for pid holding devices, or None when pid is gone.

    It is protected when it is in own (this process and its ancestors) or has a verified
    protected identity; a process that only calls itself by a protected name is a normal
    holder with impersonates set.
    """
    info = read_process(pid, proc)
    if info is None:
        return None
    holder = Holder(pid, *info, devices=sorted(devices))
    if pid in own:
        holder.protected = True
        return holder
    claimed = holder.claimed_name(protect)
    if claimed is not None:
        if verify_protected(holder, protect, proc):
            holder.protected = True
        else:
            holder.impersonates = claimed
    return holder


def uid_min(path='/etc/login.defs'):
    """The first uid of a regular user (UID_MIN in login.defs, else 1000)."""
    try:
        with open(path) as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == 'UID_MIN' and parts[1].isdigit():
                    return int(parts[1])
    except (IOError, OSError):
        pass
    return DEFAULT_UID_MIN


def real_and_effective_uid(pid, proc='/proc'):
    try:
        with open(os.path.join(proc, str(pid), 'status')) as handle:
            for line in handle:
                if line.startswith('Uid:'):
                    return [int(value) for value in line.split()[1:3]]
    except (IOError, OSError, ValueError):
        pass
    return None


def runs_root_owned_program(pid, proc='/proc'):
    """Whether pid's executable (the file really running) is owned by root and writable by
    neither group nor others: a program an administrator installed, not a user's copy."""
    try:
        exe = os.stat(os.path.join(proc, str(pid), 'exe'))
    except OSError:
        return False
    return exe.st_uid == 0 and not exe.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def verify_protected(holder, protect, proc='/proc'):
    """True when holder is what a protected name promises, not only what it calls itself.

    Its executable (/proc/PID/exe, which names the file actually running, even when it has
    been deleted or replaced) must have a protected name and be a root-owned file that group
    and others cannot write, and the process must run as root or a system account.
    """
    name = holder.exe_name
    if not name or not any(fnmatch.fnmatchcase(name, pattern) for pattern in protect):
        return False
    if not runs_root_owned_program(holder.pid, proc):
        return False
    uids = real_and_effective_uid(holder.pid, proc)
    return uids is not None and all(uid < uid_min() for uid in uids)


def ancestors(pid, proc='/proc'):
    """pid and every ancestor of it up to init."""
    chain = set()
    while pid and pid not in chain:
        chain.add(pid)
        info = read_process(pid, proc)
        if info is None:
            break
        pid = info.ppid
    return chain


def cgroup(pid, proc='/proc'):
    """The unified (v2) cgroup path of pid, or the systemd one on a v1 host; None if unknown."""
    found = None
    try:
        with open(os.path.join(proc, str(pid), 'cgroup')) as handle:
            lines = handle.read(PROC_FILE_MAX).splitlines()
    except (IOError, OSError):
        return None
    for line in lines:
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        if parts[1] == '':
            return parts[2]
        if parts[1] == 'name=systemd':
            found = parts[2]
    return found


CONTAINER_RE = re.compile(r'(?:docker|cri-containerd|crio|libpod)-([0-9a-f]{12,64})\.scope$|^([0-9a-f]{64})$')


def supervisor(holder, proc='/proc'):
    """Who (re)started holder: its parent, and the systemd unit or container of its cgroup."""
    parent = read_process(holder.ppid, proc) if holder.ppid else None
    name = display_name(parent.comm, parent.exe, _argv0(parent.cmdline)) if parent else None
    out = {'pid': holder.ppid, 'name': name, 'unit': None, 'container': None}
    for part in (cgroup(holder.pid, proc) or '').split('/'):
        match = CONTAINER_RE.search(part)
        if match:
            out['container'] = match.group(1) or match.group(2)
        elif part.endswith('.service') or part.endswith('.scope'):
            out['unit'] = part
    return out
