# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_summary import FilterModule, gpu_reset_summary
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import summary

CLEAN = {'gpu_reset_result': {'outcome': 'clean', 'gpus_free': 2}}
FAILED = {'gpu_reset_result': {'outcome': 'failed', 'reason': 'GPU 1 lost or unreadable', 'duration_s': 1.25}}


def test_the_filter_is_registered():
    assert FilterModule().filters()['gpu_reset_summary'] is gpu_reset_summary


def test_with_a_report_from_every_host_it_is_the_verdicts_summary():
    hostvars = {'gpu01': CLEAN, 'gpu02': FAILED}
    assert gpu_reset_summary(['gpu01', 'gpu02'], hostvars) == summary(['gpu01', 'gpu02'], hostvars) == [
        '2 of 2 host(s): 1 clean, 0 released, 1 failed',
        'FAILED    gpu02  after 1.2 s: GPU 1 lost or unreadable',
        'clean     1 host(s), nothing to do (2 GPU(s) free): gpu01',
    ]


def test_each_host_without_a_report_is_named_with_why():
    hostvars = {
        'gpu01': CLEAN,
        'gpu02': FAILED,
        'gpu04': {'gpu_reset_result': {'unreachable': True, 'changed': False,
                                       'msg': 'Failed to connect to the host via ssh:\n Connection refused'}},
        'gpu05': {'gpu_reset_result': {'failed': True, 'msg': 'MODULE FAILURE'}},
        # Never ran: no result at all, or the role's placeholder (roles/gpu_reset/vars/main.yml).
        'gpu06': {},
        'gpu7': {'gpu_reset_result': {'outcome': None, 'reason': None}},
    }
    lines = gpu_reset_summary(sorted(hostvars), hostvars)
    assert lines[0] == '2 of 6 host(s): 1 clean, 0 released, 1 failed'
    assert lines[3:] == [
        'UNREACHED gpu04  Failed to connect to the host via ssh: Connection refused',
        'FAILED    gpu05  MODULE FAILURE',
        'NOT RUN   gpu06  no result: the play ended before the role ran on it',
        'NOT RUN   gpu7   no result: the play ended before the role ran on it',
    ]


def test_a_long_message_is_cut_and_control_characters_escaped():
    hostvars = {'gpu01': {'gpu_reset_result': {'unreachable': True, 'msg': '\x1b[2J' + 'x' * 400}}}
    line = gpu_reset_summary(['gpu01'], hostvars)[-1]
    assert line.startswith('UNREACHED gpu01  \\x1b[2J') and line.endswith('...(107 more characters)'), line
