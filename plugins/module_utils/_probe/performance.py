# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The probe's performance level: a GPU that works, but slowly, named alone.

Each GPU's child (as at the allocation level, one per GPU, forked) first times pinned copies host
to device and back with CUDA events, then keeps copying while the parent reads the PCIe link (an
idle link drops to Gen1 by design, so only a read under load says anything), then proves its
memory as the allocation level does, timing the kernels with events for the memory's bandwidth.
The parent conducts the children through a pipe each: GPUs that share a PCIe switch never copy at
once (the topology NVML or `nvidia-smi topo -m` gives), so that each GPU's figure is its own, and
the link is read once, for every GPU, while all of them copy. A GPU is slow when its link is below
its own maximum under load, when the replay counter grew, or when a bandwidth is more than
slow_fraction below its peers' median. Before the copies, the pair check (peers.py) copies between
every two GPUs that can reach each other, with the NVLinks read around it (nvlinks.py).

Imported by the probe module alone: what the release ships every host does not grow with it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import json
import re
import statistics
import sys
import threading
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import nvlinks as _nvlinks
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import peers as _peers
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.conductor import (
    COPIED,
    COPY,
    COPY_MIB,
    DONE,
    GB,
    LOAD,
    LOADED,
    READY,
    SIGNATURES,
    Control,
    await_word,
    fork_conducted,
    slow,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import (
    ANSWER_FIELDS,
    PERFORMANCE,
    READ_RESERVE_S,
    ProbeChild,
    ProbeOptions,
    Prober,
    gpu_name,
    probe_argument_spec,
    valid_uuid,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import normalize_bus_id

# How far below its peers' median a GPU's bandwidth may be before it is called slow: well outside
# the spread of healthy GPUs (docs/benchmarks.md), well inside what a link trained down or a slow
# memory costs (a half or more).
DEFAULT_SLOW_FRACTION = 0.15
MAX_SLOW_FRACTION = 0.9
# Timed copies each way; the best counts (a copy is only ever slowed by something else).
COPY_REPS = 3
# How long the child keeps the link loaded at most while the parent reads it.
LOAD_MAX_S = 5.0
# How long the parent waits for a child's step (ready, copied, loaded) once the first child is
# ready: a GPU slower than that is left out of the step, and the others go on.
STEP_WAIT_S = 5.0
# How long a child waits for the conductor's next word at most (the pair check runs before the
# copies); the parent's deadline ends it anyway.
COMMAND_WAIT_S = 60.0

# Why a GPU is slow (its result's slow[].reason).
PCIE_LINK_DEGRADED = 'PCIE_LINK_DEGRADED'
PCIE_REPLAYS = 'PCIE_REPLAYS'
# A memory bank with no spare row left: its next row failure cannot be remapped (NVML's
# nvmlRowRemapperHistogramValues_t: none).
REMAP_HEADROOM_NONE = 'REMAP_HEADROOM_NONE'
BELOW_PEERS = (('h2d_gbps', 'H2D_BELOW_PEERS', 'copied host to device at'),
               ('d2h_gbps', 'D2H_BELOW_PEERS', 'copied device to host at'),
               ('hbm_gbps', 'HBM_BELOW_PEERS', 'read and wrote its memory at'))
# Every reason a GPU can be called slow for (each said in the module's and the guides' words).
SLOW_REASONS = (PCIE_LINK_DEGRADED, PCIE_REPLAYS, REMAP_HEADROOM_NONE) + tuple(
    reason for dummy, reason, dummy in BELOW_PEERS) + _peers.PEER_REASONS

# What the parent takes of a child's answer at this level.
PERFORMANCE_FIELDS = ANSWER_FIELDS + ('h2d_gbps', 'd2h_gbps', 'hbm_gbps')


def check_slow_fraction(slow_fraction):
    """GpuopsError when slow_fraction is not above 0 and at most MAX_SLOW_FRACTION."""
    number = isinstance(slow_fraction, (int, float)) and not isinstance(slow_fraction, bool)
    if not number or not 0 < slow_fraction <= MAX_SLOW_FRACTION:
        raise GpuopsError('slow_fraction must be more than 0 and at most %g (0.15: 15 %% below its peers), got %r'
                          % (MAX_SLOW_FRACTION, slow_fraction))


def probe_module_argument_spec():
    """The probe module's options: the probe's, and the performance level's bound."""
    return dict(probe_argument_spec(), slow_fraction=dict(type='float', default=DEFAULT_SLOW_FRACTION))


class PerformanceOptions(ProbeOptions):
    """The probe's options, and slow_fraction (the performance level's alone)."""

    slow_fraction = DEFAULT_SLOW_FRACTION

    @classmethod
    def from_params(cls, params):
        options = super(PerformanceOptions, cls).from_params(params)
        options.set_slow_fraction(params.get('slow_fraction', DEFAULT_SLOW_FRACTION))
        return options

    def set_slow_fraction(self, slow_fraction):
        check_slow_fraction(slow_fraction)
        self.slow_fraction = slow_fraction
        return self


# ---------------------------------------------------------------- the child

class PerformanceProbe(_cuda.GpuProbe):
    """One GPU at the performance level: the copies (timed, then under load for the link read)
    as the conductor says, then the allocation level's proof with its kernels timed."""

    def __init__(self, cuda, gpu, mib, level, control):
        super(PerformanceProbe, self).__init__(cuda, gpu, mib, 'allocation')
        self.control = control
        self.host = ctypes.c_void_p()
        self.device = ctypes.c_uint64()
        self.events = [ctypes.c_void_p(), ctypes.c_void_p()]
        self.copy_bytes = COPY_MIB * _cuda.MIB

    def run(self):
        result = super(PerformanceProbe, self).run()
        result['level'] = 'performance'
        return result

    def _steps(self, result):
        result.update(h2d_gbps=None, d2h_gbps=None, hbm_gbps=None)
        try:
            self._open()
            self._copies(result)
        finally:
            self.control.close()
            self._free_copy_buffers()
        fields = self._prove(result)
        if fields.get('kernel'):
            milliseconds = self._elapsed()
            if milliseconds:
                result['hbm_gbps'] = round(2.0 * result['mib'] * _cuda.MIB / (milliseconds / 1000.0) / GB, 1)
        return fields

    def _copies(self, result):
        for event in self.events:
            self.cuda.call('cuEventCreate', ctypes.byref(event), 0)
        self.cuda.call('cuMemAllocHost_v2', ctypes.byref(self.host), self.copy_bytes)
        self.cuda.call('cuMemAlloc_v2', ctypes.byref(self.device), self.copy_bytes)
        self.control.say(READY)
        while True:
            word = self.control.next(COMMAND_WAIT_S)
            if word == COPY:
                result['h2d_gbps'] = self._best('cuMemcpyHtoDAsync_v2', self.device, self.host)
                result['d2h_gbps'] = self._best('cuMemcpyDtoHAsync_v2', self.host, self.device)
                self.control.say(COPIED)
            elif word == LOAD:
                self._keep_link_loaded()
            else:
                return

    def _best(self, call, target, source):
        """The best of COPY_REPS timed copies by call, in GB/s."""
        best = None
        for dummy in range(COPY_REPS):
            self.cuda.call('cuEventRecord', self.events[0], None)
            self.cuda.call(call, target, source, self.copy_bytes, None)
            milliseconds = self._elapsed()
            if milliseconds:
                speed = self.copy_bytes / (milliseconds / 1000.0) / GB
                best = speed if best is None else max(best, speed)
        return None if best is None else round(best, 2)

    def _elapsed(self):
        """Milliseconds from the start event to now on the GPU's stream (0.0 when it cannot say)."""
        elapsed = ctypes.c_float()
        self.cuda.call('cuEventRecord', self.events[1], None)
        self.cuda.call('cuEventSynchronize', self.events[1])
        self.cuda.call('cuEventElapsedTime', ctypes.byref(elapsed), self.events[0], self.events[1])
        return elapsed.value if elapsed.value > 0 else 0.0

    def _keep_link_loaded(self):
        """Copies back to back until the conductor has read the link (LOADED once they run)."""
        deadline = time.monotonic() + LOAD_MAX_S
        said = False
        while time.monotonic() < deadline:
            self.cuda.call('cuMemcpyHtoDAsync_v2', self.device, self.host, self.copy_bytes, None)
            if not said:
                self.control.say(LOADED)
                said = True
            self.cuda.call('cuEventRecord', self.events[1], None)
            self.cuda.call('cuEventSynchronize', self.events[1])
            if self.control.waiting():
                return

    def _launch_all(self, kernels, sizes):
        # The kernels' time on the GPU's stream, for the memory's bandwidth.
        self.cuda.call('cuEventRecord', self.events[0], None)
        super(PerformanceProbe, self)._launch_all(kernels, sizes)

    def _free_copy_buffers(self):
        self._quietly('cuMemFreeHost', self.host)
        self._quietly('cuMemFree_v2', self.device)
        self.host, self.device = ctypes.c_void_p(), ctypes.c_uint64()

    def _teardown(self, result):
        for event in self.events:
            self._quietly('cuEventDestroy_v2', event)
        return super(PerformanceProbe, self)._teardown(result)

    def _quietly(self, name, handle):
        """name called on handle, when it was made; an error is left to the context's destruction,
        which frees everything the context made."""
        if not handle.value:
            return
        try:
            self.cuda.call(name, handle)
        except _cuda.CudaError:
            pass


def answer(request):
    """The child of one GPU at the performance level: its answer, one JSON line on stdout."""
    control = Control(*request['control'])

    def make_probe(cuda, gpu, mib, level):
        return PerformanceProbe(cuda, gpu, mib, level, control)

    try:
        found = _cuda.probe_all(request, make_probe, SIGNATURES)
    finally:
        control.close()  # a child that failed before its GPU's probe began
    sys.stdout.write(json.dumps(found) + '\n')
    sys.stdout.flush()


# ---------------------------------------------------------------- the parent

class PerformanceChild(ProbeChild):
    """Starts each GPU's child with a pipe each way to the conductor (channels, by child)."""

    def __init__(self, library=_cuda.LIBRARY):
        super(PerformanceChild, self).__init__(answer, library, 'performance')
        self.channels = {}

    def start(self, gpu, mib):
        request = dict(library=self.library, mib=mib, level=self.level,
                       gpus=[dict(index=gpu.get('index'), pci_bus_id=gpu['pci_bus_id'])])
        child, channel = fork_conducted(lambda request, keep: self.fork(gpu, request, keep), request)
        self.channels[child] = channel
        return child


def copy_rounds(indexes, shares_switch):
    """indexes in rounds, no two GPUs of a round on one PCIe switch (shares_switch(a, b))."""
    rounds = []
    for index in indexes:
        for group in rounds:
            if not any(shares_switch(index, other) for other in group):
                group.append(index)
                break
        else:
            rounds.append([index])
    return rounds


class PerformanceProber(Prober):
    """The probe at the performance level: the allocation level's, with its children conducted
    and every GPU judged against its peers."""

    answer_fields = PERFORMANCE_FIELDS

    def __init__(self, reader, options, child=None, pair_child=None):
        super(PerformanceProber, self).__init__(reader, options, child or PerformanceChild(options.cuda_library))
        self.links = Links(reader)
        self.pair_child = pair_child or _peers.PeerChild(options.cuda_library)
        # The pair check: (its child, its channel) once started, its answer, and the NVLinks as read
        # before and after its copies.
        self.pair, self.pair_answer, self.nvlinks = None, {}, ({}, {})
        self.pair_warnings = []

    def _answers(self, probed):
        """The pair child forked first, from this thread as every child is, then the GPUs' own."""
        scope, self.pair_warnings = _peers.pair_scope([gpu for gpu, dummy in probed])
        if scope:
            try:
                self.pair = self.pair_child.start_pairs(scope, copy_s=STEP_WAIT_S, copy_until=self.deadline - READ_RESERVE_S)
            except GpuopsError as exc:
                self.pair_warnings.append(str(exc))
        try:
            return super(PerformanceProber, self)._answers(probed)
        finally:
            # The release of the pair child's memory is awaited as the GPUs' children's is.
            self.child.pids |= self.pair_child.pids

    def _while_answering(self, probed, children):
        channels = dict((res['index'], self.child.channels[child]) for (dummy, res), child in zip(probed, children)
                        if child is not None)
        for gpu, res in probed:
            res.update(uuid=gpu.get('uuid') if valid_uuid(gpu.get('uuid')) else None, link=None, replays=None,
                       copy_round=None, remap_histogram=None, slow=[])
        collecting = self._collect_pairs()
        try:
            self._conduct(probed, channels)
        finally:
            for channel in channels.values():
                channel.close()
            if self.pair:
                self.pair[1].close()
            if collecting:
                collecting.join()

    def _collect_pairs(self):
        """The pair child's answer read as it comes, in a thread of its own (self.pair_answer)."""
        if not self.pair:
            return None
        child = self.pair[0]

        def collect():
            try:
                self.pair_answer = self.pair_child.collect(child, self.deadline - READ_RESERVE_S - child.started)
            except Exception as exc:  # a thread's error would be lost: said, as the child's are
                self.pair_answer = dict(failure=dict(error_name='PROBE_ERROR', error_string='%s: %s' % (
                    type(exc).__name__, exc)))

        thread = threading.Thread(target=collect)
        thread.start()
        return thread

    def _check_pairs(self, indexes, last):
        """The pair check's copies, between the NVLinks' two reads; before the GPUs' own copies, so
        that no copy of one disturbs the other's figures."""
        if not self.pair:
            return  # one GPU, or none that a pair check may use: no peer to copy with or compare
        before, warnings = _nvlinks.read_nvlinks(self.reader, indexes, self._left_for_reads(last))
        _peers.copy_pairs(self.pair[1], min(last, time.monotonic() + 2 * STEP_WAIT_S))
        self.pair[1].close()
        after, more = {}, []
        if any(read.get('links') for read in before.values()):
            after, more = _nvlinks.read_nvlinks(self.reader, indexes, self._left_for_reads(last))
        self.nvlinks = (before, after)
        self.pair_warnings.extend(warnings + more)

    def _conduct(self, probed, channels):
        """Ready, the copies in rounds, the links read under load, then the children left to prove
        their memory while the histograms are read."""
        results = dict((res['index'], res) for dummy, res in probed)
        last = self.deadline - READ_RESERVE_S
        before = self.links.replays(sorted(channels), self._left_for_reads(last))
        shares_switch = self.links.switch_test(sorted(channels), self._left_for_reads(last))
        # Contexts are made at once, in parallel: a GPU not ready STEP_WAIT_S after the first is left out.
        ready = await_word(list(channels.values()), READY, last, grace=STEP_WAIT_S)
        self._check_pairs(sorted(channels), last)
        copied = self._copy_in_rounds([index for index in sorted(channels) if channels[index] in ready], channels,
                                      results, shares_switch, last)
        loaded, under_load = self._read_under_load(copied, channels, last)
        for index in loaded:
            channels[index].say(DONE)
            results[index]['link'] = link_fields(under_load.get(index))
            results[index]['replays'] = replays_during(before.get(index), under_load.get(index))
        # Read while the children prove their memory: it costs them nothing.
        for index, histogram in self.links.remap_histograms(list(results.values()), self._left_for_reads(last)).items():
            results[index]['remap_histogram'] = histogram

    def _copy_in_rounds(self, ready, channels, results, shares_switch, last):
        """The timed copies of ready, round by round (no two GPUs of one PCIe switch at once): the
        GPUs that copied."""
        copied = []
        for number, group in enumerate(copy_rounds(ready, shares_switch)):
            said = [channels[index] for index in group if channels[index].say(COPY)]
            done = await_word(said, COPIED, min(last, time.monotonic() + STEP_WAIT_S))
            for index in group:
                results[index]['copy_round'] = number + 1
            copied += [index for index in group if channels[index] in done]
        return copied

    def _read_under_load(self, copied, channels, last):
        """(the GPUs whose links were read while they copied, the read) of copied."""
        loading = [index for index in copied if channels[index].say(LOAD)]
        said = await_word([channels[index] for index in loading], LOADED, min(last, time.monotonic() + STEP_WAIT_S))
        loaded = [index for index in loading if channels[index] in said]
        return loaded, self.links.read(loaded, self._left_for_reads(last))

    def _left_for_reads(self, last):
        return max(0.0, last - time.monotonic())

    def _judge(self, probed, result):
        results = [res for dummy, res in probed]
        fraction = getattr(self.options, 'slow_fraction', DEFAULT_SLOW_FRACTION)
        by_index = dict((res['index'], res) for res in results)
        pairs = self.pair_answer.get('pairs')
        peer_reasons = _peers.peer_reasons(by_index, pairs, self.nvlinks[0], self.nvlinks[1], fraction,
                                           self.pair_answer.get('pair_wait_s'))
        for res in results:
            res['peers'] = _peers.peer_fields(res['index'], pairs)
            res['nvlink'] = _peers.nvlink_fields(res['index'], *self.nvlinks)
            res['slow'] = slow_reasons(res, results, fraction) + peer_reasons.get(res['index'], [])
            if res['slow']:
                result.warnings.append('%s is slow: %s' % (gpu_name(res), '; '.join(
                    reason['message'] for reason in res['slow'])))
        result.warnings.extend(self.links.warnings + self.pair_warnings + _peers.pair_warnings(self.pair_answer, by_index))

    def _record_history(self, probed, proven, cured, now, result):
        """A slow GPU's probe is recorded slow in its history, with every reason; the others as
        the probe records them."""
        slow = [(gpu, res) for gpu, res in probed if res.get('ok') and res.get('slow')]
        history = History.for_host(self.options.host_root, self.options.state_dir)
        history.record([(gpu.get('uuid'), gpu.get('index'), '; '.join(reason['message'] for reason in res['slow']))
                        for gpu, res in slow], 'probe', now, result='slow')
        result.warnings.extend(warning for warning in history.warnings if warning not in result.warnings)
        rest = [(gpu, res) for gpu, res in probed if (gpu, res) not in slow]
        super(PerformanceProber, self)._record_history(rest, proven, cured, now, result)


def link_fields(read):
    if not read:
        return None
    return dict((key, read.get(key)) for key in ('gen', 'width', 'max_gen', 'max_width'))


def replays_during(before, after):
    if before is None or not after or after.get('replays') is None:
        return None
    return max(0, after['replays'] - before)


def slow_reasons(res, results, fraction):
    """Why res's GPU is slow, each {reason, message}: its link under load below its maximum,
    replays during the copies, a bandwidth more than fraction below its peers' median."""
    name = gpu_name(res)
    reasons = []
    link = res.get('link') or {}
    if None not in [link.get(key) for key in ('gen', 'width', 'max_gen', 'max_width')] and (
            link['gen'] < link['max_gen'] or link['width'] < link['max_width']):
        reasons.append(slow(PCIE_LINK_DEGRADED, '%s: its PCIe link ran at Gen%s x%s while loaded, below its maximum '
                            'of Gen%s x%s' % (name, link['gen'], link['width'], link['max_gen'], link['max_width'])))
    none = (res.get('remap_histogram') or {}).get('none')
    if none:
        reasons.append(slow(REMAP_HEADROOM_NONE, '%s: %d of its memory banks have no spare row left (the row '
                            "remapper's histogram: %s): the next row failure there cannot be remapped" % (
                                name, none, ', '.join('%s %s' % (key, res['remap_histogram'][key]) for key in REMAP_BINS))))
    if res.get('replays'):
        reasons.append(slow(PCIE_REPLAYS, '%s: its PCIe replay counter grew by %d during the copies' % (
            name, res['replays'])))
    for field, reason, words in BELOW_PEERS:
        figure = res.get(field)
        peers = [other[field] for other in results if other is not res and other.get(field)]
        if not figure or not peers:
            continue
        median = statistics.median(peers)
        bound = median * (1 - fraction)
        if figure < bound:
            reasons.append(slow(reason, '%s %s %.1f GB/s, below %.1f GB/s (%d %% under the median %.1f GB/s of its '
                                '%d peers)' % (name, words, figure, bound, round(fraction * 100), median, len(peers))))
    return reasons


# ---------------------------------------------------------------- the links, through the reader

# nvidia-smi's names for the link fields (nvidia-smi --help-query-gpu), and NVML's calls.
SMI_LINK_FIELDS = ('index', 'pcie.link.gen.current', 'pcie.link.width.current', 'pcie.link.gen.max',
                   'pcie.link.width.max')
NVML_LINK_CALLS = (('gen', 'nvmlDeviceGetCurrPcieLinkGeneration'), ('width', 'nvmlDeviceGetCurrPcieLinkWidth'),
                   ('max_gen', 'nvmlDeviceGetMaxPcieLinkGeneration'), ('max_width', 'nvmlDeviceGetMaxPcieLinkWidth'),
                   ('replays', 'nvmlDeviceGetPcieReplayCounter'))
# The row remapper's histogram, as NVML's struct and nvidia-smi -q's lines name its bins.
REMAP_BINS = ('max', 'high', 'partial', 'low', 'none')
# Two GPUs under one PCIe switch: NVML's NVML_TOPOLOGY_SINGLE (10) and MULTIPLE (20); nvidia-smi
# topo -m's PIX and PXB.
NVML_SHARED_SWITCH = (10, 20)
SMI_SHARED_SWITCH = ('PIX', 'PXB')


class Links:
    """The PCIe links, the switches above the GPUs and the row remappers' histograms, read by the
    module's own reader (NVML or nvidia-smi, with its deadline). Read failures are warnings: that
    figure is then not judged."""

    def __init__(self, reader):
        self.reader = _nvlinks.backend_of(reader)
        self.warnings = []

    def read(self, indexes, timeout):
        """{index: {gen, width, max_gen, max_width, replays}} of indexes (replays: NVML only)."""
        if not indexes:
            return {}
        return self._by_backend(timeout, 'the PCIe links could not be read (%s): no link is judged', {},
                                lambda nvml: dict((index, nvml_link(nvml, index)) for index in indexes),
                                lambda runner, seconds: smi_links(runner, indexes, seconds))

    def replays(self, indexes, timeout):
        """{index: the PCIe replay counter} of indexes; {} with nvidia-smi, which has no field for it."""
        if getattr(self.reader, 'backend', None) != 'nvml' or not indexes:
            return {}
        return dict((index, link.get('replays')) for index, link in self.read(indexes, timeout).items())

    def remap_histograms(self, results, timeout):
        """{index: {max, high, partial, low, none}}: how many memory banks have all, many, some, few
        or no spare rows left, of each GPU of results (its index and bus id); {} when not read."""
        if not results:
            return {}
        return self._by_backend(
            timeout, "the row remapper's histograms could not be read (%s): their headroom is not judged", {},
            lambda nvml: dict((res['index'], nvml_histogram(nvml, res['index'])) for res in results),
            lambda runner, seconds: smi_histograms(runner, results, seconds))

    def switch_test(self, indexes, timeout):
        """A test of two indexes: whether they share a PCIe switch (never, when unknown)."""
        if len(indexes) < 2:
            return lambda a, b: False
        shared = self._by_backend(timeout, 'the PCIe topology could not be read (%s): every GPU copied at once, and '
                                  'GPUs under one switch may share its bandwidth', set(),
                                  lambda nvml: nvml_shared(nvml, indexes),
                                  lambda runner, seconds: parse_topology(smi_output(runner, ['topo', '-m'], seconds)))
        return lambda a, b: frozenset((a, b)) in shared

    def _by_backend(self, timeout, failed, default, with_nvml, with_smi):
        """_nvlinks.by_backend's read, or default with the warning failed (%s: why)."""
        try:
            return _nvlinks.by_backend(self.reader, timeout, 'reading the PCIe links', with_nvml, with_smi)
        except (GpuopsError, ValueError, AttributeError) as exc:
            self.warnings.append(failed % printable(str(exc), 200))
            return default


def smi_output(runner, args, timeout):
    return _nvlinks.smi_output(runner, args, time.monotonic() + timeout)


def nvml_link(nvml, index):
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    link = {}
    for key, name in NVML_LINK_CALLS:
        try:
            link[key] = int(getattr(nvml, name)(handle))
        except nvml.NVMLError:
            link[key] = None
    return link


def nvml_histogram(nvml, index):
    try:
        values = nvml.nvmlDeviceGetRowRemapperHistogram(nvml.nvmlDeviceGetHandleByIndex(index))
    except nvml.NVMLError:  # no row remapper before Ampere, or not supported here
        return None
    return dict((key, int(getattr(values, key))) for key in REMAP_BINS)


def nvml_shared(nvml, indexes):
    handles = dict((index, nvml.nvmlDeviceGetHandleByIndex(index)) for index in indexes)
    shared = set()
    for a in indexes:
        for b in indexes:
            if a < b and nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]) in NVML_SHARED_SWITCH:
                shared.add(frozenset((a, b)))
    return shared


