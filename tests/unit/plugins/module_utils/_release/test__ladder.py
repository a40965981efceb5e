# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The signal ladder on real processes of this test's own: who joins it where, and who is left
alone. (The ladder within whole releases is tested in test__release.py.)"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import Budget
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import load_holder
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.ladder import RESPAWN_LIMIT, Ladder
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.observation import Observer
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import Signaller

from processes import gone, read_pid

# Ignores TERM, writes the pid of a child it forked to argv[1], and sleeps.
FORKER = (
    'import os, signal, sys, time\n'
    'signal.signal(signal.SIGTERM, signal.SIG_IGN)\n'
    'child = os.fork()\n'
    'if child == 0:\n'
    '    time.sleep(60)\n'
    '    os._exit(0)\n'
    'open(sys.argv[1] + ".tmp", "w").write(str(child))\n'
    'os.rename(sys.argv[1] + ".tmp", sys.argv[1])\n'
    'time.sleep(60)\n'
)


@pytest.fixture
def ladder():
    options = ReleaseOptions(['/dev/null'], signals=['TERM', 'KILL'], grace_period=1, timeout=10)
    seen = Observer(None, options, clock=time.monotonic)
    # What Release.run gives the observer (start() would also look for NVIDIA device nodes).
    seen.budget = Budget('the test', 10, time.monotonic)
    seen.deadline = time.monotonic() + 10
    seen.signal_deadline = seen.deadline - 1
    made = Ladder(options, Signaller(lambda line: None), seen, fd_limit=1024)
    seen.ladder = made
    yield made
    made.close()


def running_sleep(pid, seconds=5):
    """Wait until pid runs sleep: read before its exec, it would have another command line."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            if handle.read() == b'sleep\x0060\x00':
                return
        time.sleep(0.01)
    raise AssertionError('pid %d does not run sleep' % pid)


def holder_of(pid):
    holder = load_holder(pid, ['/dev/null'], [], set())
    assert holder is not None
    return holder


def test_a_fork_of_a_target_joins_the_ladder_at_the_step_its_parent_reached(ladder, tmp_path):
    pidfile = str(tmp_path / 'child.pid')
    parent = subprocess.Popen([sys.executable, '-c', FORKER, pidfile])
    try:
        child = read_pid(pidfile)
        now = time.monotonic()
        assert ladder.enlist([holder_of(parent.pid)], now)
        ladder.advance(now)  # TERM, which the parent ignores
        target = ladder.target(holder_of(parent.pid))
        assert target.signals_sent == ['TERM'] and target.step == 1
        forked = holder_of(child)
        assert ladder.relative(forked) is target
        assert ladder.enlist([forked], now)
        assert ladder.target(forked).step == 1 and ladder.target(forked).due == target.due
        assert ladder.finish(time.monotonic())  # the KILL, to both
        assert parent.wait(5) == -signal.SIGKILL and gone(child)
    finally:
        parent.kill()
        parent.wait()


def test_a_command_that_keeps_coming_back_is_left_alone_after_one_respawn(ladder):
    started = []
    try:
        for dummy in range(RESPAWN_LIMIT + 2):
            process = subprocess.Popen(['sleep', '60'])
            started.append(process)
            running_sleep(process.pid)
            holder = holder_of(process.pid)
            joined = ladder.enlist([holder], time.monotonic())
            if len(started) <= RESPAWN_LIMIT + 1:
                assert joined and ladder.has(holder)
                ladder.advance(time.monotonic())
                assert process.wait(5) == -signal.SIGTERM
                ladder.note_exits(time.monotonic)
                time.sleep(0.1)  # a supervisor's restart delay: the next one starts after this one was seen gone
        assert not joined and not ladder.has(holder)
        assert list(ladder.left_alone) == [(holder.pid, holder.starttime)]
        assert started[-1].poll() is None  # never signalled
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
