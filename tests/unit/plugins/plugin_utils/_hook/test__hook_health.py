# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Slurm's HealthCheckProgram (plugin_utils/_hook/health.py): what scontrol and squeue say about the
node, which node the health check may heal, and the node resumed only when its GPUs are clean."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import health as _hook_health
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import slurm as _hook_slurm
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status
from gpusim.state import is_alive as alive
from slurm_texts import show_node


def test_the_nodes_state_and_reason_as_scontrol_shows_them():
    state, reason, line = _hook_health.parse_node(show_node(), 'gpu07')
    assert (state, reason) == ('IDLE+DRAIN', 'gpu_reset: GPU 3: 4096 MiB held with no process left')
    assert line == 'Reason=gpu_reset: GPU 3: 4096 MiB held with no process left [root@2026-12-01T11:59:46]'
    assert _hook_health.parse_node(show_node('IDLE', None), 'gpu07') == ('IDLE', '', '')


@pytest.mark.parametrize('text', [
    '',
    'slurm_load_node error: Invalid node name specified\n',
    'Node gpu07 not found\n',
    show_node().replace('NodeName=gpu07', 'NodeName=gpu08'),
    show_node() + show_node().replace('gpu07', 'gpu08'),
    show_node().replace('   State=', '   Stat='),
    show_node() + '   State=IDLE+DRAIN\n',
    show_node() + '   Reason=gpu_reset: again\n',
    show_node(state=''),
    '{"nodes": [{"name": "gpu07", "state": ["IDLE", "DRAIN"]}]}',
    '\x00\x1b[2J' * 50,
])
def test_scontrol_output_that_cannot_be_read_is_refused(text):
    with pytest.raises(_hook_slurm.SlurmUnreadable):
        _hook_health.parse_node(text, 'gpu07')


def test_an_unreadable_node_name_is_escaped_in_the_message():
    with pytest.raises(_hook_slurm.SlurmUnreadable) as caught:
        _hook_health.parse_node('NodeName=x\x1b[2J\n', 'gpu07')
    assert '\x1b' not in str(caught.value) and '\\x1b[2J' in str(caught.value)


@pytest.mark.parametrize('state, reason, expected', [
    ('IDLE+DRAIN', 'gpu_reset: GPU 3: orphaned memory', None),
    ('IDLE', '', 'is not drained'),
    ('MIXED', '', 'is not drained'),
    ('IDLE+DRAIN', 'maintenance: new firmware', "not this collection's"),
    ('IDLE+DRAIN', 'Prolog error', "not this collection's"),
    ('IDLE+DRAIN', 'GPU_RESET: shouted', "not this collection's"),
    ('IDLE+DRAIN', 'gpu_reset:no space', "not this collection's"),
    ('MIXED+DRAIN', 'gpu_reset: GPU 3', 'a job still runs or ends there'),
    ('ALLOCATED+DRAIN', 'gpu_reset: GPU 3', 'a job still runs or ends there'),
    ('IDLE+COMPLETING+DRAIN', 'gpu_reset: GPU 3', 'a job still runs or ends there'),
    ('IDLE+DRAIN+REBOOT_REQUESTED', 'gpu_reset: GPU 3', 'State=IDLE+DRAIN+REBOOT_REQUESTED'),
    ('DOWN+DRAIN', 'gpu_reset: GPU 3', 'State=DOWN+DRAIN'),
    # Held for a person: a reboot asked for within a day did not cure it; also as an older version
    # drained such a node, before the hold prefix.
    ('IDLE+DRAIN', 'gpu_reset(hold): not rebooted (a reboot asked for at 2026-12-01T10:00:00Z did not cure it): '
                   'GPU 1 needs a reboot (Xid 79 since the last cure)', 'for a person'),
    ('IDLE+DRAIN', 'gpu_reset(hold): GPU 3 Xid 95 came back after 2 cures', 'until an operator resumes it'),
    ('IDLE+DRAIN', 'gpu_reset: not rebooted (a reboot asked for at 2026-12-01T10:00:00Z did not cure it): GPU 1 '
                   'fell off the bus', 'for a person'),
    ('IDLE+DRAIN', 'gpu_reset(hold)x: not ours', "not this collection's"),
    # Drained for a reboot that waits for its evidence: the reboot's, never healed.
    ('IDLE+DRAIN', 'gpu_reset(reboot): GPU 2 lost or unreadable', 'waits for the reboot'),
])
def test_only_a_node_this_collection_drained_and_idle_is_healed(state, reason, expected):
    why = _hook_health.why_not_heal('gpu07', state, reason)
    assert why is None if expected is None else expected in why, why


