# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_brake_problem import FilterModule

brake_problem = FilterModule().filters()['gpu_reset_brake_problem']


@pytest.mark.parametrize('value', ['10%', '1', 10, '100%', '0'])
def test_a_cap_the_hook_reads_is_no_problem(value):
    assert brake_problem(value) == ''


@pytest.mark.parametrize('value', ['10 %', '%5', '5%3', '10%%', 'ten', '', None, '-1'])
def test_a_cap_the_hook_would_refuse_is_named_in_its_words(value):
    assert brake_problem(value) == '%r is neither a number of nodes nor a percentage (N%%)' % (value,)


@pytest.mark.parametrize('value, problem', [
    ('5/10m', ''),
    ('1/1h', ''),
    ('5', "'5' is not NODES/WINDOW, such as 5/10m (s, m or h)"),
    ('0/10m', "'0/10m' must be at least 1 node within 1 s to 7 days"),
    ('5/200h', "'5/200h' must be at least 1 node within 1 s to 7 days"),
])
def test_a_rate_is_checked_by_the_hook_s_rule(value, problem):
    assert brake_problem(value, 'max_drain_rate') == problem


def test_a_setting_that_is_no_brake_s_is_an_error():
    with pytest.raises(AnsibleFilterError, match='setting must be max_drain_rate or max_drained'):
        brake_problem('10%', 'max_drain')
