# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The nvidia-smi backend: the one place that runs nvidia-smi, and its CSV parser."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, PermanentReadError
from ansible_collections.gpuops.nvidia.plugins.module_utils._reader import GpuReader, Snapshot


# nvidia-smi field name -> fact name, in the order they are queried.
GPU_FIELDS = [
    ('index', 'index'),
    ('uuid', 'uuid'),
    ('name', 'name'),
    ('pci.bus_id', 'pci_bus_id'),
    ('memory.total', 'memory_total_mib'),
    ('memory.used', 'memory_used_mib'),
    ('memory.free', 'memory_free_mib'),
    ('utilization.gpu', 'utilization_gpu_pct'),
    ('temperature.gpu', 'temperature_c'),
    ('persistence_mode', 'persistence_mode'),
    ('compute_mode', 'compute_mode'),
    ('driver_version', 'driver_version'),
]
# Memory repair state, queried with the GPU fields; drivers older than R450 do not know these
# fields and refuse the whole query, which is then repeated without them.
HEALTH_FIELDS = [
    ('remapped_rows.pending', 'remapped_rows_pending'),
    ('remapped_rows.failure', 'remapped_rows_failure'),
    ('retired_pages.pending', 'retired_pages_pending'),
]
# Memory the driver reserves, outside memory.used (drivers that report it apart). A driver that
# does not know the field refuses the query; it is repeated without it, and the value is null.
RESERVED_FIELDS = [('memory.reserved', 'memory_reserved_mib')]
RESERVED_WARNING = ('nvidia-smi does not know memory.reserved (an older driver): memory_reserved_mib is null, '
                    'and memory used may include the memory the driver reserves, so idle GPUs may look used')
YES_NO_FACTS = frozenset(fact for dummy, fact in HEALTH_FIELDS)
INT_FACTS = frozenset(['index', 'memory_total_mib', 'memory_used_mib', 'memory_free_mib',
                       'utilization_gpu_pct', 'temperature_c', 'memory_reserved_mib'])
# What the driver prints in place of a process name it cannot read (real-samples
# smi_compute_apps/A02): the name is null.
UNREPORTED_PROCESS_NAMES = frozenset(['[Not Found]', '[Insufficient Permissions]', '[N/A]', '[Unknown Error]'])
APP_FIELDS = ['pid', 'process_name', 'used_memory', 'gpu_uuid', 'gpu_bus_id']

# From the nvidia-smi man page, "RETURN VALUE".
EXIT_CODES = {
    2: 'invalid argument or flag',
    3: 'the requested operation is not available on the target device',
    4: 'insufficient permissions',
    6: 'the query was unsuccessful',
    8: 'external power cables are not attached',
    9: 'the NVIDIA driver is not loaded',
    10: 'the NVIDIA kernel driver detected an interrupt issue with a GPU',
    12: 'the NVML shared library could not be found or loaded',
    13: 'the local NVML version does not implement this function',
    14: 'the infoROM is corrupted',
    15: 'a GPU has fallen off the bus or has otherwise become inaccessible',
    18: 'the driver and the NVML library versions do not match (reload the driver or reboot)',
    255: 'internal driver error',
}

NO_DEVICES = 'No devices were found'
INVALID_FIELD = 'is not a valid field to query'
PCI_BUS_ID_RE = re.compile(r'([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])')
NUMBER_RE = re.compile(r'^(-?[0-9]+(?:\.[0-9]+)?)(?:\s*(?:MiB|%|C|W|MHz))?$')


class SmiParseError(GpuopsError):
    """nvidia-smi printed something that is not the CSV it was asked for."""


def normalize_bus_id(bus_id):
    """Upper-case, 8-digit-domain form of a PCI bus id, as nvidia-smi prints it."""
    if not bus_id:
        return None
    domain, rest = bus_id.strip().split(':', 1)
    return ('%08X:%s' % (int(domain, 16), rest)).upper()


