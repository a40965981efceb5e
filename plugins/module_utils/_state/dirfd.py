# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""A private directory opened by descriptor, so that no other user can redirect what is written in it.

The directory is reached from / one component at a time (openat with O_DIRECTORY and O_NOFOLLOW),
each checked on the open descriptor: every directory on the way belongs to root or to the caller,
and one that others can write has the sticky bit (no one else can then rename or replace what is in
it); the directory itself belongs to the caller and no one else can write it. A symbolic link on
the way is followed only when root or the caller owns it (the directory that holds it has been
checked, so no one else planted it); the directory itself is never a link. What is then read or
written in it goes through the descriptor (dir_fd), never through the path again: a component
swapped for a link after the check changes nothing.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import stat

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.lock import _kind, _user, private_dir_problem, shared_dir_problem

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The kernel's own limit on the links one lookup follows.
MAX_LINKS = 40


class DirRefused(Exception):
    """Why a directory is not used, worded to follow its path ('is below /x, which ...')."""


def open_private_dir(path, euid=None, parents_mode=None):
    """An fd on the directory path (absolute), opened and checked as above; created 0700 when it is
    missing, and its missing parents with parents_mode when that is given. DirRefused says why it
    cannot be used."""
    euid = os.geteuid() if euid is None else euid
    if not os.path.isabs(path):
        raise DirRefused('is not an absolute path')
    path = os.path.normpath(path)
    for dummy in range(MAX_LINKS + 1):
        fd, path = _walk(path, euid, parents_mode)
        if fd is not None:
            return fd
    raise DirRefused('has more than %d symbolic links on the way' % MAX_LINKS)


def _walk(path, euid, parents_mode):
    """(fd on path, None); or (None, the path to walk instead) at a link on the way that may be followed."""
    names = [name for name in path.split('/') if name]
    here, fd = '/', _open_root()
    try:
        for at, name in enumerate(names):
            last = at == len(names) - 1
            _check_above(fd, here, euid)
            child, target = _open_child(fd, here, name, euid, 0o700 if last else parents_mode, last)
            os.close(fd)
            fd = None
            if target is not None:
                return None, os.path.normpath(os.path.join(here, target, *names[at + 1:]))
            fd, here = child, os.path.join(here, name)
        problem = private_dir_problem(os.fstat(fd), euid)
        if problem:
            raise DirRefused(problem)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return fd, None


def _open_root():
    try:
        return os.open('/', DIR_FLAGS)
    except OSError as exc:
        raise DirRefused('cannot be opened: /: %s' % exc.strerror)


def _check_above(fd, here, euid):
    problem = shared_dir_problem(os.fstat(fd), euid, parent=False)
    if problem:
        raise DirRefused('is below %s, which %s' % (here, problem))


def _open_child(fd, here, name, euid, mode, last):
    """(fd on the directory name in fd, None), or (None, the target of a link that may be followed);
    name is created with mode when it is missing and mode is not None."""
    where = os.path.join(here, name)
    for attempt in (1, 2):
        try:
            return os.open(name, DIR_FLAGS, dir_fd=fd), None
        except OSError as exc:
            error = exc
        if error.errno != errno.ENOENT or mode is None or attempt == 2:
            break
        try:
            os.mkdir(name, mode, dir_fd=fd)
        except OSError as exc:
            if exc.errno != errno.EEXIST:  # created meanwhile: opened (and checked) as any other
                raise DirRefused('cannot be created: %s: %s' % (where, exc.strerror))
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        return None, _link_target(fd, where, name, euid, last)
    if error.errno == errno.ENOENT:
        raise DirRefused('cannot be created: %s does not exist' % where)
    raise DirRefused('cannot be opened: %s: %s' % (where, error.strerror))


def _link_target(fd, where, name, euid, last):
    """The target of the link name in fd (where: its path), when it may be followed."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        raise DirRefused('cannot be opened: %s: %s' % (where, exc.strerror))
    if not stat.S_ISLNK(st.st_mode):
        what = 'is %s, not a directory' % _kind(st.st_mode)
        raise DirRefused(what if last else 'is below %s, which %s' % (where, what))
    if last:
        raise DirRefused('is not a directory (a symbolic link is not followed)')
    if st.st_uid not in (0, euid):
        raise DirRefused('is below %s, a symbolic link owned by %s (only links of root or %s are followed)'
                         % (where, _user(st.st_uid), _user(euid)))
    try:
        return os.readlink(name, dir_fd=fd)
    except OSError as exc:
        raise DirRefused('cannot be opened: %s: %s' % (where, exc.strerror))
