# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet brake (plugin_utils/_brake.py): the cap, a number or a share of the cluster; the rate;
the nodes sinfo lists as out of service for gpu_reset; and what the Slurm hook's Prolog does past
them, run against simulated hosts and a fake sinfo."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _brake, _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import reset as _hook_reset
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status


def sinfo_lines(nodes, drained=(), other=(), at=None):
    """sinfo -h -N -o '%N|%t|%H|%E' (SLURM_TIME_FORMAT=%s) of nodes gpu01..gpuNN in two partitions:
    drained, with a gpu_reset reason given at `at` (seconds since the epoch; default an hour ago);
    other, drained for a reason of someone else's."""
    at = int(time.time() - 3600 if at is None else at)
    lines = []
    for partition in ('batch', 'debug'):
        for number in range(1, nodes + 1):
            name = 'gpu%02d' % number
            if name in drained:
                lines.append('%s|drain|%d|gpu_reset: GPU 1: 900 MiB held with no process left | pid 7' % (name, at))
            elif name in other:
                lines.append('%s|drain*|%d|bad DIMM' % (name, at))
            else:
                lines.append('%s|idle|Unknown|none' % name)
        if partition == 'debug':
            lines = lines[:nodes + 2]  # the debug partition holds only two of the nodes
    return '\n'.join(lines) + '\n'


def prolog(slurm, capsys, hook_vars, *more):
    rc = _slurm_hook.main(['--node', 'gpu07', '--scontrol', slurm.scontrol, '--vars-file', hook_vars(),
                           '--timeout', '5', '--deadline', '30'] + list(more))
    out = capsys.readouterr()
    return rc, json.loads(out.out), [call for call in slurm.calls() if call[1:2] == ['update']]


def test_past_the_cap_a_node_that_can_run_jobs_stays_in_service(gpuhost, slurm, capsys, hook_vars):
    """A probe that fails on every node (a driver update, a bug) must not empty the cluster: with
    one of 20 nodes drained by gpu_reset already and a cap of 1, the node stays in service."""
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(20, drained=('gpu03',), other=('gpu05',)))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '1')
    assert rc == _hook_status.RUNNER_BRAKE_HELD and updates == []
    assert report['outcome'] == 'failed' and report['drained'] is False
    assert report['brake'] == {'held': True, 'drained_nodes': 1, 'nodes': 20, 'cap': 1, 'rule': 'count'}
    assert report['reason'].endswith('; not drained: the brake holds (count: 1 of 20 nodes drained by gpu_reset already, '
                                     'at most 1)'), report['reason']


def test_under_the_cap_the_node_is_drained(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(30, drained=('gpu03', 'gpu07'), other=('gpu05',)))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '10%')
    # 10 % of 30 nodes is 3; one other node is drained by gpu_reset (this one does not count).
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'drained_nodes': 1, 'nodes': 30, 'cap': 3}


def test_a_node_where_no_job_can_run_is_drained_past_the_cap_saying_so(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('lost', gpu=1)
    slurm.says(sinfo=sinfo_lines(4, drained=('gpu01', 'gpu02')))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '1')
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'drained_nodes': 2, 'nodes': 4, 'cap': 1, 'rule': 'count', 'overridden': True}
    assert updates[0][-1].startswith('reason=gpu_reset: the brake (count: 2 of 4 nodes drained by gpu_reset already, at most 1) '
                                     'is overridden, no job can run here: GPU 1 lost'), updates[0][-1]


@pytest.mark.parametrize('sinfo', ['', 'garbage; rm -rf /\n'])
def test_a_cluster_sinfo_cannot_tell_is_drained_as_without_a_brake(gpuhost, slurm, capsys, hook_vars, sinfo):
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo)
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '1')
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'why': 'the drained nodes could not be counted: sinfo listed no node'}


