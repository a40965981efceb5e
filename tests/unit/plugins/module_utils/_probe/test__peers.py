# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The pair check without CUDA: its verdict, the NVLink reads from nvidia-smi's text and a stand-in
NVML, and its child, run on a stand-in driver in this process and as a real forked process that
hears the conductor's words (the CUDA side runs on gpusim in tests/integration/test_gpu_probe_peers.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys
import threading
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import peers as _peers
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.cuda import CALLING, CudaError
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.conductor import COPIED, COPY, READY, Control
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.peers import (
    PairCheck,
    PeerChild,
    nvlink_fields,
    pair_scope,
    pair_warnings,
    peer_fields,
    peer_reasons,
    visible_all,
)

COUNTERS = ('replay', 'recovery', 'crc_flit', 'crc_data')
UUIDS = ['GPU-%08x-c209-4cac-629f-6fbed82c07cd' % n for n in range(8)]


def bus_id(index):
    return '00000000:%02X:00.0' % (0x18 + index)


def results(count=8):
    return dict((n, dict(index=n, pci_bus_id=bus_id(n))) for n in range(count))


def every_pair(count=8, gbps=lambda src, dst: 370.0):
    return [dict(_peers.blank_pair(src, dst), gbps=gbps(src, dst)) for src in range(count) for dst in range(count)
            if src != dst]


def nvlinks(count=8, links=18, down=None, errors=None):
    """A read of count GPUs of links NVLinks each; down: {index: [links]}; errors: {index: {counter: n}}."""
    found = {}
    for index in range(count):
        off = (down or {}).get(index, [])
        counted = dict((name, 0 if links else None) for name in COUNTERS)
        counted.update((errors or {}).get(index, {}))
        found[index] = dict(links=links, active=[link for link in range(links) if link not in off], down=list(off),
                            errors=counted)
    return found


def named(reasons):
    return dict((index, [reason['reason'] for reason in found]) for index, found in reasons.items() if found)


# ------------------------------------------------------------------ the verdict

def test_one_gpu_with_two_of_its_18_links_down_is_named_alone_with_the_links():
    reasons = peer_reasons(results(), every_pair(), nvlinks(), nvlinks(down={5: [0, 1]}), 0.15)
    assert named(reasons) == {5: ['NVLINK_DOWN']}
    assert reasons[5][0]['message'] == ('NVLINK_DOWN: GPU 5 (00000000:1D:00.0): 16 of its 18 NVLinks are active, where '
                                        'the best GPU of the host has 18; links 0, 1 are down')
    # Down in the read before the copies alone, and back after: the read after counts.
    assert named(peer_reasons(results(), every_pair(), nvlinks(down={5: [0, 1]}), nvlinks(), 0.15)) == {}
    # Only the read before: it is judged.
    assert named(peer_reasons(results(), every_pair(), nvlinks(down={2: [7]}), {}, 0.15)) == {2: ['NVLINK_DOWN']}


def test_a_gpu_without_nvlink_is_never_judged_by_its_links():
    reads = nvlinks(links=0)
    assert named(peer_reasons(results(), [], reads, reads, 0.15)) == {}
    reads = nvlinks()
    reads[7] = dict(links=0, active=[], down=[], errors=dict((name, None) for name in COUNTERS))
    assert named(peer_reasons(results(), [], reads, reads, 0.15)) == {}


def test_error_counters_that_grew_during_the_copies_are_named_with_the_growth():
    before = nvlinks(errors={0: dict(crc_flit=4, replay=1)})
    after = nvlinks(errors={0: dict(crc_flit=46, replay=4), 3: dict(crc_data=None)})
    reasons = peer_reasons(results(), every_pair(), before, after, 0.15)
    assert named(reasons) == {0: ['NVLINK_ERRORS']}
    assert reasons[0][0]['message'] == ('NVLINK_ERRORS: GPU 0 (00000000:18:00.0): its NVLink error counters grew during '
                                        'the peer copies: flit CRC errors by 42, replays by 3 (summed over its 18 links)')
    # A counter read once only, or one that went back (reset between the reads), says nothing.
    assert named(peer_reasons(results(), [], nvlinks(errors={1: dict(recovery=9)}), nvlinks(), 0.15)) == {}
    assert named(peer_reasons(results(), [], {}, after, 0.15)) == {}


