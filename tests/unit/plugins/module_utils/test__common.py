# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What every module of the collection shares (module_utils/_common.py): user-chosen text made safe
to print on one line, a task's time spent phase by phase, and the checks of a number of seconds."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    CALL_FLOOR_S,
    MAX_SECONDS,
    Budget,
    NoTimeLeft,
    check_non_negative,
    check_seconds,
    check_time_left,
    printable,
)


@pytest.mark.parametrize('text, expected', [
    ('python3 train.py --lr 0.1', 'python3 train.py --lr 0.1'),
    ('x\ny', 'x\\x0ay'),
    ('\x1b]0;pwn\x07', '\\x1b]0;pwn\\x07'),
    ('\x9b2J\x7f', '\\x9b2J\\x7f'),
    ('a\u202eb\u2028c\u2066', 'a\\u202eb\\u2028c\\u2066'),
    # A backslash that was there is doubled: it cannot pass for an escape made here.
    ('C:\\x1b', 'C:\\\\x1b'),
    ('caf\u00e9 \u4e2d', 'caf\u00e9 \u4e2d'),
    (None, None),
])
def test_user_chosen_text_prints_on_one_line_with_its_control_characters_escaped(text, expected):
    assert printable(text) == expected


def test_text_made_printable_once_is_not_escaped_again_and_is_capped_saying_how_much():
    once = printable('a\\b\nc')
    assert printable(once, backslashes=False) == once == 'a\\\\b\\x0ac'
    assert printable('n' * 300, 80) == 'n' * 80 + '...(220 more characters)'
    assert printable('\n' * 30, 8) == '\\x0a\\x0a...(112 more characters)'
    assert printable('short', 80) == 'short'


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_budget_says_where_its_time_went_leaving_out_what_took_no_time():
    clock = Clock()
    budget = Budget('the release', 3.0, clock=clock)
    clock.now = 100.4
    budget.spend('scan of /proc', 100.0)
    budget.spend('locking', 100.4)
    since = clock.now
    clock.now = 101.5
    budget.spend('waiting for the holders to exit', since)
    clock.now = 102.7
    budget.spend('waiting for the holders to exit', 101.5)
    assert budget.used() == 'the release used 2.7 s of 3.0 s: scan of /proc 0.4 s, waiting for the holders to exit 2.3 s'
    assert Budget('the probe', 5.0, clock=clock).used() == 'the probe used 0.0 s of 5.0 s'


def test_no_call_is_made_with_less_than_its_floor_left():
    check_time_left('read the GPUs', CALL_FLOOR_S)
    with pytest.raises(NoTimeLeft, match=r'no time was left within the timeout to read the GPUs \(0\.00 s left; a call '
                                         r'is given at least 0\.5 s\)'):
        check_time_left('read the GPUs', -3)


@pytest.mark.parametrize('value, positive, problem', [
    (None, True, None),
    (0, False, None),
    (2.5, True, None),
    (MAX_SECONDS, False, None),
    (0, True, 'timeout must be more than 0 seconds, got 0'),
    (-1, False, 'timeout must be zero or more, got -1'),
    (float('nan'), False, 'timeout must be a finite number of seconds, got nan'),
    (float('-inf'), True, 'timeout must be a finite number of seconds, got -inf'),
    (MAX_SECONDS + 1, False, 'timeout must be at most %d seconds, got %d' % (MAX_SECONDS, MAX_SECONDS + 1)),
])
def test_a_number_of_seconds_is_finite_not_negative_and_fits_a_timer(value, positive, problem):
    assert check_seconds('timeout', value, positive) == problem


def test_the_first_negative_option_is_named():
    params = {'memory_threshold_mib': 0, 'expected_gpus': -2, 'other': -1, 'unset': None}
    assert check_non_negative(params, ['memory_threshold_mib', 'unset', 'expected_gpus', 'other']) == \
        'expected_gpus must be zero or more, got -2'
    assert check_non_negative(params, ['memory_threshold_mib', 'unset']) is None
