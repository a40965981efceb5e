# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filter gpuops.nvidia.gpu_reset_reports: the role's report of each host, by host name, as the
playbook reset_gpus publishes them (set_stats). Published by a real run:
tests/integration/test_ansible_runner.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.template import trust_as_template

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_reports import FilterModule

gpu_reset_reports = FilterModule().filters()['gpu_reset_reports']


def test_each_host_with_a_report_is_published_under_its_name():
    clean = {'outcome': 'clean', 'reason': None, 'gpus_free': 2}
    failed = {'outcome': 'failed', 'reason': 'GPU 1 lost or unreadable', 'drained': True}
    hostvars = {'gpu01': {'gpu_reset_result': clean}, 'gpu02': {'gpu_reset_result': failed}}
    assert gpu_reset_reports(['gpu01', 'gpu02'], hostvars) == {
        'gpu01': dict(clean, host='gpu01'), 'gpu02': dict(failed, host='gpu02')}


def test_a_host_without_a_report_is_left_out():
    hostvars = {
        'gpu01': {'gpu_reset_result': {'outcome': 'released', 'reason': None}},
        # Unreachable, a module failure, never ran (no result, or the role's placeholder).
        'gpu02': {'gpu_reset_result': {'unreachable': True, 'msg': 'Failed to connect to the host via ssh'}},
        'gpu03': {'gpu_reset_result': {'failed': True, 'msg': 'MODULE FAILURE'}},
        'gpu04': {},
        'gpu05': {'gpu_reset_result': {'outcome': None, 'reason': None}},
    }
    assert sorted(gpu_reset_reports(['gpu0%d' % number for number in range(1, 6)], hostvars)) == ['gpu01']


def test_what_ansible_adds_to_a_tasks_result_is_not_published():
    report = {'outcome': 'failed', 'reason': 'GPU 1 lost', 'changed': False, 'failed': True, 'msg': 'GPU 1 lost',
              '_ansible_no_log': False}
    published = gpu_reset_reports([trust_as_template('gpu01')], {'gpu01': {'gpu_reset_result': report}})
    assert published == {'gpu01': {'outcome': 'failed', 'reason': 'GPU 1 lost', 'host': 'gpu01'}}
    assert [type(name) for name in published] == [str]
