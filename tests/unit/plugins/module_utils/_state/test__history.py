# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Each GPU's history: kept across reboots, bounded, never read from a file it did not write."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._state import history as _history
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History, check_hold_options
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, load_cures, record_cure

UUID = 'GPU-11111111-2222-3333-4444-555555555555'
OTHER = 'GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee'
DAY = 86400.0


def test_under_a_simulated_host_it_lives_in_its_var_lib(tmp_path):
    history = History.for_host(str(tmp_path))
    assert history.state.path == str(tmp_path / 'var' / 'lib' / 'gpuops') and history.state.usable
    assert stat.S_IMODE(os.stat(history.state.path).st_mode) == 0o700
    assert _history.default_history_dir('/', euid=0) == '/var/lib/gpuops'


def test_the_history_survives_a_reboot_where_the_cures_of_run_do_not(tmp_path):
    run, var = StateDir(str(tmp_path / 'run')), History.for_host(str(tmp_path))
    record_cure(run, [UUID], 1000.0, 'reset', boot='boot-1')
    var.record([(UUID, 3, 'orphaned memory')], 'reset', when=1000.0)
    # A new boot: the cure of the old one no longer counts; the history is still there.
    assert load_cures(run, 'boot-2') == {}
    again = History.for_host(str(tmp_path))
    assert [(event['kind'], event['index'], event['reason']) for event in again.events(UUID)] == [
        ('reset', 3, 'orphaned memory')]


def test_a_fault_back_after_two_cures_within_the_window_is_held(tmp_path):
    history = History.for_host(str(tmp_path))
    now = 100 * DAY
    history.record([(UUID, 3, 'Xid 119')], 'reset', when=now - 6 * DAY)
    assert history.hold_reason(UUID, 3, 'needs a reset (Xid 119)', now=now) is None
    history.record([(UUID, 3, 'Xid 119')], 'reboot_asked', when=now - DAY)
    why = history.hold_reason(UUID, 3, 'needs a reset (Xid 119)', now=now)
    assert why.startswith('GPU 3 (%s): needs a reset (Xid 119), back after 2 cure(s) within 7 days (reset ' % UUID), why
    assert why.endswith('): not cured again, held for a person')
    # Out of the window: the older cure no longer counts; another GPU is not concerned.
    assert history.hold_reason(UUID, 3, 'x', now=now + 2 * DAY) is None
    assert history.hold_reason(OTHER, 1, 'x', now=now) is None


def test_a_gpu_held_once_stays_held_until_its_history_is_cleared(tmp_path):
    history = History.for_host(str(tmp_path))
    history.record([(UUID, 3, 'held')], 'cure_failed', when=1000.0)
    assert history.hold_reason(UUID, 3, 'x', now=1000.0 + 60 * DAY) is not None
    assert history.clear(UUID) == [UUID]
    assert history.hold_reason(UUID, 3, 'x', now=1000.0 + 60 * DAY) is None
    history.record([(UUID, 3, 'a')], 'reset', when=1.0)
    history.record([(OTHER, 1, 'b')], 'reset', when=1.0)
    assert history.clear('all') == sorted([UUID, OTHER]) and history.gpus() == {}


def test_the_bound_holds_per_gpu_and_over_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(_history, 'MAX_GPUS', 5)
    history = History.for_host(str(tmp_path))
    for number in range(_history.MAX_EVENTS + 30):
        history.record([(UUID, 0, 'reset %d' % number)], 'reset', when=float(number))
    events = history.events(UUID)
    assert len(events) == _history.MAX_EVENTS and events[-1]['reason'] == 'reset %d' % (_history.MAX_EVENTS + 29)
    for number in range(8):
        history.record([('GPU-%08d-0000-0000-0000-000000000000' % number, number, 'r')], 'reset', when=1000.0 + number)
    kept = history.gpus()
    assert len(kept) == 5 and UUID not in kept
    assert 'GPU-00000007-0000-0000-0000-000000000000' in kept


def test_a_probe_that_passes_again_is_counted_not_appended(tmp_path):
    history = History.for_host(str(tmp_path))
    history.record([(UUID, 0, 'Xid 119')], 'reset', when=10.0)
    for when in range(500):
        history.record([(UUID, 0, 'probe passed')], 'probe', when=20.0 + when, result='pass')
    events = history.events(UUID)
    assert [event['kind'] for event in events] == ['reset', 'probe'] and events[1]['count'] == 500
    summary = history.summary(UUID, now=600.0)
    assert summary['counts']['1d'] == {'reset': 1, 'probe': 500}


