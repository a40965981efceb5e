# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The pair check on gpusim, driven from this process as the conductor drives it: its child (forked
from here) copies between contexts of gpusim's libcuda.so.1 (370 GB/s over NVLink, scaled by links
down and capped by --p2p; PCIe speed between the GPUs under one switch), the NVLinks are read
before and after through the module's readers (nvidia-smi nvlink and NVML), and the verdict names
the GPU at fault alone."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.peers import (
    PAIR_WAIT_S,
    PeerChild,
    pair_warnings,
    peer_fields,
    peer_reasons,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.nvlinks import read_nvlinks

from gpusim.state import NVLINK_PEER_GBPS

JITTER = 0.02
# A healthy H200's copies over its Gen5 x16 link, 0.85 x 3.938 x 16 GB/s: a PCIe pair's too.
PCIE_GBPS = 0.85 * 3.938 * 16
PAIRS_OF_8 = [(src, dst) for src in range(8) for dst in range(8) if src != dst]


@pytest.fixture
def hgx(gpuhost, monkeypatch):
    """An HGX board of 8 H200s (18 NVLinks each) whose fake libcuda the pair child loads: its path is
    in the request, and the child, forked from this process, has the host's environment."""
    gpuhost.nvlink(18)
    gpuhost.library = gpuhost.install_cuda()
    for name, value in gpuhost.env(cuda=True).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv('GPUSIM_ROOT', gpuhost.root)
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    return gpuhost


def make_reader(host, backend):
    if backend == 'nvidia-smi':
        return SmiReader(SmiRunner(host.smi_path))
    from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nvml import NvmlReader
    try:
        import pynvml  # noqa: F401
    except ImportError:
        pytest.skip('nvidia-ml-py is not installed')
    # Loaded first by its path: pynvml's dlopen of libnvidia-ml.so.1 finds it by its soname.
    ctypes.CDLL(host.install_nvml())
    return NvmlReader(10.0).open()


def check(host, backend='nvidia-smi', pair_wait_s=PAIR_WAIT_S, fraction=0.15, deadline_s=60):
    """What the conductor would find: (the child's answer, the reasons by GPU, the reads before and
    after, every warning, the seconds from the child's start to its answer)."""
    reader = make_reader(host, backend)
    try:
        gpus = host.state['gpus']
        indexes = [gpu['index'] for gpu in gpus]
        before, warnings = read_nvlinks(reader, indexes, 10)
        child = PeerChild(host.library)
        started = time.monotonic()
        found = child.conduct(*child.start_pairs(gpus, pair_wait_s) + (started + deadline_s,))
        took = time.monotonic() - started
        after, more = read_nvlinks(reader, indexes, 10)
    finally:
        if backend == 'nvml':
            reader.close()
    results = dict((gpu['index'], dict(index=gpu['index'], pci_bus_id=gpu['pci_bus_id'])) for gpu in gpus)
    reasons = peer_reasons(results, found['pairs'], before, after, fraction, found['pair_wait_s'])
    return found, reasons, (before, after), warnings + more + pair_warnings(found, results), took


def named(reasons):
    return dict((index, [reason['reason'] for reason in found]) for index, found in reasons.items() if found)


def near(gbps, expected):
    return expected * (1 - JITTER) - 0.1 <= gbps <= expected * (1 + JITTER) + 0.1


def by_pair(found):
    return dict(((pair['src'], pair['dst']), pair) for pair in found['pairs'])


@pytest.mark.parametrize('backend', ['nvidia-smi', 'nvml'])
def test_every_pair_of_an_nvlink_board_copies_at_its_speed_and_nobody_is_named(hgx, backend):
    found, reasons, reads, warnings, took = check(hgx, backend)
    assert found['failure'] is None and found['copied'] and warnings == [], warnings
    assert found['peer_capable'] == [list(pair) for pair in PAIRS_OF_8]
    assert sorted(by_pair(found)) == PAIRS_OF_8
    assert all(near(pair['gbps'], NVLINK_PEER_GBPS) for pair in found['pairs']), found['pairs']
    assert named(reasons) == {}
    for read in reads:
        assert read == dict((index, dict(links=18, active=list(range(18)), down=[], errors=dict(
            replay=0, recovery=0, crc_flit=0, crc_data=0 if backend == 'nvml' else None))) for index in range(8))
    fields = peer_fields(4, found['pairs'])
    assert len(fields['pairs']) == 14 and near(fields['median_gbps'], NVLINK_PEER_GBPS) and fields['hung'] == []
    # Forked, contexts and buffers on 8 GPUs, 56 copies of 256 MiB, answered: well within a second here.
    print('the pair check of 8 GPUs took %.2f s' % took)
    assert took < 5


def test_a_gpu_with_slow_peer_copies_is_named_alone(hgx):
    hgx.slow(3, p2p=200)
    found, reasons, dummy, warnings, dummy = check(hgx)
    assert warnings == [] and named(reasons) == {3: ['P2P_BELOW_PEERS']}
    assert all(near(pair['gbps'], 200.0) == (3 in key) for key, pair in by_pair(found).items())
    message = reasons[3][0]['message']
    assert message.startswith('P2P_BELOW_PEERS: GPU 3 (%s) copied peer to peer at a median of ' % hgx.state['gpus'][3][
        'pci_bus_id'])
    assert '(15 % under the median ' in message and ' of its 7 peers); its slowest copy: GPU ' in message


