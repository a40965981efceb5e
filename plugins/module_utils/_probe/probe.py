# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Proof by allocation: each GPU in scope is opened through the CUDA driver API by its PCI bus id,
in a child process of its own bounded by a deadline (forked, running _cuda.answer), and the GPU counts as proven
only once the reader shows the probe's own memory released again."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import json
import os
import re
import signal
import socket
import threading
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    CALL_FLOOR_S,
    DEFAULT_MEMORY_THRESHOLD_MIB,
    MIN_TIMEOUT_S,
    Budget,
    GpuopsError,
    NoTimeLeft,
    check_seconds,
    check_time_left,
    printable,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import check_expected_gpus
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import driver_hung
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import no_such_gpus
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Forked, Runner
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, boot_id, record_cure, record_verified

# MiB each GPU's probe allocates and writes. The point is to prove that memory the counters call
# free can be allocated and written, not to test all of it: a CUDA context alone costs a few
# hundred MiB (about 500 MiB on an H100), and 1 GiB more spans hundreds of the driver's 2 MiB
# pages across every memory partition. Writing it takes about a millisecond at HBM speed
# (0.3 ms at 3.3 TB/s on an H100, 3 ms at 300 GB/s on a T4), so the time is in context creation,
# not here. A job that races the probe loses 1 GiB for well under a second: under 1 % of an
# 80 GiB GPU and about 6 % of a 16 GiB one. Orphaned memory large enough to leave less than
# this is already a counter's finding; what this proves is that the rest really works.
DEFAULT_PROBE_MIB = 1024
# The least probe_mib: the probe must allocate and write something.
MIN_PROBE_MIB = 1
DEFAULT_TIMEOUT_S = 30.0
# How often the GPUs are read while the probe's memory is being released.
RELEASE_POLL_S = 0.05
# Kept from the child for the reads after it: the probe's memory is read as released even when
# the child had to be killed (twice a call's floor: a read may be two calls).
READ_RESERVE_S = 2 * CALL_FLOOR_S
PROBE_NAME = 'the CUDA probe'
# CUDA reads these to number and hide devices; the probe addresses GPUs by bus id and ignores both.
CUDA_ENVIRONMENT = ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')
MISSING_LIBRARY_CHOICES = ('fail', 'skip')
# The level that also times each GPU's copies and kernels and reads its PCIe link under load
# (_probe/performance.py): the probe module's alone, so that what the release ships stays as it is.
PERFORMANCE = 'performance'
PROBE_LEVELS = _cuda.LEVELS + (PERFORMANCE,)


def check_probe_mib(probe_mib):
    """GpuopsError when probe_mib is no size the probe can allocate."""
    if probe_mib is None or probe_mib < MIN_PROBE_MIB:
        raise GpuopsError('probe_mib must be %d or more, got %s' % (MIN_PROBE_MIB, probe_mib))


def check_probe_level(probe_level):
    """GpuopsError when probe_level is not one of the probe's levels (PROBE_LEVELS)."""
    if probe_level not in PROBE_LEVELS:
        levels = '%s or %s' % (', '.join(PROBE_LEVELS[:-1]), PROBE_LEVELS[-1])
        raise GpuopsError('probe_level must be %s, got %r' % (levels, probe_level))


def probe_argument_spec():
    spec = dict(
        gpus=dict(type='list', elements='int'),
        probe_mib=dict(type='int', default=DEFAULT_PROBE_MIB),
        probe_level=dict(type='str', default=_cuda.DEFAULT_LEVEL, choices=list(PROBE_LEVELS)),
        timeout=dict(type='float', default=DEFAULT_TIMEOUT_S),
        memory_threshold_mib=dict(type='int', default=DEFAULT_MEMORY_THRESHOLD_MIB),
        missing_library=dict(type='str', default='fail', choices=list(MISSING_LIBRARY_CHOICES)),
        cuda_library=dict(type='str', default=_cuda.LIBRARY),
    )
    spec.update(reader_argument_spec())
    return spec


