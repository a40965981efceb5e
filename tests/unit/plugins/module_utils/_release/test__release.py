# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._release import signals as _signals
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.escalation import Escalation
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import Holder, start_time
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import (
    Release,
    ReleaseOptions,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import parse_signal
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import (
    ProcessRef,
    Signaller,
    wait_exited,
)
from gpusim.state import is_alive as alive


def escalation(options):
    """The reset of a release with reset_orphaned, as nvidia_device_reset runs it."""
    return Escalation if options.get('reset_orphaned') else None


class Run:
    """Runs releases against a gpusim host, recording every signal the signaller logs; without
    host_root, the host keeps its state in its own state directory, not the machine's."""

    def __init__(self, host, tmp_path):
        self.host = host
        self.lock_file = str(tmp_path / 'release.lock')
        self.logged = []

    def __call__(self, check_mode=False, smi_path=None, **options):
        options.setdefault('devices', [self.host.dev_glob])
        options.setdefault('protect', DEFAULT_PROTECT)
        options.setdefault('timeout', 10)
        options.setdefault('grace_period', min(2, options['timeout'] / 4.0))
        options.setdefault('lock_file', self.lock_file)
        if 'host_root' not in options:
            options.setdefault('state_dir', self.host.state_dir)
        reader, dummy = select_reader('auto', smi_path or self.host.smi_path, 10)
        return Release(reader, ReleaseOptions(**options), check_mode=check_mode,
                       signaller=Signaller(self.logged.append), escalation=escalation(options)).run()


@pytest.fixture
def run(gpuhost, tmp_path):
    return Run(gpuhost, tmp_path)


# -- options ------------------------------------------------------------------------------

@pytest.mark.parametrize('given, expected', [
    ('TERM', ('TERM', signal.SIGTERM)), ('SIGKILL', ('KILL', signal.SIGKILL)),
    ('int', ('INT', signal.SIGINT)), ('15', ('TERM', signal.SIGTERM)), (' hup ', ('HUP', signal.SIGHUP)),
])
def test_parse_signal(given, expected):
    assert parse_signal(given) == expected


@pytest.mark.parametrize('bad', ['TERMINATE', 'SIG_DFL', '', '999', 'KILL;rm'])
def test_parse_signal_rejects_unknown(bad):
    with pytest.raises(GpuopsError, match='signal'):
        parse_signal(bad)


@pytest.mark.parametrize('options, message', [
    (dict(signals=[]), 'at least one signal'),
    (dict(signals=['TERM', 'NOPE']), "unknown signal 'NOPE'"),
    (dict(timeout=-1), 'timeout must be more than 0 seconds'),
    (dict(timeout=0), 'timeout must be more than 0 seconds'),
    (dict(grace_period=-0.5), 'grace_period must be zero or more'),
    (dict(grace_period=float('nan')), 'grace_period must be a finite number of seconds, got nan'),
    (dict(timeout=float('inf')), 'timeout must be a finite number of seconds, got inf'),
    (dict(timeout=2147484), 'timeout must be at most 2147483 seconds'),
    (dict(settle_time=-1), 'settle_time must be zero or more'),
    (dict(signals=['STOP']), 'SIGSTOP does not end a process'),
    (dict(signals=['TERM', 'CONT', 'KILL']), 'SIGCONT does not end a process'),
    (dict(signals=['19']), 'SIGSTOP does not end a process'),
    (dict(signals=['INT', 'TERM', 'KILL'], grace_period=30, timeout=3),
     r'signals \[INT, TERM, KILL\] with grace_period 30.0 s take 60.0 s before the last signal, which does not '
     r'fit in timeout 3.0 s'),
    (dict(memory_threshold_mib=-1), 'memory_threshold_mib must be between 0 and 16384 MiB'),
    (dict(memory_threshold_mib=10 ** 18), 'memory_threshold_mib must be between 0 and 16384 MiB'),
    (dict(signals=['KILL', 'TERM']), 'KILL must come last'),
    (dict(protect=['nvidia-persistenced', '*']), "'\\*' matches every process"),
    (dict(protect=['?*']), 'matches every process'),
    (dict(devices=['dev/nvidia*']), 'not an absolute path'),
    (dict(gpus=[0, -2]), 'GPU indexes are zero or more'),
    (dict(gpus=[]), 'name at least one GPU index'),
])
def test_options_are_validated(options, message):
    options.setdefault('devices', ['/dev/nvidia*'])
    with pytest.raises(GpuopsError, match=message):
        ReleaseOptions(**options)


# -- the seed scenario --------------------------------------------------------------------

def test_hung_job_is_released_and_persistenced_kept(gpuhost, run):
    scenario = gpuhost.scenario('hung-job', release_delay=1.0)
    ranks = set(rank['pid'] for rank in scenario['ranks'])
    daemon = scenario['persistenced']['pid']

    result = run()
    assert result.failure is None
    assert result.released is True and result.changed is True
    # Back to the idle reading (1 MiB, as real H200s), at or below the default threshold.
    assert gpuhost.memory_used() == dict((index, 1) for index in range(8))
    assert [gpu['memory_used_mib'] for gpu in result.gpus_before] == [1 + 76113] * 8
    assert result.gpus_after == [{'index': index, 'memory_used_mib': 1} for index in range(8)]
    assert set(entry['pid'] for entry in result.signalled) == ranks
    assert all(entry['signals_sent'] == ['TERM'] and entry['exited'] for entry in result.signalled)
    assert [entry['pid'] for entry in result.protected] == [daemon]
    assert start_time(daemon) is not None
    assert result.survivors == [] and result.orphaned_gpus == []
    assert result.elapsed_s < 8  # no fixed sleeps: ~1 s driver delay plus polling
    # every signal sent is logged with pid, user and command
    assert len(run.logged) == 8
    assert all('sent SIGTERM to pid' in line and ' (user ' in line for line in run.logged)
    assert any('python3 train.py --local-rank 3' in line for line in run.logged)
    before = result.dump(diff=True)['diff']['before']
    assert 'train.py --local-rank 0' in before and '(protected)' in before

    again = run()
    assert again.changed is False and again.released is True and again.signalled == []
    assert run.logged[8:] == []


# -- signal ladder, children, check mode ---------------------------------------------------

def test_term_ignoring_holder_and_its_children_are_killed_after_grace(gpuhost, run):
    info = gpuhost.hold(gpus=[2], mib=4096, ignore_term=True, children=2)
    started = time.monotonic()
    result = run(grace_period=0.4)
    took = time.monotonic() - started
    assert result.released is True, result.failure
    by_pid = dict((entry['pid'], entry) for entry in result.signalled)
    assert set(by_pid) == set([info['pid']] + info['children'])
    for entry in by_pid.values():
        assert entry['signals_sent'] == ['TERM', 'KILL'] and entry['exited']
    assert 0.4 <= took < 5
    assert gpuhost.memory_used()[2] == 1


def test_check_mode_signals_nothing(gpuhost, run):
    info = gpuhost.hold(gpus=[0], mib=1000)
    daemon = gpuhost.hold(gpus='all', name='nvidia-persistenced', daemon=True)
    starttime = start_time(info['pid'])
    result = run(check_mode=True)
    assert result.changed is True
    assert [entry['pid'] for entry in result.signalled] == [info['pid']]
    assert result.signalled[0]['signals_sent'] == [] and result.signalled[0]['exited'] is False
    assert [entry['pid'] for entry in result.protected] == [daemon['pid']]
    assert result.released is False and result.failure is None
    assert alive(info['pid'], starttime) and run.logged == []
    assert gpuhost.memory_used()[0] == 1 + 1000
    diff = result.dump(diff=True)['diff']
    assert str(info['pid']) in diff['before'] and str(info['pid']) not in diff['after']


def test_children_forked_later_are_signalled_in_a_new_round(gpuhost, run, tmp_path):
    # Forks a device-holding child when told to stop, then exits: the child appears only
    # after the first round and must be released in the next one.
    code = ('import os, signal, sys, time\n'
            'fds = [os.open(p, os.O_RDWR) for p in sys.argv[1:]]\n'
            'def stop(*a):\n'
            '    if os.fork() == 0:\n'
            '        signal.signal(signal.SIGTERM, signal.SIG_DFL)\n'
            '        time.sleep(60)\n'
            '    os._exit(0)\n'
            'signal.signal(signal.SIGTERM, stop)\n'
            'print("ready", flush=True)\n'
            'time.sleep(60)\n')
    # A group of its own in this session: a job of whoever runs the release (root's processes of
    # another session that the driver does not report are foreign holders, never signalled).
    proc = subprocess.Popen([sys.executable, '-c', code, gpuhost.dev_path(1)], stdout=subprocess.PIPE,
                            process_group=0)
    try:
        assert proc.stdout.readline().strip() == b'ready'
        result = run(grace_period=1)
        assert result.released is True, result.failure
        pids = [entry['pid'] for entry in result.signalled]
        assert pids[0] == proc.pid and len(pids) == 2
        assert result.signalled[1]['exited']
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- a recycled pid is never hit ------------------------------------------------------------

@pytest.mark.parametrize('use_pidfd', [True, False])
def test_process_with_another_start_time_is_never_signalled(spawn, tmp_path, use_pidfd):
    if use_pidfd and not _signals.HAS_PIDFD:
        pytest.skip('no pidfd on this host')
    # The process now at this pid is not the one discovered (which started a tick earlier).
    proc = spawn([])
    ref = ProcessRef(proc.pid, start_time(proc.pid) - 1, use_pidfd=use_pidfd)
    logged = []
    assert Signaller(logged.append).send(ref, 'KILL', signal.SIGKILL, 'root', 'x', []) is False
    assert ref.exited() and logged == []
    time.sleep(0.05)
    assert proc.poll() is None


@pytest.mark.parametrize('use_pidfd', [True, False])
def test_recycled_pid_is_never_signalled(use_pidfd):
    """A real pid reuse: discover, let it exit, put a new process at the same pid, signal."""
    if use_pidfd and not _signals.HAS_PIDFD:
        pytest.skip('no pidfd on this host')
    ns_last_pid = '/proc/sys/kernel/ns_last_pid'
    if not os.access(ns_last_pid, os.W_OK):
        pytest.skip('needs root to choose the next pid')
    first = subprocess.Popen(['sleep', '60'])
    ref = ProcessRef(first.pid, start_time(first.pid), use_pidfd=use_pidfd)
    first.kill()
    first.wait()
    # Start times count clock ticks (10 ms): the new process must start in a later tick,
    # as it always does when a pid is recycled by wrapping around.
    time.sleep(0.05)
    second = None
    for dummy in range(20):
        with open(ns_last_pid, 'w') as handle:
            handle.write(str(first.pid - 1))
        candidate = subprocess.Popen(['sleep', '60'])
        if candidate.pid == first.pid:
            second = candidate
            break
        candidate.kill()
        candidate.wait()
    if second is None:
        pytest.skip('could not place a process at the recycled pid')
    try:
        assert ref.send(signal.SIGKILL) is False
        time.sleep(0.05)
        assert second.poll() is None
    finally:
        second.kill()
        second.wait()
        ref.close()


def test_wait_exited_without_pidfd(spawn):
    proc = spawn([])
    ref = ProcessRef(proc.pid, start_time(proc.pid), use_pidfd=False)
    assert wait_exited([ref], 0.05) is False
    assert ref.send(signal.SIGTERM) is True
    proc.wait()
    assert wait_exited([ref], 2) is True
    assert ref.send(signal.SIGKILL) is False


# -- what cannot be released ----------------------------------------------------------------

def test_leaked_memory_is_orphaned_and_fails_naming_the_gpu(gpuhost, run):
    gpuhost.hold(gpus=[5], mib=2048, leak=True)
    result = run(timeout=3)
    assert result.changed is True and result.released is False
    assert result.orphaned_gpus == [5], (result.failure, result.warnings)
    assert 'GPU 5: 2049 MiB held with no process left (orphaned' in result.failure
    assert 'GPU 4' not in result.failure
    assert result.gpus_after[5] == {'index': 5, 'memory_used_mib': 2049}


def test_stuck_memory_with_nothing_to_release(gpuhost, run):
    gpuhost.fault('stuck', gpu=3, mib=512)
    result = run(timeout=3)
    assert result.changed is False and result.signalled == []
    assert result.orphaned_gpus == [3] and 'GPU 3: 513 MiB' in result.failure
    # without waiting there is nothing to prove, so nothing fails
    result = run(wait=False)
    assert result.failure is None and result.released is False and result.orphaned_gpus == []


def test_respawned_holder_is_reported_not_chased(gpuhost_factory, tmp_path):
    # The driver's release delay keeps the release polling while the supervisor restarts it.
    host = gpuhost_factory('slow', release_delay=1.0)
    run = Run(host, tmp_path)
    # A supervisor restarts it 0.2 s after each death (systemd: RestartSec=100ms, plus start-up).
    host.hold(gpus=[6], mib=100, respawn=-1, respawn_delay=0.2)
    result = run(timeout=8, grace_period=0.5)  # ends early: once only the respawn is left
    assert result.released is False
    assert [entry['reason'] for entry in result.survivors] == ['respawned']
    survivor = result.survivors[0]
    assert survivor['signals_sent'] == [] and survivor['gpus'] == [6]
    assert len(result.signalled) == 2  # the original and its first respawn
    assert survivor['supervisor']['name'] == 'gpusim-monitor'
    # (the memory of the earlier ones may still be on its way out: the driver is slow here)
    assert 'MiB used, held by pid %d (python3, respawned by pid %d gpusim-monitor)' % (
        survivor['pid'], survivor['supervisor']['pid']) in result.failure


def test_holder_ignoring_every_signal_sent(gpuhost, run):
    info = gpuhost.hold(gpus=[0], mib=10, ignore_term=True)
    result = run(signals=['TERM'], grace_period=0.2, timeout=3)
    assert [(entry['pid'], entry['reason']) for entry in result.survivors] == [(info['pid'], 'ignored_signals')]
    assert result.survivors[0]['signals_sent'] == ['TERM']
    assert 'held by pid %d (python3, ignored_signals)' % info['pid'] in result.failure


@pytest.mark.parametrize('state, reason', [('D', 'uninterruptible'), ('Z', 'zombie'), ('S', 'respawned')])
def test_survivor_reasons(state, reason):
    holder = Holder(4242, 1, 0, 'python3', 'python3 x.py', None, 99, state, 4242, 1, ['/dev/nvidia0'])
    assert Release(None, ReleaseOptions(['/dev/nvidia*']))._reason(holder) == reason


# -- scope ----------------------------------------------------------------------------------

def test_gpus_limits_the_release(gpuhost, run, spawn):
    on_zero = gpuhost.hold(gpus=[0], mib=300)
    on_one = gpuhost.hold(gpus=[1], mib=400)
    shared = spawn([os.path.join(gpuhost.root, 'dev', 'nvidiactl')])
    result = run(gpus=[1])
    assert result.released is True, result.failure
    assert [entry['pid'] for entry in result.signalled] == [on_one['pid']]
    assert result.gpus_after == [{'index': 1, 'memory_used_mib': 1}]
    assert gpuhost.memory_used()[0] == 1 + 300
    assert shared.poll() is None and start_time(on_zero['pid']) is not None
    with pytest.raises(GpuopsError, match='no GPU 9 on this host'):
        run(gpus=[9])


def test_glob_matching_nothing_is_an_error(gpuhost, run):
    with pytest.raises(GpuopsError, match=r'devices: .*/dev/nothing\* matches no NVIDIA device node'):
        run(devices=[gpuhost.dev_glob, os.path.join(gpuhost.root, 'dev', 'nothing*')])


@pytest.mark.parametrize('fault', ['missing', 'driver'])
def test_what_waiting_cannot_fix_fails_at_once_and_signals_nothing(gpuhost, run, tmp_path, fault):
    info = gpuhost.hold(gpus=[0], mib=10)
    smi_path = str(tmp_path / 'missing-smi') if fault == 'missing' else None
    if fault == 'driver':
        gpuhost.fault('driver-not-loaded')
    started = time.monotonic()
    with pytest.raises(GpuopsError, match='nothing was signalled') as failure:
        run(smi_path=smi_path, timeout=60)
    assert time.monotonic() - started < 30  # not the 60 s timeout, whatever the load
    assert ('nvidia-smi not found' if fault == 'missing' else 'driver') in str(failure.value)
    assert alive(info['pid']) and run.logged == []


def test_lost_gpu_fails_at_once_once_its_holders_are_gone(gpuhost, run):
    gpuhost.hold(gpus=[0], mib=1024)
    gpuhost.fault('lost', gpu=2)
    started = time.monotonic()
    result = run(timeout=60)
    assert time.monotonic() - started < 30  # not the timeout, whatever the load
    assert result.changed is True and result.released is False
    assert result.failure.startswith('GPUs not released: GPU 2 lost or unreadable (Unable to determine')
    assert 'GPU 0' not in result.failure


def test_hung_nvidia_smi_is_bounded_by_the_timeout(gpuhost, run):
    gpuhost.fault('hang', seconds=60)
    started = time.monotonic()
    result = run(timeout=3)
    assert time.monotonic() - started < 30  # not the hang's 60 s
    assert result.released is False and 'did not answer' in result.failure


class ReportingReader:
    """The real reader, plus one process the driver reports on a GPU (as NVML does for a
    process whose device nodes discovery cannot see)."""

    def __init__(self, reader, gpu, pid):
        self.reader, self.gpu, self.pid = reader, gpu, pid

    def read(self, timeout=None, full=True):
        snapshot = self.reader.read(timeout=timeout, full=full)
        for gpu in snapshot.gpus:
            if gpu['index'] == self.gpu and alive(self.pid):
                gpu['processes'].append({'pid': self.pid, 'name': 'python3', 'used_memory_mib': 1})
        return snapshot

    def close(self):
        pass


def test_a_process_the_driver_reports_but_that_holds_no_node_is_never_signalled(gpuhost, spawn, tmp_path):
    reported = spawn([])  # holds no device node at all: the driver's word alone is no proof
    reader, dummy = select_reader('auto', gpuhost.smi_path, 10)
    options = ReleaseOptions([gpuhost.dev_glob], gpus=[2], protect=DEFAULT_PROTECT, timeout=3, grace_period=0.5,
                             lock_file=str(tmp_path / 'lock'), state_dir=gpuhost.state_dir)
    result = Release(ReportingReader(reader, 2, reported.pid), options, signaller=Signaller(lambda msg: None)).run()
    assert result.signalled == [] and alive(reported.pid)
    assert result.released is False
    assert 'pid %d (python3, reported by the driver)' % reported.pid in result.failure


@pytest.mark.parametrize('use_pidfd', [True, False] if _signals.HAS_PIDFD else [False])
def test_a_signal_not_permitted_is_reported_as_such(gpuhost, run, monkeypatch, use_pidfd):
    info = gpuhost.hold(gpus=[0], mib=10)

    def refuse(*args):
        raise OSError(errno.EPERM, 'Operation not permitted')

    # The kernel's answer to a signal for another user's process, without another user.
    monkeypatch.setattr(_signals, 'HAS_PIDFD', use_pidfd)
    monkeypatch.setattr(signal, 'pidfd_send_signal', refuse, raising=False)
    monkeypatch.setattr(os, 'kill', refuse)
    result = run(grace_period=0.1, timeout=3)
    assert [(entry['pid'], entry['reason'], entry['signals_sent'], entry['uid']) for entry in result.survivors] == [
        (info['pid'], 'not_permitted', [], os.getuid())]
    assert 'pid %d (python3, not_permitted, uid %d)' % (info['pid'], os.getuid()) in result.failure
    assert result.changed is False


def test_a_host_root_that_does_not_exist_is_an_error_before_any_signal(gpuhost, run, tmp_path):
    info = gpuhost.hold(gpus=[0], mib=100)
    missing = str(tmp_path / 'no-such-root')
    with pytest.raises(GpuopsError, match=r'devices: %s/dev/nvidia\* matches no NVIDIA device node' % missing):
        run(devices=['/dev/nvidia*'], host_root=missing)
    assert alive(info['pid']) and run.logged == []


# -- what the reads cost ----------------------------------------------------------------------

def counted_release(host, tmp_path, **options):
    """A release through the host's view, as the module runs it; (result, nvidia-smi calls)."""
    log = str(tmp_path / 'calls.log')
    smi = host.counting_smi(log)
    reader, dummy = select_reader('nvidia-smi', smi, 10)
    options = dict(dict(devices=['/dev/nvidia*'], host_root=host.root, protect=DEFAULT_PROTECT, timeout=60,
                        lock_file=str(tmp_path / 'release.lock'), nvidia_smi_path=smi), **options)
    result = Release(HostReader(reader, host.root), ReleaseOptions(**options), signaller=Signaller(lambda line: None),
                     escalation=escalation(options)).run()
    return result, [argv[0].split('=')[0] for argv in host.smi_calls(log)]


def test_a_hung_job_reads_its_health_once_and_polls_light(gpuhost, tmp_path):
    gpuhost.scenario('hung-job', release_delay=1.0)
    result, calls = counted_release(gpuhost, tmp_path)
    assert result.released is True and result.failure is None
    # One full read (--query-gpu, --query-remapped-rows, --query-compute-apps), then polls of
    # memory and processes once the settle window is over: 22 calls before.
    assert calls.count('--query-remapped-rows') == 1 and len(calls) <= 8, calls


def test_the_drivers_word_stays_through_the_light_polls(gpuhost, tmp_path):
    gpuhost.scenario('hung-job', release_delay=1.0)
    gpuhost.fault('reset-required', gpu=5)
    gpuhost.fault('remap', gpu=6, pending=True)
    result, calls = counted_release(gpuhost, tmp_path)
    assert calls.count('--query-remapped-rows') == 1, calls
    assert result.released is False and 'GPU 5 needs a GPU reset' in result.failure
    states = dict((gpu['index'], gpu['state']) for gpu in result.gpu_states)
    assert states == dict((index, 'reset_required' if index == 5 else 'free') for index in range(8))


def test_a_driver_slower_than_the_settle_window_is_waited_for(gpuhost, tmp_path):
    gpuhost.scenario('hung-job', release_delay=3.0)
    result, calls = counted_release(gpuhost, tmp_path)
    assert result.released is True and result.orphaned_gpus == []
    # Polls that read the memory grow to a second apart while no process holds it: 40 calls before.
    assert calls.count('--query-remapped-rows') == 1 and len(calls) <= 16, calls


@pytest.mark.parametrize('orphan', ['stuck', 'leak'])
def test_orphaned_memory_fails_once_the_driver_would_have_freed_it(gpuhost, tmp_path, orphan):
    if orphan == 'stuck':
        gpuhost.fault('stuck', gpu=3, mib=8192)
    else:
        gpuhost.hold(gpus=[3], mib=8192, leak=True)
    started = time.monotonic()
    result, dummy = counted_release(gpuhost, tmp_path, timeout=60)
    # ORPHAN_WAIT_S (5 s) after the first read that found the memory held by no process, not the 60 s timeout.
    assert time.monotonic() - started < 30
    assert result.released is False and result.orphaned_gpus == [3]
    assert result.failure.startswith('GPUs not released: GPU 3: 8193 MiB held with no process left (orphaned memory')
    assert 'it stayed held by no process for 5.0 s, longer than a driver takes' in result.failure
    assert '(set reset_orphaned to reset such GPUs)' in result.failure


def test_orphaned_memory_is_reset_once_the_driver_would_have_freed_it(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    started = time.monotonic()
    result, calls = counted_release(gpuhost, tmp_path, timeout=60, reset_orphaned=True)
    # Before: the wait for the driver ended where the reset's third of the timeout began (39 s).
    assert time.monotonic() - started < 30  # far from 39 s, whatever the load
    assert result.escalation['ok'] is True and result.released is True and result.orphaned_gpus == []
    # The read after the reset is a full one: the GPU's health is read again.
    assert calls.count('--query-remapped-rows') == 2, calls
