# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._health import kernel_log as _health
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, PermanentReadError
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import (
    OUTPUT_MAX,
    CommandTimeout,
    OutputTooLarge,
    Runner,
    process_state,
)
from processes import gone, kill_left, read_pid


def program(tmp_path, name, body):
    path = tmp_path / name
    path.write_text('#!/bin/sh\n' + body + '\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_any_program_runs_with_its_arguments_in_the_c_locale_and_extra_environment(tmp_path):
    path = program(tmp_path, 'journalctl', 'echo "$@ $LC_ALL $SYSTEMD_PAGER."; echo "sid $(ps -o sid= -p $$)" >&2; exit 3')
    rc, stdout, stderr = Runner(path, env=dict(SYSTEMD_PAGER='none')).run(['-k', '-q'])
    assert (rc, stdout) == (3, '-k -q C none.\n')
    # A session of its own: its session id is its own pid, not ours.
    assert int(stderr.split()[1]) != os.getsid(0)


def test_a_program_found_on_path_is_named_in_errors_by_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))
    program(tmp_path, 'dmesg', 'echo hi')
    assert Runner('dmesg').run([]) == (0, 'hi\n', '')
    with pytest.raises(PermanentReadError, match=r"^journalctl not found or not executable at 'journalctl'$"):
        Runner('journalctl').run([])
    with pytest.raises(PermanentReadError, match=r"^journalctl not found .*: install systemd$"):
        Runner('journalctl', hint='install systemd').run([])


def test_exec_failures_name_the_program(tmp_path):
    path = tmp_path / 'dmesg'
    path.write_text('#!/opt/gone/sh\n')
    path.chmod(0o755)
    with pytest.raises(PermanentReadError, match="dmesg at .* bad interpreter '/opt/gone/sh'"):
        Runner(str(path)).run([])


@pytest.mark.parametrize('detach', ['', 'setsid '])
def test_timeout_kills_the_program_and_what_it_started(tmp_path, detach):
    pidfile = str(tmp_path / 'child.pid')
    path = program(tmp_path, 'journalctl', "trap '' TERM; %ssleep 30 & echo $! > %s; sleep 30" % (detach, pidfile))
    started = time.monotonic()
    try:
        with pytest.raises(CommandTimeout, match=r'^journalctl -k did not answer within 0.5 s and was killed$') as error:
            Runner(path, 0.5).run(['-k'])
        assert error.value.timeout == 0.5 and error.value.argv == [path, '-k']
        assert isinstance(error.value, GpuopsError) and not isinstance(error.value, PermanentReadError)
        assert time.monotonic() - started < 3
        assert gone(read_pid(pidfile))
    finally:
        kill_left(pidfile)


def test_a_program_that_keeps_forking_into_sessions_of_its_own_leaves_none_behind(tmp_path):
    """A child that keeps forking processes that leave the group (setsid) while the program is
    killed: none of them is left running (the descendants are stopped, listed again until no new
    one appears, then killed; how narrow the race is that the stop closes is not timed here)."""
    pids = tmp_path / 'pids'
    path = program(tmp_path, 'journalctl', "trap '' TERM; (while :; do setsid sh -c 'echo $$ >> %s; exec sleep 30' & "
                                           "sleep 0.01; done) & sleep 30" % pids)
    try:
        with pytest.raises(CommandTimeout):
            Runner(path, 0.5).run(['-k'])
        time.sleep(0.3)  # what a process that outran the kill would have started by now
        started = [int(line) for line in pids.read_text().split()]
        assert started and all(gone(pid, 2) for pid in started), [pid for pid in started if not gone(pid, 0)]
    finally:
        for line in pids.read_text().split() if pids.exists() else ():
            try:
                os.kill(int(line), 9)
            except OSError:
                pass


def test_the_kernel_log_reader_runs_through_the_runner(tmp_path):
    # A journalctl that hangs with a child holding its pipes: the child dies with it.
    pidfile = str(tmp_path / 'child.pid')
    hung = program(tmp_path, 'journalctl', 'setsid sleep 30 & echo $! > %s; sleep 30' % pidfile)
    started = time.monotonic()
    try:
        events, warnings = _health.read_xid_events(None, 0.5, commands=([hung],))
        assert events is None and 'journalctl did not finish within 0.5 s' in warnings[0]
        assert time.monotonic() - started < 3
        assert gone(read_pid(pidfile))
    finally:
        kill_left(pidfile)


def test_the_kernel_log_reader_names_a_program_that_does_not_run(tmp_path):
    events, warnings = _health.read_xid_events(None, 1, commands=([str(tmp_path / 'journalctl')],))
    assert events is None and 'journalctl not found or not executable' in warnings[0]


def test_a_program_that_prints_more_than_its_bound_is_stopped(tmp_path):
    # Before: its output was kept whole, however large (a flood of lines read into memory).
    pidfile = str(tmp_path / 'child.pid')
    path = program(tmp_path, 'sinfo', 'sleep 30 & echo $! > %s; yes "a line of output"' % pidfile)
    try:
        with pytest.raises(OutputTooLarge, match=r'^sinfo -h printed more than 100000 bytes and was stopped$'):
            Runner(path, 20, max_output=100000).run(['-h'])
        assert gone(read_pid(pidfile))
    finally:
        kill_left(pidfile)
    assert OUTPUT_MAX == 64 * 1024 * 1024 and Runner('nvidia-smi').max_output == OUTPUT_MAX