def smi_links(runner, indexes, timeout):
    stdout = smi_output(runner, ['--query-gpu=' + ','.join(SMI_LINK_FIELDS), '--format=csv,noheader,nounits'], timeout)
    links = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split(',')]
        if len(cells) != len(SMI_LINK_FIELDS) or not cells[0].isdigit():
            continue
        values = [int(cell) if cell.isdigit() else None for cell in cells[1:]]
        links[int(cells[0])] = dict(zip(('gen', 'width', 'max_gen', 'max_width'), values), replays=None)
    return dict((index, links[index]) for index in indexes if index in links)


def smi_histograms(runner, results, timeout):
    by_bus = parse_remap_histograms(smi_output(runner, ['-q', '-d', 'ROW_REMAPPER'], timeout))
    return dict((res['index'], by_bus[normalize_bus_id(res['pci_bus_id'])]) for res in results
                if res.get('pci_bus_id') and normalize_bus_id(res['pci_bus_id']) in by_bus)


GPU_COLUMN = re.compile(r'^GPU(\d+)$')
SMI_GPU_HEADER = re.compile(r'^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$')
SMI_BIN = re.compile(r'^\s*(Max|High|Partial|Low|None)\s*:\s*(\d+)\s*bank')


def parse_remap_histograms(text):
    """{bus id: {max, high, partial, low, none}} from `nvidia-smi -q -d ROW_REMAPPER`: each GPU's
    block starts with its bus id; a GPU whose histogram is not all there is left out."""
    found, bus = {}, None
    for line in text.splitlines():
        header = SMI_GPU_HEADER.match(line)
        if header:
            bus = normalize_bus_id(header.group(1))
            continue
        value = SMI_BIN.match(line)
        if bus and value:
            found.setdefault(bus, {})[value.group(1).lower()] = int(value.group(2))
    return dict((bus, bins) for bus, bins in found.items() if set(bins) == set(REMAP_BINS))