@pytest.mark.parametrize('backend', ['nvidia-smi', 'nvml'])
def test_links_down_are_named_and_the_eighth_they_cost_is_not_below_peers(hgx, backend):
    hgx.slow(5, nvlink_down=[0, 1])
    found, reasons, reads, warnings, dummy = check(hgx, backend)
    assert warnings == [] and named(reasons) == {5: ['NVLINK_DOWN']}
    assert reasons[5][0]['message'] == ('NVLINK_DOWN: GPU 5 (%s): 16 of its 18 NVLinks are active, where the best GPU '
                                        'of the host has 18; links 0, 1 are down' % hgx.state['gpus'][5]['pci_bus_id'])
    # The pairs with GPU 5 share the 16 links it has left.
    assert all(near(pair['gbps'], NVLINK_PEER_GBPS * (16 / 18.0 if 5 in key else 1)) for key, pair in
               by_pair(found).items())
    assert reads[1][5]['down'] == [0, 1] and reads[1][5]['active'] == list(range(2, 18))


@pytest.mark.parametrize('backend', ['nvidia-smi', 'nvml'])
def test_errors_the_copies_add_are_named_with_their_count(hgx, backend):
    hgx.slow(1, nvlink_errors=3)
    found, reasons, reads, warnings, dummy = check(hgx, backend)
    assert warnings == [] and named(reasons) == {1: ['NVLINK_ERRORS']}
    # 3 on its link 0 for each of the 14 copies GPU 1 was in.
    assert reads[1][1]['errors']['crc_flit'] - reads[0][1]['errors']['crc_flit'] == 42
    assert reasons[1][0]['message'] == ('NVLINK_ERRORS: GPU 1 (%s): its NVLink error counters grew during the peer '
                                        'copies: flit CRC errors by 42 (summed over its 18 links)'
                                        % hgx.state['gpus'][1]['pci_bus_id'])


def test_a_hung_copy_engine_names_its_gpu_alone_after_two_waits(hgx):
    # Every copy with GPU 2 hangs 30 s: it hangs with GPU 0 and with GPU 1, and finishes none;
    # 0 and 1 copy with every other GPU, so GPU 2 is the culprit, and is tried no more.
    hgx.slow(2, copy_hang=30)
    found, reasons, dummy, warnings, took = check(hgx, pair_wait_s=1.0)
    pairs = by_pair(found)
    assert [key for key in PAIRS_OF_8 if pairs[key]['hung']] == [(0, 2), (1, 2)]
    assert pairs[(0, 2)]['call'] == 'cuMemcpyPeerAsync'
    assert [key for key in PAIRS_OF_8 if pairs[key]['skipped']] == [key for key in PAIRS_OF_8 if 2 in key and key not in (
        (0, 2), (1, 2))]
    measured = [key for key in PAIRS_OF_8 if pairs[key]['gbps']]
    assert measured == [key for key in PAIRS_OF_8 if 2 not in key]
    assert all(near(pairs[key]['gbps'], NVLINK_PEER_GBPS) for key in measured)
    # GPU 0's stream holds its hung copy: its later copies went from the peer's context.
    assert pairs[(0, 3)]['timed_on'] == 3 and pairs[(3, 0)]['timed_on'] == 3
    assert named(reasons) == {2: ['P2P_HUNG']} and warnings == []
    assert reasons[2][0]['message'].endswith('did not end within 1.0 s, and none of its copies ended')
    # Two waits of 1 s, not 14; the child answered (its hung threads end with it).
    assert took < 8


def test_a_child_killed_at_the_deadline_names_the_pair_it_was_in(hgx):
    hgx.slow(2, copy_hang=30)
    found, reasons, dummy, warnings, took = check(hgx, pair_wait_s=20.0, deadline_s=3)
    assert took < 8 and named(reasons) == {}
    assert (found['failure']['error_name'], found['failure']['pair'], found['failure']['call']) == (
        'PROBE_TIMEOUT', [0, 2], 'cuMemcpyPeerAsync')
    assert warnings[-1].startswith('the pair check gave no answer (PROBE_TIMEOUT): the pair check did not answer within')
    assert '; it was in the pair GPU 0 to GPU 2 (at cuMemcpyPeerAsync); no pair is judged' in warnings[-1]


@pytest.mark.parametrize('backend', ['nvidia-smi', 'nvml'])
def test_without_nvlink_only_the_gpus_under_one_switch_copy_at_pcie_speed(hgx, backend):
    hgx.nvlink(0)
    found, reasons, reads, warnings, dummy = check(hgx, backend)
    switch_pairs = [(src, src ^ 1) for src in range(8)]
    assert warnings == [] and found['peer_capable'] == [list(pair) for pair in switch_pairs]
    assert sorted(by_pair(found)) == switch_pairs
    assert all(near(pair['gbps'], PCIE_GBPS) for pair in found['pairs']), found['pairs']
    assert named(reasons) == {}
    assert all(read['links'] == 0 and read['active'] == [] for read in reads[1].values())
