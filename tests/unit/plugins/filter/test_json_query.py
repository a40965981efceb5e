# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
from ansible.errors import AnsibleFilterError
from ansible.template import trust_as_template

from ansible_collections.gpuops.nvidia.plugins.filter import json_query as plugin
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import clean_query

# The clean query the role ships (gpu_reset_clean_query null), at a threshold of 16 MiB.
DEFAULT_QUERY = clean_query(None, 16)


def facts(gpus, holders=()):
    return dict(nvidia_gpus=list(gpus), nvidia_device_holders=list(holders), nvidia_gpu_count=len(gpus))


def gpu(index, used=0, error=None):
    return dict(index=index, memory_used_mib=used, error=error, state='free')


@pytest.mark.parametrize('data, clean', [
    (facts([gpu(0), gpu(1, 16)]), True),
    (facts([gpu(0), gpu(1, 17)]), False),
    (facts([gpu(0), gpu(1, None)]), False),
    (facts([gpu(0, error='Unable to determine the device handle')]), False),
    (facts([gpu(0)], [dict(pid=1, protected=True)]), True),
    (facts([gpu(0)], [dict(pid=1, protected=True), dict(pid=2, protected=False)]), False),
    (facts([]), True),
])
def test_default_clean_query(data, clean):
    assert plugin.json_query(data, DEFAULT_QUERY) is clean


def test_selects_values():
    data = facts([gpu(0, 10), gpu(1, 76113)])
    assert plugin.json_query(data, 'nvidia_gpus[?memory_used_mib > `16`].index') == [1]
    assert plugin.json_query(data, 'nvidia_gpus[].{index: index, memory_used_mib: memory_used_mib}') == [
        {'index': 0, 'memory_used_mib': 10}, {'index': 1, 'memory_used_mib': 76113}]
    assert plugin.json_query(data, 'no.such.path') is None


def test_tagged_values_are_searched_as_plain_values():
    # Ansible tags the strings it loads (a subclass of str), which JMESPath's type checks reject.
    name = trust_as_template('nvidia-persistenced')
    assert type(name).__name__ != 'str'
    data = {trust_as_template('holders'): [{'comm': name}]}
    assert plugin.json_query(data, "length(holders[?starts_with(comm, 'nvidia')])") == 1
    assert plugin.json_query(data, trust_as_template('holders[0].comm')) == 'nvidia-persistenced'


def test_tuples_and_sets_become_lists():
    assert plugin.json_query({'a': (1, 2)}, 'length(a)') == 2
    assert plugin.json_query({'a': frozenset([3])}, 'a[0]') == 3


@pytest.mark.parametrize('expr, message', [
    ('nvidia_gpus[?', 'invalid JMESPath expression'),
    ('length(`1`)', 'failed: '),
])
def test_errors_are_filter_errors(expr, message):
    with pytest.raises(AnsibleFilterError, match=message):
        plugin.json_query(facts([gpu(0)]), expr)


def test_expression_must_be_a_string():
    with pytest.raises(AnsibleFilterError, match='must be a string'):
        plugin.json_query({}, 5)


def test_missing_jmespath_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(plugin, 'jmespath', None)
    with pytest.raises(AnsibleFilterError, match='needs the jmespath Python library on the controller'):
        plugin.json_query({}, 'a')


def test_registered_under_its_name():
    assert plugin.FilterModule().filters()['json_query'] is plugin.json_query
