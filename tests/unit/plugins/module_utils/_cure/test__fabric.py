# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.fabric import wait_for_fabric
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiRunner


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Answers:
    """What an nvidia-smi gpusim cannot be says (an older one, one that fails): the boundary."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def run(self, args, timeout=None):
        self.calls.append(args)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_registering_gpu_is_waited_for_until_it_completes():
    clock = Clock()
    runner = Answers((0, '3, In Progress, N/A\n', ''), (0, '3, In Progress, N/A\n', ''), (0, '3, Completed, Success\n', ''))
    entries = wait_for_fabric(runner, [3], 10.0, clock, clock.sleep)
    assert entries == [{'index': 3, 'state': 'Completed', 'status': 'Success', 'ok': True}]
    assert len(runner.calls) == 3 and clock.now == 1.0
    assert runner.calls[0] == ['-i', '3', '--query-gpu=index,fabric.state,fabric.status', '--format=csv,noheader']


def test_the_wait_ends_at_the_deadline():
    clock = Clock()
    entries = wait_for_fabric(Answers((0, '0, Not Started, N/A\n', '')), [0], 3.0, clock, clock.sleep)
    assert entries[0]['ok'] is False and entries[0]['state'] == 'Not Started' and clock.now <= 3.0


def test_an_nvidia_smi_without_the_fields_is_not_waited_for():
    said = 'Field "fabric.state" is not a valid field to query.\n'
    entries = wait_for_fabric(Answers((2, said, '')), [0, 1], 10.0, Clock())
    assert [entry['ok'] for entry in entries] == [True, True]
    assert entries[0]['note'] == 'this nvidia-smi does not report the fabric state'


def test_an_undocumented_state_or_an_unanswered_query_is_not_ok():
    entries = wait_for_fabric(Answers((0, '0, [Unknown Error], [Unknown Error]\n', '')), [0], 10.0, Clock())
    assert entries[0]['ok'] is False and 'does not document' in entries[0]['note']
    entries = wait_for_fabric(Answers(GpuopsError('nvidia-smi did not answer within 2 s')), [0], 10.0, Clock())
    assert entries[0]['ok'] is False and 'did not answer' in entries[0]['note']
    entries = wait_for_fabric(Answers((0, '1, Completed, Success\n', '')), [0], 10.0, Clock())
    assert entries[0]['ok'] is False and 'could not be read' in entries[0]['note']


def test_the_simulators_fabric_after_a_reset(gpuhost):
    gpuhost.fault('fabric', value='on', seconds=0.6)
    runner = SmiRunner(gpuhost.smi_path)
    assert wait_for_fabric(runner, [0], time.monotonic() + 5)[0]['state'] == 'Completed'
    assert gpuhost.smi('--gpu-reset', '-i', '1').returncode == 255  # persistence mode holds it
    gpuhost.smi('-i', '1', '-pm', '0')
    assert gpuhost.smi('--gpu-reset', '-i', '1').returncode == 0
    rc, out, dummy = runner.run(['-i', '1', '--query-gpu=fabric.state,fabric.status', '--format=csv,noheader'])
    assert out.strip() == 'In Progress, N/A'
    assert wait_for_fabric(runner, [1], time.monotonic() + 5) == [{'index': 1, 'state': 'Completed', 'status': 'Success', 'ok': True}]