@pytest.mark.parametrize('text', ['', 'garbage\n', show_node().replace('State=', 'Stat=')])
def test_garbage_from_scontrol_means_no_action(slurm, capsys, text):
    slurm.says(scontrol=text)
    rc, out = slurm.check(capsys, '--vars-file', '/nonexistent')
    assert rc == _hook_status.HEALTH_UNREADABLE
    assert 'nothing done' in out.err
    assert out.out == ''  # no sequence ran, so no report
    assert [call[:2] for call in slurm.calls()] == [['scontrol', 'show']]


def test_a_node_drained_by_someone_else_is_only_read(slurm, capsys):
    slurm.says(scontrol=show_node(reason='bad DIMM, ticket 4711 [alice@2026-12-01T10:00:00]'))
    rc, out = slurm.check(capsys, '--vars-file', '/nonexistent')
    assert rc == 0 and 'left to whoever drained it' in out.err
    assert [call[:2] for call in slurm.calls()] == [['scontrol', 'show']]


@pytest.mark.parametrize('squeue', ['42 RUNNING\n', '42 COMPLETING\n', 'garbage\n'])
def test_a_node_where_squeue_names_a_job_is_only_read(slurm, capsys, squeue):
    slurm.says(scontrol=show_node(), squeue='41 COMPLETED\n' + squeue)
    rc, out = slurm.check(capsys, '--vars-file', '/nonexistent')
    assert rc == 0 and 'runs jobs' in out.err, out.err
    assert [call[0] for call in slurm.calls()] == ['scontrol', 'squeue']
    assert slurm.calls()[1][1:] == ['-h', '-w', 'gpu07', '-t', 'all', '-o', '%i %T']


def test_a_node_name_that_is_a_list_is_refused_before_any_call(slurm, capsys):
    rc = _slurm_hook.main(['--health-check', '--node', 'gpu07,gpu08', '--scontrol', slurm.scontrol])
    assert rc == _hook_status.HEALTH_UNREADABLE
    assert slurm.calls() == []


def test_a_drained_node_whose_gpus_are_clean_is_resumed(slurm, capsys, hook_vars):
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5')
    assert rc == 0, out.err
    assert json.loads(out.out)['outcome'] == 'clean'
    assert 'resumed gpu07' in out.err
    assert slurm.calls()[-1] == ['scontrol', 'update', 'nodename=gpu07', 'state=resume']


def test_observe_mode_says_it_would_resume_and_changes_nothing(gpuhost, slurm, capsys, hook_vars):
    """--observe (GPU_RESET_MODE=observe): the drained node's GPUs are read, a holder is named as
    one that would be signalled, and the node would be resumed; nothing is signalled, no update."""
    holder = gpuhost.hold(gpus=[0], mib=1024)['pid']
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5', '--observe')
    assert rc == 0, out.err
    report = json.loads(out.out)
    assert report['outcome'] == 'would_release' and report['check_mode'] is True
    assert [entry['pid'] for entry in report['signalled']] == [holder] and alive(holder)
    assert 'observe mode: would resume gpu07 (its GPUs would be released first)' in out.err, out.err
    assert [call for call in slurm.calls() if call[1:2] == ['update']] == []


