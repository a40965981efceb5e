# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The NVIDIA device nodes: which files a device glob may name (a character device of a major an
NVIDIA driver registered, or a simulated node only its maker can write), and how a node is told
whatever the path it is opened or mapped by, as fuser tells it: by its device number or inode."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os
import re
import stat

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import PROC_FILE_MAX

# Device nodes the NVIDIA drivers create: /dev/nvidiaN, nvidiactl, nvidia-uvm(-tools),
# nvidia-modeset, nvidia-nvlink, nvidia-nvswitchN/ctl, nvidia-vgpuN, and the capability
# nodes in /dev/nvidia-caps and /dev/nvidia-caps-imex-channels.
NODE_NAME_RE = re.compile(r'^nvidia([0-9]+|ctl|-uvm|-uvm-tools|-modeset|-nvlink|-nvswitch[0-9]+|-nvswitchctl|-vgpu[0-9]+)$')
CAP_DIRS = {'nvidia-caps': re.compile(r'^nvidia-cap[0-9]+$'),
            'nvidia-caps-imex-channels': re.compile(r'^channel[0-9]+$')}


def nvidia_majors(proc='/proc'):
    """Character device majors that an NVIDIA driver registered in /proc/devices."""
    majors = set()
    try:
        with open(os.path.join(proc, 'devices')) as handle:
            text = handle.read(PROC_FILE_MAX)
    except (IOError, OSError):
        return majors
    chars = text.split('Block devices:')[0]
    for line in chars.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].startswith('nvidia'):
            majors.add(int(parts[0]))
    return majors


def _node_name_ok(path):
    parent = os.path.basename(os.path.dirname(path))
    name = os.path.basename(path)
    if parent in CAP_DIRS:
        return bool(CAP_DIRS[parent].match(name))
    return bool(NODE_NAME_RE.match(name))


def check_device_node(path, majors):
    """None when path may be treated as an NVIDIA device node, else why not.

    A character device must carry a major number an NVIDIA driver registered; a regular file
    (a simulated host) must be named like a node. Anything else is refused.
    """
    try:
        mode = os.stat(path)
    except OSError as exc:
        return 'cannot be read (%s)' % exc.strerror
    if stat.S_ISCHR(mode.st_mode):
        major = os.major(mode.st_rdev)
        if major not in majors:
            return ('is a character device of major %d, which no NVIDIA driver registered in '
                    '/proc/devices' % major)
        if not os.path.basename(path).startswith('nvidia') and not _node_name_ok(path):
            return 'is not named like an NVIDIA device node'
        return None
    if not stat.S_ISREG(mode.st_mode):
        return 'is neither an NVIDIA character device nor a simulated one (a regular file)'
    if not _node_name_ok(path):
        return 'is not named like an NVIDIA device node (nvidiaN, nvidiactl, nvidia-uvm, ...)'
    return _simulated_node_problem(path, mode)


def _simulated_node_problem(path, mode):
    """A regular file stands for a device node only on a simulated host that this process (or
    root) made: owned by root or by this process's user, in a directory no one else can write,
    so that no other user can plant or replace one."""
    trusted = (0, os.geteuid())
    if mode.st_uid not in trusted:
        return ('is a regular file owned by uid %d, not a device node: a simulated node must be owned by '
                'root or by the user running the release' % mode.st_uid)
    parent = os.stat(os.path.dirname(path) or '.')
    if parent.st_uid not in trusted or parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return ('is a regular file in a directory that other users can write, not a device node: a '
                'simulated node must sit in a directory only root or the user running the release can write')
    return None


def expand_devices(patterns, proc='/proc'):
    """Resolve device globs to the sorted list of NVIDIA device node paths they match.

    Directories (such as /dev/nvidia-caps) are skipped. Raises GpuopsError for a pattern
    that is not an absolute path, and for a match that is not an NVIDIA device node: nothing
    is read or signalled through a pattern like /dev/* or /dev/null.
    """
    paths = set()
    majors = None
    for pattern in patterns:
        if not pattern or not os.path.isabs(pattern):
            raise GpuopsError('devices: %r is not an absolute path or glob (e.g. /dev/nvidia*)' % (pattern,))
        for path in glob.glob(pattern):
            try:
                if stat.S_ISDIR(os.stat(path).st_mode):
                    continue
            except OSError:
                continue
            if majors is None:
                majors = nvidia_majors(proc)
            problem = check_device_node(path, majors)
            if problem:
                raise GpuopsError('devices: %s (matched by %s) %s; refusing to treat its holders '
                                  'as GPU holders' % (path, pattern, problem))
            paths.add(os.path.normpath(path))
    return sorted(paths)


def node_identity(info):
    """What names a device node whatever the path it is opened by, as fuser compares them: a
    character device by its device number, a simulated node (a regular file) by its inode."""
    if stat.S_ISCHR(info.st_mode):
        return ('rdev', info.st_rdev)
    return ('inode', info.st_dev, info.st_ino)


class NodeSet:
    """The matched device nodes, looked up by identity: an open descriptor by the stat of the file
    it names, a mapping by the device and inode /proc/PID/maps prints. Never by a path's text, so
    a bind mount, a container's own node or the host's /dev seen under host_root all match."""

    def __init__(self, paths):
        self.by_identity = {}
        self.by_inode = {}
        for path in sorted(paths):
            try:
                info = os.stat(path)
            except OSError:
                continue
            self.by_identity.setdefault(node_identity(info), path)
            self.by_inode.setdefault((info.st_dev, info.st_ino), path)
        # A maps line that maps a node has its inode between spaces: maps without one are not parsed
        # (most processes map no node).
        inodes = sorted(set(b'%d' % inode for dummy, inode in self.by_inode))
        self.inode_field = re.compile(b' (?:%s) ' % b'|'.join(inodes)) if inodes else None

    def __bool__(self):
        return bool(self.by_identity)

    __nonzero__ = __bool__

    def mapped(self, maps):
        """The nodes that the text of a /proc/PID/maps maps."""
        if self.inode_field is None or not self.inode_field.search(maps):
            return set()
        found = set()
        for line in maps.splitlines():
            inode = _mapped_inode(line)
            if inode in self.by_inode:
                found.add(self.by_inode[inode])
        return found


def _mapped_inode(line):
    """(st_dev, st_ino) of the file a /proc/PID/maps line maps, or None for anonymous memory."""
    parts = line.split(None, 5)
    if len(parts) < 6 or parts[4] == b'0':
        return None
    major, dummy, minor = parts[3].partition(b':')
    try:
        return os.makedev(int(major, 16), int(minor, 16)), int(parts[4])
    except ValueError:
        return None
