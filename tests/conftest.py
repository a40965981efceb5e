"""Shared pytest setup: gpusim importable, and fixtures for simulated GPU hosts."""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The ansible commands the tests run load this checkout (linked there by scripts/lib.sh),
# never a copy of the collection installed elsewhere.
os.environ['ANSIBLE_COLLECTIONS_PATH'] = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.build', 'collections')

from gpusim.api import Host  # noqa: E402
from processes import await_ready  # noqa: E402


@pytest.fixture
def gpuhost_factory(tmp_path):
    """make(name="host", **init_opts) -> an initialised gpusim Host under tmp_path.

    Every host made is stopped at teardown (all its processes SIGKILLed), pass or fail.
    """
    hosts = []

    def make(name="host", **opts):
        host = Host(str(tmp_path / name))
        hosts.append(host)
        host.init(**opts)
        return host

    try:
        yield make
    finally:
        errors = []
        for host in hosts:
            try:
                host.stop()
            except Exception as e:  # keep stopping the other hosts
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def gpuhost(gpuhost_factory):
    """A fresh simulated host with the defaults (8 x NVIDIA H200)."""
    return gpuhost_factory()


# A real process that opens (or maps) the files named on its command line, optionally
# renames itself (comm) the way daemons do, says "ready" and waits.
HOLDER = r'''
import ctypes, mmap, os, sys, time
name, mode, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
if name != '-':
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)
keep = []
for path in paths:
    fd = os.open(path, os.O_RDWR)
    if mode == 'map':
        keep.append(mmap.mmap(fd, 4096))
        os.close(fd)
    else:
        keep.append(fd)
print('ready', flush=True)
time.sleep(60)
'''


def install_program(directory, name):
    """A copy of this Python interpreter at directory/name (mode 0755): a process run from it
    has an executable of that name, as a daemon run from its own program has."""
    os.makedirs(str(directory), exist_ok=True)
    exe = os.path.join(str(directory), name)
    if not os.path.exists(exe):
        shutil.copyfile(os.path.realpath(sys.executable), exe)
        os.chmod(exe, 0o755)
    return exe


@pytest.fixture
def spawn(tmp_path):
    """start(paths, name='-', mode='fd', argv0=None, exe=None, user=None): a plain process
    holding the files open (mode='map': mapped), run from the program exe (a name: a copy of
    Python of that name, see install_program; a path: that file) and as user (a uid) when
    given; every one is killed at teardown."""
    procs = []

    def start(paths, name='-', mode='fd', argv0=None, exe=None, user=None):
        env = None
        if argv0:
            # The shell opens the file and execs sleep under another argv[0]; the fd survives exec.
            script = 'exec 3<>"$1"; echo ready; exec -a "$0" sleep 60'
            argv = ['bash', '-c', script, argv0, str(paths[0])]
        else:
            program = sys.executable
            if exe:
                program = exe if os.path.isabs(exe) else install_program(tmp_path / 'sbin', exe)
                env = dict(os.environ, PYTHONHOME='%s:%s' % (sys.base_prefix, sys.base_exec_prefix))
            argv = [program, '-c', HOLDER, name, mode] + [str(p) for p in paths]

        def as_user():
            os.setgid(user)
            os.setuid(user)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env,
                                preexec_fn=None if user is None else as_user)
        procs.append(proc)
        await_ready(proc, argv)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
