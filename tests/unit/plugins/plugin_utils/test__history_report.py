# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a fleet's GPU histories say (plugin_utils/_history_report.py), from history files the
collection wrote, and from files that are not."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._history_report import Unreadable, lines, report

DAY = 86400.0
NOW = 100 * DAY
FLAKY = 'GPU-11111111-2222-3333-4444-555555555555'
STEADY = 'GPU-66666666-7777-8888-9999-000000000000'
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def history_file(tmp_path, name, write):
    history = History.for_host(str(tmp_path / name))
    write(history)
    return os.path.join(history.state.path, 'history.json')


def flaky_node(history):
    """GPU 3 reset three times in ten days (the last time it came back it was held), GPU 5 probed."""
    for day in (80, 85):
        history.record([(FLAKY, 3, 'orphaned memory')], 'not_attempted', when=day * DAY - 600, outcome='not_attempted')
        history.record([(FLAKY, 3, 'orphaned memory')], 'reset', when=day * DAY, outcome='cured', duration_s=5.0)
        history.record([(FLAKY, 3, 'orphaned memory')], 'cure', when=day * DAY, how='reset')
    history.record([(FLAKY, 3, 'back after 2 cures')], 'cure_failed', when=90 * DAY, outcome='held')
    history.record([(STEADY, 5, 'probe passed')], 'probe', when=90 * DAY, result='pass')
    history.record_node('reboot_asked', 'GPU 3 lost', when=70 * DAY, outcome='escalated', to='reboot')


def quiet_node(history):
    history.record([(STEADY, 0, 'Xid 119')], 'reset', when=95 * DAY, outcome='cured', duration_s=20.0)
    history.record([(STEADY, 0, 'Xid 119')], 'cure', when=95 * DAY, how='reset')


def test_the_worst_node_and_gpu_come_first_with_their_figures(tmp_path):
    flaky = open(history_file(tmp_path, 'flaky', flaky_node)).read()
    quiet = open(history_file(tmp_path, 'quiet', quiet_node)).read()
    found = report({'gpu02': quiet, 'gpu01': flaky}, now=NOW)
    assert [node['node'] for node in found] == ['gpu01', 'gpu02']
    worst = found[0]
    assert (worst['incidents'], worst['reboots'], worst['held']) == (3, 1, True)
    gpu = worst['gpus'][0]
    assert (gpu['uuid'], gpu['index'], gpu['incidents'], gpu['open'], gpu['held']) == (FLAKY, 3, 3, True, True)
    assert gpu['cures'] == {'reset': 2, 'probe': 0, 'reboot': 0}
    # Each cured incident lasted from the first refusal to the reset (600 s); the held one is still open.
    assert gpu['lost_s'] == 600 + 600 + (NOW - 90 * DAY)
    assert gpu['mean_between_s'] == (5 * DAY + (90 * DAY - (85 * DAY - 600))) / 2
    # A GPU only probed is listed, last: no incident, no time lost.
    assert [(row['uuid'], row['incidents'], row['lost_s']) for row in worst['gpus']][1] == (STEADY, 0, 0.0)
    text = lines(found)
    assert text[0].split()[:2] == ['node', 'gpu'] and text[1].startswith('gpu01') and 'reboots 1' in text[1]
    assert FLAKY in text[2] and '2/0/0' in text[2] and text[2].endswith('yes') and STEADY in text[3]
    assert text[-1].startswith('gpu02') and '20s' in text[-1]


def test_files_that_are_not_histories_are_named_and_never_counted(tmp_path):
    found = report({'a': 'not json {', 'b': json.dumps([1, 2]), 'c': Unreadable('unreachable: ssh timed out'),
                    'd': json.dumps({'gpus': {'not-a-uuid': [{'time': 1, 'kind': 'reset', 'reason': ''}],
                                              FLAKY: [{'time': 'soon', 'kind': 'reset', 'reason': ''}, 'x']}})}, now=NOW)
    assert dict((node['node'], node['warning']) for node in found) == {
        'a': 'not JSON', 'b': 'not a history of gpuops.nvidia', 'c': 'unreachable: ssh timed out', 'd': None}
    assert all(node['gpus'] == [] and node['incidents'] == 0 for node in found)
    assert 'history unreadable: unreachable: ssh timed out' in '\n'.join(lines(found))


def test_the_script_prints_the_table_of_files_copied_off_the_hosts(tmp_path):
    path = history_file(tmp_path, 'flaky', flaky_node)
    proc = subprocess.run([sys.executable, os.path.join(REPO, 'scripts', 'history_report.py'), 'gpu01=' + path,
                           'gpu09=' + str(tmp_path / 'missing.json')], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith('gpu01') and FLAKY in proc.stdout
    assert 'gpu09' in proc.stdout and 'No such file or directory' in proc.stdout
