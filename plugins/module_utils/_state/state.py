# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The host's state directory: what the collection remembers between runs on a host.

It holds where the kernel log was last read (and the summary of what was read so far), and each
GPU's last cure (a successful reset), keyed by GPU UUID and boot id. It lives where only root can
write, as the release lock does (/run/gpuops, created 0700; /run is a tmpfs, so it goes with the
boot). It is opened by descriptor from / (_dirfd): a directory that is a symbolic link, owned by
another user or writable by others, or below a directory that another user could swap it in, is
refused, and then nothing is remembered. It is opened and checked again for each read and write,
and files are read and written through that descriptor only: atomically (a temporary file in the
directory, then a rename), and never through a link. A file that cannot be read as the JSON object
this module wrote is ignored with a warning.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import binascii
import errno
import json
import os
import stat

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.dirfd import DirRefused, open_private_dir
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.lock import default_lock_dir
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import PROC_FILE_MAX

STATE_DIR = '/run/gpuops'
BOOT_ID = '/proc/sys/kernel/random/boot_id'
CURES = 'cures.json'
VERIFIED = 'verified.json'
# The most GPUs a verification record keeps (the newest): a host has at most a few dozen; what
# is beyond is not ours, or GPUs long gone.
MAX_VERIFIED = 256
# The largest state file read back: a summary is a few KiB; anything far larger is not ours.
MAX_BYTES = 4 * 1024 * 1024
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Missing directories above a simulated host's state directory are created with this mode.
PARENTS_MODE = 0o755


def default_state_dir(host_root='/'):
    """/run/gpuops (for root; another user's own directory, as the lock's), under host_root when
    that is set (a simulated host keeps its own)."""
    if not host_root or os.path.normpath(host_root) == '/':
        return default_lock_dir()
    return os.path.join(host_root, STATE_DIR.lstrip('/'))


def boot_id(path=BOOT_ID):
    """This boot's id (the kernel's), or None when it cannot be read."""
    try:
        with open(path) as handle:
            return handle.read(PROC_FILE_MAX).strip() or None
    except (IOError, OSError):
        return None


class StateDir:
    """A state directory; usable is False (and problem says why) when it must not be used.

    parents: create the missing directories above it (a simulated host's)."""

    def __init__(self, path, euid=None, parents=False):
        self.path = path
        self.euid = os.geteuid() if euid is None else euid
        self.parents_mode = PARENTS_MODE if parents else None
        self.warnings = []
        self.problem = self._prepare()

    @classmethod
    def for_host(cls, state_dir=None, host_root='/'):
        return cls(state_dir or default_state_dir(host_root))

    @property
    def usable(self):
        return self.problem is None

    def _open_dir(self):
        return open_private_dir(os.path.abspath(self.path), self.euid, parents_mode=self.parents_mode)

    def _prepare(self):
        try:
            os.close(self._open_dir())
        except DirRefused as exc:
            return str(exc)
        return None

    def _opened(self):
        """An fd on the directory, opened and checked anew (it may have been swapped since it was
        first checked); None, with a warning, when it can no longer be used."""
        try:
            return self._open_dir()
        except DirRefused as exc:
            self._warn('state directory %s %s; it is not used (set state_dir to a directory only root can write)'
                       % (self.path, exc))
            return None

    def _warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)

    def load(self, name):
        """The JSON object in the state file name, or None (missing, unusable or corrupt)."""
        dirfd = self._opened() if self.usable else None
        if dirfd is None:
            return None
        try:
            data = self._read(dirfd, name)
        finally:
            os.close(dirfd)
        if data is None:
            return None
        try:
            value = json.loads(data.decode('utf-8'))
        except (UnicodeDecodeError, ValueError):
            value = None
        if not isinstance(value, dict):
            self._warn('state file %s is not what gpuops.nvidia wrote (corrupt?); it is ignored and will be '
                       'written anew' % os.path.join(self.path, name))
            return None
        return value

    def _read(self, dirfd, name):
        path = os.path.join(self.path, name)
        try:
            fd = os.open(_plain(name), READ_FLAGS, dir_fd=dirfd)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self._warn('state file %s cannot be opened (%s); it is ignored' % (path, exc.strerror))
            return None
        try:
            return self._read_regular(fd, path)
        finally:
            os.close(fd)

    def _read_regular(self, fd, path):
        st = os.fstat(fd)
        data = None
        if stat.S_ISREG(st.st_mode) and st.st_uid == self.euid and st.st_size <= MAX_BYTES:
            data = _read_at_most(fd, MAX_BYTES + 1)  # the file may grow after the fstat
        if data is None or len(data) > MAX_BYTES:
            self._warn('state file %s is not a regular file of this user\'s of at most %d bytes; it is ignored'
                       % (path, MAX_BYTES))
            return None
        return data

    def save(self, name, value):
        """Write value (a JSON object) to the state file name, atomically; False when it could not."""
        if not self.usable:
            return False
        try:
            data = json.dumps(value, sort_keys=True, separators=(',', ':')).encode('utf-8')
        except (TypeError, ValueError) as exc:
            self._warn('cannot write the state file %s (%s)' % (os.path.join(self.path, name), exc))
            return False
        return self.write(name, data)

    def write(self, name, data):
        """Write data (bytes) to the file name, atomically; False, with a warning, when it could not."""
        dirfd = self._opened() if self.usable else None
        if dirfd is None:
            return False
        try:
            return self._replace(dirfd, _plain(name), data, os.path.join(self.path, name))
        finally:
            os.close(dirfd)

    def mtime(self, name):
        """When the file name was last written (the file itself, never a link's target), or None."""
        dirfd = self._opened() if self.usable else None
        if dirfd is None:
            return None
        try:
            return os.stat(_plain(name), dir_fd=dirfd, follow_symlinks=False).st_mtime
        except OSError:
            return None
        finally:
            os.close(dirfd)

    def _replace(self, dirfd, name, data, path):
        """Write data to a new file in dirfd, then rename it to name: a reader sees the old or the new."""
        tmp = '.%s.%s' % (name, binascii.hexlify(os.urandom(6)).decode('ascii'))
        try:
            fd = os.open(tmp, WRITE_FLAGS, 0o600, dir_fd=dirfd)
        except OSError as exc:
            self._warn('cannot write in the state directory %s (%s)' % (self.path, exc.strerror))
            return False
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except OSError as exc:
            self._warn('cannot write the state file %s (%s)' % (path, exc.strerror))
            _unlink(tmp, dirfd)
            return False
        try:
            os.fsync(dirfd)  # the rename itself, for a directory that outlives a reboot
        except OSError:
            pass
        return True

    def unusable_warning(self, what):
        """The warning that the directory is refused, naming what is not remembered; None if usable."""
        if self.usable:
            return None
        return ('state directory %s %s; it is not used, so %s (set state_dir to a directory only root can '
                'write)' % (self.path, self.problem, what))