class ProbeOptions:
    """Validated options of a probe."""

    def __init__(self, gpus=None, probe_mib=DEFAULT_PROBE_MIB, timeout=DEFAULT_TIMEOUT_S,
                 memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB, missing_library='fail',
                 cuda_library=_cuda.LIBRARY, expected_gpus=None, state_dir=None, host_root='/',
                 probe_level=_cuda.DEFAULT_LEVEL):
        problem = check_seconds('timeout', timeout, positive=True)
        if problem:
            raise GpuopsError(problem)
        if timeout < MIN_TIMEOUT_S:
            raise GpuopsError('timeout must be at least %.1f s (a read of the GPUs, the CUDA probe, and %.1f s for the '
                              'reads after it), got %s' % (MIN_TIMEOUT_S, READ_RESERVE_S, timeout))
        check_probe_mib(probe_mib)
        check_probe_level(probe_level)
        if gpus is not None and not gpus:
            raise GpuopsError('gpus is an empty list: name the GPUs to probe, or leave gpus out to probe every GPU')
        if memory_threshold_mib < 0:
            raise GpuopsError('memory_threshold_mib must be zero or more, got %s' % memory_threshold_mib)
        if missing_library not in MISSING_LIBRARY_CHOICES:
            raise GpuopsError('missing_library must be fail or skip, got %r' % (missing_library,))
        check_expected_gpus(None, expected_gpus)
        self.gpus, self.probe_mib, self.timeout, self.probe_level = gpus, probe_mib, timeout, probe_level
        self.memory_threshold_mib, self.missing_library = memory_threshold_mib, missing_library
        self.cuda_library, self.expected_gpus = cuda_library, expected_gpus
        self.state_dir, self.host_root = state_dir, host_root or '/'

    @classmethod
    def from_params(cls, params):
        return cls(params.get('gpus'), params['probe_mib'], params['timeout'], params['memory_threshold_mib'],
                   params['missing_library'], params['cuda_library'], params.get('expected_gpus'),
                   params.get('state_dir'), params.get('host_root'), params.get('probe_level') or _cuda.DEFAULT_LEVEL)


def gpu_name(gpu):
    """How messages name a GPU: its index and its bus id."""
    if gpu.get('index') is None:
        return 'GPU %s' % gpu.get('pci_bus_id')
    return 'GPU %s (%s)' % (gpu['index'], gpu.get('pci_bus_id'))


# Compute modes in which a GPU takes one context at a time: while the probe holds it, a job that
# starts on the GPU fails with CUDA_ERROR_DEVICE_UNAVAILABLE, and the probe does when a process holds it.
EXCLUSIVE_MODES = ('Exclusive_Process', 'Exclusive_Thread')


def blank_result(gpu):
    """A GPU's result before its probe: nothing proven yet."""
    return dict(index=gpu.get('index'), pci_bus_id=gpu.get('pci_bus_id'), compute_mode=gpu.get('compute_mode'),
                ok=None, ms=None, mib=0, level=None, kernel=False, bytes_checked=0, kernel_ms=None, call=None,
                error_code=None, error_name=None, error_string=None, released=None, verified_at=None)


def describe_failure(result):
    """One line for a failed GPU: the GPU, the CUDA error's name, the call, the driver's text."""
    text = result.get('error_name') or 'failed'
    if result.get('call'):
        text += ' at %s' % result['call']
    if result.get('error_string'):
        text += ' (%s)' % printable(result['error_string'], limit=300)
    if result.get('error_name') == 'CUDA_ERROR_DEVICE_UNAVAILABLE' and result.get('compute_mode') in EXCLUSIVE_MODES:
        text += '; the GPU is in %s compute mode and another process holds its one context' % result['compute_mode']
    return '%s: %s' % (gpu_name(result), text)


