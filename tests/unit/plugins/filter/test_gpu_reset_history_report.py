# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filter gpu_reset_history_report: slurp's results by host, as the playbook passes them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_history_report import gpu_reset_history_report

UUID = 'GPU-11111111-2222-3333-4444-555555555555'


def slurped(data):
    return {'content': base64.b64encode(json.dumps(data).encode()).decode(), 'encoding': 'base64'}


def test_each_host_as_slurp_read_it_missing_and_unreachable_ones_said():
    history = {'gpus': {UUID: [{'time': 1000.0, 'kind': 'reset', 'reason': 'orphaned memory', 'index': 2,
                                'outcome': 'cured', 'duration_s': 3.0}]}}
    text = gpu_reset_history_report({
        'gpu01': slurped(history),
        'gpu02': {'failed': False, 'msg': 'file not found: /var/lib/gpuops/history.json'},
        'gpu03': {'unreachable': True, 'msg': 'Failed to connect to the host via ssh'},
        'gpu04': {'content': '!!!', 'encoding': 'base64'},
    })
    joined = '\n'.join(text)
    assert text[1].startswith('gpu01') and UUID in text[2] and '3s' in text[2]
    assert 'gpu02' in joined and 'unreadable' not in [line for line in text if line.startswith('gpu02')][0]
    assert 'history unreadable: unreachable: Failed to connect to the host via ssh' in joined
    assert 'history unreadable: not base64 as slurp gives it' in joined or 'history unreadable: not JSON' in joined


@pytest.mark.parametrize('value', [None, 'gpu01', ['gpu01']])
def test_anything_but_results_by_host_is_refused(value):
    with pytest.raises(AnsibleFilterError, match='expected {host: slurp result}'):
        gpu_reset_history_report(value)