def test_a_gpu_whose_copies_are_40_percent_below_its_peers_is_named_alone():
    pairs = every_pair(gbps=lambda src, dst: 222.0 if 3 in (src, dst) else 370.0)
    pairs[0]['gbps'] = 369.0  # 0 to 1
    reasons = peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.15)
    assert named(reasons) == {3: ['P2P_BELOW_PEERS']}
    slowest = [pair for pair in pairs if pair['src'] == 3][0]
    slowest['gbps'] = 221.5
    reasons = peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.15)
    assert reasons[3][0]['message'] == (
        'P2P_BELOW_PEERS: GPU 3 (00000000:1B:00.0) copied peer to peer at a median of 222.0 GB/s, below 314.5 GB/s (15 % '
        'under the median 370.0 GB/s of its 7 peers); its slowest copy: GPU 3 (00000000:1B:00.0) to GPU 0 '
        '(00000000:18:00.0) at 221.5 GB/s')


def test_the_healthy_spread_of_3_percent_is_never_named():
    pairs = every_pair(gbps=lambda src, dst: round(370.0 * (1 + ((src * 8 + dst) % 3 - 1) * 0.03), 1))
    assert named(peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.15)) == {}
    # A stricter bound names nobody either: every GPU has the same mix of pairs around it.
    assert named(peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.02)) == {}


def test_links_down_that_cost_an_eighth_of_the_bandwidth_are_not_below_peers():
    pairs = every_pair(gbps=lambda src, dst: round(370.0 * 16 / 18, 1) if 5 in (src, dst) else 370.0)
    reasons = peer_reasons(results(), pairs, nvlinks(down={5: [0, 1]}), nvlinks(down={5: [0, 1]}), 0.15)
    assert named(reasons) == {5: ['NVLINK_DOWN']}


def test_gpus_with_one_peer_or_another_kind_of_link_are_not_held_against_each_other():
    # PCIe only: each GPU copies with the one under its switch; a slow pair cannot tell which is slow.
    pairs = [dict(_peers.blank_pair(src, src ^ 1), gbps=20.0 if src in (2, 3) else 53.6) for src in range(8)]
    assert named(peer_reasons(results(), pairs, nvlinks(links=0), nvlinks(links=0), 0.15)) == {}
    # An NVLink pair beside PCIe pairs: compared with GPUs of as many links alone.
    reads = nvlinks(count=4, links=0)
    for index in (0, 1):
        reads[index] = nvlinks(count=1, links=4)[0]
    pairs = every_pair(count=3, gbps=lambda src, dst: 100.0 if {src, dst} == {0, 1} else 25.0)
    assert named(peer_reasons(results(4), pairs, reads, reads, 0.15)) == {}


def hung(pairs, *which):
    for pair in pairs:
        if (pair['src'], pair['dst']) in which:
            pair.update(gbps=None, hung=True, call='cuMemcpyPeerAsync')
    return pairs


def test_a_hung_pair_names_its_two_gpus_only():
    pairs = hung(every_pair(), (3, 5), (5, 3))
    reasons = peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.15, pair_wait_s=2.0)
    assert named(reasons) == {3: ['P2P_HUNG'], 5: ['P2P_HUNG']}
    assert reasons[3][0]['message'] == (
        'P2P_HUNG: GPU 3 (00000000:1B:00.0): its peer copies to GPU 5 (00000000:1D:00.0), from GPU 5 (00000000:1D:00.0) '
        'did not end within 2.0 s, though both GPUs copied with other peers')


def test_a_gpu_none_of_whose_copies_ended_is_the_culprit_named_alone():
    # GPU 2 hung with 0 and with 1; its other pairs were not tried; 0 and 1 copied with others.
    pairs = hung(every_pair(), (0, 2), (1, 2))
    for pair in pairs:
        if 2 in (pair['src'], pair['dst']) and not pair['hung']:
            pair.update(gbps=None, skipped='not tried: GPU 2 hung with 2 peers and finished no copy')
    reasons = peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.15, pair_wait_s=1.0)
    assert named(reasons) == {2: ['P2P_HUNG']}
    assert reasons[2][0]['message'] == (
        'P2P_HUNG: GPU 2 (00000000:1A:00.0): its peer copies from GPU 0 (00000000:18:00.0), from GPU 1 (00000000:19:00.0) '
        'did not end within 1.0 s, and none of its copies ended')
    # Two GPUs alone: neither can be cleared, both are named.
    assert named(peer_reasons(results(2), hung(every_pair(2), (0, 1), (1, 0)), {}, {}, 0.15)) == {
        0: ['P2P_HUNG'], 1: ['P2P_HUNG']}