@pytest.mark.parametrize('content', [
    b'not json', b'[]', b'{"gpus": []}', b'\xff\xfe',
    json.dumps({'gpus': {'../../etc': [{'time': 1, 'kind': 'reset', 'reason': 'x'}],
                         UUID: [{'time': 'yesterday', 'kind': 'reset', 'reason': 'x'}, {'kind': 'rm -rf'}, 5]}}).encode(),
])
def test_a_corrupt_or_hostile_file_is_ignored_and_written_anew(tmp_path, content):
    history = History.for_host(str(tmp_path))
    path = os.path.join(history.state.path, _history.HISTORY)
    with open(path, 'wb') as handle:
        handle.write(content)
    assert history.gpus() == {} and history.hold_reason(UUID, 0, 'x') is None
    assert history.record([(UUID, 0, 'Xid 119')], 'reset', when=1.0)
    assert [event['reason'] for event in History.for_host(str(tmp_path)).events(UUID)] == ['Xid 119']


def test_a_history_file_that_is_a_link_is_not_followed(tmp_path):
    history = History.for_host(str(tmp_path))
    target = tmp_path / 'elsewhere.json'
    target.write_text(json.dumps({'gpus': {UUID: [{'time': 1.0, 'kind': 'cure_failed', 'reason': 'planted'}]}}))
    os.symlink(str(target), os.path.join(history.state.path, _history.HISTORY))
    assert history.gpus() == {} and any('cannot be opened' in warning for warning in history.warnings)


def test_a_directory_others_can_write_is_refused(tmp_path):
    path = tmp_path / 'var' / 'lib' / 'gpuops'
    path.mkdir(parents=True)
    path.chmod(0o777)
    history = History.for_host(str(tmp_path))
    assert not history.state.usable and history.record([(UUID, 0, 'x')], 'reset') is False
    assert 'no GPU history is kept' in history.warnings[0]


@pytest.mark.skipif(os.geteuid() != 0, reason='plants a link of another user: needs root')
def test_a_link_of_another_user_on_the_way_is_not_followed(tmp_path):
    # The simulated host's /var/lib is another user's link to a directory of root's.
    elsewhere = tmp_path / 'elsewhere'
    (elsewhere / 'gpuops').mkdir(parents=True, mode=0o700)
    (tmp_path / 'var').mkdir()
    os.symlink(str(elsewhere), str(tmp_path / 'var' / 'lib'))
    os.lchown(str(tmp_path / 'var' / 'lib'), 65534, 65534)
    history = History.for_host(str(tmp_path))
    assert not history.state.usable and history.record([(UUID, 0, 'x')], 'reset') is False
    assert os.listdir(str(elsewhere / 'gpuops')) == []
    assert 'is below %s, a symbolic link owned by nobody' % (tmp_path / 'var' / 'lib') in history.warnings[0]


def test_the_history_dir_swapped_for_a_link_after_its_check_is_not_written_through(tmp_path):
    history = History.for_host(str(tmp_path))
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    os.rename(history.state.path, str(tmp_path / 'checked'))
    os.symlink(str(elsewhere), history.state.path)
    assert history.record([(UUID, 0, 'x')], 'reset') is False and os.listdir(str(elsewhere)) == []
    assert 'is not a directory (a symbolic link is not followed)' in history.warnings[0]