def test_observe_mode_says_a_node_that_is_not_clean_would_stay_drained(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('lost', gpu=1)
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5', '--observe')
    assert rc == 0, out.err
    assert json.loads(out.out)['would_drain'] is True
    assert 'observe mode: gpu07 would stay drained: GPU 1 lost or unreadable' in out.err, out.err
    assert [call for call in slurm.calls() if call[1:2] == ['update']] == []


def test_a_drained_node_whose_gpus_are_still_dirty_stays_drained_with_the_new_reason(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('stuck', gpu=1, mib=2048)
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5')
    assert rc == _hook_status.RUNNER_DRAINED, out.err
    update = slurm.calls()[-1]
    assert update[:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain']
    assert re.match(r'reason=gpu_reset: GPU 1: \d+ MiB held with no process left', update[4]), update
    assert 'state=resume' not in json.dumps(slurm.calls())


def test_a_node_drained_again_meanwhile_is_neither_resumed_nor_drained(gpuhost, slurm, capsys, hook_vars, monkeypatch):
    """Someone drains the node with a reason of their own while the sequence runs."""
    slurm.says(scontrol=show_node(), squeue='')
    reset = _hook_health.reset

    def reset_then_redrain(*args, **kwargs):
        result = reset(*args, **kwargs)
        slurm.says(scontrol=show_node(reason='maintenance [bob@2026-12-01T12:00:00]'))
        return result
    monkeypatch.setattr(_hook_health, 'reset', reset_then_redrain)
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5')
    assert rc == 0 and 'not resumed' in out.err, out.err
    # Read, the sequence, read again: the reason is someone else's now, so no update.
    assert [call[:2] for call in slurm.calls()] == [['scontrol', 'show'], ['squeue', '-h'], ['scontrol', 'show']]


# -- the cure the hook starts at once (--cure-within) ----------------------------------------------

def test_the_cure_waits_while_the_job_ends_then_resumes_the_node_it_cured(gpuhost, slurm, capsys, hook_vars, monkeypatch):
    """Drained by an Epilog, the node still COMPLETING: the cure reads it again until it is idle,
    then runs the sequence (the GPU reset the hook may do) and resumes it, without a health check."""
    monkeypatch.setattr(_hook_health, 'CURE_POLL_S', 0.2)
    variables = hook_vars()
    with open(variables, 'a') as handle:
        handle.write('gpu_reset_allow_gpu_reset: true\n')
    gpuhost.fault('stuck', gpu=3, mib=4096)
    slurm.says(scontrol=show_node(state='IDLE+COMPLETING+DRAIN'), squeue='')
    reads = []
    read_node = _hook_health.read_node

    def job_ends_after_three_reads(*args):
        reads.append(args)
        if len(reads) == 3:
            slurm.says(scontrol=show_node())
        return read_node(*args)
    monkeypatch.setattr(_hook_health, 'read_node', job_ends_after_three_reads)
    rc, out = slurm.check(capsys, '--vars-file', variables, '--timeout', '10', '--deadline', '40', '--cure-within', '30')
    assert rc == 0, out.err
    first = json.loads(out.out.splitlines()[0])
    assert first['escalation']['gpus'] == [3] and gpuhost.memory_used()[3] < 4096, first['reason']
    assert 'resumed gpu07' in out.err and out.err.count('runs jobs') + out.err.count('State=') == 0, out.err
    assert slurm.calls()[-1] == ['scontrol', 'update', 'nodename=gpu07', 'state=resume']
    assert len(reads) >= 4


def test_the_cure_checks_again_while_the_gpus_may_yet_be_found_clean(gpuhost, slurm, capsys, hook_vars, monkeypatch):
    """Resets not allowed, memory held with no process: still drained after the first run; the
    driver lets it go (a late release) and the next run resumes the node."""
    monkeypatch.setattr(_hook_health, 'CURE_RETRY_S', 0.5)
    gpuhost.fault('stuck', gpu=3, mib=4096)
    slurm.says(scontrol=show_node(), squeue='')
    reset = _hook_health.reset
    runs = []

    def late_release(*args, **kwargs):
        result = reset(*args, **kwargs)
        runs.append(result['outcome'])
        gpuhost.fault('stuck', gpu=3, mib=0)
        return result
    monkeypatch.setattr(_hook_health, 'reset', late_release)
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5', '--cure-within', '60')
    assert rc == 0 and runs == ['failed', 'clean'], (runs, out.err)
    updates = [call[3:] for call in slurm.calls() if call[1:2] == ['update']]
    assert updates[0][0] == 'state=drain' and updates[-1] == ['state=resume'], updates


@pytest.mark.parametrize('fault, reason', [
    (None, 'gpu_reset(hold): GPU 3 (GPU-x): needs a reset, back after 2 cure(s) [root@2026-12-01T11:59:46]'),
    ('lost', None),
])
def test_the_cure_leaves_a_held_node_or_one_that_needs_a_reboot_at_once(gpuhost, slurm, capsys, hook_vars, fault, reason):
    if fault:
        gpuhost.fault(fault, gpu=1, message='lost')
    slurm.says(scontrol=show_node(**({'reason': reason} if reason else {})), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5', '--cure-within', '600')
    assert 'state=resume' not in json.dumps(slurm.calls())
    if reason:
        assert rc == 0 and 'held by gpu_reset for a person' in out.err
        assert [call for call in slurm.calls() if call[1:2] == ['update']] == []
    else:
        # Run once: a lost GPU is not found again by waiting.
        assert rc == _hook_status.RUNNER_DRAINED and out.out.count('"outcome"') == 1, out.err


@pytest.mark.parametrize('args, words', [
    (['--cure-within', '30'], '--cure-within is a mode of --health-check'),
    (['--health-check', '--cure-within', '0'], 'GPU_RESET_CURE_WITHIN_S: 0 is not a number of seconds'),
    (['--health-check', '--cure-within', 'soon'], 'GPU_RESET_CURE_WITHIN_S: soon is not a number of seconds'),
    (['--health-check', '--cure-within', '7200'], 'at most 3600'),
])
def test_a_cure_window_that_is_not_a_number_of_seconds_is_refused(capsys, args, words):
    with pytest.raises(SystemExit) as raised:
        _slurm_hook.main(['--node', 'gpu07'] + args)
    assert raised.value.code == 2 and words in capsys.readouterr().err