def test_a_copy_that_failed_is_named_with_the_error():
    pairs = every_pair()
    pairs[8].update(gbps=None, call='cuMemcpyPeerAsync', error_name='CUDA_ERROR_NVLINK_UNCORRECTABLE',
                    error_string='uncorrectable NVLink error was detected during the execution')
    assert (pairs[8]['src'], pairs[8]['dst']) == (1, 2)
    reasons = peer_reasons(results(), pairs, nvlinks(), nvlinks(), 0.15)
    assert named(reasons) == {1: ['P2P_FAILED'], 2: ['P2P_FAILED']}
    assert reasons[1][0]['message'] == (
        'P2P_FAILED: GPU 1 (00000000:19:00.0): its peer copy to GPU 2 (00000000:1A:00.0) failed with '
        'CUDA_ERROR_NVLINK_UNCORRECTABLE at cuMemcpyPeerAsync (uncorrectable NVLink error was detected during the '
        'execution), though both GPUs copied with other peers')


def test_a_gpus_fields_say_its_pairs_and_its_links():
    pairs = hung(every_pair(3, gbps=lambda src, dst: 370.0 + src), (2, 0))
    assert peer_fields(0, pairs) == dict(median_gbps=370.0, hung=[dict(peer=2, direction='from')], failed=[], pairs=[
        dict(peer=1, direction='to', gbps=370.0), dict(peer=2, direction='to', gbps=370.0),
        dict(peer=1, direction='from', gbps=371.0)])
    assert peer_fields(5, pairs) is None
    before, after = nvlinks(errors={1: dict(crc_flit=2)}), nvlinks(down={1: [3]}, errors={1: dict(crc_flit=9)})
    assert nvlink_fields(1, before, after) == dict(links=18, active=[n for n in range(18) if n != 3], down=[3],
                                                   errors=dict(replay=0, recovery=0, crc_flit=7, crc_data=0))
    assert nvlink_fields(1, {}, {}) is None


# ------------------------------------------------------------------ the NVLinks read


ALREADY_ENABLED = 704


class FakeCuda:
    """Stands for Cuda in the pair child: GPU n at bus id 0x18 + n, contexts current per thread,
    copies at gbps(src, dst) on the launching context's stream clock. A copy with a GPU of hang
    sleeps hang_s in the call, and holds the stream of the context it was launched from: a later
    copy launched there sleeps too, as one queued behind it on a real GPU's stream would. refuse:
    {index: (call, CUresult)}; capable(a, b): cuDeviceCanAccessPeer."""

    def __init__(self, gbps=lambda src, dst: 370.0, hang=(), hang_s=3.0, refuse=None, capable=lambda a, b: True):
        self.gbps, self.hang, self.hang_s, self.refuse, self.capable = gbps, set(hang), hang_s, refuse or {}, capable
        self.mine = threading.local()
        self.lock = threading.Lock()
        self.clock, self.events, self.held, self.enabled, self.live = {}, {}, set(), set(), set()
        self.calls, self.destroyed = [], []

    def call(self, name, *args):
        with self.lock:
            self.calls.append(name)
        values = [getattr(arg, 'value', arg) for arg in args]
        code = getattr(self, name)(args, *values)
        if code:
            raise CudaError(name, code)

    def describe(self, code):
        return {2: 'CUDA_ERROR_OUT_OF_MEMORY', 217: 'CUDA_ERROR_PEER_ACCESS_UNSUPPORTED'}.get(code, 'CUresult %d' % code), \
            'the driver says %d' % code

    def current(self):
        return getattr(self.mine, 'context', None)

    def refused(self, name, index):
        call, code = self.refuse.get(index, (None, 0))
        return code if call == name else 0

    def cuInit(self, args, flags):
        return 0

    def cuDeviceGetByPCIBusId(self, args, device, bus):
        args[0]._obj.value = int(bus.split(b':')[1], 16) - 0x18
        return 0

    def cuCtxCreate_v2(self, args, context, flags, device):
        if self.refused('cuCtxCreate_v2', device):
            return self.refused('cuCtxCreate_v2', device)
        args[0]._obj.value = 0x1000 + device
        with self.lock:
            self.live.add(0x1000 + device)
            self.clock[0x1000 + device] = 0.0
        self.mine.context = 0x1000 + device
        return 0

    def cuMemAlloc_v2(self, args, pointer, size):
        args[0]._obj.value = (self.current() - 0x1000 + 1) << 32
        return self.refused('cuMemAlloc_v2', self.current() - 0x1000)

    def cuEventCreate(self, args, event, flags):
        with self.lock:
            args[0]._obj.value = 0x9000 + len(self.events)
            self.events[args[0]._obj.value] = [self.current(), None]
        return 0

    def cuDeviceCanAccessPeer(self, args, can, device, peer):
        args[0]._obj.value = 1 if self.capable(device, peer) else 0
        return 0

    def cuCtxSetCurrent(self, args, context):
        self.mine.context = context
        return 0

    def cuCtxEnablePeerAccess(self, args, peer, flags):
        with self.lock:
            if (self.current(), peer) in self.enabled:
                return ALREADY_ENABLED
            self.enabled.add((self.current(), peer))
        return 0

    def cuEventRecord(self, args, event, stream):
        self.events[event][1] = self.clock[self.current()]
        return 0

    def cuMemcpyPeerAsync(self, args, dst, dst_context, src, src_context, size, stream):
        source, target, launched = src_context - 0x1000, dst_context - 0x1000, self.current()
        if launched in self.held or self.hang & set((source, target)):
            self.held.add(launched)
            time.sleep(self.hang_s)
        self.clock[launched] += size / (self.gbps(source, target) * 1e9)
        return 0

    def cuEventSynchronize(self, args, event):
        return 0

    def cuEventElapsedTime(self, args, elapsed, start, end):
        args[0]._obj.value = (self.events[end][1] - self.events[start][1]) * 1000.0
        return 0

    def cuEventDestroy_v2(self, args, event):
        return 0

    def cuMemFree_v2(self, args, pointer):
        return 0

    def cuCtxDestroy_v2(self, args, context):
        with self.lock:
            self.live.discard(context)
            self.destroyed.append(context - 0x1000)
        return 0


