# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._state import lock as _lock
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.lock import (
    ReleaseLock,
    default_lock_dir,
    default_lock_file,
    describe_holder,
    lock_holders,
)

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason='plants files of another user: needs root')

# A process that holds an exclusive flock on a file (opened read-only: flock does not care),
# says "ready" and waits.
HOLDER = r'''
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
time.sleep(60)
'''


@pytest.fixture
def lock_dir(monkeypatch, tmp_path):
    """The default lock directory, moved under tmp_path; returns its path (not created)."""
    path = str(tmp_path / 'run' / 'gpuops')
    os.mkdir(str(tmp_path / 'run'), 0o755)
    monkeypatch.setattr(_lock, 'LOCK_DIR', path)
    return path


@pytest.fixture
def shared_dir():
    """A sticky world-writable directory that every user can reach, like /tmp or /run/lock."""
    path = tempfile.mkdtemp(prefix='gpuops-lock-test-', dir='/tmp')
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def holder():
    """start(path) -> a real process holding an exclusive flock on path."""
    procs = []

    def start(path):
        proc = subprocess.Popen([sys.executable, '-c', HOLDER, path], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == 'ready'
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def acquire(path=None, seconds=0.3):
    lock = ReleaseLock(path)
    lock.acquire(time.monotonic() + seconds)
    return lock


def as_user(uid, func):
    """Run func() in a forked child with uid (real and effective); its return value, or the
    text of the GpuopsError it raised, comes back as JSON."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            try:
                out = {'value': func()}
            except GpuopsError as exc:
                out = {'error': str(exc)}
            os.write(write_end, json.dumps(out).encode())
        except BaseException as exc:  # report anything else too
            os.write(write_end, json.dumps({'crash': repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, 'rb') as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    out = json.loads(data.decode())
    assert 'crash' not in out, out
    return out


# -- the default place ----------------------------------------------------------------------

def test_root_default_is_a_private_directory_under_run():
    assert default_lock_dir(euid=0) == '/run/gpuops'
    if os.geteuid() == 0:
        assert default_lock_file() == '/run/gpuops/nvidia-release.lock'


def test_default_lock_directory_is_created_private_and_the_file_0600(lock_dir):
    lock = acquire()
    try:
        assert lock.path == os.path.join(lock_dir, 'nvidia-release.lock')
        st = os.lstat(lock_dir)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        st = os.lstat(lock.path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        with open(lock.path) as handle:
            assert handle.read() == '%d\n' % os.getpid()
    finally:
        lock.release()


@root_only
def test_no_other_user_can_open_the_default_lock_and_so_cannot_hold_it(shared_dir, monkeypatch):
    lock_dir = os.path.join(shared_dir, 'gpuops')  # every user can reach its parent, as /run
    monkeypatch.setattr(_lock, 'LOCK_DIR', lock_dir)
    acquire().release()
    path = os.path.join(lock_dir, 'nvidia-release.lock')
    assert os.path.exists(path)

    def try_to_lock():
        try:
            os.open(path, os.O_RDONLY)
        except OSError as exc:
            return exc.strerror
        return 'opened'

    assert as_user(NOBODY, try_to_lock) == {'value': 'Permission denied'}


@root_only
def test_a_lock_directory_planted_by_another_user_is_refused(lock_dir):
    os.mkdir(lock_dir, 0o700)
    os.chown(lock_dir, NOBODY, NOBODY)
    with pytest.raises(GpuopsError, match=r'lock directory %s is owned by nobody \(uid 65534\), not by root' % lock_dir):
        acquire()
    assert os.listdir(lock_dir) == []


def test_a_lock_directory_others_can_write_is_refused(lock_dir):
    os.mkdir(lock_dir)
    os.chmod(lock_dir, 0o1777)  # /run/lock's own mode
    with pytest.raises(GpuopsError, match=r'can be written by others \(mode 1777\)'):
        acquire()
    assert os.listdir(lock_dir) == []


def test_a_lock_directory_that_is_a_symlink_is_refused(lock_dir, tmp_path):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    os.symlink(str(elsewhere), lock_dir)
    with pytest.raises(GpuopsError, match='lock directory %s is a symbolic link, not a directory' % lock_dir):
        acquire()
    assert os.listdir(str(elsewhere)) == []


@root_only
def test_a_user_without_root_gets_a_private_directory_of_their_own(shared_dir, monkeypatch):
    monkeypatch.delenv('XDG_RUNTIME_DIR', raising=False)
    monkeypatch.setattr(tempfile, 'tempdir', shared_dir)

    def lock_as_user():
        lock = acquire()
        st_dir, st_file = os.lstat(os.path.dirname(lock.path)), os.lstat(lock.path)
        lock.release()
        return [lock.path, st_dir.st_uid, stat.S_IMODE(st_dir.st_mode), st_file.st_uid, stat.S_IMODE(st_file.st_mode)]

    expected = os.path.join(shared_dir, 'gpuops-%d' % NOBODY, 'nvidia-release.lock')
    assert as_user(NOBODY, lock_as_user) == {'value': [expected, NOBODY, 0o700, NOBODY, 0o600]}


@root_only
def test_a_user_directory_planted_by_someone_else_is_refused(shared_dir, monkeypatch):
    monkeypatch.delenv('XDG_RUNTIME_DIR', raising=False)
    monkeypatch.setattr(tempfile, 'tempdir', shared_dir)
    os.mkdir(os.path.join(shared_dir, 'gpuops-%d' % NOBODY), 0o700)  # root's, in nobody's place
    out = as_user(NOBODY, lambda: acquire().path)
    assert 'is owned by root (uid 0), not by nobody (uid 65534)' in out['error'], out


@root_only
def test_a_user_runtime_directory_is_used_when_it_is_private(tmp_path):
    runtime = tmp_path / 'user'
    runtime.mkdir(mode=0o700)
    os.chown(str(runtime), NOBODY, NOBODY)
    environ = {'XDG_RUNTIME_DIR': str(runtime)}
    assert default_lock_dir(euid=NOBODY, environ=environ) == str(runtime / 'gpuops')
    runtime.chmod(0o777)
    assert default_lock_dir(euid=NOBODY, environ=environ) == os.path.join(tempfile.gettempdir(), 'gpuops-65534')


# -- what a lock_file may be ----------------------------------------------------------------

@root_only
def test_a_symlink_planted_at_the_lock_path_is_never_followed(tmp_path):
    target = tmp_path / 'shadow'
    target.write_text('root:secret\n')
    target.chmod(0o600)
    path = str(tmp_path / 'release.lock')
    os.symlink(str(target), path)
    os.lchown(path, NOBODY, NOBODY)
    with pytest.raises(GpuopsError, match='lock file %s is a symbolic link, not a regular file; refusing' % path):
        acquire(path)
    assert target.read_text() == 'root:secret\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@root_only
def test_a_lock_file_of_another_user_is_refused_and_left_alone(tmp_path):
    path = str(tmp_path / 'release.lock')
    with open(path, 'w') as handle:
        handle.write('12345\n')
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(GpuopsError, match=r'owned by nobody \(uid 65534\), not by root .*another user may have planted it'):
        acquire(path)
    with open(path) as handle:
        assert handle.read() == '12345\n'


def test_an_existing_file_with_content_is_locked_but_never_emptied(tmp_path):
    path = tmp_path / 'important.conf'
    path.write_text('keep = me\n')
    lock = acquire(str(path))
    try:
        assert path.read_text() == 'keep = me\n'
        with pytest.raises(GpuopsError, match='still holds'):
            acquire(str(path), 0.05)
    finally:
        lock.release()
    assert path.read_text() == 'keep = me\n'


def test_a_hard_linked_file_is_refused(tmp_path):
    path = tmp_path / 'release.lock'
    path.write_text('')
    os.link(str(path), str(tmp_path / 'other-name'))
    with pytest.raises(GpuopsError, match='has 2 hard links'):
        acquire(str(path))


@pytest.mark.parametrize('kind', ['dev-null', 'fifo', 'directory'])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    if kind == 'dev-null':
        path, what = '/dev/null', 'a character device'
    elif kind == 'fifo':
        path, what = str(tmp_path / 'fifo'), 'a FIFO'
        os.mkfifo(path)
    else:
        path, what = str(tmp_path), 'a directory'
    started = time.monotonic()
    with pytest.raises(GpuopsError, match='lock file %s is %s, not a regular file; refusing' % (path, what)):
        acquire(path, 5)
    assert time.monotonic() - started < 1


def test_a_missing_directory_for_lock_file_is_a_clear_error(tmp_path):
    with pytest.raises(GpuopsError, match='cannot open lock file .*No such file or directory'):
        acquire(str(tmp_path / 'absent' / 'release.lock'))


# -- where a lock_file may be ---------------------------------------------------------------

@pytest.mark.parametrize('mode, what', [(0o1777, r'mode 1777, sticky'), (0o777, r'mode 0777'), (0o770, r'mode 0770')])
def test_a_lock_file_in_a_directory_others_can_write_is_refused(tmp_path, mode, what):
    """flock works on any file a user can open: in /tmp or /run/lock anyone can create the
    name first (a sticky bit does not stop that) and hold it, blocking every release."""
    shared = tmp_path / 'shared'
    shared.mkdir()
    os.chown(str(shared), os.geteuid(), 100)  # a group that is not root's
    shared.chmod(mode)
    path = str(shared / 'release.lock')
    with pytest.raises(GpuopsError) as info:
        acquire(path)
    assert re.match(r'lock_file %s is in %s, which (every user can write|group \d+ can write) \(%s' % (
        re.escape(path), re.escape(str(shared)), what), str(info.value)), str(info.value)
    assert 'leave lock_file unset for the default (%s)' % default_lock_file() in str(info.value)
    assert os.listdir(str(shared)) == []


@root_only
def test_a_lock_file_below_a_directory_another_user_owns_is_refused(tmp_path):
    """nobody could rename the directory away and put one of their own in its place."""
    theirs = tmp_path / 'theirs'
    theirs.mkdir(mode=0o755)
    os.chown(str(theirs), NOBODY, NOBODY)
    ours = theirs / 'locks'
    ours.mkdir(mode=0o700)
    path = str(ours / 'release.lock')
    with pytest.raises(GpuopsError, match=r'lock_file %s is in %s, below %s, which is owned by nobody \(uid 65534\)' % (
            re.escape(path), re.escape(str(ours)), re.escape(str(theirs)))):
        acquire(path)
    assert os.listdir(str(ours)) == []


def test_a_lock_file_in_a_directory_only_root_writes_below_sticky_tmp_is_used(shared_dir):
    """A directory of the caller's own inside /tmp: others cannot replace it (sticky /tmp)."""
    ours = os.path.join(shared_dir, 'locks')
    os.mkdir(ours, 0o755)
    acquire(os.path.join(ours, 'release.lock')).release()
    assert os.listdir(ours) == ['release.lock']


# -- who holds it ---------------------------------------------------------------------------

def test_a_free_lock_is_taken_even_with_no_time_left(tmp_path):
    path = str(tmp_path / 'release.lock')
    lock = ReleaseLock(path)
    lock.acquire(time.monotonic() - 1)
    lock.release()


def test_the_real_holder_is_named_never_the_stale_pid_in_the_file(tmp_path, holder):
    path = tmp_path / 'release.lock'
    path.write_text('999999\n')  # left by a release that finished long ago
    proc = holder(str(path))
    started = time.monotonic()
    with pytest.raises(GpuopsError) as error:
        acquire(str(path), 0.3)
    assert 0.25 < time.monotonic() - started < 2  # bounded by the deadline
    message = str(error.value)
    assert 'another process still holds the lock file %s: pid %d (python' % (path, proc.pid) in message
    assert '999999' not in message
    assert 'gave up when the timeout passed' in message


def test_two_releases_serialise_on_the_lock(tmp_path):
    path = str(tmp_path / 'release.lock')
    first = acquire(path)
    with pytest.raises(GpuopsError, match=r'still holds the lock file %s: pid %d \(' % (path, os.getpid())):
        acquire(path, 0.2)
    timer = threading.Timer(0.2, first.release)
    timer.start()
    started = time.monotonic()
    second = acquire(path, 5)
    assert 0.1 < time.monotonic() - started < 3
    with open(path) as handle:
        assert handle.read() == '%d\n' % os.getpid()
    second.release()
    timer.join()


def test_a_lock_file_removed_while_waiting_is_not_waited_on(tmp_path, holder):
    path = tmp_path / 'release.lock'
    path.write_text('')
    holder(str(path))  # holds the old file for a minute
    timer = threading.Timer(0.2, path.unlink)
    timer.start()
    started = time.monotonic()
    lock = acquire(str(path), 5)
    try:
        assert time.monotonic() - started < 2
        assert path.read_text() == '%d\n' % os.getpid()
    finally:
        lock.release()
        timer.join()


def test_the_default_lock_file_is_made_private_again(lock_dir):
    os.mkdir(lock_dir, 0o700)
    path = os.path.join(lock_dir, 'nvidia-release.lock')
    with open(path, 'w'):
        pass
    os.chmod(path, 0o644)
    acquire().release()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_holder_the_kernel_hides_is_not_given_a_pid(tmp_path):
    path = tmp_path / 'release.lock'
    path.write_text('')
    fd = os.open(str(path), os.O_RDONLY)
    try:
        st = os.fstat(fd)
        locks = tmp_path / 'locks'
        locks.write_text('1: POSIX  ADVISORY  WRITE 4242 %02x:%02x:%d 0 EOF\n'
                         '2: FLOCK  ADVISORY  WRITE 0 %02x:%02x:%d 0 EOF\n'
                         '2: -> FLOCK  ADVISORY  WRITE 4343 %02x:%02x:%d 0 EOF\n'
                         % ((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) * 3))
        assert lock_holders(fd, str(locks)) == [0]
        assert describe_holder(0) == 'a process in another pid namespace'
        locks.write_text('')
        assert lock_holders(fd, str(locks)) == []
    finally:
        os.close(fd)