def parse_topology(text):
    """The pairs of GPUs under one PCIe switch, from `nvidia-smi topo -m`'s matrix: its header
    (an empty first cell, then GPU0, GPU1, ...) names the columns, each GPU row its links; colour
    codes, NIC rows and the legend are skipped."""
    columns, shared = None, set()
    for line in re.sub(r'\x1b\[[0-9;]*m', '', text).splitlines():
        cells = [cell.strip() for cell in line.split('\t')]
        if columns is None:
            if len(cells) > 1 and not cells[0] and GPU_COLUMN.match(cells[1]):
                columns = dict((position, int(GPU_COLUMN.match(cell).group(1))) for position, cell in enumerate(cells)
                               if GPU_COLUMN.match(cell))
            continue
        row = GPU_COLUMN.match(cells[0])
        for position, other in (columns.items() if row else ()):
            if position < len(cells) and cells[position] in SMI_SHARED_SWITCH:
                shared.add(frozenset((int(row.group(1)), other)))
    if columns is None:
        raise ValueError('nvidia-smi topo -m printed no GPU matrix')
    return shared


def probe(reader, options, check_mode=False, child=None, snapshot=None):
    """The probe at options.probe_level: the performance level's own prober, else the probe's."""
    if options.probe_level != PERFORMANCE:
        return Prober(reader, options, child).run(check_mode, snapshot)
    return PerformanceProber(reader, options, child).run(check_mode, snapshot)
