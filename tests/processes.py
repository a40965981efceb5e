# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Waiting on processes that tests start: a pid a script writes, a process that must end; and
running a risky test in a private PID namespace."""

import functools
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gpusim.state import is_alive as alive


def read_pid(path, seconds=5):
    """The pid written to path, once it is there."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        time.sleep(0.01)
    raise AssertionError('no pid in %s' % path)


def gone(pid, seconds=3):
    """True once pid no longer runs (a zombie no one reaps counts as gone)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


def kill_left(pidfile):
    """SIGKILL the process whose pid a test script wrote to pidfile, if it still runs."""
    pid = read_pid(pidfile)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def await_ready(proc, argv):
    """Read the 'ready' line proc prints; where argv is a shell script that execs its program
    right after printing it, wait for that exec too (until then the process is still bash)."""
    assert proc.stdout.readline().strip() == b'ready'
    if argv[0] == 'bash' and argv[2].partition('echo ready;')[2].lstrip().startswith('exec '):
        wait_exec(proc.pid)


def wait_exec(pid, seconds=10):
    """Wait until pid no longer runs bash."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            if os.path.basename(os.readlink('/proc/%d/exe' % pid)) != 'bash':
                return
        except OSError:
            return
        time.sleep(0.01)
    raise AssertionError('pid %d still runs bash' % pid)


INSIDE = 'GPUOPS_PRIVATE_PID_NAMESPACE'


def in_private_pid_namespace(test):
    """Run the test in a new PID namespace with its own /proc: pytest re-runs this one test
    there (as its PID 1), and the outer test passes when the inner one does."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if os.environ.get(INSIDE) == '1':
            return test(*args, **kwargs)
        if os.getuid() != 0 or not shutil.which('unshare'):
            pytest.skip('needs root and unshare(1) for a private PID namespace')
        node = os.environ['PYTEST_CURRENT_TEST'].rsplit(' ', 1)[0]
        # pytest-xdist's --dist loadgroup names a test of an xdist_group NODEID@GROUP: the test is NODEID.
        if node.rfind('@') > node.rfind(']'):
            node = node.rsplit('@', 1)[0]
        proc = subprocess.run(['unshare', '-pf', '--mount-proc', sys.executable, '-m', 'pytest', '-q',
                               '-p', 'no:cacheprovider', node],
                              env=dict(os.environ, **{INSIDE: '1'}), capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert '1 passed' in proc.stdout, proc.stdout[-4000:]
    return wrapper