def test_a_state_dir_below_a_directory_every_user_can_write_keeps_no_history(tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    shared.chmod(0o777)
    history = History.for_host('/', state_dir=str(shared / 'gpuops'))
    assert history.state.path == str(shared / 'gpuops' / 'history') and not history.state.usable
    assert 'is below %s, which every user can write (mode 0777)' % shared in history.warnings[0]
    assert os.listdir(str(shared)) == []


@pytest.mark.parametrize('after, days, words', [
    (0, 7, 'hold_after_cures must be between 1 and 100'),
    (101, 7, 'hold_after_cures must be between 1 and 100'),
    (2, 0, 'hold_window_days must be more than 0'),
    (2, 400, 'at most 365 days'),
])
def test_the_threshold_and_window_are_checked(after, days, words):
    with pytest.raises(GpuopsError, match=words):
        check_hold_options(after, days)
    check_hold_options(2, 7.0)


@pytest.mark.parametrize('resets, reboots, words', [
    (0, 2, 'reset_budget must be between 1 and 100'),
    (101, 2, 'reset_budget must be between 1 and 100'),
    (3, 0, 'reboot_budget must be between 1 and 100'),
    (3, True, 'reboot_budget must be between 1 and 100'),
])
def test_the_budgets_are_checked(resets, reboots, words):
    with pytest.raises(GpuopsError, match=words):
        check_hold_options(2, 7.0, resets, reboots)
    check_hold_options(2, 7.0, 3, 2)


def test_resets_tried_within_the_window_spend_the_reset_budget_whether_they_worked_or_not(tmp_path):
    history = History.for_host(str(tmp_path))
    now = 100 * DAY
    history.record([(UUID, 3, 'orphaned memory')], 'reset', when=now - 8 * DAY, outcome='cured')  # out of the window
    history.record([(UUID, 3, 'orphaned memory')], 'reset', when=now - 3 * DAY, outcome='cured')
    history.record([(UUID, 3, 'Xid 119')], 'reset_failed', when=now - DAY, outcome='cure_failed')
    history.record([(UUID, 3, 'probe passed')], 'probe', when=now - DAY, result='pass')
    events = history.events(UUID)
    assert _history.budget_spent(events, 'reset', 3, 7.0, now=now) is None
    why = _history.budget_spent(events, 'reset', 2, 7.0, now=now)
    assert why.startswith('its reset budget is spent: 2 reset(s) within 7 days (') and why.endswith(
        'at most 2: not tried again, held for a person'), why
    assert [event.get('outcome') for event in events] == ['cured', 'cured', 'cure_failed', None]


def test_a_reset_that_fails_the_same_way_again_spends_the_budget_each_time(tmp_path):
    """Repeats of one failure are one event with its count: each counts against the budget, and
    the event says what the newest one said."""
    history = History.for_host(str(tmp_path))
    now = 100 * DAY
    for number in range(3):
        history.record([(UUID, 3, 'Xid 119')], 'reset_failed', when=now - 3 * DAY + number, outcome='cure_failed',
                       error='refused, try %d' % number, duration_s=float(number))
    event, = history.events(UUID)
    assert (event['count'], event['error'], event['duration_s'], event['time']) == (3, 'refused, try 2', 2.0, now - 3 * DAY + 2)
    assert _history.budget_spent(history.events(UUID), 'reset', 4, 7.0, now=now) is None
    assert 'its reset budget is spent: 3 reset(s) within 7 days' in _history.budget_spent(history.events(UUID), 'reset', 3, 7.0, now=now)


def test_the_nodes_reboots_are_kept_beside_the_gpus_and_cleared_with_all(tmp_path):
    history = History.for_host(str(tmp_path))
    now = 100 * DAY
    assert history.record_node('reboot_asked', 'GPU 2 lost', when=now - 2 * DAY, outcome='escalated', to='reboot')
    assert history.record([(UUID, 3, 'orphaned memory')], 'reset', when=now - DAY)
    assert history.record_node('reboot_asked', 'the driver hung', when=now - DAY, outcome='escalated', to='reboot')
    again = History.for_host(str(tmp_path))
    assert [event['reason'] for event in again.node_events()] == ['GPU 2 lost', 'the driver hung']
    assert list(again.gpus()) == [UUID]
    assert 'reboot budget is spent: 2 reboot(s)' in _history.budget_spent(again.node_events(), 'reboot', 2, 7.0, now=now)
    assert _history.budget_spent(again.node_events(), 'reboot', 2, 1.5, now=now) is None
    # One GPU's history cleared: the node's reboots still count; all: they are forgotten too.
    assert again.clear(UUID) == [UUID] and len(again.node_events()) == 2
    assert again.clear('all') == [] and again.node_events() == []


def test_incidents_open_at_the_first_fault_after_a_cure_and_close_at_the_next_cure():
    day = DAY
    events = [
        dict(time=1 * day, kind='probe', result='pass', reason='', index=3),
        dict(time=2 * day, kind='not_attempted', reason='orphaned memory', index=3, outcome='not_attempted'),
        dict(time=2 * day + 60, kind='reset', reason='orphaned memory', index=3, outcome='cured', duration_s=5.0),
        dict(time=2 * day + 60, kind='cure', how='reset', reason='orphaned memory', index=3),
        dict(time=5 * day, kind='reset', reason='Xid 119', index=3, outcome='cured', duration_s=4.0),
        dict(time=9 * day, kind='probe', result='fail', reason='CUDA_ERROR_ECC_UNCORRECTABLE', index=3),
        dict(time=9 * day + 30, kind='cure_failed', reason='held', index=3, outcome='held'),
    ]
    found = _history.incidents(events)
    assert found['repair_s'] == [60.0, 4.0]
    assert found['between_s'] == [3 * day - 4.0, 4 * day + 4.0]
    assert found['open_since'] == 9 * day
    summary = _history.summarize(events, now=10 * day)
    assert summary['cures'] == {'reset': 1} and summary['incidents'] == found
