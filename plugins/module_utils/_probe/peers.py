# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The performance level's pair check: every two GPUs that can reach each other's memory copy to
each other directly, and a GPU whose peer copies are slow or hang, or whose NVLinks are down or
count errors, is named.

What it proves: for every ordered pair of GPUs that cuDeviceCanAccessPeer allows both ways (every
pair of an NVSwitch board, the GPUs under one PCIe switch elsewhere), that peer access can be
enabled and that one copy of COPY_MIB goes through at the pair's bandwidth, timed with events on
the GPU's stream; and, from the module's own reader before and after the copies, which NVLinks are
up and whether their error counters grew while the copies ran.

What it costs: one child (forked, as each GPU's probe is, every GPU of the check visible to it)
holds a context and COPY_MIB on each GPU while it runs. A pair copies 256 MiB in 0.7 ms at the
370 GB/s of an H200's NVLink and 5 ms at PCIe Gen5's 53 GB/s: the 56 pairs of 8 GPUs take well
under a second beyond the contexts. A copy that hangs costs its wait (PAIR_WAIT_S), and a GPU
that hung with HUNG_PEERS_TO_STOP peers without finishing any copy is tried no more, so that one
dead copy engine costs two waits, not one for each of its pairs.

Imported by the probe module alone, as the rest of the performance level.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import json
import os
import statistics
import sys
import threading
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.conductor import (
    COPIED,
    COPY,
    COPY_MIB,
    GB,
    READY,
    SIGNATURES as PERFORMANCE_SIGNATURES,
    Control,
    await_word,
    fork_conducted,
    slow,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.nvlinks import COUNTER_WORDS, NVLINK_COUNTERS
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import (
    EXCLUSIVE_MODES,
    ProbeChild,
    exit_words,
    gpu_name,
    last_call,
    said,
    valid_uuid,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Runner

# How long one pair's copy (peer access enabled both ways, the copy, its events) may take before
# it is called hung: 256 MiB take 40 ms even at PCIe Gen3 x8's 6.7 GB/s, and enabling peer access
# maps the peer's memory in milliseconds.
PAIR_WAIT_S = 2.0
# A GPU that hung with this many peers, and finished no copy, is tried no more: it is the culprit.
HUNG_PEERS_TO_STOP = 2
# How long the child waits for every GPU's context, buffer and events (made at once, in parallel):
# a GPU not ready by then is left out, as hung in its first calls.
OPEN_WAIT_S = 10.0
PAIR_CHECK = 'the pair check'
# What the child writes to stderr as each pair begins: a child killed at its deadline names it.
PAIR = 'pair '
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
# Every CUDA call is said on stderr before it is made, and the parent may read stderr only once the
# pairs are done: on a host of many GPUs the pipe's 64 KiB would fill and stall the child. 1 MiB is
# what Linux lets any process ask for (/proc/sys/fs/pipe-max-size); F_SETPIPE_SZ is 1031 in fcntl.h.
STDERR_PIPE_BYTES = 1024 * 1024
F_SETPIPE_SZ = 1031

# Why a GPU is named by the pair check (its result's slow[].reason, with the performance level's).
NVLINK_DOWN = 'NVLINK_DOWN'
NVLINK_ERRORS = 'NVLINK_ERRORS'
P2P_BELOW_PEERS = 'P2P_BELOW_PEERS'
P2P_HUNG = 'P2P_HUNG'
P2P_FAILED = 'P2P_FAILED'
PEER_REASONS = (NVLINK_DOWN, NVLINK_ERRORS, P2P_BELOW_PEERS, P2P_HUNG, P2P_FAILED)

# The entry points the pair check adds to the performance level's (cuda.h of CUDA 12.4).
SIGNATURES = dict(PERFORMANCE_SIGNATURES, **{
    'cuDeviceCanAccessPeer': (ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int),
    'cuCtxEnablePeerAccess': (ctypes.c_void_p, ctypes.c_uint),
    'cuCtxSetCurrent': (ctypes.c_void_p,),
    'cuMemcpyPeerAsync': (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                          ctypes.c_void_p),
})


# ---------------------------------------------------------------- the child

class GpuSide:
    """One GPU in the pair child: its context, its buffer of COPY_MIB, two events, and why it was
    left out (failure), if it was."""

    def __init__(self, gpu):
        self.index = gpu.get('index')
        self.pci_bus_id = gpu['pci_bus_id']
        self.device = ctypes.c_int()
        self.context = ctypes.c_void_p()
        self.buffer = ctypes.c_uint64()
        self.events = [ctypes.c_void_p(), ctypes.c_void_p()]
        self.call = None
        self.failure = None
        self.hung = False


class PairCheck:
    """The pair child's work: every GPU opened, READY said, and on COPY every ordered pair that
    can reach each other both ways copied once, each in a thread of its own given pair_wait_s;
    COPIED said at the end (the control's pipes are its caller's to close). A pair's copy is launched from its source's context, unless a hung
    copy holds that context's stream (every later copy there would queue behind it): then from
    its destination's."""

    def __init__(self, cuda, request, control):
        self.cuda = cuda
        self.control = control
        self.sides = [GpuSide(gpu) for gpu in request['gpus']]
        self.pair_wait_s = float(request.get('pair_wait_s') or PAIR_WAIT_S)
        self.open_wait_s = float(request.get('open_wait_s') or OPEN_WAIT_S)
        self.copy_until = request.get('copy_until')
        self.copy_s = request.get('copy_s')
        self.copy_bytes = COPY_MIB * _cuda.MIB
        self.pairs = []
        self.capable = []
        # Contexts whose stream holds a hung copy; (context, peer) that peer access was enabled for;
        # the peers each GPU hung with; the GPUs with a copy that ended (measured or failed).
        self.blocked = set()
        self.enabled = set()
        self.hung_with = dict((side.index, set()) for side in self.sides)
        self.ended = set()

    def run(self, answer):
        self._open_all()
        usable = [side for side in self.sides if side.failure is None]
        answer['unusable'] = [side.failure for side in self.sides if side.failure is not None]
        self._find_capable(usable)
        answer['peer_capable'] = [[source.index, target.index] for source, target in self.capable]
        self.control.say(READY)
        if self.control.next(None) == COPY:
            answer['copied'] = True
            if self.copy_s is not None:
                self.copy_until = min(self.copy_until or float('inf'), time.monotonic() + self.copy_s)
            for source, target in self.capable:
                self.pairs.append(self._pair(source, target))
            self.control.say(COPIED)
        answer['pairs'] = self.pairs
        self._teardown()

    # -- opening

    def _open_all(self):
        threads = [threading.Thread(target=self._open, args=(side,)) for side in self.sides]
        deadline = time.monotonic() + self.open_wait_s
        for thread in threads:
            thread.daemon = True
            thread.start()
        for thread, side in zip(threads, self.sides):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                side.hung = True
                side.failure = dict(index=side.index, call=side.call, error_name='PROBE_TIMEOUT',
                                    error_string='its context, buffer and events were not made within %.1f s'
                                                 '%s' % (self.open_wait_s, ' (in %s)' % side.call if side.call else ''))

    def _open(self, side):
        try:
            self._side_call(side, 'cuDeviceGetByPCIBusId', ctypes.byref(side.device), side.pci_bus_id.encode('ascii'))
            self._side_call(side, 'cuCtxCreate_v2', ctypes.byref(side.context), 0, side.device)
            self._side_call(side, 'cuMemAlloc_v2', ctypes.byref(side.buffer), self.copy_bytes)
            for event in side.events:
                self._side_call(side, 'cuEventCreate', ctypes.byref(event), 0)
        except _cuda.CudaError as exc:
            side.failure = dict((key, value) for key, value in _cuda.failure(self.cuda, exc).items() if key != 'ok')
            side.failure['index'] = side.index
        except Exception as exc:  # said, never a traceback
            side.failure = dict(index=side.index, call=side.call, error_name=_cuda.PROBE_ERROR,
                                error_string='%s: %s' % (type(exc).__name__, exc))

    def _side_call(self, side, name, *args):
        side.call = name
        self.cuda.call(name, *args)

    def _find_capable(self, usable):
        """The ordered pairs whose GPUs can reach each other's memory both ways; a pair the driver
        cannot say for is a pair that failed."""
        for source in usable:
            for target in usable:
                if source is target:
                    continue
                try:
                    if self._can_access(source, target) and self._can_access(target, source):
                        self.capable.append((source, target))
                except _cuda.CudaError as exc:
                    self.pairs.append(dict(blank_pair(source.index, target.index), **pair_failure(self.cuda, exc)))

    def _can_access(self, side, peer):
        can = ctypes.c_int()
        self.cuda.call('cuDeviceCanAccessPeer', ctypes.byref(can), side.device, peer.device)
        return can.value == 1

    # -- the pairs

    def _pair(self, source, target):
        pair = blank_pair(source.index, target.index)
        why, launcher = self._why_not(source, target)
        if why:
            pair['skipped'] = why
            return pair
        pair['timed_on'] = launcher.index
        sys.stderr.write('%s%s %s\n' % (PAIR, source.index, target.index))
        sys.stderr.flush()
        outcome = {}
        thread = threading.Thread(target=self._copy_safely, args=(outcome, source, target, launcher))
        thread.daemon = True
        thread.start()
        thread.join(self.pair_wait_s)
        if thread.is_alive():
            pair.update(hung=True, call=outcome.get('call'))
            self.blocked.add(outcome.get('current', launcher.index))
            self.hung_with[source.index].add(target.index)
            self.hung_with[target.index].add(source.index)
            return pair
        self.ended.update((source.index, target.index))
        pair.update(outcome.get('fields') or {})
        return pair

    def _why_not(self, source, target):
        """(why the pair is not tried, or None; the side whose context launches its copy)."""
        if self.copy_until is not None and time.monotonic() + self.pair_wait_s > self.copy_until:
            return 'not tried: no time was left for its wait of %.1f s' % self.pair_wait_s, None
        for side in (source, target):
            if len(self.hung_with[side.index]) >= HUNG_PEERS_TO_STOP and side.index not in self.ended:
                return 'not tried: GPU %s hung with %d peers and finished no copy' % (
                    side.index, len(self.hung_with[side.index])), None
        launcher = next((side for side in (source, target) if side.index not in self.blocked), None)
        if launcher is None:
            return "not tried: a hung copy holds both GPUs' streams", None
        return None, launcher

    def _copy_safely(self, outcome, source, target, launcher):
        try:
            outcome['fields'] = dict(gbps=self._copy(outcome, source, target, launcher))
        except _cuda.CudaError as exc:
            outcome['fields'] = pair_failure(self.cuda, exc)
        except Exception as exc:  # said, never a traceback
            outcome['fields'] = dict(call=outcome.get('call'), error_name=_cuda.PROBE_ERROR,
                                     error_string='%s: %s' % (type(exc).__name__, exc))

    def _copy(self, outcome, source, target, launcher):
        """GB/s of one copy of the pair, after peer access enabled from each side that can."""
        for side, peer in ((source, target), (target, source)):
            if side.index in self.blocked or (side.index, peer.index) in self.enabled:
                continue
            self._make_current(outcome, side)
            try:
                self._pair_call(outcome, 'cuCtxEnablePeerAccess', peer.context, 0)
            except _cuda.CudaError as exc:
                if exc.code != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
                    raise
            self.enabled.add((side.index, peer.index))
        self._make_current(outcome, launcher)
        start, end = launcher.events
        self._pair_call(outcome, 'cuEventRecord', start, None)
        self._pair_call(outcome, 'cuMemcpyPeerAsync', target.buffer, target.context, source.buffer, source.context,
                        self.copy_bytes, None)
        self._pair_call(outcome, 'cuEventRecord', end, None)
        self._pair_call(outcome, 'cuEventSynchronize', end)
        elapsed = ctypes.c_float()
        self._pair_call(outcome, 'cuEventElapsedTime', ctypes.byref(elapsed), start, end)
        if elapsed.value <= 0:
            return None
        return round(self.copy_bytes / (elapsed.value / 1000.0) / GB, 1)

    def _make_current(self, outcome, side):
        outcome['current'] = side.index
        self._pair_call(outcome, 'cuCtxSetCurrent', side.context)

    def _pair_call(self, outcome, name, *args):
        outcome['call'] = name
        self.cuda.call(name, *args)

    # -- the end

    def _teardown(self):
        """Everything freed and destroyed but what a hung call may still use (the contexts of a
        hung pair, a GPU hung while opening), in a thread given pair_wait_s: a destruction that
        hangs does not cost the answer."""
        held = set()
        for pair in self.pairs:
            if pair['hung']:
                held.update((pair['src'], pair['dst']))
        sides = [side for side in self.sides if side.context.value and not side.hung and side.index not in held]
        thread = threading.Thread(target=self._destroy, args=(sides,))
        thread.daemon = True
        thread.start()
        thread.join(self.pair_wait_s)

    def _destroy(self, sides):
        for side in sides:
            steps = [('cuCtxSetCurrent', side.context)] + [('cuEventDestroy_v2', event) for event in side.events]
            steps += [('cuMemFree_v2', side.buffer), ('cuCtxDestroy_v2', side.context)]
            for name, handle in steps:
                if not handle.value:
                    continue
                try:
                    self.cuda.call(name, handle)
                except _cuda.CudaError:  # the context's destruction frees what it made
                    pass


def blank_pair(source, target):
    return dict(src=source, dst=target, gbps=None, hung=False, skipped=None, timed_on=None, call=None,
                error_name=None, error_string=None)


def pair_failure(cuda, exc):
    found = _cuda.failure(cuda, exc)
    return dict(call=found['call'], error_name=found['error_name'], error_string=found['error_string'])


def widen_stderr():
    try:
        import fcntl
        fcntl.fcntl(2, getattr(fcntl, 'F_SETPIPE_SZ', F_SETPIPE_SZ), STDERR_PIPE_BYTES)
    except (ImportError, IOError, OSError, ValueError):  # not a pipe, or not Linux: as it is
        pass


def answer(request, cuda=None):
    """The pair child: its answer, one JSON line on stdout. cuda: the driver's entry points (the
    request's library, with SIGNATURES, by default)."""
    control = Control(*request['control'])
    found = dict(pid=os.getpid(), library_error=None, init=None, error=None, copied=False,
                 pair_wait_s=float(request.get('pair_wait_s') or PAIR_WAIT_S), pairs=[], peer_capable=[], unusable=[],
                 gpus=[])
    widen_stderr()
    try:
        cuda = cuda or _cuda.Cuda(request.get('library') or _cuda.LIBRARY, SIGNATURES)
        try:
            cuda.call('cuInit', 0)
        except _cuda.CudaError as exc:
            found['init'] = _cuda.failure(cuda, exc)
        else:
            PairCheck(cuda, request, control).run(found)
    except _cuda.LibraryError as exc:
        found['library_error'] = str(exc)
    except Exception as exc:  # said, never a traceback
        found['error'] = '%s: %s' % (type(exc).__name__, exc)
    finally:
        control.close()
    # A hung copy's thread is a daemon, and the forked child ends with os._exit: nothing waits for it.
    sys.stdout.write(json.dumps(found) + '\n')
    sys.stdout.flush()


# ---------------------------------------------------------------- the parent

def visible_all(gpus):
    """The CUDA environment of the pair child: every GPU of the check visible by its UUID, so that
    cuInit brings up those alone; none set when a UUID is not one (the child finds each GPU by its
    bus id either way)."""
    uuids = [gpu.get('uuid') for gpu in gpus]
    if uuids and all(valid_uuid(uuid) for uuid in uuids):
        return dict(CUDA_VISIBLE_DEVICES=','.join(uuids))
    return {}


def pair_scope(gpus):
    """(the GPUs of the pair check, warnings): those with an index and a bus id, but GPUs in an
    exclusive compute mode, where the pair child's context and the GPU's own probe's would refuse
    each other; none when fewer than two are left."""
    scope, warnings = [], []
    for gpu in gpus:
        if gpu.get('index') is None or not gpu.get('pci_bus_id') or gpu.get('error'):
            continue
        if gpu.get('compute_mode') in EXCLUSIVE_MODES:
            warnings.append('%s is in %s compute mode: it is left out of %s (its own probe holds its one '
                            'context)' % (gpu_name(gpu), gpu['compute_mode'], PAIR_CHECK))
            continue
        scope.append(gpu)
    return (scope if len(scope) > 1 else []), warnings


class PeerChild(ProbeChild):
    """Starts the pair child with a pipe each way to the conductor, and collects its answer; pids
    holds the pid of every pair child started (the probe waits for their memory too)."""

    def __init__(self, library=_cuda.LIBRARY):
        super(PeerChild, self).__init__(answer, library, 'performance')

    def start_pairs(self, gpus, pair_wait_s=PAIR_WAIT_S, copy_s=None, copy_until=None, open_wait_s=OPEN_WAIT_S):
        """(the child, its Channel) for gpus. No pair is begun with less than its pair_wait_s left
        before copy_s seconds from the word COPY, nor before copy_until (a time.monotonic(): a
        forked child shares this process's clock); None: no bound. open_wait_s: how long it waits
        for the GPUs' contexts before READY. Fork it from one thread, before any other starts, as
        every probe child is."""
        request = dict(library=self.library, pair_wait_s=pair_wait_s, copy_s=copy_s, copy_until=copy_until,
                       open_wait_s=open_wait_s,
                       gpus=[dict(index=gpu.get('index'), pci_bus_id=gpu['pci_bus_id']) for gpu in gpus])
        child, channel = fork_conducted(lambda request, keep: self.fork(None, request, keep, visible_all(gpus)), request)
        with self._lock:
            self.pids.add(child.pid)
        return child, channel

    def answer(self, child, timeout):
        """The child's answer within timeout seconds of its start; GpuopsError (CommandTimeout when
        it was killed at its deadline) when there is none."""
        runner = Runner(PAIR_CHECK, name=PAIR_CHECK)
        runner.proc = self.proc
        rc, stdout, stderr = runner.finish(child, timeout, [PAIR_CHECK], started=child.started)
        if rc != 0:
            raise GpuopsError('%s %s%s' % (PAIR_CHECK, exit_words(rc), said(stderr)))
        try:
            found = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
        except ValueError:
            found = None
        if not isinstance(found, dict) or not isinstance(found.get('pairs'), list):
            raise GpuopsError('%s gave no answer that can be read (it printed %r)%s' % (
                PAIR_CHECK, printable(stdout.strip(), limit=200), said(stderr)))
        return found

    def collect(self, child, timeout):
        """The child's answer (its failure None), or one that says why there is none (its failure:
        error_name, error_string, the call and the pair it was in when killed). timeout: seconds
        from the child's start, as answer takes. Best run in a thread of its own from the start, as
        the probe's answers are: what the child writes is read as it comes. The child ends once it
        has copied, or once its channel is closed."""
        try:
            found = self.answer(child, timeout)
        except CommandTimeout as exc:
            pair = last_pair(exc.stderr)
            where = '; it was in the pair GPU %s to GPU %s' % tuple(pair) if pair else ''
            return no_answer(child, 'PROBE_TIMEOUT', '%s%s' % (exc, where), last_call(exc.stderr), pair)
        except GpuopsError as exc:
            return no_answer(child, 'PROBE_ERROR', str(exc))
        found['failure'] = None
        return found

    def conduct(self, child, channel, deadline):
        """The pairs copied (READY awaited, COPY said, COPIED awaited before deadline, a
        time.monotonic()), the channel closed, and the answer collected by deadline: collected
        from the start, in a thread, so that what the child writes is read as it comes."""
        collected = {}

        def collect():
            try:
                collected['found'] = self.collect(child, deadline - child.started)
            except Exception as exc:  # a thread's error would be lost: said, as the child's are
                collected['found'] = no_answer(child, 'PROBE_ERROR', '%s: %s' % (type(exc).__name__, exc))

        thread = threading.Thread(target=collect)
        thread.start()
        try:
            copy_pairs(channel, deadline)
        finally:
            channel.close()
            thread.join()
        return collected['found']


def copy_pairs(channel, deadline):
    """Whether the pair child said it copied, READY awaited and COPY said before deadline."""
    if not await_word([channel], READY, deadline) or not channel.say(COPY):
        return False
    return bool(await_word([channel], COPIED, deadline))


def last_pair(stderr):
    """[source, destination] of the pair the child said it began last, or None."""
    pairs = [line[len(PAIR):].split() for line in (stderr or '').splitlines() if line.startswith(PAIR)]
    pairs = [pair for pair in pairs if len(pair) == 2 and all(part.isdigit() for part in pair)]
    return [int(part) for part in pairs[-1]] if pairs else None


def no_answer(child, error_name, error_string, call=None, pair=None):
    return dict(pid=child.pid, library_error=None, init=None, error=None, copied=False, pair_wait_s=None, pairs=[],
                peer_capable=[], unusable=[], gpus=[],
                failure=dict(error_name=error_name, error_string=error_string, call=call, pair=pair))


def named(results_by_index, index):
    res = (results_by_index or {}).get(index)
    return gpu_name(res) if res else 'GPU %s' % index


def pair_warnings(found, results_by_index=None):
    """What the pair child's answer (or its want of one) says beside the GPUs' reasons."""
    warnings = []
    if found.get('failure'):
        failure = found['failure']
        warnings.append('%s gave no answer (%s): %s%s; no pair is judged' % (
            PAIR_CHECK, failure['error_name'], printable(failure['error_string'], 300),
            ' (at %s)' % failure['call'] if failure.get('call') else ''))
    if found.get('library_error'):
        warnings.append('%s could not run: %s' % (PAIR_CHECK, found['library_error']))
    if found.get('init'):
        warnings.append('%s could not run: cuInit failed with %s (%s)' % (
            PAIR_CHECK, found['init'].get('error_name'), found['init'].get('error_string')))
    if found.get('error'):
        warnings.append('%s failed: %s' % (PAIR_CHECK, printable(found['error'], 300)))
    for failure in found.get('unusable') or []:
        warnings.append('%s left %s out: %s at %s (%s)' % (
            PAIR_CHECK, named(results_by_index, failure.get('index')), failure.get('error_name'), failure.get('call'),
            printable(failure.get('error_string') or '', 300)))
    late = [pair for pair in found.get('pairs') or [] if (pair.get('skipped') or '').startswith('not tried: no time')]
    if late:
        warnings.append('%s had no time left for %d of its %d pairs: they are not judged' % (
            PAIR_CHECK, len(late), len(found['pairs'])))
    return warnings


# ---------------------------------------------------------------- the verdict

def nvlink_fields(index, nvlinks_before, nvlinks_after):
    """A GPU's nvlink result: {links, active, down, errors} of the read after the copies (the one
    before when that failed), errors being how much each counter grew between the two (None: not
    read both times); None when neither read has the GPU."""
    before, after = (nvlinks_before or {}).get(index), (nvlinks_after or {}).get(index)
    read = after or before
    if not read:
        return None
    return dict(links=read['links'], active=list(read['active']), down=list(read['down']),
                errors=growth(before, after))


def growth(before, after):
    grown = {}
    for name, dummy in NVLINK_COUNTERS:
        first = (before or {}).get('errors', {}).get(name)
        last = (after or {}).get('errors', {}).get(name)
        grown[name] = None if first is None or last is None else max(0, last - first)
    return grown


def peer_fields(index, pairs):
    """A GPU's peers result: {median_gbps, pairs: [{peer, direction, gbps}], hung: [{peer,
    direction}], failed: [{peer, direction, call, error_name}]}; None when it was in no pair."""
    mine = [(pair, 'to' if pair['src'] == index else 'from') for pair in pairs or [] if index in (pair['src'], pair['dst'])]
    if not mine:
        return None

    def peer(pair, direction):
        return pair['dst'] if direction == 'to' else pair['src']

    speeds = [pair['gbps'] for pair, dummy in mine if pair.get('gbps')]
    return dict(median_gbps=round(statistics.median(speeds), 1) if speeds else None,
                pairs=[dict(peer=peer(pair, way), direction=way, gbps=pair['gbps']) for pair, way in mine
                       if pair.get('gbps')],
                hung=[dict(peer=peer(pair, way), direction=way) for pair, way in mine if pair.get('hung')],
                failed=[dict(peer=peer(pair, way), direction=way, call=pair.get('call'), error_name=pair['error_name'])
                        for pair, way in mine if pair.get('error_name') and not pair.get('hung')])


def peer_reasons(results_by_index, pairs, nvlinks_before, nvlinks_after, fraction, pair_wait_s=None):
    """{index: [{reason, message}]} for every GPU of results_by_index (none: an empty list), in the
    words of performance.slow_reasons: NVLINK_DOWN (links_down), NVLINK_ERRORS (errors_grown),
    P2P_BELOW_PEERS (below_peers), P2P_HUNG and P2P_FAILED (broken_pairs). pairs: the child's;
    the reads: read_nvlinks' before and after the copies; pair_wait_s: the child's, for words."""
    reasons = dict((index, []) for index in results_by_index)
    pairs = pairs or []
    links_down(results_by_index, nvlinks_before, nvlinks_after, reasons)
    errors_grown(results_by_index, nvlinks_before, nvlinks_after, reasons)
    below_peers(results_by_index, pairs, nvlinks_before, nvlinks_after, fraction, reasons)
    broken_pairs(results_by_index, pairs, pair_wait_s, reasons)
    return reasons


def links_down(results, nvlinks_before, nvlinks_after, reasons):
    """NVLINK_DOWN: a GPU with NVLink that has fewer links active than the best GPU of the host, or
    a link inactive. A GPU without NVLink is never judged."""
    reads = dict((index, nvlink_fields(index, nvlinks_before, nvlinks_after)) for index in results)
    reads = dict((index, read) for index, read in reads.items() if read and read['links'])
    most = max([len(read['active']) for read in reads.values()] or [0])
    for index, read in sorted(reads.items()):
        if len(read['active']) >= most and not read['down']:
            continue
        text = '%s: %d of its %d NVLinks are active, where the best GPU of the host has %d' % (
            named(results, index), len(read['active']), read['links'], most)
        if read['down']:
            text += '; %s %s down' % (links_words(read['down']), 'is' if len(read['down']) == 1 else 'are')
        reasons[index].append(slow(NVLINK_DOWN, text))


def links_words(links):
    return '%s %s' % ('link' if len(links) == 1 else 'links', ', '.join(str(link) for link in links))


def errors_grown(results, nvlinks_before, nvlinks_after, reasons):
    """NVLINK_ERRORS: a counter of the GPU's NVLinks that grew between the reads before and after
    the copies."""
    for index in sorted(results):
        before, after = (nvlinks_before or {}).get(index), (nvlinks_after or {}).get(index)
        if not before or not after or not after['links']:
            continue
        grown = [(name, count) for name, count in sorted(growth(before, after).items()) if count]
        if grown:
            reasons[index].append(slow(NVLINK_ERRORS, '%s: its NVLink error counters grew during the peer copies: %s '
                                       '(summed over its %d links)' % (named(results, index), ', '.join(
                                           '%s by %d' % (COUNTER_WORDS[name], count) for name, count in grown),
                                           after['links'])))


def below_peers(results, pairs, nvlinks_before, nvlinks_after, fraction, reasons):
    """P2P_BELOW_PEERS: a GPU whose median over its copies (either way) is more than fraction below
    the median of the other GPUs' medians. Judged only for a GPU that copied with two peers or
    more (with one, the pair's two GPUs have the same figures: which is slow cannot be told), and
    against GPUs with as many NVLinks (a PCIe pair is never held against an NVLink one)."""
    measured = [pair for pair in pairs if pair.get('gbps')]
    speeds, peers = {}, {}
    for pair in measured:
        for index, other in ((pair['src'], pair['dst']), (pair['dst'], pair['src'])):
            speeds.setdefault(index, []).append(pair)
            peers.setdefault(index, set()).add(other)
    medians = dict((index, statistics.median([pair['gbps'] for pair in found])) for index, found in speeds.items())

    def links(index):
        read = nvlink_fields(index, nvlinks_before, nvlinks_after)
        return read['links'] if read else None

    for index in sorted(medians):
        if index not in results or len(peers[index]) < 2:
            continue
        others = [median for other, median in medians.items() if other != index and links(other) == links(index)]
        if not others:
            continue
        median = statistics.median(others)
        bound = median * (1 - fraction)
        if medians[index] >= bound:
            continue
        slowest = min(speeds[index], key=lambda pair: pair['gbps'])
        reasons[index].append(slow(P2P_BELOW_PEERS, '%s copied peer to peer at a median of %.1f GB/s, below %.1f GB/s '
                                   '(%d %% under the median %.1f GB/s of its %d peers); its slowest copy: %s to %s at '
                                   '%.1f GB/s' % (named(results, index), medians[index], bound, round(fraction * 100),
                                                  median, len(others), named(results, slowest['src']),
                                                  named(results, slowest['dst']), slowest['gbps'])))


def broken_pairs(results, pairs, pair_wait_s, reasons):
    """P2P_HUNG and P2P_FAILED, for the GPUs of a pair whose copy hung or failed. A GPU none of
    whose copies ended (P2P_HUNG) or went through (P2P_FAILED) is the culprit of its pairs, named
    alone; a pair whose two GPUs both copied with others names both (the link between them)."""
    ended = set()
    through = set()
    for pair in pairs:
        if not pair.get('hung') and (pair.get('gbps') or pair.get('error_name')):
            ended.update((pair['src'], pair['dst']))
        if pair.get('gbps'):
            through.update((pair['src'], pair['dst']))
    wait = ' within %.1f s' % pair_wait_s if pair_wait_s else ''
    for reason, broken, fine in ((P2P_HUNG, [pair for pair in pairs if pair.get('hung')], ended),
                                 (P2P_FAILED, [pair for pair in pairs if pair.get('error_name') and not pair.get('hung')],
                                  through)):
        blamed = {}
        for pair in broken:
            culprits = [index for index in (pair['src'], pair['dst']) if index not in fine]
            for index in culprits or (pair['src'], pair['dst']):
                blamed.setdefault(index, []).append(pair)
        for index in sorted(blamed):
            if index in reasons:
                reasons[index].append(slow(reason, broken_words(results, index, blamed[index], reason, index not in fine,
                                                                wait)))


def broken_words(results, index, pairs, reason, culprit, wait):
    if reason == P2P_HUNG:
        what = 'its peer %s %s did not end%s' % ('copy' if len(pairs) == 1 else 'copies', ', '.join(
            copy_words(results, index, pair) for pair in pairs), wait)
        alone = 'and none of its copies ended' if culprit else 'though both GPUs copied with other peers'
    else:
        what = '; '.join('its peer copy %s failed with %s at %s (%s)' % (
            copy_words(results, index, pair), pair['error_name'], pair.get('call'),
            printable(pair.get('error_string') or '', 200)) for pair in pairs)
        alone = 'and none of its copies went through' if culprit else 'though both GPUs copied with other peers'
    return '%s: %s, %s' % (named(results, index), what, alone)


def copy_words(results, index, pair):
    if pair['src'] == index:
        return 'to %s' % named(results, pair['dst'])
    return 'from %s' % named(results, pair['src'])