def parse_value(fact, raw):
    """Turn one CSV cell into a fact value; (value, problem) where problem is None or a text."""
    raw = raw.strip()
    if raw == '' or raw.upper() == 'N/A' or (raw.startswith('[') and raw.endswith(']')):
        return None, None
    if fact in INT_FACTS:
        match = NUMBER_RE.match(raw)
        if not match:
            return None, 'unreadable value %r' % raw
        return int(float(match.group(1))), None
    if fact == 'persistence_mode':
        if raw in ('Enabled', 'Disabled'):
            return raw == 'Enabled', None
        return None, 'unreadable value %r' % raw
    if fact in YES_NO_FACTS:
        if raw in ('Yes', 'No'):
            return raw == 'Yes', None
        if raw.isdigit():
            return int(raw) > 0, None
        return None, 'unreadable value %r' % raw
    if fact == 'pci_bus_id':
        if not PCI_BUS_ID_RE.match(raw):
            return None, 'unreadable value %r' % raw
        return normalize_bus_id(raw), None
    return raw, None


def parse_gpu_csv(text, fields=None):
    """Parse ``--query-gpu=<fields> --format=csv,noheader,nounits`` output.

    fields: the (field, fact) pairs queried, GPU_FIELDS first; by default every field.

    Returns (gpus, warnings). nvidia-smi prints one line per GPU in index order; a GPU it
    cannot read (lost, unknown error) gets an error line in its place, so its index is its
    position. Raises SmiParseError when no line is usable at all.
    """
    fields = GPU_FIELDS + HEALTH_FIELDS + RESERVED_FIELDS if fields is None else fields
    widths = (len(GPU_FIELDS), len(GPU_FIELDS) + len(HEALTH_FIELDS), len(fields))
    gpus, warnings = [], []
    lines = [line for line in text.splitlines() if line.strip()]
    for position, line in enumerate(lines):
        cells = line.split(',')
        if len(cells) in widths and not line.startswith('Unable to'):
            gpu, problems = _gpu_from_cells(cells, fields)
            if gpu['index'] is None:
                gpu['index'] = position
            for problem in problems:
                warnings.append('nvidia-smi, GPU %s: %s' % (gpu['index'], problem))
            gpus.append(gpu)
        else:
            gpus.append(_unreadable_gpu(position, line.strip()))
    if lines and all(gpu['error'] for gpu in gpus) and not any(PCI_BUS_ID_RE.search(line) for line in lines):
        raise SmiParseError('nvidia-smi printed no GPU data: %s' % _first_line(text))
    return gpus, warnings


def _gpu_from_cells(cells, fields):
    gpu, problems = {'error': None, 'memory_reserved_mib': None}, []
    for (field, fact), raw in zip(fields, cells):
        value, problem = parse_value(fact, raw)
        if problem:
            problems.append('%s: %s' % (field, problem))
        gpu[fact] = value
    return gpu, problems


def _unreadable_gpu(position, line):
    gpu = dict((fact, None) for dummy, fact in GPU_FIELDS + HEALTH_FIELDS + RESERVED_FIELDS)
    match = PCI_BUS_ID_RE.search(line)
    gpu.update(index=position, pci_bus_id=normalize_bus_id(match.group(1)) if match else None, error=line)
    return gpu


def parse_apps_csv(text):
    """Parse ``--query-compute-apps=<APP_FIELDS> --format=csv,noheader,nounits`` output.

    process_name is printed unquoted and may itself contain commas, so the fixed fields
    are taken from both ends of the line. Returns (apps, warnings).
    """
    apps, warnings = [], []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith('No running'):
            continue
        cells = line.split(',')
        pid = cells[0].strip()
        if len(cells) < len(APP_FIELDS) or not pid.isdigit():
            warnings.append('nvidia-smi printed an unreadable process line: %r' % line.strip())
            continue
        used, dummy = parse_value('memory_used_mib', cells[-3])
        bus_id, dummy = parse_value('pci_bus_id', cells[-1])
        name = ','.join(cells[1:-3]).strip()
        apps.append({
            'pid': int(pid),
            'name': None if name in UNREPORTED_PROCESS_NAMES else name,
            'used_memory_mib': used,
            'gpu_uuid': cells[-2].strip() or None,
            'gpu_bus_id': bus_id,
        })
    return apps, warnings


