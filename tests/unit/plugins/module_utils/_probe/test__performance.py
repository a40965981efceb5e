# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The performance level's judgement, topology and conducting, without CUDA: its children here
are real forked processes that speak the conductor's words (the CUDA side runs on gpusim in
tests/integration/test_gpu_probe_performance.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import performance as _performance
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.conductor import (
    COPY,
    DONE,
    LOAD,
    LOADED,
    READY,
    Channel,
    Control,
    await_word,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.performance import (
    PerformanceOptions,
    copy_rounds,
    parse_topology,
    slow_reasons,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import ProbeChild, ProbeOptions
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

# `nvidia-smi topo -m` of a PCIe host with two GPUs under each switch, as the driver prints it
# (tabs between cells, a NIC beside GPU 0 and 1, the legend after a blank line).
TOPOLOGY = (
    '\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n'
    'GPU0\t X \tPIX\tNODE\tSYS\tPXB\t0-31\t0\t\tN/A\n'
    'GPU1\tPIX\t X \tNODE\tSYS\tPXB\t0-31\t0\t\tN/A\n'
    'GPU2\tNODE\tNODE\t X \tSYS\tNODE\t0-31\t0\t\tN/A\n'
    'GPU3\tSYS\tSYS\tSYS\t X \tSYS\t32-63\t1\t\tN/A\n'
    'NIC0\tPXB\tPXB\tNODE\tSYS\t X \t\t\t\t\n'
    '\n'
    'Legend:\n'
    '\n'
    '  X    = Self\n'
    '  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n'
    '  PIX  = Connection traversing at most a single PCIe bridge\n'
    '  NV#  = Connection traversing a bonded set of # NVLinks\n'
)


def test_gpus_under_one_switch_are_read_from_topo_m():
    assert parse_topology(TOPOLOGY) == set([frozenset((0, 1))])
    # NVLink between GPUs says nothing of their PCIe switch; colour codes are skipped.
    nvlink = '\x1b[4m\tGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tNV18\t0-31\nGPU1\tNV18\t X \t0-31\n'
    assert parse_topology(nvlink) == set()
    with pytest.raises(ValueError, match='no GPU matrix'):
        parse_topology('Failed to initialize NVML: Driver/library version mismatch\n')


def test_gpus_of_one_switch_copy_in_different_rounds():
    pairs = set(frozenset((n, n + 1)) for n in range(0, 8, 2))
    rounds = copy_rounds(list(range(8)), lambda a, b: frozenset((a, b)) in pairs)
    assert rounds == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert copy_rounds([0, 1, 2], lambda a, b: False) == [[0, 1, 2]]


def result(index, h2d=55.0, d2h=54.0, hbm=3700.0, link=(5, 16, 5, 16), replays=0):
    return dict(index=index, pci_bus_id='00000000:%02X:00.0' % (0x18 + index), h2d_gbps=h2d, d2h_gbps=d2h,
                hbm_gbps=hbm, replays=replays,
                link=None if link is None else dict(zip(('gen', 'width', 'max_gen', 'max_width'), link)))


def reasons(res, results, fraction=0.15):
    return [(reason['reason'], reason['message']) for reason in slow_reasons(res, results, fraction)]


def test_a_link_degraded_under_load_is_named_alone_with_its_figures():
    results = [result(n) for n in range(8)]
    results[3] = result(3, h2d=6.7, d2h=6.6, link=(3, 8, 5, 16))
    assert [n for n, res in enumerate(results) if reasons(res, results)] == [3]
    found = dict(reasons(results[3], results))
    assert found['PCIE_LINK_DEGRADED'] == ('PCIE_LINK_DEGRADED: GPU 3 (00000000:1B:00.0): its PCIe link ran at Gen3 x8 '
                                           'while loaded, below its maximum of Gen5 x16')
    assert found['H2D_BELOW_PEERS'] == ('H2D_BELOW_PEERS: GPU 3 (00000000:1B:00.0) copied host to device at 6.7 GB/s, '
                                        'below 46.8 GB/s (15 % under the median 55.0 GB/s of its 7 peers)')
    assert 'D2H_BELOW_PEERS' in found and 'HBM_BELOW_PEERS' not in found


def test_a_bandwidth_40_percent_below_its_peers_is_slow_and_the_healthy_spread_is_not():
    results = [result(n, h2d=55.0 * (1 + (n % 3 - 1) * 0.03)) for n in range(8)]
    assert not any(reasons(res, results) for res in results)
    results[5]['hbm_gbps'] = 3700.0 * 0.6
    assert [n for n, res in enumerate(results) if reasons(res, results)] == [5]
    assert reasons(results[5], results)[0][0] == 'HBM_BELOW_PEERS'
    # A stricter bound is an option: 3 % below is then slow.
    assert [reason for reason, dummy in reasons(results[0], results, 0.02)] == ['H2D_BELOW_PEERS']


def test_what_was_not_read_is_not_judged():
    # A link not read under load (None), a GPU alone (no peers), a figure missing: nothing to judge.
    alone = result(0, link=None)
    assert reasons(alone, [alone]) == []
    results = [result(0, h2d=None), result(1, h2d=10.0, link=(None, None, 5, 16))]
    assert [reason for reason, dummy in reasons(results[1], results)] == []


def test_replays_during_the_copies_make_a_gpu_slow():
    results = [result(n) for n in range(2)]
    results[1]['replays'] = 12
    assert reasons(results[1], results) == [('PCIE_REPLAYS', 'PCIE_REPLAYS: GPU 1 (00000000:19:00.0): its PCIe replay '
                                             'counter grew by 12 during the copies')]


@pytest.mark.parametrize('fraction', [0, 1, -0.1, 0.95, True, 'x'])
def test_a_bad_slow_fraction_is_named(fraction):
    with pytest.raises(GpuopsError, match='slow_fraction must be more than 0 and at most 0.9'):
        PerformanceOptions(probe_level='performance').set_slow_fraction(fraction)


def test_the_performance_level_is_the_probe_modules_and_not_the_releases():
    assert ProbeOptions(probe_level='performance').probe_level == 'performance'
    from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import RELEASE_PROBE_SPEC
    assert 'performance' not in RELEASE_PROBE_SPEC['level']['choices']


# ------------------------------------------------------------------ conducting real children

def child_that_speaks(request):
    """A child of the conductor: ready, then copies when told, loaded when told, and says what
    it heard (a stand-in for PerformanceProbe's copies, whose CUDA side gpusim tests)."""
    control = Control(*request['control'])
    control.say(READY)
    heard = []
    while True:
        word = control.next(5)
        if not word:
            break
        heard.append(word.decode())
        if word == COPY:
            time.sleep(float(request['gpus'][0]['index']) / 100)
            control.say(b'T')
        elif word == LOAD:
            control.say(LOADED)
    control.close()
    print(json.dumps(dict(pid=os.getpid(), gpus=[], heard=heard)))


def test_children_keep_only_their_pipes_and_hear_the_conductor():
    child = _performance.PerformanceChild()
    child.program = child_that_speaks
    started = [child.start(dict(index=n, pci_bus_id='00000000:%02X:00.0' % (0x18 + n)), 64) for n in range(2)]
    channels = [child.channels[proc] for proc in started]
    assert await_word(channels, READY, time.monotonic() + 10) == channels
    for channel in channels:
        assert channel.say(COPY) and channel.say(LOAD)
    assert await_word(channels, LOADED, time.monotonic() + 10) == channels
    for channel in channels:
        channel.say(DONE)
        channel.close()
    answers = [child.answer(proc, 10) for proc in started]
    assert [answer['heard'] for answer in answers] == [['C', 'L', 'D']] * 2


def test_a_child_that_never_speaks_is_waited_for_no_longer_than_the_grace():
    def silent(request):
        time.sleep(3)
        print(json.dumps(dict(pid=os.getpid(), gpus=[])))

    def ready(request):
        Control(*request['control']).say(READY)
        print(json.dumps(dict(pid=os.getpid(), gpus=[])))

    child = _performance.PerformanceChild()
    procs = []
    for program in (ready, silent):
        child.program = program
        procs.append(child.start(dict(index=len(procs), pci_bus_id='00000000:18:00.0'), 64))
    channels = [child.channels[proc] for proc in procs]
    started = time.monotonic()
    assert await_word(channels, READY, started + 30, grace=0.5) == channels[:1]
    assert time.monotonic() - started < 2.5
    for proc, channel in zip(procs, channels):
        channel.close()
        Runner('child').finish(proc, 10, ['child'])


def test_a_channel_whose_child_is_gone_says_so():
    commands, answers = os.pipe(), os.pipe()
    channel = Channel(commands[1], answers[0])
    for fd in (commands[0], answers[1]):
        os.close(fd)
    assert channel.say(COPY) is False
    assert await_word([channel], READY, time.monotonic() + 5) == []
    channel.close()


def test_a_probe_child_without_pipes_keeps_nothing_open():
    # The allocation level's children are started as before: no descriptor of the parent's.
    found = ProbeChild(lambda request: print(json.dumps(dict(pid=os.getpid(), gpus=[], fds=os.listdir('/proc/self/fd'))))
                       ).run(dict(index=0, pci_bus_id='00000000:18:00.0'), 64, 5)
    assert len(found['fds']) <= 4


ROW_REMAPPER = '''
==============NVSMI LOG==============

Attached GPUs                             : 2
GPU 00000000:18:00.0
    Remapped Rows
        Correctable Error                 : 0
        Bank Remap Availability Histogram
            Max                           : 3072 bank(s)
            High                          : 0 bank(s)
            Partial                       : 0 bank(s)
            Low                           : 0 bank(s)
            None                          : 0 bank(s)

GPU 00000000:2A:00.0
    Remapped Rows
        Bank Remap Availability Histogram
            Max                           : 3070 bank(s)
            High                          : 0 bank(s)
            None                          : 2 bank(s)
'''


def test_the_row_remappers_histograms_are_read_by_bus_id_and_a_partial_one_is_left_out():
    assert _performance.parse_remap_histograms(ROW_REMAPPER) == {
        '00000000:18:00.0': dict(max=3072, high=0, partial=0, low=0, none=0)}


def test_a_bank_without_spare_rows_is_named():
    res = result(0)
    res['remap_histogram'] = dict(max=3070, high=0, partial=0, low=0, none=2)
    assert [reason for reason, dummy in reasons(res, [res])] == ['REMAP_HEADROOM_NONE']


def test_every_reason_a_gpu_is_called_slow_for_is_documented_where_operators_look():
    import os
    import yaml
    from ansible_collections.gpuops.nvidia.plugins.modules import nvidia_gpu_probe

    repo = os.path.join(os.path.dirname(__file__), *(['..'] * 5))
    documented = yaml.safe_load(nvidia_gpu_probe.RETURN)['gpus']['contains']['slow']['description']
    with open(os.path.join(repo, 'docs', 'docsite', 'rst', 'guide_troubleshooting.rst')) as handle:
        troubleshooting = handle.read()
    for reason in _performance.SLOW_REASONS:
        assert 'V(%s)' % reason in ' '.join(documented), reason
        assert '``%s``' % reason in troubleshooting, reason
