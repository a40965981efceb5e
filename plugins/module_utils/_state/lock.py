# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The release lock: one release at a time on a host, and no other user can touch it.

A release runs as root next to users who may be hostile. flock works on any fd, even a
read-only one, so a lock file that another user can open is a lock that user can hold
forever; a lock file in a directory that others can write is a path they can replace with a
symbolic link, a FIFO or a file of their own. So by default the lock lives in a directory
only the caller can write (/run/gpuops for root, created 0700), and a lock file is used only
when it is a regular file of the caller's with one link. It is never followed when it is a
symbolic link, never opened when it is not a regular file, and its content is replaced by the
holder's pid only when it is empty or already a pid. Who holds the lock is read from the
kernel (/proc/locks), never from the file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re
import stat
import tempfile
import time

try:
    import fcntl
    HAS_FCNTL = True
except ImportError:  # not a POSIX host
    HAS_FCNTL = False

try:
    import pwd
except ImportError:  # not a POSIX host
    pwd = None

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import PROC_FILE_MAX

# Root's lock directory; /run is a tmpfs only root can write, so nobody can plant it first.
LOCK_DIR = '/run/gpuops'
LOCK_NAME = 'nvidia-release.lock'
# Non-root runs: a directory of the caller's own, under $XDG_RUNTIME_DIR or the temp dir.
USER_DIR = 'gpuops-%d'
PROC_LOCKS = '/proc/locks'
PROC = '/proc'

OPEN_FLAGS = (os.O_RDWR | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0) | getattr(os, 'O_NONBLOCK', 0) | getattr(os, 'O_NOCTTY', 0))
PID_CONTENT_RE = re.compile(br'^[0-9]*\s*$')
HINT = 'set lock_file to a file in a directory only this user can write'


