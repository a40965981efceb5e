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
import glob
import os
import pwd
import stat

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError

COMM_LEN = 15  # the kernel truncates /proc/PID/comm to 15 characters


class Holder:
    """A process holding device nodes, identified by (pid, starttime)."""

    def __init__(self, pid, ppid, uid, comm, cmdline, exe, starttime, state, devices):
        self.pid = pid
        self.ppid = ppid
        self.uid = uid
        self.comm = comm
        self.cmdline = cmdline
        self.exe = exe
        self.starttime = starttime
        self.state = state
        self.devices = devices
        self.protected = False

    @property
    def user(self):
        try:
            return pwd.getpwuid(self.uid).pw_name
        except (KeyError, TypeError):
            return str(self.uid)

    def names(self):
        """Every name this process goes by: comm, argv[0] and executable basenames."""
        names = set([self.comm])
        argv0 = self.cmdline.split(' ', 1)[0] if self.cmdline else ''
        for path in (argv0, self.exe or ''):
            if path:
                names.add(os.path.basename(path))
        return names

    def matches(self, names):
        """True when this process goes by one of names (comm compared as the kernel keeps it)."""
        own = self.names()
        return any(name in own or name[:COMM_LEN] == self.comm for name in names)

    def to_dict(self):
        return {
            'pid': self.pid,
            'user': self.user,
            'comm': self.comm,
            'cmdline': self.cmdline,
            'devices': list(self.devices),
            'protected': self.protected,
        }


def expand_devices(patterns):
    """Resolve device globs to the sorted list of device node paths they match.

    Directories (such as /dev/nvidia-caps) are skipped. Raises GpuopsError for a pattern
    that is not an absolute path.
    """
    paths = set()
    for pattern in patterns:
        if not pattern or not os.path.isabs(pattern):
            raise GpuopsError('devices: %r is not an absolute path or glob (e.g. /dev/nvidia*)' % (pattern,))
        for path in glob.glob(pattern):
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            if not stat.S_ISDIR(mode):
                paths.add(os.path.normpath(path))
    return sorted(paths)


def read_process(pid, proc='/proc'):
    """(ppid, uid, comm, cmdline, exe, starttime, state) of pid, or None when it is gone."""
    base = os.path.join(proc, str(pid))
    try:
        with open(os.path.join(base, 'stat'), 'rb') as handle:
            raw = handle.read().decode('utf-8', 'replace')
        uid = os.stat(base).st_uid
        with open(os.path.join(base, 'cmdline'), 'rb') as handle:
            cmdline = handle.read().rstrip(b'\0').replace(b'\0', b' ').decode('utf-8', 'replace')
    except (IOError, OSError):
        return None
    # comm sits in parentheses and may itself contain spaces or parentheses.
    comm = raw[raw.index('(') + 1:raw.rindex(')')]
    fields = raw[raw.rindex(')') + 2:].split()
    try:
        exe = os.readlink(os.path.join(base, 'exe'))
    except OSError:
        exe = None
    return int(fields[1]), uid, comm, cmdline, exe, int(fields[19]), fields[0]


def start_time(pid, proc='/proc'):
    """The start time (clock ticks since boot) of pid, or None when pid does not exist."""
    info = read_process(pid, proc)
    return info[5] if info else None


def _open_paths(pid, proc):
    """Paths pid has open, or None when its descriptors cannot be read (permission)."""
    fd_dir = os.path.join(proc, str(pid), 'fd')
    try:
        names = os.listdir(fd_dir)
    except OSError as exc:
        return None if exc.errno in (errno.EACCES, errno.EPERM) else set()
    paths = set()
    for name in names:
        try:
            paths.add(os.readlink(os.path.join(fd_dir, name)))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                return None
    return paths


def _mapped_paths(pid, proc):
    paths = set()
    try:
        with open(os.path.join(proc, str(pid), 'maps'), 'rb') as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith(b'/'):
                    paths.add(parts[5].rstrip(b'\n').decode('utf-8', 'replace'))
    except (IOError, OSError):
        pass
    return paths


def _pids(proc):
    return sorted(int(name) for name in os.listdir(proc) if name.isdigit())


def find_holders(devices, protect=(), proc='/proc'):
    """Every process holding one of the device paths, sorted by pid.

    Processes that go by a name in protect, and this process with its ancestors, are marked
    protected. Returns (holders, unreadable) where unreadable counts the processes whose
    descriptors could not be inspected (not running as root).
    """
    wanted = set(devices)
    if not wanted:
        return [], 0
    own = ancestors(os.getpid(), proc)
    holders, unreadable = [], 0
    for pid in _pids(proc):
        opened = _open_paths(pid, proc)
        if opened is None:
            unreadable += 1
            continue
        held = (opened | _mapped_paths(pid, proc)) & wanted
        if not held:
            continue
        holder = load_holder(pid, held, protect, own, proc)
        if holder is not None:
            holders.append(holder)
    return holders, unreadable


def load_holder(pid, devices, protect, own, proc='/proc'):
    """The Holder for pid holding devices, protected when it is in own (this process and its
    ancestors) or goes by a name in protect; None when pid is gone."""
    info = read_process(pid, proc)
    if info is None:
        return None
    holder = Holder(pid, *info, devices=sorted(devices))
    holder.protected = pid in own or holder.matches(protect)
    return holder


def ancestors(pid, proc='/proc'):
    """pid and every ancestor of it up to init."""
    chain = set()
    while pid and pid not in chain:
        chain.add(pid)
        info = read_process(pid, proc)
        if info is None:
            break
        pid = info[0]
    return chain
