# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The NVLinks read through the module's reader: nvidia-smi's nvlink -s and -e, and NVML's link
states and error counters, through stand-in readers (gpusim's, in tests/integration/test_gpu_probe_peers.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.nvlinks import (
    parse_nvlink_errors,
    parse_nvlink_status,
    read_nvlinks,
)

COUNTERS = ('replay', 'recovery', 'crc_flit', 'crc_data')


STATUS = (
    'GPU 0: NVIDIA H200 (UUID: GPU-e3e70682-c209-4cac-629f-6fbed82c07cd)\n'
    '\t Link 0: 26.562 GB/s\n'
    '\t Link 1: <inactive>\n'
    '\t Link 2: 26.562 GB/s\n'
    'GPU 1: NVIDIA H200 (UUID: GPU-67a9c378-7c65-c1e5-82e2-e662f728b4fa)\n'
    '\t Link 0: 26.562 GB/s\n'
    '\t Link 1: 26.562 GB/s\n'
    '\t Link 2: 26.562 GB/s\n'
)
# As a GB300 prints it (no UUID), then an H100's, with what a newer driver adds and a value it cannot read.
ERRORS = (
    'GPU 0: NVIDIA GB300\n'
    '\t Link 0: Replay Errors: 0\n'
    '\t Link 0: Recovery Errors: 1\n'
    '\t Link 0: CRC Errors: 6\n'
    '\n'
    '\t Link 1: Replay Errors: 2\n'
    '\t Link 1: Recovery Errors: 0\n'
    '\t Link 1: CRC Errors: 3\n'
    'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-67a9c378-7c65-c1e5-82e2-e662f728b4fa)\n'
    '\t Link 0: Replay Errors: 0\n'
    '\t Link 0: Recovery Errors: N/A\n'
    '\t Link 0: Rx Errors: 12\n'
    '\t Link 0: CRC Errors: 0\n'
)


def test_nvlink_status_and_error_counters_are_read_from_nvidia_smis_text():
    assert parse_nvlink_status(STATUS) == {0: {0: True, 1: False, 2: True}, 1: {0: True, 1: True, 2: True}}
    assert parse_nvlink_status('') == {}
    assert parse_nvlink_errors(ERRORS) == {
        0: {0: dict(replay=0, recovery=1, crc_flit=6), 1: dict(replay=2, recovery=0, crc_flit=3)},
        1: {0: dict(replay=0, crc_flit=0)}}


class Runner:
    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def run(self, args, timeout=None):
        self.asked.append((args, timeout))
        return self.answers[' '.join(args)]


class SmiReader:
    backend = 'nvidia-smi'

    def __init__(self, answers):
        self.runner = Runner(answers)


class HostReader:
    def __init__(self, reader):
        self.reader = reader
        self.backend = reader.backend


def test_nvidia_smi_reads_sum_each_counter_over_the_links():
    reader = HostReader(SmiReader({'nvlink -s': (0, STATUS, ''), 'nvlink -e': (0, ERRORS, '')}))
    found, warnings = read_nvlinks(reader, [0, 1, 2], 5.0)
    assert warnings == []
    assert found[0] == dict(links=3, active=[0, 2], down=[1], errors=dict(replay=2, recovery=1, crc_flit=9,
                                                                          crc_data=None))
    assert found[1]['errors'] == dict(replay=0, recovery=None, crc_flit=0, crc_data=None)
    # Not printed: a GPU without NVLink.
    assert found[2] == dict(links=0, active=[], down=[], errors=dict((name, None) for name in COUNTERS))
    assert all(0 < timeout <= 5.0 for dummy, timeout in reader.reader.runner.asked)


def test_a_failed_nvidia_smi_is_a_warning_and_nothing_is_judged():
    reader = SmiReader({'nvlink -s': (3, '', 'Failed to initialize NVML: Unknown Error\n')})
    assert read_nvlinks(reader, [0], 5.0) == ({}, [
        'the NVLinks could not be read (nvidia-smi nvlink -s exited 3: Failed to initialize NVML: Unknown Error): no '
        'NVLink is judged'])
    reader = SmiReader({'nvlink -s': (0, STATUS, ''), 'nvlink -e': (2, '', 'Invalid combination of input arguments')})
    found, warnings = read_nvlinks(reader, [0], 5.0)
    assert found[0]['active'] == [0, 2] and found[0]['errors']['crc_flit'] is None
    assert warnings == ['the NVLink error counters could not be read (nvidia-smi nvlink -e exited 2: Invalid '
                        'combination of input arguments): they are not judged']
    assert read_nvlinks(reader, [], 5.0) == ({}, [])


class NVMLError(Exception):
    def __init__(self, value):
        super(NVMLError, self).__init__('NVML error %d' % value)
        self.value = value


class Nvml:
    """Stands for pynvml: GPU n has links[n] NVLinks (down: those down), counter c of link l reads
    counts.get((n, l, c), 0); 15 (GPU lost) for a GPU in lost."""

    NVMLError = NVMLError

    def __init__(self, links, down=None, counts=None, lost=()):
        self.links, self.down, self.counts, self.lost = links, down or {}, counts or {}, lost

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if handle in self.lost:
            raise NVMLError(15)
        if not self.links[handle]:
            raise NVMLError(3)
        if link >= self.links[handle]:
            raise NVMLError(2)
        return 0 if link in self.down.get(handle, ()) else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        if not self.links[handle] or link >= self.links[handle] or counter > 4:
            raise NVMLError(2)
        return self.counts.get((handle, link, counter), 0)


class NvmlReader:
    backend = 'nvml'

    def __init__(self, nvml):
        self.nvml, self.calls = nvml, []

    def _call(self, func, timeout, what):
        self.calls.append((timeout, what))
        return func()


def test_nvml_reads_each_link_until_the_gpu_has_no_more():
    reader = NvmlReader(Nvml([18, 0, 12, 18], down={0: [3, 17]}, counts={(0, 0, 2): 5, (0, 9, 2): 1, (0, 4, 0): 2},
                             lost=(3,)))
    found, warnings = read_nvlinks(HostReader(reader), [0, 1, 2, 3], 4.0)
    assert found[0] == dict(links=18, active=[n for n in range(18) if n not in (3, 17)], down=[3, 17],
                            errors=dict(replay=2, recovery=0, crc_flit=6, crc_data=0))
    assert found[1] == dict(links=0, active=[], down=[], errors=dict((name, None) for name in COUNTERS))
    assert found[2]['links'] == 12 and 3 not in found
    assert warnings == ['the NVLinks of GPU 3 could not be read (NVML error 15): they are not judged']
    assert reader.calls == [(4.0, 'reading the NVLinks')]


# ------------------------------------------------------------------ the child, on a stand-in driver