def _first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return '(no output)'


def describe_failure(rc, stdout, stderr):
    """An operator-readable sentence for a failed nvidia-smi call."""
    meaning = EXIT_CODES.get(rc, 'unexpected exit code')
    said = _first_line(stderr) if stderr.strip() else _first_line(stdout)
    return 'nvidia-smi exited with %d (%s): %s' % (rc, meaning, said)


class SmiRunner:
    """Runs nvidia-smi with a hard deadline. The collection's single caller of nvidia-smi.

    nvidia-smi runs in a session of its own. A read ends when nvidia-smi itself exits, not when
    its pipes close (a process it left behind may keep them open): what it printed is its
    answer, and whatever is left in its process group is killed. When it does not exit in
    time, its process group and every process descended from it are killed. Errors that no
    second try can cure (no nvidia-smi that runs, no driver, no library, a driver/library
    mismatch) raise PermanentReadError at once.
    """

    # nvidia-smi exit codes that no retry cures (meanings in EXIT_CODES).
    PERMANENT_EXIT_CODES = (9, 12, 18)
    POLL_S = 0.05
    KILL_WAIT_S = 1.0
    HINT = 'install the NVIDIA driver utilities or set nvidia_smi_path'

    def __init__(self, path='nvidia-smi', timeout=10.0):
        self.path = path
        self.timeout = timeout

    def resolve(self):
        found = shutil.which(self.path) if os.sep not in self.path else self.path
        if not found or not os.path.exists(found):
            raise PermanentReadError('nvidia-smi not found or not executable at %r: %s' % (self.path, self.HINT))
        if not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise PermanentReadError('nvidia-smi at %r is not executable (%s): %s' % (
                found, 'a directory' if os.path.isdir(found) else 'mode %04o' % stat.S_IMODE(os.stat(found).st_mode),
                self.HINT))
        return found

    def run(self, args, timeout=None):
        """Run nvidia-smi with args; return (rc, stdout, stderr).

        Raise PermanentReadError when it cannot run or exits with a permanent code, and
        GpuopsError when it does not exit within timeout seconds.
        """
        timeout = self.timeout if timeout is None else timeout
        path = self.resolve()
        env = dict(os.environ, LC_ALL='C', LANG='C')
        try:
            proc = subprocess.Popen([path] + list(args), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                    close_fds=True, start_new_session=True)
        except OSError as exc:
            raise PermanentReadError(_exec_failure(path, exc) + ': ' + self.HINT)
        try:
            output = self._collect(proc, time.monotonic() + timeout)
        except BaseException:  # interrupted: leave nothing running behind
            self._abandon(proc)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
        if output is None:
            raise GpuopsError('nvidia-smi %s did not answer within %.1f s and was killed; the driver '
                              'may be stuck on a sick GPU' % (' '.join(args), timeout))
        stdout, stderr = (data.decode('utf-8', 'replace') for data in output)
        if proc.returncode in self.PERMANENT_EXIT_CODES:
            raise PermanentReadError(describe_failure(proc.returncode, stdout, stderr))
        return proc.returncode, stdout, stderr

    def _collect(self, proc, deadline):
        """(stdout, stderr) bytes once nvidia-smi has exited and is reaped; None after killing
        it when deadline passes first."""
        chunks = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
        selector = selectors.DefaultSelector()
        try:
            for pipe in (proc.stdout, proc.stderr):
                selector.register(pipe, selectors.EVENT_READ)
            delay, drain_until, reaped = 0.001, None, False
            while True:
                state = _exited(proc.pid)
                exited, reaped = state is not False, state is None
                if exited and drain_until is None:
                    drain_until = time.monotonic() + self.POLL_S
                if exited and (not selector.get_map() or time.monotonic() > drain_until):
                    break
                left = deadline - time.monotonic()
                if not exited and left <= 0:
                    self._abandon(proc)
                    return None
                if selector.get_map():
                    # Once it has exited, all it wrote is in the pipes: take what is there and
                    # stop; a process it left behind may keep the pipes open (and busy) for ever.
                    ready = selector.select(0 if exited else min(left, self.POLL_S))
                    if exited and not ready:
                        break
                    for key, dummy in ready:
                        data = os.read(key.fd, 65536)
                        if data:
                            chunks[key.fd].append(data)
                        else:
                            selector.unregister(key.fileobj)
                else:  # both pipes closed: it is about to exit
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, self.POLL_S)
        finally:
            selector.close()
        if not reaped:  # unreaped, its pid still names its group: kill what it left there
            _kill_group(proc.pid)
        proc.wait()
        return b''.join(chunks[proc.stdout.fileno()]), b''.join(chunks[proc.stderr.fileno()])

    def _abandon(self, proc):
        # Its descendants are found first (one may have left the group with setsid), then the
        # group and they are killed. A process stuck in the driver (D state) cannot die until
        # the driver lets it go: give it a moment, and never wait on it longer than that.
        if proc.returncode is not None or _exited(proc.pid) is None:
            return  # reaped: its pid may be another process's by now
        descendants = _descendants(proc.pid)
        _kill_group(proc.pid)
        for pid, starttime in descendants:
            _kill_same(pid, starttime)
        try:
            proc.wait(timeout=self.KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass


def _exec_failure(path, exc):
    """Why exec of path failed, in words: the errno alone names the wrong culprit."""
    if exc.errno == errno.ENOENT:  # the file exists: what it needs to start does not
        interpreter = _interpreter(path)
        if interpreter:
            return 'nvidia-smi at %r cannot be run: bad interpreter %r in its #! line (%s)' % (
                path, interpreter, 'not executable' if os.path.exists(interpreter) else 'no such file')
        return ('nvidia-smi at %r cannot be run: its program loader is missing (No such file or directory; '
                'built for another system?)' % path)
    if exc.errno == errno.ENOEXEC:
        return ('nvidia-smi at %r is not an executable this host can run (exec format error: wrong '
                'format or architecture, or a damaged file)' % path)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ('nvidia-smi at %r cannot be run: permission denied (not executable, or on a file system '
                'mounted noexec)' % path)
    return 'nvidia-smi at %r cannot be run: %s' % (path, exc.strerror)


def _interpreter(path):
    try:
        with open(path, 'rb') as handle:
            head = handle.read(256)
    except (IOError, OSError):
        return None
    if not head.startswith(b'#!'):
        return None
    words = head[2:].split(b'\n', 1)[0].split()
    return words[0].decode('utf-8', 'replace') if words else None


def _exited(pid):
    """False while the child pid runs, True once it has exited (a zombie, unreaped until waited
    for, so its pid and process group id cannot be reused), None when it was reaped elsewhere."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return None


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # the group is empty, or gone
        pass


def _stat_fields(pid, proc='/proc'):
    """(ppid, starttime) of pid from /proc, or None."""
    try:
        with open('%s/%d/stat' % (proc, pid), 'rb') as handle:
            fields = handle.read().rsplit(b')', 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (IOError, OSError, IndexError, ValueError):
        return None


def _descendants(root, proc='/proc'):
    """[(pid, starttime)] of every process descended from root, read from /proc."""
    children = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            fields = _stat_fields(int(name), proc)
            if fields is not None:
                children.setdefault(fields[0], []).append((int(name), fields[1]))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _kill_same(pid, starttime):
    """SIGKILL pid if it is still the process that started at starttime (a pidfd where there is one)."""
    pidfd = None
    try:
        if hasattr(os, 'pidfd_open'):
            pidfd = os.pidfd_open(pid)
        fields = _stat_fields(pid)
        if fields is None or fields[1] != starttime:
            return
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:  # gone already
        pass
    finally:
        if pidfd is not None:
            os.close(pidfd)


class SmiReader(GpuReader):
    """Reads GPU state by running nvidia-smi's CSV queries."""

    backend = 'nvidia-smi'

    def __init__(self, runner):
        self.runner = runner

    def read(self, timeout=None):
        fields = GPU_FIELDS + HEALTH_FIELDS + RESERVED_FIELDS
        rc, stdout, stderr = self._query_gpus(fields, timeout)
        while rc == 2 and INVALID_FIELD in stdout + stderr and fields != GPU_FIELDS:
            fields = _accepted_fields(fields, stdout + stderr)
            rc, stdout, stderr = self._query_gpus(fields, timeout)
        if NO_DEVICES in stdout or NO_DEVICES in stderr:
            return Snapshot([], None, ['nvidia-smi: %s' % NO_DEVICES])
        try:
            gpus, warnings = parse_gpu_csv(stdout, fields)
        except SmiParseError:
            if rc != 0:
                raise GpuopsError(describe_failure(rc, stdout, stderr))
            raise
        if not gpus:
            if rc != 0:
                raise GpuopsError(describe_failure(rc, stdout, stderr))
            raise SmiParseError('nvidia-smi printed nothing for --query-gpu')
        if rc != 0 and all(gpu['error'] is None for gpu in gpus):
            warnings.append(describe_failure(rc, stdout, stderr))
        if RESERVED_FIELDS[0] not in fields:
            warnings.append(RESERVED_WARNING)
        apps, app_warnings = self._read_apps(timeout)
        _attach_processes(gpus, apps)
        driver = next((gpu.pop('driver_version') for gpu in gpus if gpu.get('driver_version')), None)
        for gpu in gpus:
            gpu.pop('driver_version', None)
        return Snapshot(gpus, driver, warnings + app_warnings)

    def _query_gpus(self, fields, timeout):
        return self.runner.run(['--query-gpu=' + ','.join(field for field, dummy in fields),
                                '--format=csv,noheader,nounits'], timeout=timeout)

    def _read_apps(self, timeout):
        rc, stdout, stderr = self.runner.run(
            ['--query-compute-apps=' + ','.join(APP_FIELDS), '--format=csv,noheader,nounits'],
            timeout=timeout)
        apps, warnings = parse_apps_csv(stdout)
        if rc != 0 and not apps:
            warnings.append('process list unavailable: ' + describe_failure(rc, stdout, stderr))
        return apps, warnings


def _accepted_fields(fields, said):
    """fields less the optional ones nvidia-smi refused: memory.reserved when it names that
    field, the health fields otherwise, and then every optional field."""
    for field, fact in RESERVED_FIELDS:
        if '"%s"' % field in said and (field, fact) in fields:
            return [pair for pair in fields if pair not in RESERVED_FIELDS]
    if any(pair in fields for pair in HEALTH_FIELDS):
        return [pair for pair in fields if pair not in HEALTH_FIELDS]
    return list(GPU_FIELDS)


def _attach_processes(gpus, apps):
    by_uuid = dict((gpu['uuid'], gpu) for gpu in gpus if gpu.get('uuid'))
    by_bus = dict((gpu['pci_bus_id'], gpu) for gpu in gpus if gpu.get('pci_bus_id'))
    for gpu in gpus:
        gpu['processes'] = []
    for app in apps:
        gpu = by_uuid.get(app['gpu_uuid']) or by_bus.get(app['gpu_bus_id'])
        if gpu is not None:
            gpu['processes'].append(
                {'pid': app['pid'], 'name': app['name'], 'used_memory_mib': app['used_memory_mib']})