def request(count=4, pair_wait_s=0.3, **more):
    return dict(more, gpus=[dict(index=n, pci_bus_id=bus_id(n)) for n in range(count)], pair_wait_s=pair_wait_s)


def check_here(cuda, count=4, word=COPY, **more):
    """The pair check run in this process, the conductor's word written ahead: (answer, cuda)."""
    commands, answers = os.pipe(), os.pipe()
    if word:
        os.write(commands[1], word)
    os.close(commands[1])
    found = dict(copied=False)
    control = Control(commands[0], answers[1])
    try:
        PairCheck(cuda, request(count, **more), control).run(found)
    finally:
        control.close()
    heard = os.read(answers[0], 16)
    os.close(answers[0])
    return found, heard


def test_every_ordered_pair_copies_once_timed_by_events_and_everything_is_destroyed():
    cuda = FakeCuda(gbps=lambda src, dst: 300.0 if 1 in (src, dst) else 370.0)
    found, heard = check_here(cuda)
    assert heard == READY + COPIED and found['copied'] and found['unusable'] == []
    assert [(pair['src'], pair['dst']) for pair in found['pairs']] == [(s, d) for s in range(4) for d in range(4) if s != d]
    assert [pair['gbps'] for pair in found['pairs'][:3]] == [300.0, 370.0, 370.0]
    assert all(pair['timed_on'] == pair['src'] and not pair['hung'] for pair in found['pairs'])
    assert found['peer_capable'] == [[pair['src'], pair['dst']] for pair in found['pairs']]
    # Access enabled once from each context to each peer (a second time is 704, and fine).
    assert len(cuda.enabled) == 12 and cuda.calls.count('cuCtxEnablePeerAccess') == 12
    assert sorted(cuda.destroyed) == [0, 1, 2, 3] and not cuda.live


