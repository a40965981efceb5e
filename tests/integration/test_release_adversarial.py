# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The attacks the release withstands, one test each: a hostile local user, a careless operator.

nvidia_device_release runs as root beside users who may try to block it, fool it or outrun
it. Every test here runs inside a private PID namespace (unshare -pf --mount-proc, re-running
this very test there): a test that went wrong could only signal processes of its own.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.escalation import Escalation
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import Release, ReleaseOptions
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import Signaller
from gpusim.api import Host
from gpusim.state import is_alive as alive
from processes import await_ready, in_private_pid_namespace


@pytest.fixture
def public_host():
    """A simulated host that every user can reach (its device nodes mode 0666), for attacks run
    as user nobody; stopped and removed at the end."""
    root = tempfile.mkdtemp(prefix='gpuops-attack-')
    os.chmod(root, 0o755)
    host = Host(root)
    host.init(gpus=4)
    for name in os.listdir(host.paths.dev):
        os.chmod(os.path.join(host.paths.dev, name), 0o666)
    try:
        yield host
    finally:
        host.stop()
        shutil.rmtree(root, ignore_errors=True)


def start(argv, user=None):
    """A process that prints 'ready' once it holds what it holds; as user (a uid) when given.

    Root's processes run in a group of their own in this session, as jobs of whoever runs the
    release do (root's processes of another session that the driver does not place on a GPU
    are foreign holders, never signalled)."""
    def as_user():
        os.setgid(user)
        os.setuid(user)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, process_group=0,
                            preexec_fn=None if user is None else as_user)
    await_ready(proc, argv)
    return proc


def holding(path, name, user=None):
    """bash opening path, then exec'ing sleep under the name argv[0] = name."""
    return start(['bash', '-c', 'exec 3<>"$1"; echo ready; exec -a "$2" sleep 120', '-', path, name], user)


def release(host, **options):
    options.setdefault('devices', [host.dev_glob])
    options.setdefault('protect', DEFAULT_PROTECT)
    options.setdefault('timeout', 10)
    options.setdefault('grace_period', 1)
    options.setdefault('lock_file', os.path.join(host.root, 'release.lock'))
    if 'host_root' not in options:
        # Found by its devices alone, the host keeps its state in its own directory, not the machine's.
        options.setdefault('state_dir', host.state_dir)
    logged = []
    reader, dummy = select_reader('nvidia-smi', host.smi_path, 10)
    # With reset_orphaned, the release and its reset, as nvidia_device_reset runs them.
    result = Release(reader, ReleaseOptions(**options), signaller=Signaller(logged.append),
                     escalation=Escalation if options.get('reset_orphaned') else None).run()
    result.logged = logged
    return result


def python_job(code, *args):
    return start([sys.executable, '-c', code] + [str(arg) for arg in args])