def exclusive_warning(results):
    """What the probe of GPUs in an exclusive compute mode costs a job, or None."""
    exclusive = [str(res['index']) for res in results if res.get('compute_mode') in EXCLUSIVE_MODES]
    if not exclusive:
        return None
    return ('%s %s in an exclusive compute mode: while the probe held its context, a job starting there would have '
            'failed with CUDA_ERROR_DEVICE_UNAVAILABLE (probe before jobs start, as the Slurm Prolog does)' % (
                'GPU' if len(exclusive) == 1 else 'GPUs', ', '.join(exclusive)))


def valid_uuid(uuid):
    return isinstance(uuid, str) and UUID_PATTERN.match(uuid) is not None


def verification(gpu, res, driver_version, result):
    """What a passed probe proved on a GPU, as its record keeps it."""
    return dict(index=gpu.get('index'), pci_bus_id=gpu.get('pci_bus_id'), verified_at=res['verified_at'],
                level=res.get('level'), mib=res.get('mib'), kernel=res.get('kernel') is True,
                driver_version=driver_version, duration_ms=round((time.monotonic() - result.started) * 1000.0, 1))


# Where the probe's one line per run goes: the host's syslog socket (journald or rsyslog listen
# there), facility daemon, tag gpuops; nothing is sent where there is none.
SYSLOG_SOCKET = '/dev/log'
SYSLOG_TAG = 'gpuops'
SYSLOG_DAEMON = 3
SYSLOG_INFO, SYSLOG_WARNING = 6, 4


def log_value(value):
    """A value as the line carries it: one word of safe characters (others become ?), - for none."""
    text = '-' if value is None or value == '' else str(value)
    return re.sub(r'[^A-Za-z0-9._:,+-]', '?', text)[:200]


def log_line(result, driver_version):
    """The probe's run in one stable key=value line, for monitors that read syslog."""
    proven = [res for res in result.gpus if res.get('verified_at') is not None]
    failed = [res for res in result.gpus if res.get('ok') is False]
    levels = sorted(set(str(res.get('level') or 'allocation') for res in proven))
    fields = [
        ('event', 'probe'), ('outcome', 'failed' if failed else 'passed'), ('gpus', len(result.gpus)),
        ('verified', ','.join(str(res['index']) for res in proven)),
        ('failed', ','.join('%s:%s' % (res.get('index'), res.get('error_name')) for res in failed)),
        ('level', ','.join(levels)), ('mib', ','.join(sorted(set(str(res.get('mib')) for res in proven)))),
        ('kernel', 'yes' if proven and all(res.get('kernel') is True for res in proven) else 'no'),
        ('driver', driver_version), ('duration_ms', round((time.monotonic() - result.started) * 1000.0)),
    ]
    return ' '.join('%s=%s' % (key, log_value(value)) for key, value in fields)


def send_syslog(line, host_root='/', failed=False):
    """Send line to the host's syslog socket (under host_root); False when there is none."""
    path = os.path.join(host_root or '/', SYSLOG_SOCKET.lstrip('/'))
    severity = SYSLOG_WARNING if 'outcome=failed' in line else SYSLOG_INFO
    message = ('<%d>%s: %s' % (SYSLOG_DAEMON * 8 + severity, SYSLOG_TAG, line)).encode('utf-8')
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError:
        return False
    try:
        sock.settimeout(1.0)
        sock.connect(path)
        sock.send(message)
        return True
    except OSError:  # no syslog listening there: the report and the state directory still have it
        return False
    finally:
        sock.close()