def test_every_state_that_takes_no_jobs_counts_when_gpu_reset_gave_the_reason(slurm):
    slurm.says(sinfo='gpu01|failg|1796214743|gpu_reset: GPU 1 lost\ngpu02|drng*|Unknown|gpu_reset: GPU 2 lost\n'
                     'gpu03|down~|2026-12-02T12:32:23|gpu_reset: x\n'
                     'gpu04|idle|Unknown|none\ngpu05|drain|1|bad DIMM\ngpu06|alloc|1|gpu_reset: an old reason\n'
                     'gpu07|drain|1|gpu_reset(hold): not rebooted (a reboot asked for at 2026-12-01T10:00:00Z did not '
                     'cure it): GPU 1 needs a reboot\ngpu08|drain|1|gpu_reset(holdout): not ours\n')
    nodes, drained = _brake.parse_listing(_hook_reset.read_listing(slurm.scontrol, 5))
    assert sorted(nodes) == ['gpu0%d' % number for number in range(1, 9)]
    # A node held for a person is out of service for gpu_reset as much as a drained one.
    assert sorted(drained) == ['gpu01', 'gpu02', 'gpu03', 'gpu07']
    assert drained['gpu01'] == 1796214743 and drained['gpu02'] is None and drained['gpu07'] == 1
    # A Slurm that ignores SLURM_TIME_FORMAT prints its local time.
    assert drained['gpu03'] == time.mktime(time.strptime('2026-12-02T12:32:23', '%Y-%m-%dT%H:%M:%S'))
    assert slurm.calls()[-1] == ['sinfo', '-h', '-N', '-o', '%N|%t|%H|%E']


@pytest.mark.parametrize('text, nodes, cap', [('10%', 30, 3), ('10%', 5, 1), ('25%', 10, 3), ('4', 100, 4), ('0', 9, 1)])
def test_the_cap_is_a_number_or_a_share_of_the_cluster_at_least_one(text, nodes, cap):
    assert _brake.brake_cap(text, nodes) == cap


def test_past_the_rate_a_node_that_can_run_jobs_stays_in_service(gpuhost, slurm, capsys, hook_vars):
    """Two nodes drained by gpu_reset a minute ago, at most 2 in 10 minutes: held by the rate,
    far under the count's cap."""
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(40, drained=('gpu03', 'gpu04'), other=('gpu05',), at=time.time() - 60))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '50%', '--max-drain-rate', '2/10m')
    assert rc == _hook_status.RUNNER_BRAKE_HELD and updates == []
    assert report['brake'] == {'held': True, 'drained_nodes': 2, 'nodes': 40, 'cap': 20, 'rate': '2/10m',
                               'recent_drains': 2, 'rule': 'rate'}
    assert report['reason'].endswith('; not drained: the brake holds (rate: 2 nodes drained by gpu_reset within '
                                     '600 s, at most 2/10m)'), report['reason']


def test_drains_older_than_the_window_leave_the_rate_alone(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(40, drained=('gpu03', 'gpu04'), at=time.time() - 700))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '50%', '--max-drain-rate', '2/10m')
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'drained_nodes': 2, 'nodes': 40, 'cap': 20, 'rate': '2/10m', 'recent_drains': 0}


def test_a_node_where_no_job_can_run_is_drained_past_the_rate_saying_which_rule(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('lost', gpu=1)
    slurm.says(sinfo=sinfo_lines(40, drained=('gpu03',), at=time.time() - 5))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '50%', '--max-drain-rate', '1/1h')
    assert rc == _hook_status.RUNNER_DRAINED and report['brake']['overridden'] and report['brake']['rule'] == 'rate'
    assert updates[0][-1].startswith('reason=gpu_reset: the brake (rate: 1 nodes drained by gpu_reset within 3600 s, '
                                     'at most 1/1h) is overridden, no job can run here: GPU 1 lost'), updates[0][-1]


@pytest.mark.parametrize('text, seconds', [('5/10m', 600), ('1/30s', 30), ('12/2h', 7200), ('1/168h', 7 * 24 * 3600)])
def test_a_rate_window_is_seconds_minutes_or_hours(text, seconds):
    assert _brake.drain_rate_problem(text) is None and _brake.window_s(text) == seconds


@pytest.mark.parametrize('text', ['10%\n', '5\n', '10%\nALL'])
def test_a_cap_with_a_line_break_is_no_cap(text):
    assert _brake.max_drained_problem(text)


@pytest.mark.parametrize('rate', ['5/10m\n', '5/10m\nx'])
def test_a_rate_with_a_line_break_is_no_rate(rate):
    assert _brake.drain_rate_problem(rate)