def test_only_pairs_that_reach_each_other_both_ways_copy():
    found, dummy = check_here(FakeCuda(capable=lambda a, b: a // 2 == b // 2 or (a, b) == (0, 2)))
    assert found['peer_capable'] == [[0, 1], [1, 0], [2, 3], [3, 2]]
    assert [pair['gbps'] for pair in found['pairs']] == [370.0] * 4


def test_a_gpu_that_cannot_be_opened_is_left_out_and_named():
    cuda = FakeCuda(refuse={2: ('cuMemAlloc_v2', 2)})
    found, dummy = check_here(cuda)
    assert found['unusable'] == [dict(index=2, call='cuMemAlloc_v2', error_code=2, error_name='CUDA_ERROR_OUT_OF_MEMORY',
                                      error_string='the driver says 2')]
    assert all(2 not in (pair['src'], pair['dst']) for pair in found['pairs']) and len(found['pairs']) == 6
    assert sorted(cuda.destroyed) == [0, 1, 2, 3]  # its context too
    assert pair_warnings(found, results(4)) == [
        'the pair check left GPU 2 (00000000:1A:00.0) out: CUDA_ERROR_OUT_OF_MEMORY at cuMemAlloc_v2 (the driver says 2)']


def test_without_the_word_to_copy_nothing_is_copied():
    for word in (b'', b'D'):
        cuda = FakeCuda()
        found, heard = check_here(cuda, word=word)
        assert heard == READY and not found['copied'] and found['pairs'] == [] and len(found['peer_capable']) == 12
        assert 'cuMemcpyPeerAsync' not in cuda.calls and sorted(cuda.destroyed) == [0, 1, 2, 3]


def test_a_hung_copy_engine_costs_two_waits_and_its_gpu_alone_is_named():
    cuda = FakeCuda(hang=[2], hang_s=2.0)
    started = time.monotonic()
    found, dummy = check_here(cuda, pair_wait_s=0.3)
    assert time.monotonic() - started < 1.5
    by_pair = dict(((pair['src'], pair['dst']), pair) for pair in found['pairs'])
    assert [key for key, pair in sorted(by_pair.items()) if pair['hung']] == [(0, 2), (1, 2)]
    assert by_pair[(0, 2)]['call'] == 'cuMemcpyPeerAsync'
    skipped = [key for key, pair in sorted(by_pair.items()) if pair['skipped']]
    assert skipped == [(2, 0), (2, 1), (2, 3), (3, 2)]
    assert by_pair[(2, 3)]['skipped'] == 'not tried: GPU 2 hung with 2 peers and finished no copy'
    # GPU 0's stream holds the hung copy: its later copies are launched from the peer's context, and go through.
    assert by_pair[(0, 3)]['timed_on'] == 3 and by_pair[(0, 3)]['gbps'] == 370.0
    assert by_pair[(1, 0)]['timed_on'] == 1 and by_pair[(1, 3)]['timed_on'] == 3
    assert len([pair for pair in found['pairs'] if pair['gbps']]) == 6
    reasons = peer_reasons(results(4), found['pairs'], {}, {}, 0.15, found.get('pair_wait_s', 0.3))
    assert named(reasons) == {2: ['P2P_HUNG']}
    # What a hung call may still use is left alone: the contexts of the hung pairs.
    assert sorted(cuda.destroyed) == [3]


def test_no_pair_is_begun_without_its_wait_left():
    found, dummy = check_here(FakeCuda(), pair_wait_s=0.5, copy_until=time.monotonic() + 0.2)
    assert [pair['skipped'] for pair in found['pairs']] == ['not tried: no time was left for its wait of 0.5 s'] * 12
    assert pair_warnings(found) == ['the pair check had no time left for 12 of its 12 pairs: they are not judged']
    # Counted from the word COPY: 0.3 s for waits of 0.2 s, and a hang takes them all.
    found, dummy = check_here(FakeCuda(hang=[0], hang_s=1.0), pair_wait_s=0.2, copy_s=0.3, copy_until=time.monotonic() + 60)
    assert [bool(pair['hung']) for pair in found['pairs'][:2]] == [True, False]
    assert found['pairs'][1]['skipped'].startswith('not tried: no time was left')


# ------------------------------------------------------------------ the child, forked and conducted

def test_the_forked_child_hears_the_conductor_and_answers():
    child = PeerChild()
    child.program = lambda request: _peers.answer(request, cuda=FakeCuda())
    gpus = [dict(index=n, pci_bus_id=bus_id(n), uuid=UUIDS[n]) for n in range(3)]
    proc, channel = child.start_pairs(gpus, pair_wait_s=0.5)
    found = child.conduct(proc, channel, time.monotonic() + 20)
    assert found['failure'] is None and found['copied'] and found['pid'] == proc.pid and proc.pid in child.pids
    assert [pair['gbps'] for pair in found['pairs']] == [370.0] * 6 and found['pair_wait_s'] == 0.5


def test_the_child_sees_every_gpu_of_the_check_and_keeps_only_its_pipes(monkeypatch):
    def program(request):
        control = Control(*request['control'])
        control.say(READY)
        heard = control.next(5)
        control.say(COPIED)
        print(json.dumps(dict(pid=os.getpid(), pairs=[], gpus=[], heard=heard.decode(), fds=len(os.listdir(
            '/proc/self/fd')), visible=os.environ.get('CUDA_VISIBLE_DEVICES'))))

    child = PeerChild()
    child.program = program
    gpus = [dict(index=n, pci_bus_id=bus_id(n), uuid=UUIDS[n]) for n in range(3)]
    found = child.conduct(*child.start_pairs(gpus) + (time.monotonic() + 10,))
    assert found['heard'] == 'C' and found['visible'] == ','.join(UUIDS[:3])
    assert found['fds'] <= 6  # stdin, stdout, stderr, its two pipe ends, the listing's own
    gpus[1]['uuid'] = 'GPU-not-one'
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0')
    found = child.conduct(*child.start_pairs(gpus) + (time.monotonic() + 10,))
    assert found['visible'] is None


def test_a_child_killed_at_its_deadline_names_the_pair_and_the_call():
    def stuck(request):
        Control(*request['control']).say(READY)
        sys.stderr.write('pair 0 1\n%scuMemcpyPeerAsync\npair 0 2\n%scuCtxSetCurrent\n%scuMemcpyPeerAsync\n' % (
            (CALLING,) * 3))
        sys.stderr.flush()
        time.sleep(30)

    child = PeerChild()
    child.program = stuck
    proc, channel = child.start_pairs([dict(index=n, pci_bus_id=bus_id(n)) for n in range(3)])
    started = time.monotonic()
    found = child.conduct(proc, channel, time.monotonic() + 1.5)
    assert time.monotonic() - started < 5
    assert found['pairs'] == [] and found['failure']['error_name'] == 'PROBE_TIMEOUT'
    assert (found['failure']['pair'], found['failure']['call']) == ([0, 2], 'cuMemcpyPeerAsync')
    assert found['failure']['error_string'].startswith('the pair check did not answer within ')
    assert found['failure']['error_string'].endswith('; it was in the pair GPU 0 to GPU 2')
    assert pair_warnings(found)[0].startswith('the pair check gave no answer (PROBE_TIMEOUT): the pair check did not '
                                              'answer within ')


def test_a_child_that_fails_or_prints_nonsense_is_said_in_words():
    child = PeerChild()
    child.program = lambda request: print('not json')
    found = child.conduct(*child.start_pairs([dict(index=0, pci_bus_id=bus_id(0))]) + (time.monotonic() + 10,))
    assert found['failure']['error_name'] == 'PROBE_ERROR'
    assert found['failure']['error_string'] == "the pair check gave no answer that can be read (it printed 'not json')"
    child.program = lambda request: 3
    found = child.conduct(*child.start_pairs([dict(index=0, pci_bus_id=bus_id(0))]) + (time.monotonic() + 10,))
    assert found['failure']['error_string'] == 'the pair check exited with status 3'


def test_the_childs_own_failures_are_words():
    child = PeerChild('/nonexistent/libcuda.so.1')
    found = child.conduct(*child.start_pairs([dict(index=0, pci_bus_id=bus_id(0))]) + (time.monotonic() + 10,))
    assert found['failure'] is None and found['library_error'].startswith('/nonexistent/libcuda.so.1 cannot be loaded')
    assert pair_warnings(found)[0].startswith('the pair check could not run: /nonexistent/libcuda.so.1 cannot be loaded')


# ------------------------------------------------------------------ scope

def test_gpus_in_an_exclusive_mode_or_unreadable_are_left_out():
    gpus = [dict(index=n, pci_bus_id=bus_id(n), compute_mode='Default') for n in range(3)]
    gpus[1]['compute_mode'] = 'Exclusive_Process'
    scope, warnings = pair_scope(gpus + [dict(index=None, pci_bus_id=None, error='lost')])
    assert [gpu['index'] for gpu in scope] == [0, 2]
    assert warnings == ['GPU 1 (00000000:19:00.0) is in Exclusive_Process compute mode: it is left out of the pair '
                        'check (its own probe holds its one context)']
    assert pair_scope(gpus[:2]) == ([], warnings)


def test_the_uuids_of_every_gpu_or_none_are_made_visible():
    gpus = [dict(uuid=uuid) for uuid in UUIDS[:2]]
    assert visible_all(gpus) == dict(CUDA_VISIBLE_DEVICES=','.join(UUIDS[:2]))
    assert visible_all(gpus + [dict(uuid=None)]) == {} and visible_all([]) == {}


@pytest.mark.parametrize('stderr, pair', [('pair 3 5\ncalling x\n', [3, 5]), ('calling x\n', None), ('pair 3\n', None)])
def test_the_last_pair_is_read_from_stderr(stderr, pair):
    assert _peers.last_pair(stderr) == pair