class ProbeResult:
    """What a probe found: one result per GPU in scope, and what to say about it."""

    def __init__(self, gpus):
        self.gpus = gpus
        self.warnings = []
        self.probed = False
        self.skipped = False
        self.library_error = None
        self.started = time.monotonic()
        self.duration_ms = None
        self.verified = {}

    @property
    def failure(self):
        """The message that fails the task, or None when every GPU was proven (or nothing was probed)."""
        if self.library_error and not self.skipped:
            return self.library_error
        failed = [describe_failure(gpu) for gpu in self.gpus if gpu['ok'] is False]
        if not failed:
            return None
        return 'the allocation probe failed on %d of %d GPUs: %s' % (len(failed), len(self.gpus), '; '.join(failed))

    def dump(self):
        return dict(changed=False, probed=self.probed, library_missing=self.skipped, gpus=self.gpus,
                    duration_ms=self.duration_ms, verified=self.verified)


def select_gpus(snapshot, wanted):
    """The GPUs in scope: every GPU the reader and the host know (lost ones included), or those
    whose index is in wanted; an index that is not there is an error."""
    known = snapshot.gpus + snapshot.missing
    if wanted is None:
        return known
    indexes = set(gpu.get('index') for gpu in known)
    unknown = sorted(set(wanted) - indexes)
    if unknown:
        raise GpuopsError('gpus: %s' % no_such_gpus(unknown, indexes))
    return [gpu for gpu in known if gpu.get('index') in set(wanted)]


# A GPU's UUID as the driver prints it: the only text a child's CUDA_VISIBLE_DEVICES carries.
UUID_PATTERN = re.compile(r'^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\Z')


def loadable(library):
    """None when the driver library can be loaded (dlopen only: nothing of CUDA starts), else the
    child's own words for it: without it no GPU's child is started (each would only find the same)."""
    try:
        ctypes.CDLL(library)
    except OSError as exc:
        return _cuda.not_loaded(library, exc)
    return None


def visible_only(gpu):
    """The CUDA environment of gpu's child: that GPU alone visible, by its UUID as CUDA reads it,
    so that its cuInit brings up one GPU and a GPU whose driver hangs stalls no other child;
    every GPU when the UUID is not one (the child finds its GPU by bus id either way)."""
    uuid = gpu.get('uuid')
    return dict(CUDA_VISIBLE_DEVICES=uuid) if valid_uuid(uuid) else {}


class ProbeCrashed(GpuopsError):
    """A GPU's child was killed by a signal: (message, the CUDA call it was in)."""

    def __init__(self, message, call):
        super(ProbeCrashed, self).__init__(message)
        self.call = call


class ProbeChild:
    """Runs one GPU's probe in a child of its own, with a deadline, and returns its answer: a child
    that hangs is killed with everything it started (CommandTimeout), one that crashes is
    ProbeCrashed, one that exits or prints garbage is said in words (GpuopsError). The child is
    forked, not a new interpreter: it is at work at once, which on a host with fewer cores than
    GPUs is most of what eight children cost. Children of different GPUs run at once: start forks
    each from one thread, before any waits; answer waits for one, from any thread. pids holds
    every child's pid that answered. program: what the child runs with the request (_cuda.answer).
    A child past its deadline in D state in the driver (read from proc) is driver_hung."""

    proc = '/proc'

    def __init__(self, program=None, library=_cuda.LIBRARY, level=_cuda.DEFAULT_LEVEL):
        self.program = program or _cuda.answer
        self.library = library
        self.level = level
        self.pids = set()
        self._lock = threading.Lock()

    def start(self, gpu, mib):
        """gpu's child, started; GpuopsError when no child can be started."""
        return self.fork(gpu, dict(library=self.library, mib=mib, level=self.level,
                                   gpus=[dict(index=gpu.get('index'), pci_bus_id=gpu['pci_bus_id'])]))

    def fork(self, gpu, request, keep=(), env=None):
        """The child of gpu, running self.program with request; keep: descriptors it keeps; env:
        its CUDA environment (visible_only(gpu) by default)."""
        env = visible_only(gpu) if env is None else env
        try:
            return Forked(self.program, (request,), env=env, unset=[name for name in CUDA_ENVIRONMENT if name not in env],
                          keep=keep)
        except OSError as exc:
            raise GpuopsError('%s could not be started: %s' % (PROBE_NAME, exc.strerror or exc))

    def answer(self, child, timeout):
        """The answer of a started child, within timeout seconds of its start."""
        runner = Runner(PROBE_NAME, name=PROBE_NAME)
        runner.proc = self.proc
        rc, stdout, stderr = runner.finish(child, timeout, [PROBE_NAME], started=child.started)
        if rc < 0:
            raise ProbeCrashed('%s %s%s' % (PROBE_NAME, exit_words(rc), said(stderr)), last_call(stderr))
        if rc != 0:
            raise GpuopsError('%s %s%s' % (PROBE_NAME, exit_words(rc), said(stderr)))
        answer = parse_answer(stdout, stderr)
        with self._lock:
            self.pids.add(answer.get('pid'))
        return answer

    def run(self, gpu, mib, timeout):
        return self.answer(self.start(gpu, mib), timeout)