def holders_of(path):
    out = subprocess.run(['fuser', path], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


# -- 1. the lock ---------------------------------------------------------------------------

@in_private_pid_namespace
def test_a_symlink_planted_at_the_lock_makes_root_write_nothing(gpuhost, tmp_path):
    precious = tmp_path / 'shadow'
    precious.write_text('root:secret\n')
    planted = tmp_path / 'release.lock'
    os.symlink(str(precious), str(planted))
    info = gpuhost.hold(gpus=[0], mib=100)
    with pytest.raises(GpuopsError, match='release.lock'):
        release(gpuhost, lock_file=str(planted))
    assert precious.read_text() == 'root:secret\n'
    assert alive(info['pid'])


# -- 2. devices that are not NVIDIA device nodes --------------------------------------------

@in_private_pid_namespace
@pytest.mark.parametrize('devices', [['/dev/null'], ['/dev/*'], ['/dev/nvidia*', '/dev/zero']])
def test_devices_outside_the_nvidia_nodes_are_refused_before_any_signal(gpuhost, devices):
    sshd = holding('/dev/null', 'sshd')
    systemd = holding('/dev/zero', 'systemd')
    devices = [gpuhost.dev_glob if pattern == '/dev/nvidia*' else pattern for pattern in devices]
    with pytest.raises(GpuopsError, match=r'devices: /dev/\S+ \(matched by /dev/\S+\) is .*refusing'):
        release(gpuhost, devices=devices)
    assert sshd.poll() is None and systemd.poll() is None


# -- 3. a pattern that matches nothing -------------------------------------------------------

@in_private_pid_namespace
def test_a_typo_in_devices_is_an_error_not_a_clean_host(gpuhost):
    scenario = gpuhost.scenario('hung-job')
    with pytest.raises(GpuopsError, match='nvida\\* matches no NVIDIA device node'):
        release(gpuhost, devices=[os.path.join(gpuhost.paths.dev, 'nvida*')])
    assert all(alive(rank['pid']) for rank in scenario['ranks'])
    assert all(used > 76000 for used in gpuhost.memory_used().values())


# -- 4. protection by a name the job chooses -------------------------------------------------

@in_private_pid_namespace
def test_a_user_process_named_like_a_daemon_is_released_and_named_an_impersonator(public_host):
    nobody = pwd.getpwnam('nobody').pw_uid
    fake_persistenced = holding(public_host.dev_path(0), 'nvidia-persistenced', user=nobody)
    fake_xorg = holding(public_host.dev_path(1), 'Xorg', user=nobody)
    daemon = public_host.hold(gpus='all', name='nvidia-persistenced', daemon=True)
    result = release(public_host)
    assert result.released is True, result.failure
    assert dict((entry['pid'], entry.get('impersonates')) for entry in result.signalled) == {
        fake_persistenced.pid: 'nvidia-persistenced', fake_xorg.pid: 'Xorg'}
    assert any('calls itself nvidia-persistenced' in warning for warning in result.warnings)
    assert [entry['pid'] for entry in result.protected] == [daemon['pid']] and alive(daemon['pid'])


@in_private_pid_namespace
def test_a_protected_daemon_holding_memory_is_named_in_the_failure(gpuhost):
    daemon = gpuhost.hold(gpus=[2], mib=700, name='nv-hostengine', daemon=True)
    result = release(gpuhost, timeout=3, grace_period=0.1)
    assert result.released is False and alive(daemon['pid'])
    assert re.search(r'GPU 2: 70[01] MiB used, held by protected pid %d \(nv-hostengine\), which is never '
                     r'signalled' % daemon['pid'], result.failure), result.failure


# -- 5. forks that race the ladder, and the timeout as a hard cap -----------------------------

# On SIGTERM: fork a child that calls setsid() (a new session, soon no parent) and keeps the
# device; the parent exits. The child does the same on its own SIGTERM.
FORK_ON_TERM = '''
import os, signal, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
def escape(*unused):
    if os.fork() == 0:
        os.setsid()
        return
    os._exit(0)
signal.signal(signal.SIGTERM, escape)
print('ready', flush=True)
while True:
    time.sleep(1)
'''


@in_private_pid_namespace
def test_a_job_that_forks_away_on_sigterm_is_released(gpuhost):
    job = python_job(FORK_ON_TERM, gpuhost.dev_path(3))
    result = release(gpuhost, grace_period=0.5)
    assert result.released is True, result.failure
    assert holders_of(gpuhost.dev_path(3)) == [], (result.signalled, result.foreign_holders)
    assert job.pid in [entry['pid'] for entry in result.signalled] and len(result.signalled) >= 2


# Every signal it can catch makes it fork a renamed child (a new name, a new command line)
# and exit: each generation looks like a new, unrelated job.
RENAMING = '''
import ctypes, os, signal, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
generation = [0]
def next_generation(*unused):
    if os.fork() == 0:
        generation[0] += 1
        ctypes.CDLL(None).prctl(15, b'gen%d' % generation[0], 0, 0, 0)
        return
    os._exit(0)
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, next_generation)
print('ready', flush=True)
while True:
    time.sleep(1)
'''


@in_private_pid_namespace
def test_a_job_that_renames_each_generation_cannot_outlast_the_timeout(gpuhost):
    python_job(RENAMING, gpuhost.dev_path(1))
    started = time.monotonic()
    # The last signal goes at 2 s: the settle window (1 s) fits before the timeout.
    result = release(gpuhost, signals=['INT', 'TERM', 'KILL'], grace_period=1, timeout=5)
    took = time.monotonic() - started
    assert result.released is True, result.failure
    assert holders_of(gpuhost.dev_path(1)) == []
    assert took < 5 + 1.5, took  # the timeout, and at most one last read


# -- 6. a supervisor that restarts the job ------------------------------------------------------

@in_private_pid_namespace
def test_a_job_restarted_a_quarter_second_later_is_not_called_released(gpuhost):
    gpuhost.hold(gpus=[5], mib=2048, respawn=-1, respawn_delay=0.25)
    result = release(gpuhost, grace_period=0.5, timeout=8)
    assert result.released is False
    assert [survivor['reason'] for survivor in result.survivors] == ['respawned']
    assert result.survivors[0]['supervisor']['name'] == 'gpusim-monitor'
    assert 'respawned by pid' in result.failure


# -- 7. a holder whose main thread has exited -------------------------------------------------

# The main thread exits (the exit system call, not exit_group) while a thread keeps the device.
HEADLESS = '''
import ctypes, os, platform, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDWR)
threading.Thread(target=time.sleep, args=(120,)).start()
print('ready', flush=True)
time.sleep(0.2)
ctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}[platform.machine()], 0)
'''


@in_private_pid_namespace
def test_a_holder_whose_main_thread_exited_is_found_and_released(gpuhost):
    job = python_job(HEADLESS, gpuhost.dev_path(0))
    time.sleep(0.5)
    assert os.listdir('/proc/%d/fd' % job.pid) == []  # what made it invisible
    result = release(gpuhost, grace_period=0.5)
    assert result.released is True, result.failure
    assert [entry['pid'] for entry in result.signalled] == [job.pid]
    assert result.signalled[0]['exited'] is True


# -- 8. numbers that are not numbers ------------------------------------------------------------

@in_private_pid_namespace
@pytest.mark.parametrize('options, message', [
    (dict(grace_period=float('nan')), 'grace_period must be a finite number'),
    (dict(timeout=float('inf')), 'timeout must be a finite number'),
    (dict(timeout=2147484.0), 'timeout must be at most 2147483 seconds'),
    (dict(settle_time=float('nan')), 'settle_time must be a finite number'),
])
def test_nan_infinity_and_huge_values_are_refused_before_any_signal(gpuhost, options, message):
    info = gpuhost.hold(gpus=[0], mib=100)
    with pytest.raises(GpuopsError, match=message):
        release(gpuhost, **options)
    assert alive(info['pid'])


# -- 9. options that would leave the job in place ---------------------------------------------

@in_private_pid_namespace
def test_stop_signals_are_refused(gpuhost):
    info = gpuhost.hold(gpus=[0], mib=100)
    with pytest.raises(GpuopsError, match='SIGSTOP does not end a process'):
        release(gpuhost, signals=['STOP'])
    assert alive(info['pid']) and open('/proc/%d/stat' % info['pid']).read().split(') ')[1][0] != 'T'


@in_private_pid_namespace
def test_a_regex_in_extra_protect_is_named_and_protects_nothing(gpuhost):
    info = gpuhost.hold(gpus=[0], mib=100)
    result = release(gpuhost, protect=DEFAULT_PROTECT + ['python.*'])
    assert any("'python.*' looks like a regular expression" in warning for warning in result.warnings)
    assert result.released is True and not alive(info['pid'])


@in_private_pid_namespace
def test_times_in_messages_are_rounded(gpuhost):
    gpuhost.hold(gpus=[1], mib=100)
    gpuhost.fault('hang', seconds=30)  # every read now waits out what is left of the timeout
    result = release(gpuhost, grace_period=0.1, timeout=2.3)
    messages = ' '.join(result.warnings + [result.failure])
    # The reads while signalling end by the signal deadline (1.3 s), the last one by the timeout.
    waits = re.findall(r'did not answer within ([0-9.]+) s', messages)
    assert all(re.match(r'^[0-9]+\.[0-9]$', wait) for wait in waits), messages
    assert 0.5 <= float(waits[0]) <= 1.3, messages
    assert sum(float(wait) for wait in set(waits)) <= 2.3 + 0.1, messages
    assert 'GPUs not released within 2.3 s:' in result.failure


# == release safety on shared nodes: what the driver says is a hint, the host is the proof ======

def _nobody():
    return pwd.getpwnam('nobody').pw_uid


def _gpu(host, index):
    return [gpu for gpu in host.state['gpus'] if gpu['index'] == index][0]


def _daemon(argv):
    """A root process in a session of its own, as a system daemon runs."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    await_ready(proc, argv)
    return proc


@in_private_pid_namespace
def test_a_process_name_cannot_forge_the_driver_s_process_list(public_host):
    sshd = _daemon(['bash', '-c', 'exec 3</dev/null; echo ready; exec -a sshd sleep 120'])
    other_job = holding(public_host.dev_path(2), 'python3', user=_nobody())
    gpu0 = _gpu(public_host, 0)
    forged = ''.join('\n%d, x, 100 MiB, %s, %s' % (pid, gpu0['uuid'], gpu0['pci_bus_id'])
                     for pid in (sshd.pid, other_job.pid))
    holder_py = os.path.join(public_host.paths.lib, 'holder.py')
    attacker = public_host.hold(gpus=[0], mib=100, argv=['python3' + forged, holder_py])
    result = release(public_host, gpus=[0])
    assert sshd.poll() is None and other_job.poll() is None
    assert [entry['pid'] for entry in result.signalled] == [attacker['pid']], (result.warnings, result.failure)
    assert result.released is True, result.failure
    assert any("nvidia-smi's process list cannot be trusted" in warning for warning in result.warnings)


class RecyclingReader:
    """The real reader; after its first read the job it reported exits and an unrelated process
    is born under the same pid (ns_last_pid), before the release looks at /proc."""

    def __init__(self, reader, job_pid, newcomer_argv):
        self.reader, self.job_pid, self.newcomer_argv = reader, job_pid, newcomer_argv
        self.newcomer = None

    def read(self, timeout=None, full=True):
        snapshot = self.reader.read(timeout=timeout, full=full)
        if self.newcomer is None:
            os.kill(self.job_pid, 9)
            # Until its parent has reaped it: a zombie still takes the pid.
            while alive(self.job_pid) or os.path.exists('/proc/%d' % self.job_pid):
                time.sleep(0.01)
            with open('/proc/sys/kernel/ns_last_pid', 'w') as handle:
                handle.write(str(self.job_pid - 1))
            self.newcomer = start(self.newcomer_argv)
            assert self.newcomer.pid == self.job_pid
        return snapshot

    def close(self):
        self.reader.close()


@in_private_pid_namespace
def test_a_pid_the_driver_reported_that_was_recycled_is_never_signalled(gpuhost):
    job = gpuhost.hold(gpus=[0], mib=500)
    reader, dummy = select_reader('nvidia-smi', gpuhost.smi_path, 10)
    recycling = RecyclingReader(reader, job['pid'], ['bash', '-c', 'echo ready; exec -a cron sleep 120'])
    options = ReleaseOptions(devices=[gpuhost.dev_glob], gpus=[0], protect=DEFAULT_PROTECT, timeout=3,
                             grace_period=0.5, lock_file=os.path.join(gpuhost.root, 'release.lock'),
                             state_dir=gpuhost.state_dir)  # the host's own, not the machine's /run/gpuops
    result = Release(recycling, options, signaller=Signaller(lambda line: None)).run()
    assert recycling.newcomer.poll() is None
    assert result.signalled == []


# Receives descriptors over a unix socket and keeps them, as a bus daemon keeps those of unread
# messages.
KEEPS_FDS = '''
import array, os, socket, sys
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
server.listen(1)
print('ready', flush=True)
conn, dummy = server.accept()
fds = array.array('i')
msg, ancdata, flags, addr = conn.recvmsg(1, socket.CMSG_LEN(fds.itemsize))
fds.frombytes(ancdata[0][2])
print('ready', flush=True)
import time
time.sleep(120)
'''

HANDS_OVER = '''
import array, os, socket, sys
fd = os.open(sys.argv[2], os.O_RDWR)
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.connect(sys.argv[1])
client.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd]))])
print('ready', flush=True)
'''


@in_private_pid_namespace
def test_a_gpu_descriptor_handed_to_a_root_daemon_does_not_get_the_daemon_killed(public_host):
    sock = os.path.join(public_host.root, 'bus.sock')
    daemon = _daemon([sys.executable, '-c', KEEPS_FDS, sock])
    tenant = start(['/usr/bin/python3', '-c', HANDS_OVER, sock, public_host.dev_path(0)], user=_nobody())
    assert daemon.stdout.readline().strip() == b'ready'
    tenant.wait()
    assert holders_of(public_host.dev_path(0)) == [daemon.pid]
    result = release(public_host, gpus=[0], timeout=3)
    assert daemon.poll() is None and result.signalled == [], (result.signalled, result.warnings)
    assert [(entry['pid'], entry['reason']) for entry in result.foreign_holders] == [(daemon.pid, 'foreign_holder')]
    assert result.foreign_holders[0]['devices'] == [public_host.dev_path(0)]
    # Named as what it is, never as a protected daemon.
    assert result.protected == []
    # The GPU is not released while it holds it: named, with when it lets go.
    assert result.released is False
    assert 'held by pid %d (' % daemon.pid in result.failure and 'user root' in result.failure, result.failure
    assert public_host.dev_path(0) in result.failure and 'it lets go when' in result.failure


@in_private_pid_namespace
def test_a_gpu_that_needs_a_reset_is_not_released_while_a_daemon_keeps_a_handed_descriptor(public_host):
    public_host.fault('remap', gpu=0, pending=True)
    sock = os.path.join(public_host.root, 'bus.sock')
    daemon = _daemon([sys.executable, '-c', KEEPS_FDS, sock])
    tenant = start(['/usr/bin/python3', '-c', HANDS_OVER, sock, public_host.dev_path(0)], user=_nobody())
    assert daemon.stdout.readline().strip() == b'ready'
    tenant.wait()
    result = release(public_host, gpus=[0], reset_orphaned=True, nvidia_smi_path=public_host.smi_path)
    assert daemon.poll() is None and result.signalled == []
    assert result.released is False
    assert 'GPU 0 needs a reset (remapped rows pending), not attempted: held by pid %d (python' % daemon.pid \
        in result.failure, result.failure
    assert 'holding %s' % public_host.dev_path(0) in result.failure
    assert 'pending_fd_timeout' in result.failure
    assert result.escalation is None


@in_private_pid_namespace
def test_a_daemon_holding_a_gpu_that_must_be_reset_is_named_and_left_alone(gpuhost):
    gpuhost.fault('stuck', gpu=1, mib=4000)
    daemon = _daemon(['bash', '-c', 'exec 3<>"$1"; echo ready; exec -a monitor-agent sleep 120', '-',
                      gpuhost.dev_path(1)])
    result = release(gpuhost, gpus=[1], timeout=3, reset_orphaned=True, nvidia_smi_path=gpuhost.smi_path)
    assert daemon.poll() is None and result.released is False
    assert 'pid %d (sleep, user root, holding %s; foreign_holder' % (daemon.pid, gpuhost.dev_path(1)) \
        in result.failure, result.failure


@in_private_pid_namespace
def test_with_gpus_a_job_on_another_gpu_that_opened_every_node_is_left_alone(gpuhost):
    ours = gpuhost.hold(gpus=[0], mib=500)
    theirs = gpuhost.hold(gpus=[1], open_gpus='all', mib=500)  # as NVML or CUDA without device cgroups
    result = release(gpuhost, gpus=[0])
    assert result.released is True, result.failure
    assert [entry['pid'] for entry in result.signalled] == [ours['pid']]
    assert alive(theirs['pid'])


# A supervisor that restarts the job 200 ms after each death, under a new command line each time:
# no two generations look alike, so none is a "respawn".
RESTART_LOOP = 'i=0; while :; do i=$((i+1)); bash -c \'exec 3<>"$1"; exec -a "job-$2" sleep 120\' - "$1" "$i"; ' \
               'sleep 0.2; done'


@in_private_pid_namespace
def test_a_restart_loop_is_never_called_released(gpuhost):
    supervisor = start(['bash', '-c', 'echo ready; ' + RESTART_LOOP, '-', gpuhost.dev_path(2)])
    outcomes = []
    for dummy in range(3):
        while not holders_of(gpuhost.dev_path(2)):  # each release finds the job running
            time.sleep(0.05)
        outcomes.append(release(gpuhost, grace_period=0.3, timeout=2.5).released)
    assert outcomes == [False, False, False]
    supervisor.kill()


@in_private_pid_namespace
def test_a_job_that_renames_itself_on_each_signal_is_not_released_by_a_ladder_without_kill(gpuhost):
    # Whether the last look at the deadline catches the newest generation is a race: three rounds.
    for dummy in range(3):
        python_job(RENAMING, gpuhost.dev_path(1))
        result = release(gpuhost, signals=['INT', 'TERM'], grace_period=0.5, timeout=3)
        left = holders_of(gpuhost.dev_path(1))
        assert result.released is False and left
        assert [survivor['pid'] for survivor in result.survivors] == left
        for pid in left:
            os.kill(pid, 9)
        while holders_of(gpuhost.dev_path(1)):
            time.sleep(0.05)


@in_private_pid_namespace
def test_a_node_opened_through_a_bind_mount_is_found(gpuhost, tmp_path):
    other = str(tmp_path / 'elsewhere')
    open(other, 'w').close()
    subprocess.run(['mount', '--bind', gpuhost.dev_path(3), other], check=True)
    try:
        job = holding(other, 'python3')
        result = release(gpuhost, gpus=[3])
        assert [entry['pid'] for entry in result.signalled] == [job.pid]
        assert job.wait(5) is not None and result.released is True, result.failure
    finally:
        subprocess.run(['umount', other], check=False)


@in_private_pid_namespace
def test_host_root_finds_the_host_s_processes(gpuhost, tmp_path):
    host_view = str(tmp_path / 'host-view')
    os.mkdir(host_view)
    subprocess.run(['mount', '--bind', gpuhost.root, host_view], check=True)
    try:
        job = gpuhost.hold(gpus=[1], mib=700)  # opened as the host names it, not under host_root
        result = release(gpuhost, devices=['/dev/nvidia*'], host_root=host_view, gpus=[1])
        assert [entry['pid'] for entry in result.signalled] == [job['pid']]
        assert [entry['devices'] for entry in result.signalled] == [
            [os.path.join(host_view, 'dev', name) for name in ('nvidia-uvm', 'nvidia1', 'nvidiactl')]]
        assert result.released is True, result.failure
    finally:
        subprocess.run(['umount', host_view], check=False)


@in_private_pid_namespace
def test_a_thousand_holders_do_not_exhaust_the_descriptors(gpuhost):
    import resource
    jobs = [holding(gpuhost.dev_path(index % 8), 'job') for index in range(200)]
    for job in jobs:
        job.stdout.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))  # the hard limit too: no room to raise it
    result = release(gpuhost, grace_period=0.5, timeout=20)
    assert result.released is True, result.failure
    assert len(result.signalled) == 200 and all(job.wait(5) is not None for job in jobs)


@in_private_pid_namespace
def test_no_busy_loop_while_the_driver_frees_the_memory(gpuhost, monkeypatch):
    from ansible_collections.gpuops.nvidia.plugins.module_utils._release import observation as _observation
    gpuhost.init(gpus=8, release_delay=2.0)
    gpuhost.hold(gpus=[4], mib=4000)
    scans = []
    real = _observation.scan_holders
    monkeypatch.setattr(_observation, 'scan_holders', lambda *args, **kwargs: scans.append(1) or real(*args, **kwargs))
    result = release(gpuhost, grace_period=5, timeout=10)
    assert result.released is True, result.failure
    # Two seconds of waiting at one look every 0.25 s at most (and the rescans after an exit).
    assert len(scans) < 40, len(scans)


# ==============================================================================================
# Release safety of the hook and the audit log (report names, audit lines, drain reasons, lock
# directories, the hook's exit statuses and its GPU list).
# ==============================================================================================

# -- 10. a command line that tries to forge or drown the audit log -----------------------------

# Holds the device under a command line of its own choosing (argv), says ready and waits.
CHOSEN_COMMAND_LINE = '''
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
print('ready', flush=True)
time.sleep(120)
'''


@in_private_pid_namespace
def test_a_command_line_cannot_forge_drown_or_colour_the_audit_log(gpuhost):
    """A newline and a forged line, terminal escapes, and 260 KB of arguments (each below the
    kernel's 128 KiB per argument): one audit line per signal, escaped, that fits a datagram."""
    forged = 'train.py\nDec  1 08:00:00 node gpuops.nvidia[1]: nvidia_device_release: sent SIGKILL to pid 1\x1b]0;x\x07'
    job = python_job(CHOSEN_COMMAND_LINE, gpuhost.dev_path(0), forged, 'B' * 130000, 'C' * 130000)
    result = release(gpuhost, grace_period=0.5)
    assert result.released is True, result.failure
    assert [entry['pid'] for entry in result.signalled] == [job.pid]
    assert len(result.logged) >= len(result.signalled[0]['signals_sent']) >= 1
    for line in result.logged:
        assert re.match(r'nvidia_device_release: sent SIG[A-Z]+ to pid %d \(user root\) holding \S+, command "' % job.pid, line), line
        assert not re.search(r'[\x00-\x1f\x7f-\x9f]', line) and 'train.py\\x0aDec' in line
        assert len(line.encode('utf-8')) <= 2048


# -- 11. a lock_file where any user can take the name first -----------------------------------

# Creates the lock file in a directory every user can write (noclobber: only if it is not there),
# holds a flock on it and waits.
PLANT_AND_HOLD = ['bash', '-c', 'set -C; exec 3>"$1"; flock -x 3; echo ready; exec sleep 120', '-']


@in_private_pid_namespace
def test_a_lock_file_in_a_sticky_world_writable_dir_is_refused_before_anyone_waits(gpuhost):
    """/tmp-like: user nobody creates the name first and holds it forever; the release refuses the
    place itself, naming the option and the directory, at once and before any signal."""
    shared = tempfile.mkdtemp(prefix='gpuops-shared-', dir='/tmp')
    os.chmod(shared, 0o1777)
    try:
        path = os.path.join(shared, 'release.lock')
        squatter = start(PLANT_AND_HOLD + [path], user=pwd.getpwnam('nobody').pw_uid)
        job = gpuhost.hold(gpus=[0], mib=100)
        started = time.monotonic()
        with pytest.raises(GpuopsError, match=r'lock_file %s is in %s, which every user can write \(mode 1777, sticky\)'
                                              % (re.escape(path), re.escape(shared))):
            release(gpuhost, lock_file=path, timeout=5)
        assert time.monotonic() - started < 2
        assert alive(job['pid']) and squatter.poll() is None
    finally:
        shutil.rmtree(shared, ignore_errors=True)
