# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._release import holders as _holders
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import (
    Holder,
    ancestors,
    display_name,
    find_holders,
    process_name,
    scan_holders,
    start_time,
    supervisor,
    uninspectable_warning,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import expand_devices
from processes import await_ready


def test_finds_open_and_mapped_holders_with_their_devices(devroot, spawn):
    opener = spawn([devroot / 'nvidia0', devroot / 'nvidiactl'])
    mapper = spawn([devroot / 'nvidia1'], mode='map')
    bystander = spawn([devroot / '..' / 'dev' / 'nvidia-caps' / '..' / 'nvidia-uvm'])
    holders, dummy = find_holders(expand_devices([str(devroot / 'nvidia[0-9]*')]))
    found = dict((h.pid, h) for h in holders)
    assert set(found) == set([opener.pid, mapper.pid])
    assert found[opener.pid].devices == [str(devroot / 'nvidia0')]
    assert found[mapper.pid].devices == [str(devroot / 'nvidia1')]
    assert bystander.pid not in found
    holder = found[opener.pid].to_dict()
    assert holder['user'] == pwd.getpwuid(os.getuid()).pw_name
    assert holder['cmdline'].split(' ')[:2] == [sys.executable, '-c']
    assert holder['protected'] is False


def test_protects_nvidia_daemons_by_their_executable(devroot, spawn):
    daemon = spawn([devroot / 'nvidia0'], name='nvidia-persistenced', exe='nvidia-persistenced')
    by_comm = spawn([devroot / 'nvidia0'], name='nvidia-persistenced')
    by_argv0 = spawn([devroot / 'nvidia0'], argv0='/usr/bin/nv-hostengine')
    worker = spawn([devroot / 'nvidia0'], name='python3')
    holders, dummy = find_holders([str(devroot / 'nvidia0')], DEFAULT_PROTECT)
    found = dict((h.pid, h) for h in holders)
    assert dict((pid, h.protected) for pid, h in found.items()) == {
        daemon.pid: True, by_comm.pid: False, by_argv0.pid: False, worker.pid: False}
    assert found[daemon.pid].comm == 'nvidia-persiste'
    # The look-alikes are named for what they claim to be.
    assert found[by_comm.pid].to_dict()['impersonates'] == 'nvidia-persistenced'
    assert found[by_argv0.pid].to_dict()['impersonates'] == 'nv-hostengine'
    assert 'impersonates' not in found[worker.pid].to_dict()


@pytest.mark.skipif(os.getuid() != 0, reason='needs root to own the executable and to run as another user')
def test_protection_needs_a_root_owned_program_and_a_system_account(devroot, spawn, tmp_path):
    nobody = pwd.getpwnam('nobody').pw_uid
    # The real program, root-owned, run by a regular user: a directory that user can enter.
    public = tempfile.mkdtemp()
    os.chmod(public, 0o755)
    node = os.path.join(public, 'nvidia0')
    shutil.copyfile(str(devroot / 'nvidia0'), node)
    os.chmod(node, 0o666)
    program = os.path.join(public, 'nvidia-persistenced')
    shutil.copyfile('/bin/sleep', program)
    os.chmod(program, 0o755)
    argv = ['bash', '-c', 'exec 3<>"$1"; echo ready; exec "$2" 60', '-', node, program]
    as_user = subprocess.Popen(argv, stdout=subprocess.PIPE, preexec_fn=lambda: (os.setgid(nobody), os.setuid(nobody)))
    try:
        await_ready(as_user, argv)
        holders, dummy = find_holders([node], DEFAULT_PROTECT)
        assert [(h.pid, h.protected, h.impersonates) for h in holders] == [
            (as_user.pid, False, 'nvidia-persistenced')]
    finally:
        as_user.kill()
        as_user.wait()
        shutil.rmtree(public)
    writable = os.path.join(str(tmp_path), 'writable', 'Xorg')
    os.makedirs(os.path.dirname(writable))
    shutil.copyfile(os.path.realpath(sys.executable), writable)
    os.chmod(writable, 0o775)  # group-writable: anyone in the group could replace it
    group_writable = spawn([devroot / 'nvidia0'], exe=writable)
    foreign = os.path.join(str(tmp_path), 'foreign', 'nv-hostengine')
    os.makedirs(os.path.dirname(foreign))
    shutil.copyfile(os.path.realpath(sys.executable), foreign)
    os.chmod(foreign, 0o755)
    os.chown(foreign, nobody, -1)  # a user's own copy
    user_owned = spawn([devroot / 'nvidia0'], exe=foreign)
    holders, dummy = find_holders([str(devroot / 'nvidia0')], DEFAULT_PROTECT)
    found = dict((h.pid, h) for h in holders)
    assert [found[p.pid].protected for p in (group_writable, user_owned)] == [False] * 2
    assert [found[p.pid].impersonates for p in (group_writable, user_owned)] == ['Xorg', 'nv-hostengine']


@pytest.mark.parametrize('pattern, expected', [
    ('nvidia-persistenced', True), ('nvidia-persist*', True), ('nv*-persistenced', True),
    ('nvidia-persistence', False), ('nvidia.*', False),
])
def test_protect_names_are_exact_or_globs(devroot, spawn, pattern, expected):
    daemon = spawn([devroot / 'nvidia0'], exe='nvidia-persistenced')
    holders, dummy = find_holders([str(devroot / 'nvidia0')], [pattern])
    assert [h.protected for h in holders if h.pid == daemon.pid] == [expected]


def test_own_ancestors_are_protected(devroot):
    # This test process (and pytest's parents) hold the file: never a candidate to signal.
    with open(str(devroot / 'nvidia0'), 'rb'):
        holders, dummy = find_holders([str(devroot / 'nvidia0')])
    assert [(h.pid, h.protected) for h in holders] == [(os.getpid(), True)]
    assert os.getppid() in ancestors(os.getpid())


def test_start_time_identifies_a_process(spawn, devroot):
    proc = spawn([devroot / 'nvidia0'])
    first = start_time(proc.pid)
    assert isinstance(first, int) and first == start_time(proc.pid)
    proc.kill()
    proc.wait()
    assert start_time(proc.pid) is None


def fuser_pids(paths):
    """PIDs that psmisc fuser -v lists for paths (PIDs on stdout, the rest of its table on stderr)."""
    result = subprocess.run(['fuser', '-v'] + list(paths), capture_output=True, text=True, check=False)
    assert 'USER' in result.stderr or result.returncode == 1, result.stderr
    return set(int(pid) for pid in re.findall(r'\d+', result.stdout))


def test_discovery_agrees_with_fuser(devroot, spawn):
    spawn([devroot / 'nvidia0', devroot / 'nvidiactl'])
    spawn([devroot / 'nvidia1'], mode='map')
    spawn([devroot / 'nvidia-uvm'], name='nvidia-persistenced')
    spawn([devroot / 'nvidia0', devroot / 'nvidia1', devroot / 'nvidia-uvm'], mode='map')
    paths = expand_devices([str(devroot / 'nvidia*')])
    holders, dummy = find_holders(paths)
    assert len(holders) == 4
    assert set(h.pid for h in holders) == fuser_pids(paths)
    for path in paths:
        assert set(h.pid for h in holders if path in h.devices) == fuser_pids([path]), path


# NVIDIA's own holders that its tooling stops around a GPU reset (fuser on a DGX Station, and
# NVIDIA/mig-parted's deployments/systemd/hooks.sh) and the MPS control daemon: protected by default.
@pytest.mark.parametrize('program', ['nvsm_core', 'nvidia-device-plugin', 'gpu-feature-discovery',
                                     'nvidia-cuda-mps-control', 'gnome-shell'])
def test_nvidias_other_daemons_are_protected_by_default(devroot, spawn, program):
    daemon = spawn([devroot / 'nvidia0'], exe=program)
    holders, dummy = find_holders([str(devroot / 'nvidia0')], DEFAULT_PROTECT)
    assert [(h.pid, h.protected) for h in holders] == [(daemon.pid, True)]


def test_a_scan_stops_at_its_deadline_and_says_so(devroot, spawn):
    spawn([devroot / 'nvidia0'])
    paths = expand_devices([str(devroot / 'nvidia0')])
    assert scan_holders(paths).complete is True
    late = scan_holders(paths, deadline=0.0, clock=lambda: 1.0)
    assert late.complete is False and late.holders == []


def test_running_out_of_descriptors_is_an_error_not_an_empty_scan(devroot, spawn):
    import resource
    spawn([devroot / 'nvidia0'])
    paths = expand_devices([str(devroot / 'nvidia0')])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    kept = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        while True:
            kept.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        with pytest.raises(GpuopsError, match='out of file descriptors while reading /proc'):
            scan_holders(paths)
    finally:
        for fd in kept:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_node_is_found_by_identity_whatever_path_opened_it(devroot, spawn, tmp_path):
    link = tmp_path / 'another-name'
    os.link(str(devroot / 'nvidia1'), str(link))  # the same inode under a path that says nothing
    opener = spawn([link])
    holders, dummy = find_holders(expand_devices([str(devroot / 'nvidia1')]))
    assert [(holder.pid, holder.devices) for holder in holders] == [(opener.pid, [str(devroot / 'nvidia1')])]


def cap_status(tmp_path, caps):
    status = tmp_path / 'status'
    status.write_text('Name:\tpython3\nCapEff:\t%016x\n' % caps)
    return str(status)


def test_root_with_cap_sys_ptrace_gets_no_warning(tmp_path, monkeypatch):
    # What root with CAP_SYS_PTRACE cannot read (a sandbox's init), nothing it can do would show.
    monkeypatch.setattr(os, 'geteuid', lambda: 0)
    status = cap_status(tmp_path, 0x1fffeffffff)
    assert uninspectable_warning([(1, 'init')], 'see', status) is None


def test_root_without_cap_sys_ptrace_is_told_to_grant_it(tmp_path, monkeypatch):
    monkeypatch.setattr(os, 'geteuid', lambda: 0)
    status = cap_status(tmp_path, 0x1fffeffffff & ~(1 << 19))
    assert uninspectable_warning([(412, 'python3')], 'release', status) == (
        '1 process(es) could not be inspected for open device nodes (permission denied): pid 412 (python3); '
        'give this root the capability CAP_SYS_PTRACE (a container: --cap-add SYS_PTRACE) to release every holder')


def test_a_user_is_told_to_become_root_and_sees_at_most_five_named(tmp_path, monkeypatch):
    monkeypatch.setattr(os, 'geteuid', lambda: 1000)
    unreadable = [(pid, 'job%d' % pid) for pid in range(10, 17)] + [(10, 'job10')]
    assert uninspectable_warning(unreadable, 'see', cap_status(tmp_path, 0)) == (
        '7 process(es) could not be inspected for open device nodes (permission denied): pid 10 (job10), '
        'pid 11 (job11), pid 12 (job12), pid 13 (job13), pid 14 (job14) and 2 more; run as root (become: true) '
        'to see every holder')
    assert uninspectable_warning([], 'see', cap_status(tmp_path, 0)) is None


def as_user(uid, function, *args):
    """function(*args) in a fork of this process that runs as uid (no exec: this Python may sit
    where uid cannot read it); its return value, as text."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            os.write(write_end, str(function(*args)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as handle:
        text = handle.read()
    os.waitpid(pid, 0)
    return text


def discovery_as_user(path, pid):
    """The warning, whether pid is among the uninspectable (pid, comm) and any kernel thread is."""
    dummy, unreadable = find_holders([path])
    comms = dict(unreadable)
    return json.dumps([uninspectable_warning(unreadable, 'see'), comms.get(pid), 2 in comms])


@pytest.mark.skipif(os.geteuid() != 0, reason='runs a process as root and looks at it as nobody')
def test_a_users_discovery_names_the_root_processes_it_cannot_inspect(devroot, spawn):
    held = spawn([devroot / 'nvidia0'], name='root-job')
    text, comm, kthreadd = json.loads(as_user(pwd.getpwnam('nobody').pw_uid, discovery_as_user,
                                              str(devroot / 'nvidia0'), held.pid))
    assert comm == 'root-job'
    assert not kthreadd  # kernel threads hold no device node: not counted
    count = int(re.match(r'^(\d+) process\(es\) could not be inspected for open device nodes '
                         r'\(permission denied\): pid ', text).group(1))
    assert len(re.findall(r'pid \d+ \([^)]*\)', text)) == min(count, 5), text
    assert text.endswith('; run as root (become: true) to see every holder')


# Holds N descriptors of /dev/null, then the node given (open, or mapped and closed: 'map'), says
# ready and waits for its stdin to close.
MANY_DESCRIPTORS = '''
import mmap, os, sys
first = os.open(os.devnull, os.O_RDONLY)
for fd in range(first + 1, first + int(sys.argv[1])):
    os.dup2(first, fd)
node = os.open(sys.argv[2], os.O_RDWR)
if sys.argv[3] == 'map':
    kept = mmap.mmap(node, 4096)
    os.close(node)
print('ready', flush=True)
os.read(0, 1)
'''


@pytest.fixture
def crowded(tmp_path):
    """start(descriptors, node, how) -> (process, proc): a process holding node past descriptors
    others, and a /proc of its own that lists only it."""
    started = []

    def start(descriptors, node, how='open'):
        proc = subprocess.Popen([sys.executable, '-c', MANY_DESCRIPTORS, str(descriptors), str(node), how],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout.readline().strip() == b'ready'
        only = tmp_path / ('proc-%d' % proc.pid)
        only.mkdir()
        os.symlink('/proc/%d' % proc.pid, str(only / str(proc.pid)))
        return proc, str(only)
    try:
        yield start
    finally:
        for proc in started:
            proc.stdin.close()
            proc.wait()
            proc.stdout.close()


def test_a_process_past_the_descriptor_bound_is_read_in_part_and_named(devroot, crowded, monkeypatch):
    monkeypatch.setattr(_holders, 'DESCRIPTORS_READ_AT_MOST', 40)
    monkeypatch.setattr(_holders, 'SPARE_DESCRIPTORS', 0)
    proc, only = crowded(100, devroot / 'nvidia0')
    scan = scan_holders([str(devroot / 'nvidia0')], proc=only)
    assert scan.complete is True and scan.holders == []
    assert scan.partial == [(proc.pid, 'python', 'too_many_descriptors', os.getuid())]
    assert scan.unreadable_pids() == set([proc.pid])
    assert _holders.unread_processes(scan) == [dict(pid=proc.pid, user=pwd.getpwuid(os.getuid()).pw_name,
                                                    comm='python', why='too_many_descriptors')]
    assert re.match(r"1 process\(es\) were read only in part \(more than 40 descriptors .*: pid %d \(user \w+, "
                    r"python: too_many_descriptors\)" % proc.pid, _holders.partial_warning(scan))


def test_a_process_under_the_bound_is_read_whole(devroot, crowded, monkeypatch):
    monkeypatch.setattr(_holders, 'DESCRIPTORS_READ_AT_MOST', 40)
    proc, only = crowded(30, devroot / 'nvidia0')
    scan = scan_holders([str(devroot / 'nvidia0')], proc=only)
    assert [holder.pid for holder in scan.holders] == [proc.pid] and scan.partial == []
    assert _holders.partial_warning(scan) is None


def test_a_process_past_the_bound_is_read_whole_while_the_scans_spare_pool_lasts(devroot, crowded, monkeypatch):
    monkeypatch.setattr(_holders, 'DESCRIPTORS_READ_AT_MOST', 40)
    monkeypatch.setattr(_holders, 'SPARE_DESCRIPTORS', 100)
    proc, only = crowded(100, devroot / 'nvidia0')
    scan = scan_holders([str(devroot / 'nvidia0')], proc=only)
    assert [holder.pid for holder in scan.holders] == [proc.pid] and scan.partial == []


def test_a_mapped_node_is_found_whatever_the_descriptors_hide(devroot, crowded, monkeypatch):
    monkeypatch.setattr(_holders, 'DESCRIPTORS_READ_AT_MOST', 40)
    monkeypatch.setattr(_holders, 'SPARE_DESCRIPTORS', 0)
    proc, only = crowded(100, devroot / 'nvidia1', 'map')
    scan = scan_holders([str(devroot / 'nvidia1')], proc=only)
    assert [(holder.pid, holder.devices) for holder in scan.holders] == [(proc.pid, [str(devroot / 'nvidia1')])]
    assert [entry.why for entry in scan.partial] == ['too_many_descriptors']


def counting_clock():
    """A clock that moves one second each time it is read."""
    ticks = iter(range(10 ** 6))
    return lambda: next(ticks)


def test_the_deadline_is_looked_at_inside_a_process_s_descriptors(devroot, crowded, monkeypatch):
    monkeypatch.setattr(_holders, 'CLOCK_EVERY_DESCRIPTORS', 8)
    proc, only = crowded(100, devroot / 'nvidia0')
    # Read 0 before the process, 1 after its maps, 2 at its 8th descriptor: the deadline.
    scan = scan_holders([str(devroot / 'nvidia0')], proc=only, deadline=2, clock=counting_clock())
    assert scan.holders == [] and [entry.why for entry in scan.partial] == ['deadline']
    assert scan.complete is True  # nothing was left unreached: the one process is named


def test_a_deadline_inside_one_process_leaves_the_next_unreached(devroot, crowded, monkeypatch, tmp_path):
    monkeypatch.setattr(_holders, 'CLOCK_EVERY_DESCRIPTORS', 8)
    first, only = crowded(100, devroot / 'nvidia0')
    second, dummy = crowded(3, devroot / 'nvidia0')
    low, high = sorted([first.pid, second.pid])
    both = tmp_path / 'proc-both'
    both.mkdir()
    for pid in (low, high):
        os.symlink('/proc/%d' % pid, str(both / str(pid)))
    scan = scan_holders([str(devroot / 'nvidia0')], proc=str(both), deadline=2, clock=counting_clock())
    assert scan.complete is False  # the clock passed the deadline before the second process


# Holds the file named on its command line, its comm set to argv[1] (the kernel keeps 15 bytes),
# says ready and waits.
RENAMED = r"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
fd = os.open(sys.argv[2], os.O_RDWR)
print('ready', flush=True)
time.sleep(60)
"""


@pytest.fixture
def renamed():
    """start(argv0, comm, path): this Python (its executable keeps its own name) run under argv[0]
    argv0, its comm set to comm, holding path open; every one is killed at teardown."""
    procs = []

    def start(argv0, comm, path):
        # argv[0] names no Python: its prefix is given, as gpusim does for its daemons.
        env = dict(os.environ, PYTHONHOME='%s:%s' % (sys.base_prefix, sys.base_exec_prefix))
        argv = [argv0, '-c', RENAMED, comm, str(path)]
        proc = subprocess.Popen(argv, executable=os.path.realpath(sys.executable), stdout=subprocess.PIPE, env=env)
        procs.append(proc)
        await_ready(proc, argv)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def holder_of(pid, path):
    holders, dummy = find_holders([str(path)])
    found = [holder for holder in holders if holder.pid == pid]
    assert len(found) == 1, holders
    return found[0]


def test_a_name_the_kernel_cut_is_shown_whole_from_the_executable(devroot, spawn):
    daemon = spawn([devroot / 'nvidia0'], exe='nvidia-persistenced')  # comm: the program's name, cut
    holder = holder_of(daemon.pid, devroot / 'nvidia0')
    assert (holder.comm, holder.exe_name, holder.name) == ('nvidia-persiste', 'nvidia-persistenced', 'nvidia-persistenced')
    listed = holder.to_dict()
    assert (listed['comm'], listed['name']) == ('nvidia-persiste', 'nvidia-persistenced')
    assert process_name(daemon.pid) == 'nvidia-persistenced'


def test_a_name_the_kernel_cut_is_shown_whole_from_argv0_when_the_executable_is_another(devroot, renamed):
    daemon = renamed('/usr/bin/nvidia-persistenced', 'nvidia-persistenced', devroot / 'nvidia0')
    holder = holder_of(daemon.pid, devroot / 'nvidia0')
    assert holder.comm == 'nvidia-persiste' and holder.exe_name.startswith('python')
    assert holder.name == 'nvidia-persistenced'
    assert process_name(daemon.pid) == 'nvidia-persistenced'
    holder.spared = 'another_job'
    assert _reason.spared_why(holder).startswith('pid %d (nvidia-persistenced, user ' % daemon.pid)


@pytest.mark.parametrize('argv0, comm, expected', [
    # An argv[0] that does not start with the comm says nothing of the process's name.
    ('/usr/bin/trustme', 'nvidia-persistenced', 'nvidia-persiste'),
    ('/usr/bin/nvidia-persist', 'nvidia-persistenced', 'nvidia-persiste'),
    # Longer than any file name: no program's.
    ('nvidia-persiste' + 'x' * 300, 'nvidia-persistenced', 'nvidia-persiste'),
    # A comm under 15 bytes is whole whatever argv[0] says.
    ('/usr/bin/trainer-of-models', 'trainer', 'trainer'),
    # One that starts with the comm is shown as it is: messages quote it.
    ('nvidia-persistenced\x1b]0;owned\x07\n', 'nvidia-persistenced', 'nvidia-persistenced\x1b]0;owned\x07\n'),
])
def test_argv0_is_trusted_for_no_more_than_starting_with_the_comm(devroot, renamed, argv0, comm, expected):
    proc = renamed(argv0, comm, devroot / 'nvidia0')
    holder = holder_of(proc.pid, devroot / 'nvidia0')
    assert holder.comm == comm[:15] and holder.name == expected
    holder.spared = 'another_job'
    said = _reason.spared_why(holder)
    assert '\x1b' not in said and '\n' not in said and '\x07' not in said
    assert said.startswith('pid %d (%s, user ' % (proc.pid, expected.replace('\x1b', '\\x1b').replace(
        '\x07', '\\x07').replace('\n', '\\x0a')))


@pytest.mark.parametrize('comm, exe, argv0, expected', [
    ('nvidia-persiste', '/usr/bin/nvidia-persistenced', 'nvidia-persistence', 'nvidia-persistenced'),
    ('nvidia-persiste', '/usr/bin/nvidia-persistenced (deleted)', None, 'nvidia-persistenced'),
    ('nvidia-persiste', '/usr/bin/python3', '/usr/bin/nvidia-persistenced', 'nvidia-persistenced'),
    ('nvidia-persiste', None, None, 'nvidia-persiste'),
    ('nvidia-persiste', '/usr/bin/nvidia-persiste', '', 'nvidia-persiste'),
    ('nvidia-persiste', b'/usr/bin/nvidia-persistenced\xff'.decode('utf-8', 'surrogateescape'), None,
     u'nvidia-persistenced\ufffd'),
    ('python3', '/usr/bin/python3.11', 'python3-with-a-long-name', 'python3'),
    # 15 bytes, fewer characters: cut by the kernel all the same.
    (u'\u00f1' * 7 + 'a', u'/opt/' + u'\u00f1' * 7 + 'abc', None, u'\u00f1' * 7 + 'abc'),
    ('', '/usr/bin/anything', 'anything', ''),
    (None, '/usr/bin/anything', 'anything', None),
])
def test_display_name(comm, exe, argv0, expected):
    assert display_name(comm, exe, argv0) == expected
    if comm is not None:
        assert Holder(9, 1, 0, comm, argv0 or '', exe, 1, 'S', 9, 1, []).name == expected


def fake_process(proc, pid, comm, cmdline=None, exe=None, ppid=0):
    """/proc/PID of a process that is not there: its stat, comm, cmdline and exe link."""
    base = proc / str(pid)
    base.mkdir(parents=True)
    fields = ['S', str(ppid), str(pid), str(pid)] + ['0'] * 13 + ['1', '0', '100']
    (base / 'stat').write_text('%d (%s) %s\n' % (pid, comm, ' '.join(fields)))
    (base / 'comm').write_text(comm + '\n')
    if cmdline is not None:
        (base / 'cmdline').write_bytes(cmdline)
    if exe is not None:
        os.symlink(exe, str(base / 'exe'))


def test_the_name_of_a_process_read_for_itself_reads_a_bounded_argv0(tmp_path):
    proc = tmp_path / 'proc'
    fake_process(proc, 10, 'nvidia-persiste', b'/usr/bin/nvidia-persistenced\0--verbose\0')
    fake_process(proc, 11, 'nvidia-persiste', b'/' * 4100 + b'nvidia-persistenced')  # no NUL in 4 KiB
    fake_process(proc, 12, 'nvidia-persiste', b'/x/nvidia-persistenced', exe='/usr/bin/nvidia-persistenced-2')
    fake_process(proc, 13, 'nvidia-persiste')
    names = [process_name(pid, str(proc)) for pid in (10, 11, 12, 13, 14)]
    assert names == ['nvidia-persistenced', 'nvidia-persiste', 'nvidia-persistenced-2', 'nvidia-persiste', '?']


def test_a_supervisor_is_named_whole(tmp_path):
    proc = tmp_path / 'proc'
    fake_process(proc, 1, 'nvidia-persiste', b'nvidia-persistenced\0', exe='/usr/bin/nvidia-persistenced (deleted)')
    holder = Holder(20, 1, 0, 'python3', 'python3 x.py', None, 1, 'S', 20, 1, ['/dev/nvidia0'])
    assert supervisor(holder, str(proc)) == {'pid': 1, 'name': 'nvidia-persistenced', 'unit': None, 'container': None}


def test_a_command_line_of_800_kb_is_read_to_a_bound():
    """A tenant chooses its command line (here 800 KB, up to the kernel's limit): what is read of it,
    for each of thousands of processes, stops at PROC_FILE_MAX."""
    argv = [sys.executable, '-c', 'import sys, time; print("ready", flush=True); time.sleep(60)'] + ['x' * 100000] * 8
    sleeper = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        await_ready(sleeper, argv)
        info = _holders.read_process(sleeper.pid)
        assert info.cmdline.startswith(sys.executable) and len(info.cmdline) <= _holders.PROC_FILE_MAX
    finally:
        sleeper.kill()
        sleeper.wait()
        sleeper.stdout.close()