def exit_words(rc):
    if rc < 0:
        try:
            return 'was killed by %s' % signal.Signals(-rc).name
        except ValueError:
            return 'was killed by signal %d' % -rc
    return 'exited with status %d' % rc


def last_call(stderr):
    """The CUDA call the child said it was making last, or None when it made none."""
    calls = [line[len(_cuda.CALLING):] for line in stderr.splitlines() if line.startswith(_cuda.CALLING)]
    return printable(calls[-1], limit=80) if calls else None


def said(stderr):
    lines = [line for line in stderr.strip().splitlines() if line.strip() and not line.startswith(_cuda.CALLING)]
    return ': %s' % printable(lines[-1], limit=300) if lines else ''


def parse_answer(stdout, stderr):
    """The child's JSON answer; GpuopsError when it printed something else."""
    try:
        answer = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get('gpus'), list):
        raise GpuopsError('%s gave no answer that can be read (it printed %r)%s' % (
            PROBE_NAME, printable(stdout.strip(), limit=200), said(stderr)))
    return answer


def fail(result, **fields):
    result.update(mib=0, call=None, error_code=None)
    result.update(fields)
    result['ok'] = False


def timed_out(exc):
    """The fields of a GPU whose child was killed at its deadline: the call it hung in, when it
    had reached CUDA (the driver is stuck on that GPU), else that it never got there."""
    call = last_call(exc.stderr)
    if exc.in_driver:
        return dict(error_name='PROBE_TIMEOUT', call=call, error_string=driver_hung(
            'the probe of this GPU%s' % (' (%s)' % call if call else ''), exc.how_stuck()))
    if call:
        text = 'no answer within %.1f s; the probe of this GPU was killed (the call hung in the driver)' % exc.timeout
    else:
        text = ('the probe of this GPU had made no CUDA call when it was killed at %.1f s (its start took the time: '
                'the host may be overloaded)' % exc.timeout)
    return dict(error_name='PROBE_TIMEOUT', call=call, error_string=text)


# What the parent takes of a child's result for its GPU (kernel: whether the probe's kernels wrote
# and checked every word it allocated; level: what it set out to prove).
ANSWER_FIELDS = ('ok', 'ms', 'mib', 'level', 'kernel', 'bytes_checked', 'kernel_ms', 'call', 'error_code',
                 'error_name', 'error_string')


def merge(result, answer, fields=ANSWER_FIELDS):
    """Put the child's answer for one GPU (fields of it) into its result."""
    if answer.get('init'):
        fail(result, **answer['init'])
        return
    found = answer['gpus'][0] if len(answer['gpus']) == 1 else None
    if not isinstance(found, dict) or found.get('pci_bus_id') != result.get('pci_bus_id'):
        fail(result, error_name='PROBE_ERROR', error_string='%s answered for %d GPUs other than the one it was asked '
             'for' % (PROBE_NAME, len(answer['gpus'])))
        return
    fields = dict((key, found.get(key)) for key in fields)
    fields['ok'] = fields['ok'] is True
    fields['kernel'] = fields['kernel'] is True
    result.update(fields)