def _kind(mode):
    for test, name in ((stat.S_ISLNK, 'a symbolic link'), (stat.S_ISFIFO, 'a FIFO'),
                       (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'),
                       (stat.S_ISDIR, 'a directory'), (stat.S_ISSOCK, 'a socket'),
                       (stat.S_ISREG, 'a regular file')):
        if test(mode):
            return name
    return 'not a regular file'


def _user(uid):
    try:
        return '%s (uid %d)' % (pwd.getpwuid(uid).pw_name, uid)
    except (KeyError, AttributeError):
        return 'uid %d' % uid


def default_lock_dir(euid=None, environ=None):
    """The directory of the default lock file for this user (no side effects)."""
    euid = os.geteuid() if euid is None else euid
    environ = os.environ if environ is None else environ
    if euid == 0:
        return LOCK_DIR
    runtime = environ.get('XDG_RUNTIME_DIR')
    if runtime and os.path.isabs(runtime) and _private_dir_problem(runtime, euid) is None:
        return os.path.join(runtime, 'gpuops')
    return os.path.join(tempfile.gettempdir(), USER_DIR % euid)


def default_lock_file():
    """The default lock file for this user: /run/gpuops/nvidia-release.lock for root."""
    return os.path.join(default_lock_dir(), LOCK_NAME)


def _private_dir_problem(path, euid):
    """None when path is a real directory owned by euid that no one else can write, else why not."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return 'cannot be examined (%s)' % exc.strerror
    return private_dir_problem(st, euid)


def private_dir_problem(st, euid):
    """None when st is a directory's, owned by euid, that no one else can write, else why not."""
    if not stat.S_ISDIR(st.st_mode):
        return 'is %s, not a directory' % _kind(st.st_mode)
    if st.st_uid != euid:
        return 'is owned by %s, not by %s' % (_user(st.st_uid), _user(euid))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return 'can be written by others (mode %04o)' % stat.S_IMODE(st.st_mode)
    return None


def ensure_private_dir(path, euid=None):
    """Create path 0700 if it is missing; refuse it unless it is a directory of euid's own
    (not a symbolic link) that group and others cannot write."""
    euid = os.geteuid() if euid is None else euid
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise GpuopsError('cannot create the lock directory %s: %s (%s)' % (path, exc.strerror, HINT))
    problem = _private_dir_problem(path, euid)
    if problem:
        raise GpuopsError('the lock directory %s %s; refusing to use it, since another user could '
                          'then hold or replace the lock (remove it, or %s)' % (path, problem, HINT))


def shared_dir_problem(st, euid, parent):
    """Why a directory with stat st lets another user plant or hold a lock file in it, or None.

    parent: the lock file's own directory, where a sticky bit does not help (anyone can create
    the name first); for the directories above it, a sticky bit keeps others from replacing it."""
    if st.st_uid not in (0, euid):
        return 'is owned by %s' % _user(st.st_uid)
    if st.st_mode & stat.S_IWOTH and (parent or not st.st_mode & stat.S_ISVTX):
        return 'every user can write (mode %04o%s)' % (stat.S_IMODE(st.st_mode), ', sticky' if st.st_mode & stat.S_ISVTX else '')
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0 and (parent or not st.st_mode & stat.S_ISVTX):
        return 'group %d can write (mode %04o)' % (st.st_gid, stat.S_IMODE(st.st_mode))
    return None


def check_lock_dir(path, euid=None):
    """Refuse a lock_file of the caller's choosing in a directory that another user can write
    (or below one they could replace): flock works on any file a user can open, so a user who
    can create the name first, or swap the directory, can block every release."""
    euid = os.geteuid() if euid is None else euid
    directory = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    for current in directory_chain(directory):
        try:
            problem = shared_dir_problem(os.stat(current), euid, parent=current == directory)
        except OSError:
            return  # opening the lock file says what is missing
        if problem:
            where = 'in %s, which' % current if current == directory else 'in %s, below %s, which' % (directory, current)
            raise GpuopsError('lock_file %s is %s %s: any user could create or hold the lock there and block '
                              'every release; use a directory that only %s can write, or leave lock_file unset '
                              'for the default (%s)' % (path, where, problem, _user(euid), default_lock_file()))


def directory_chain(directory):
    """directory, then each directory above it up to /."""
    while True:
        yield directory
        if directory == os.path.dirname(directory):
            return
        directory = os.path.dirname(directory)


def _refusal(path, st, euid):
    """Why the file with stat st must not be used as the lock, or None."""
    if not stat.S_ISREG(st.st_mode):
        return 'lock file %s is %s, not a regular file; refusing to use it (%s)' % (path, _kind(st.st_mode), HINT)
    if st.st_uid != euid:
        return ('lock file %s is owned by %s, not by %s: another user may have planted it; refusing '
                'to use it (remove it, or %s)' % (path, _user(st.st_uid), _user(euid), HINT))
    if st.st_nlink != 1:
        return ('lock file %s has %d hard links (another name for the same file); refusing to use it (%s)'
                % (path, st.st_nlink, HINT))
    return None


def open_lock_file(path, euid=None):
    """An fd on path, created 0600 when missing; GpuopsError unless it is safe to lock."""
    euid = os.geteuid() if euid is None else euid
    try:
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise GpuopsError('cannot examine lock file %s: %s (%s)' % (path, exc.strerror, HINT))
        st = None
    if st is not None:  # refused before any open: opening a device or a FIFO can itself act
        problem = _refusal(path, st, euid)
        if problem:
            raise GpuopsError(problem)
    try:
        fd = os.open(path, OPEN_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise GpuopsError('lock file %s is a symbolic link; refusing to follow it (%s)' % (path, HINT))
        raise GpuopsError('cannot open lock file %s: %s (%s)' % (path, exc.strerror, HINT))
    try:
        problem = _refusal(path, os.fstat(fd), euid)  # what was opened, not what was looked at
    except OSError as exc:
        problem = 'cannot examine lock file %s: %s' % (path, exc.strerror)
    if problem:
        os.close(fd)
        raise GpuopsError(problem)
    return fd


def lock_holders(fd, locks=PROC_LOCKS, proc=PROC):
    """The pids that hold a flock on the file of fd, as the kernel lists them in /proc/locks.

    A pid of 0 or -1 is a holder the kernel does not show to this pid namespace. Files on an
    overlay file system are listed under the device of the layer below: when no line names
    our device, a line with our inode counts only if that process has our file open.
    """
    st = os.fstat(fd)
    ident = '%02x:%02x:%d' % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    exact, same_inode = [], []
    try:
        with open(locks) as handle:
            # Line by line: every lock of the host is listed, as many as its processes took.
            lines = [line for line in handle if 'FLOCK' in line]
    except (IOError, OSError):
        return []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2148252 0 EOF"; waiters are "1: -> FLOCK ...".
        if len(fields) < 6 or fields[1] != 'FLOCK':
            continue
        try:
            pid = int(fields[4])
        except ValueError:
            continue
        if fields[5] == ident:
            exact.append(pid)
        elif fields[5].rsplit(':', 1)[-1] == str(st.st_ino) and pid > 0:
            same_inode.append(pid)
    if exact:
        return exact
    return [pid for pid in same_inode if _has_open(pid, st, proc)]


def _has_open(pid, st, proc):
    base = os.path.join(proc, str(pid), 'fd')
    try:
        names = os.listdir(base)
    except OSError:
        return False
    for name in names:
        try:
            other = os.stat(os.path.join(base, name))
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return True
    return False


def describe_holder(pid, proc=PROC):
    """'pid 1234 (sleep, user nobody (uid 65534))', or what can be said of a hidden holder."""
    if pid <= 0:
        return 'a process in another pid namespace'
    try:
        with open(os.path.join(proc, str(pid), 'comm')) as handle:
            comm = handle.read(PROC_FILE_MAX).strip()
        uid = os.stat(os.path.join(proc, str(pid))).st_uid
    except (IOError, OSError):
        return 'pid %d' % pid
    return 'pid %d (%s, user %s)' % (pid, comm, _user(uid))


class ReleaseLock:
    """An exclusive flock on a file, so that releases on one host run one at a time.

    path None is the default lock file, in a directory that is created 0700 and checked.
    """

    def __init__(self, path=None):
        self.default = path is None
        self.path = default_lock_file() if path is None else path
        self.fd = None

    def acquire(self, deadline, clock=time.monotonic, sleep=time.sleep):
        """Lock, waiting until deadline (a clock() value) at most; GpuopsError when it passes."""
        if not HAS_FCNTL:
            return
        if self.default:
            ensure_private_dir(os.path.dirname(self.path))
        else:
            check_lock_dir(self.path)
        delay, opened = 0.01, False
        while True:
            if self.fd is None:
                if opened and deadline - clock() <= 0:
                    raise GpuopsError('lock file %s kept being removed or replaced; gave up when the '
                                      'timeout passed' % self.path)
                self.fd = open_lock_file(self.path)
                opened = True
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self._still_at_path():
                    break
                self.release()  # removed or replaced while we waited: lock what is there now
                continue
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    self.release()
                    raise GpuopsError('cannot lock %s: %s' % (self.path, exc.strerror))
            if not self._still_at_path():  # the file we wait on was removed or replaced
                self.release()
                continue
            left = deadline - clock()
            if left <= 0:
                holders = lock_holders(self.fd)
                self.release()
                who = ', '.join(describe_holder(pid) for pid in holders) or \
                    'a process the kernel does not name (no holder in /proc/locks)'
                raise GpuopsError('another process still holds the lock file %s: %s; gave up when '
                                  'the timeout passed' % (self.path, who))
            sleep(min(delay, left))
            delay = min(delay * 2, 0.2)
        if self.default:
            os.fchmod(self.fd, 0o600)  # our own file, in our own directory: no one else opens it
        self._write_pid()

    def _still_at_path(self):
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        mine = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _write_pid(self):
        """For people reading the file: our pid, only where the file is empty or a pid already."""
        try:
            content = os.pread(self.fd, 64, 0)
            if len(content) < 64 and PID_CONTENT_RE.match(content):
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, ('%d\n' % os.getpid()).encode('ascii'), 0)
        except OSError:  # a note for people; the lock is what counts
            pass

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing the last fd drops the flock
            self.fd = None