def test_with_keep_last_only_the_newest_output_is_kept_and_the_rest_counted(tmp_path):
    path = program(tmp_path, 'journalctl', 'seq 1 100000; echo "-- cursor: c100000"')
    runner = Runner(path, 20, max_output=1000, keep_last=True)
    rc, stdout, stderr = runner.run([])
    assert rc == 0 and len(stdout) == 1000 and stdout.endswith('99999\n100000\n-- cursor: c100000\n')
    assert runner.skipped_bytes == len(''.join('%d\n' % n for n in range(1, 100001))) + 19 - 1000


def test_what_the_program_leaves_running_in_a_session_of_its_own_is_killed(tmp_path):
    pidfile = str(tmp_path / 'child.pid')
    path = program(tmp_path, 'nvidia-smi', "setsid sleep 30 & echo $! > %s; echo done" % pidfile)
    try:
        assert Runner(path, 5).run([]) == (0, 'done\n', '')
        assert gone(read_pid(pidfile))
    finally:
        kill_left(pidfile)


def test_with_term_grace_the_program_gets_sigterm_first_and_may_finish_its_finally(tmp_path):
    # The hook's ModuleRunner: SIGTERM at the deadline, and the grace to exit through a trap.
    marker = tmp_path / 'restored'
    path = program(tmp_path, 'restores', 'trap \'echo done > "%s"; exit 143\' TERM\nsleep 60 &\nwait\n' % marker)
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r'did not answer within 1\.0 s and was stopped \(SIGTERM; it exited within 20\.0 s\)'):
        Runner(path, term_grace=20).run([], timeout=1)
    assert marker.read_text() == 'done\n' and time.monotonic() - started < 15


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    path = program(tmp_path, 'stubborn', "trap '' TERM\necho $$ > %s/pid\nwhile :; do sleep 0.1; done\n" % tmp_path)
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r'and was killed'):
        Runner(path, term_grace=1).run([], timeout=1)
    assert time.monotonic() - started >= 2
    assert gone(read_pid(str(tmp_path / 'pid')))


# A program that hangs past its deadline, and writes what /proc would show of it under a
# directory of the test's (argument 1): the runner reads its state there (Runner.proc). A real
# D state cannot be made here: it takes a kernel that blocks the task, and SIGKILL ends any
# process a test can start; the state the runner reads is the seam.
HUNG = r'''
mkdir -p "$1/$$"
read -r line < /proc/$$/stat
echo "$$ (nvidia-smi) D ${line#*) ? }" > "$1/$$/stat"
printf '%s' "$2" > "$1/$$/wchan"
printf '%b' "$3" > "$1/$$/stack"
exec sleep 30
'''


def hung_runner(tmp_path):
    runner = Runner(program(tmp_path, 'hung', HUNG), timeout=2.0)
    runner.proc = str(tmp_path / 'proc')
    return runner


def test_a_program_past_its_deadline_in_the_driver_is_said_to_be_stuck_there(tmp_path):
    runner = hung_runner(tmp_path)
    stack = r'[<0>] mutex_lock+0x1f/0x2f\n[<0>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]\n'
    with pytest.raises(CommandTimeout) as caught:
        runner.run([runner.proc, 'mutex_lock', stack])
    stuck = caught.value.stuck
    assert stuck['state'] == 'D' and stuck['wchan'] == 'mutex_lock' and stuck['nvidia'] is True
    assert caught.value.in_driver is True and 'did not answer within 2.0 s' in str(caught.value)
    assert not stuck.get('survived_kill')  # the simulated one dies when killed


def test_a_program_in_d_state_outside_the_driver_that_dies_when_killed_is_a_plain_timeout(tmp_path):
    runner = hung_runner(tmp_path)
    with pytest.raises(CommandTimeout) as caught:
        runner.run([runner.proc, 'io_schedule', r'[<0>] io_schedule+0x12/0x40\n'])
    assert caught.value.stuck['state'] == 'D' and caught.value.stuck['nvidia'] is False
    assert caught.value.in_driver is False


def test_a_program_that_sleeps_past_its_deadline_is_not_stuck(tmp_path):
    runner = Runner(program(tmp_path, 'sleeper', 'exec sleep 30\n'), timeout=2.0)
    with pytest.raises(CommandTimeout) as caught:
        runner.run([])
    assert caught.value.stuck is None and caught.value.in_driver is False


def test_process_state_reads_the_driver_in_wchan_or_the_stack(tmp_path):
    where = tmp_path / '42'
    where.mkdir()
    (where / 'stat').write_text('42 (nvidia-smi) D 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0\n')
    (where / 'wchan').write_text('os_acquire_mutex')
    state = process_state(42, str(tmp_path))
    assert state == {'pid': 42, 'state': 'D', 'wchan': 'os_acquire_mutex', 'nvidia': True}
    (where / 'wchan').write_text('0')
    assert process_state(42, str(tmp_path))['nvidia'] is False
    assert process_state(43, str(tmp_path)) is None