class Prober:
    """One probe: read, allocate on each GPU in the child, wait until the probe's memory is
    released, say what was found. The reader is the one seam to the GPUs' counters, the child
    the one to CUDA."""

    # What is taken of each child's answer for its GPU.
    answer_fields = ANSWER_FIELDS

    def __init__(self, reader, options, child=None):
        self.reader = reader
        self.options = options
        self.child = child or ProbeChild(library=options.cuda_library, level=options.probe_level)
        self.budget = Budget('the probe', options.timeout)
        self.deadline = time.monotonic() + options.timeout

    def left(self):
        return max(0.0, self.deadline - time.monotonic())

    def run(self, check_mode=False, snapshot=None):
        """snapshot: a read of the GPUs just made (the release's last, whose warnings were said
        already); the GPUs are read when None."""
        warnings = []
        if snapshot is None:
            started = time.monotonic()
            snapshot = self.reader.read(timeout=self.left())
            self.budget.spend('reading the GPUs', started)
            warnings = snapshot.warnings
        check_expected_gpus(snapshot.gpus + snapshot.missing, self.options.expected_gpus)
        scope = select_gpus(snapshot, self.options.gpus)
        result = ProbeResult([blank_result(gpu) for gpu in scope])
        result.warnings.extend(warnings)
        self.driver_version = snapshot.driver_version
        if not check_mode:
            self._probe(scope, result)
        result.duration_ms = round((time.monotonic() - result.started) * 1000.0, 1)
        if result.probed:
            send_syslog(log_line(result, self.driver_version), self.options.host_root)
        return result

    def _probe(self, scope, result):
        readable = [(gpu, res) for gpu, res in zip(scope, result.gpus) if not self._lost(gpu, res)]
        if not readable:
            return
        library_error = loadable(self.options.cuda_library) or self._answers(readable)
        if library_error:
            self._missing_library(library_error, result)
            return
        result.probed = True
        warning = exclusive_warning([res for dummy, res in readable])
        if warning:
            result.warnings.append(warning)
        self._wait_released(readable)
        self._judge(readable, result)
        self._record(readable, result)

    def _while_answering(self, probed, children):
        """Called once every GPU's child runs, while their answers are awaited: nothing here."""

    def _judge(self, probed, result):
        """Once the answers are in: nothing more is judged here (a GPU with reasons in its slow
        list is never called verified)."""

    def _record(self, probed, result):
        """Each GPU proven (its probe passed and its memory was released) gets verified_at, and a
        record by UUID in the state directory (result.verified: every GPU's last). A GPU whose
        every probed byte the kernel checked is cured as a reset cures it: its older Xid errors no
        longer count in its health."""
        now = time.time()
        proven = [(gpu, res) for gpu, res in probed if res.get('ok') and res.get('released') and not res.get('slow')]
        for dummy, res in proven:
            res['verified_at'] = round(now, 3)
        state = StateDir.for_host(self.options.state_dir, self.options.host_root)
        records = dict((gpu['uuid'], verification(gpu, res, self.driver_version, result)) for gpu, res in proven
                       if valid_uuid(gpu.get('uuid')))
        result.verified = dict((uuid, record) for uuid, record in record_verified(state, records).items()
                               if valid_uuid(uuid))
        cured = [gpu['uuid'] for gpu, res in proven if gpu.get('uuid') in records and res.get('kernel') is True]
        if cured:
            record_cure(state, cured, now, 'probe', boot_id())
        result.warnings.extend(state.warnings)
        self._record_history(probed, proven, cured, now, result)

    def _record_history(self, probed, proven, cured, now, result):
        """Each probe's result in its GPU's history (a pass repeated is counted on the last
        one), and the cures it made."""
        history = History.for_host(self.options.host_root, self.options.state_dir)
        passed = [gpu.get('uuid') for gpu, dummy in proven]
        history.record([(gpu.get('uuid'), gpu.get('index'), 'probe passed') for gpu, dummy in proven], 'probe', now,
                       result='pass')
        failed = [(gpu.get('uuid'), gpu.get('index'), '%s: %s' % (res.get('error_name') or 'failed', res.get('error_string') or ''))
                  for gpu, res in probed if gpu.get('uuid') not in passed]
        history.record(failed, 'probe', now, result='fail')
        history.record([(uuid, dict((gpu.get('uuid'), gpu.get('index')) for gpu, dummy in proven).get(uuid),
                         'every probed byte checked by the kernel') for uuid in cured], 'cure', now, how='probe',
                       outcome='cured', proof='probe')
        result.warnings.extend(warning for warning in history.warnings if warning not in result.warnings)

    @staticmethod
    def _lost(gpu, res):
        if not gpu.get('error') and gpu.get('index') is not None and gpu.get('pci_bus_id'):
            return False
        res.update(ok=False, error_name='GPU_LOST', error_string=gpu.get('error') or 'not readable')
        return True

    def _answers(self, probed):
        """Each GPU probed by a child of its own, all at once, each answer (or why there is none)
        put into its GPU's result; the library's error when libcuda cannot be loaded, else None."""
        started = time.monotonic()
        timeout = self.left() - READ_RESERVE_S
        try:
            check_time_left('run %s' % PROBE_NAME, timeout)
        except NoTimeLeft:
            for dummy, res in probed:
                fail(res, error_name='PROBE_ERROR', error_string='not probed: no time was left for %s (%s; %.1f s '
                     'are kept for the reads after it)' % (PROBE_NAME, self.budget.used(), READ_RESERVE_S))
            return None
        answers = [None] * len(probed)
        # Every child forked first, from this thread alone; then one thread waits for each.
        children = [self._start(gpu, res) for gpu, res in probed]
        threads = [threading.Thread(target=self._answer, args=(child, res, timeout, answers, position))
                   for position, (child, (dummy, res)) in enumerate(zip(children, probed)) if child is not None]
        for thread in threads:
            thread.start()
        self._while_answering(probed, children)
        for thread in threads:
            thread.join()
        self.budget.spend('the CUDA probe', started)
        return next((answer['library_error'] for answer in answers if answer and answer.get('library_error')), None)

    def _start(self, gpu, res):
        try:
            return self.child.start(gpu, self.options.probe_mib)
        except GpuopsError as exc:
            fail(res, error_name='PROBE_ERROR', error_string=str(exc))
            return None

    def _answer(self, child, res, timeout, answers, position):
        """One GPU's child: its answer merged into res (and kept in answers), or why it gave none."""
        try:
            answer = self.child.answer(child, timeout)
        except CommandTimeout as exc:
            fail(res, **timed_out(exc))
        except ProbeCrashed as exc:
            fail(res, error_name='PROBE_CRASHED', call=exc.call, error_string=str(exc))
        except GpuopsError as exc:
            fail(res, error_name='PROBE_ERROR', error_string=str(exc))
        except Exception as exc:  # a thread's error would be lost: said, as the child's are
            fail(res, error_name='PROBE_ERROR', error_string='%s: %s' % (type(exc).__name__, exc))
        else:
            answers[position] = answer
            if not answer.get('library_error'):
                merge(res, answer, self.answer_fields)

    def _missing_library(self, message, result):
        if self.options.missing_library == 'skip':
            result.skipped = True
            result.warnings.append('%s; nothing was probed (missing_library=skip)' % message)
        else:
            result.library_error = '%s (set missing_library=skip to go on without the probe)' % message

    def _wait_released(self, probed):
        """Poll the reader until no probed GPU shows the probe's memory, or the deadline; a GPU
        that still does when time is up has failed (the probe must not be what the next job finds).
        The reads are light: memory and processes are all it looks at."""
        baseline = dict((gpu.get('index'), gpu.get('memory_used_mib')) for gpu, dummy in probed)
        pending = dict((gpu.get('index'), res) for gpu, res in probed)
        while pending and self.left() >= CALL_FLOOR_S:
            started = time.monotonic()
            try:
                snapshot = self.reader.read(timeout=self.left(), full=False)
            except NoTimeLeft:  # a read of several calls, the last of them left short
                break
            finally:
                self.budget.spend('waiting for the memory to be released', started)
            for gpu in snapshot.gpus:
                if gpu.get('index') in pending and self._released(gpu, baseline[gpu.get('index')]):
                    pending.pop(gpu.get('index'))['released'] = True
            if not pending:
                break
            time.sleep(min(RELEASE_POLL_S, self.left()))
        for res in pending.values():
            self._not_released(res)

    def _released(self, gpu, before):
        pids = set(process.get('pid') for process in gpu.get('processes') or [])
        if pids & self.child.pids:
            return False
        used = gpu.get('memory_used_mib')
        return used is None or used <= max(before or 0, self.options.memory_threshold_mib)

    def _not_released(self, res):
        res['released'] = False
        if res['ok'] is not False:
            res.update(ok=False, call=None, error_code=None, error_name='PROBE_MEMORY_HELD',
                       error_string="the probe's memory still read as used %.1f s after the probe began "
                                    '(timeout)' % self.options.timeout)


