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
boot): a directory that is a symbolic link, owned by another user or writable by others is refused,
and then nothing is remembered. Files are written inside it only, atomically (a temporary file in
the directory, then a rename), and never through a link. A file that cannot be read as the JSON
object this module wrote is ignored with a warning.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import stat
import tempfile

from ansible_collections.gpuops.nvidia.plugins.module_utils._lock import _private_dir_problem, default_lock_dir

STATE_DIR = '/run/gpuops'
BOOT_ID = '/proc/sys/kernel/random/boot_id'
CURES = 'cures.json'
VERIFIED = 'verified.json'
# The most GPUs a verification record keeps (the newest): a host has at most a few dozen; what
# is beyond is not ours, or GPUs long gone.
MAX_VERIFIED = 256
# The largest state file read back: a summary is a few KiB; anything far larger is not ours.
MAX_BYTES = 4 * 1024 * 1024
READ_FLAGS = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0) | getattr(os, 'O_NONBLOCK', 0)


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
            return handle.read().strip() or None
    except (IOError, OSError):
        return None


class StateDir:
    """A state directory; usable is False (and problem says why) when it must not be used."""

    def __init__(self, path, euid=None):
        self.path = path
        self.euid = os.geteuid() if euid is None else euid
        self.warnings = []
        self.problem = self._prepare()

    @classmethod
    def for_host(cls, state_dir=None, host_root='/'):
        return cls(state_dir or default_state_dir(host_root))

    @property
    def usable(self):
        return self.problem is None

    def _prepare(self):
        try:
            os.mkdir(self.path, 0o700)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                return 'cannot be created (%s)' % exc.strerror
        return _private_dir_problem(self.path, self.euid)

    def _warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)

    def load(self, name):
        """The JSON object in the state file name, or None (missing, unusable or corrupt)."""
        if not self.usable:
            return None
        path = os.path.join(self.path, name)
        try:
            fd = os.open(path, READ_FLAGS)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self._warn('state file %s cannot be opened (%s); it is ignored' % (path, exc.strerror))
            return None
        try:
            data = self._read_regular(fd, path)
        finally:
            os.close(fd)
        if data is None:
            return None
        try:
            value = json.loads(data.decode('utf-8'))
        except (UnicodeDecodeError, ValueError):
            value = None
        if not isinstance(value, dict):
            self._warn('state file %s is not what gpuops.nvidia wrote (corrupt?); it is ignored and will be '
                       'written anew' % path)
            return None
        return value

    def _read_regular(self, fd, path):
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != self.euid or st.st_size > MAX_BYTES:
            self._warn('state file %s is not a regular file of this user\'s of at most %d bytes; it is ignored'
                       % (path, MAX_BYTES))
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b''.join(chunks)
            chunks.append(chunk)

    def save(self, name, value):
        """Write value (a JSON object) to the state file name, atomically; False when it could not."""
        if not self.usable:
            return False
        try:
            fd, tmp = tempfile.mkstemp(prefix='.%s.' % name, dir=self.path)
        except OSError as exc:
            self._warn('cannot write in the state directory %s (%s)' % (self.path, exc.strerror))
            return False
        try:
            with os.fdopen(fd, 'w') as handle:
                json.dump(value, handle, sort_keys=True, separators=(',', ':'))
            os.rename(tmp, os.path.join(self.path, name))
        except (IOError, OSError, TypeError, ValueError) as exc:
            self._warn('cannot write the state file %s (%s)' % (os.path.join(self.path, name), exc))
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        return True

    def unusable_warning(self, what):
        """The warning that the directory is refused, naming what is not remembered; None if usable."""
        if self.usable:
            return None
        return ('state directory %s %s; it is not used, so %s (set state_dir to a directory only root can '
                'write)' % (self.path, self.problem, what))


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