def _plain(name):
    """name, a file's name in the directory (never a path that could lead out of it)."""
    if not name or name in ('.', '..') or '/' in name or '\0' in name:
        raise ValueError('not a state file name: %r' % (name,))
    return name


def _read_at_most(fd, limit):
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b''.join(chunks)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink(name, dirfd):
    try:
        os.unlink(name, dir_fd=dirfd)
    except OSError:
        pass


# -- cures -----------------------------------------------------------------------------------

def load_cures(state, boot=None):
    """{uuid: epoch seconds of the GPU's last cure} recorded in this boot (boot: its id)."""
    data = state.load(CURES) or {}
    gpus = data.get('gpus') if isinstance(data.get('gpus'), dict) else {}
    cures = {}
    for uuid, record in gpus.items():
        if isinstance(record, dict) and record.get('boot_id') == boot and isinstance(record.get('time'), (int, float)):
            cures[uuid] = float(record['time'])
    return cures


def record_cure(state, uuids, when, how='reset', boot=None):
    """Record that the GPUs of uuids were cured (how: reset or probe) at when (epoch seconds)."""
    uuids = [uuid for uuid in uuids if uuid]
    if not uuids or not state.usable:
        return False
    data = state.load(CURES) or {}
    gpus = data.get('gpus') if isinstance(data.get('gpus'), dict) else {}
    for uuid in uuids:
        gpus[uuid] = {'boot_id': boot, 'time': float(when), 'how': how}
    return state.save(CURES, {'gpus': gpus})


# -- verifications ---------------------------------------------------------------------------

def record_verified(state, records):
    """Add records ({uuid: what a passed probe proved, with verified_at}) to the GPUs' last
    verifications; return them all ({uuid: record}, newest MAX_VERIFIED), what was there when
    the directory cannot be written, or records alone when it cannot be used."""
    if not state.usable:
        return dict(records)
    data = state.load(VERIFIED) or {}
    gpus = data.get('gpus') if isinstance(data.get('gpus'), dict) else {}
    gpus = dict((uuid, record) for uuid, record in gpus.items()
                if isinstance(record, dict) and isinstance(record.get('verified_at'), (int, float)))
    gpus.update(records)
    newest = sorted(gpus.items(), key=lambda item: item[1]['verified_at'], reverse=True)[:MAX_VERIFIED]
    gpus = dict(newest)
    if records:
        state.save(VERIFIED, {'gpus': gpus})
    return gpus
