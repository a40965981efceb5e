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

# Fixtures shared by the tests of one module or class (a fleet's playbook run, a Slurm cluster, a
# download): their tests run on one pytest-xdist worker, which sets the fixture up once.
SHARED_SCOPES = ('module', 'class')


def pytest_addoption(parser):
    parser.addoption('--alone', choices=('only', 'skip'), default=None,
                     help='only: run just the tests marked alone; skip: every other test (scripts/test.sh '
                          'runs the others in parallel, then these on their own)')


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'alone: a test that must have the machine to itself (it starts thousands of processes, '
                   'which every other test would have to scan, or measures a budget that they would eat '
                   'into); scripts/test.sh runs these after the others, one at a time')


def _shares_a_fixture(item):
    """Whether item uses a module- or class-scoped fixture of these tests (not pytest's own)."""
    info = getattr(item, '_fixtureinfo', None)
    if info is None:
        return False
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if fixturedef.scope in SHARED_SCOPES and fixturedef.baseid:
                return True
    return False


def _group_names(item):
    """The names of item's xdist_group marks, as pytest-xdist reads them."""
    return sorted(set(str(mark.args[0] if mark.args else mark.kwargs.get('name', 'default'))
                      for mark in item.iter_markers('xdist_group')))


def _name_groups(config, items):
    """pytest-xdist's loadgroup scheduler knows a test's group by its node id, NODEID@GROUP, which
    xdist 3.8 sets in its workers as item._nodeid: pytest 9.2 no longer reads that (its node ids
    are structured; pytest-dev/pytest-xdist#1386), and every group's tests would be spread over
    the workers, the Slurm tests' clusters side by side. Named here where xdist did not; an error
    where neither can, rather than groups silently ignored."""
    if not hasattr(config, 'workerinput') or not getattr(config.option, 'loadgroup', False):
        return
    for item in items:
        names = _group_names(item)
        suffix = '@' + '_'.join(names)
        if not names or item.nodeid.endswith(suffix):
            continue
        try:
            item._id = type(item._id).parse(item.nodeid + suffix)
        except AttributeError:
            pass
        if not item.nodeid.endswith(suffix):
            raise pytest.UsageError('pytest-xdist cannot keep %s in its xdist_group (%s) with this pytest: run '
                                    'without -n (GPUOPS_TEST_WORKERS=0)' % (item.nodeid, suffix[1:]))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """--alone: keep the tests marked alone (only) or the others (skip). Under pytest-xdist
    (--dist loadgroup), a test that uses a module- or class-scoped fixture of these tests goes into
    the xdist_group of its module, unless it names a group of its own. Before every other
    implementation of this hook; after them, each grouped test named for its group."""
    which = config.getoption('alone')
    if which:
        keep = [item for item in items if (item.get_closest_marker('alone') is not None) == (which == 'only')]
        if len(keep) != len(items):
            kept = set(keep)
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = keep
    for item in items:
        if item.get_closest_marker('xdist_group') is None and _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split('::', 1)[0]))
    result = yield
    _name_groups(config, items)
    return result


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