def probe(reader, options, check_mode=False, child=None, snapshot=None):
    """Run the allocation probe; returns a ProbeResult. Raises GpuopsError when the GPUs cannot
    be read or an option is wrong. snapshot: a read just made, which the probe starts from."""
    return Prober(reader, options, child).run(check_mode, snapshot)


# The release's option probe: the release proves the GPUs it left clean itself, in the same
# module call (the sequence's usual path stays one call on the host).
RELEASE_PROBE_SPEC = dict(
    mib=dict(type='int', default=DEFAULT_PROBE_MIB),
    level=dict(type='str', default=_cuda.DEFAULT_LEVEL, choices=list(_cuda.LEVELS)),
    missing_library=dict(type='str', default='skip', choices=list(MISSING_LIBRARY_CHOICES)),
    cuda_library=dict(type='str', default=_cuda.LIBRARY),
    timeout=dict(type='float', default=DEFAULT_TIMEOUT_S),
)


def probe_scope(gpus, shared, gpus_after):
    """The GPUs a release probes: those in its scope (gpus; None: every GPU it read, gpus_after)
    but the ones Slurm shares with other jobs, which they may be using. None: every GPU."""
    if not shared:
        return gpus
    scope = gpus if gpus is not None else [gpu.get('index') for gpu in gpus_after]
    return [index for index in scope if index not in set(shared)]


def probe_after_release(reader, release_options, params, gpus, snapshot=None):
    """The probe a release runs on the GPUs it left clean, from its last read (snapshot): (what
    the report keeps of it; its warnings). A probe that cannot run is its failure, never the
    release's: the GPUs were released."""
    if gpus == []:
        return dict(probed=False, library_missing=False, gpus=[], duration_ms=None, verified={}, failure=None), []
    try:
        options = ProbeOptions(gpus, params['mib'], params['timeout'], release_options.memory_threshold_mib,
                               params['missing_library'], params['cuda_library'], release_options.expected_gpus,
                               release_options.state_dir, release_options.host_root,
                               params.get('level') or _cuda.DEFAULT_LEVEL)
        result = probe(reader, options, snapshot=snapshot)
    except GpuopsError as exc:
        return dict(probed=False, library_missing=False, gpus=[], duration_ms=None, verified={}, failure=str(exc)), []
    return dict(result.dump(), failure=result.failure), result.warnings
