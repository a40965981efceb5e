# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""--clear-history (plugin_utils/_hook/history.py): a fault that returns after its cures is held for
a person until an operator clears the GPU's history."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import history as _hook_history
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status
from slurm_texts import show_node

UUIDS = ['GPU-11111111-2222-3333-4444-555555555555', 'GPU-66666666-7777-8888-9999-000000000000']


def prolog(slurm, capsys, variables):
    """A Prolog's run of the hook with variables: (its status, its report, the scontrol updates so far)."""
    rc = _slurm_hook.main(['--node', 'gpu07', '--scontrol', slurm.scontrol, '--vars-file', variables,
                           '--timeout', '20', '--deadline', '40'])
    return rc, json.loads(capsys.readouterr().out), [call for call in slurm.calls() if call[1:2] == ['update']]


def test_a_third_recurrence_after_two_cures_is_held_for_a_person_until_cleared(gpuhost, slurm, capsys, hook_vars):
    variables = hook_vars()
    with open(variables, 'a') as handle:
        handle.write('gpu_reset_allow_gpu_reset: true\n')

    def prolog_run():
        return prolog(slurm, capsys, variables)

    for cure in range(2):
        gpuhost.fault('stuck', gpu=3, mib=4096)
        rc, report, updates = prolog_run()
        assert (rc, report['outcome'], updates) == (0, 'released', []), report['reason']
        assert report['escalation']['gpus'] == [3]
    uuid = [gpu['uuid'] for gpu in report['gpus'] if gpu['index'] == 3][0]
    counts = report['history'][uuid]['counts']['7d']
    # Two resets, each a cure (a probe whose bytes the kernel checked cures too), and the probes passed.
    assert counts['reset'] == 2 and counts['cure'] >= 2 and counts['probe'] >= 1, report['history']
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, updates = prolog_run()
    assert rc == _hook_status.RUNNER_DRAINED and report['escalation'] is None and report['held_for_person'] is True
    assert len(updates) == 1 and updates[0][:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain']
    reason = updates[0][4][len('reason='):]
    assert reason.startswith('gpu_reset(hold): GPU 3 (%s): needs a reset (' % uuid), reason
    assert 'back after 2 cure(s) within 7 days' in reason and report['held'][0]['index'] == 3
    assert gpuhost.memory_used()[3] >= 4096  # not reset a third time
    # The health check leaves it drained, whatever its GPUs read.
    slurm.says(scontrol=show_node(reason=reason), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', variables, '--timeout', '5')
    assert rc == 0 and 'held by gpu_reset for a person' in out.err
    assert len([call for call in slurm.calls() if call[1:2] == ['update']]) == 1
    # Until an operator clears the GPU's history: then a reset is tried again.
    assert _slurm_hook.main(['--clear-history', uuid, '--vars-file', variables]) == 0
    assert uuid in capsys.readouterr().err
    rc, report, dummy = prolog_run()
    assert (rc, report['outcome'], report['escalation']['gpus']) == (0, 'released', [3]), report['reason']


def test_a_gpu_past_its_reset_budget_is_held_though_no_fault_came_back_after_cures(gpuhost, slurm, capsys, hook_vars):
    """gpu_reset_reset_budget 1 (hold_after_cures 5: the hold by cures would wait): the first reset is
    recorded cured, with how long it took and what proved it; the next GPU reset due is not tried."""
    variables = hook_vars()
    with open(variables, 'a') as handle:
        handle.write('gpu_reset_allow_gpu_reset: true\ngpu_reset_hold_after_cures: 5\ngpu_reset_reset_budget: 1\n')

    def prolog_run():
        return prolog(slurm, capsys, variables)

    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, updates = prolog_run()
    assert (rc, report['outcome'], report['escalation']['gpus'], updates) == (0, 'released', [3], []), report['reason']
    uuid = [gpu['uuid'] for gpu in report['gpus'] if gpu['index'] == 3][0]
    history = History.for_host(gpuhost.root)
    [reset] = [event for event in history.events(uuid) if event['kind'] == 'reset']
    assert (reset['outcome'], reset['proof']) == ('cured', 'read clean after the reset'), reset
    assert 0 < reset['duration_s'] < 40, reset

    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, updates = prolog_run()
    assert rc == _hook_status.RUNNER_DRAINED and report['escalation'] is None and report['held_for_person'] is True
    reason = updates[0][4][len('reason='):]
    assert reason.startswith('gpu_reset(hold): GPU 3 (%s): needs a reset (orphaned memory), its reset budget is '
                             'spent: 1 reset(s) within 7 days (' % uuid), reason
    assert gpuhost.memory_used()[3] >= 4096  # not reset a second time
    assert history.events(uuid)[-1]['kind'] == 'cure_failed' and history.events(uuid)[-1]['outcome'] == 'held'


def test_a_budget_that_is_not_a_number_of_resets_is_refused_before_anything_is_done(gpuhost, slurm, capsys, hook_vars):
    variables = hook_vars()
    with open(variables, 'a') as handle:
        handle.write('gpu_reset_reboot_budget: 0\n')
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc = _slurm_hook.main(['--node', 'gpu07', '--scontrol', slurm.scontrol, '--vars-file', variables,
                           '--timeout', '20', '--deadline', '40'])
    report = json.loads(capsys.readouterr().out)
    assert rc == _hook_status.RUNNER_DRAINED and 'gpu_reset_reboot_budget must be between 1 and 100' in report['reason']
    assert gpuhost.memory_used()[3] >= 4096


def host_with_history(tmp_path):
    """(a variables file whose gpu_reset_host_root has a history of two GPUs, that history)."""
    root = tmp_path / 'root'
    history = History.for_host(str(root))
    assert history.record([(uuid, index, 'orphaned memory') for index, uuid in enumerate(UUIDS)], 'reset')
    variables = tmp_path / 'gpu_reset.yml'
    variables.write_text('gpu_reset_host_root: %s\n' % json.dumps(str(root)))
    return str(variables), history


def test_clearing_a_gpus_history_forgets_that_gpu_alone(tmp_path, capsys):
    variables, history = host_with_history(tmp_path)
    args = _slurm_hook.parse_args(['--clear-history', UUIDS[0], '--vars-file', variables])
    assert _hook_history.clear_history(args) == 0
    assert sorted(history.gpus()) == [UUIDS[1]]
    assert 'history cleared in %s: %s' % (history.state.path, UUIDS[0]) in capsys.readouterr().err
    # Again: nothing is left to clear, and it says so.
    assert _hook_history.clear_history(args) == 0
    assert 'no history of %s was kept' % UUIDS[0] in capsys.readouterr().err
    assert sorted(history.gpus()) == [UUIDS[1]]


def test_clearing_all_forgets_every_gpu(tmp_path, capsys):
    variables, history = host_with_history(tmp_path)
    assert _slurm_hook.main(['--clear-history', 'all', '--vars-file', variables]) == 0
    assert history.gpus() == {}
    assert ', '.join(UUIDS) in capsys.readouterr().err


def test_a_history_that_cannot_be_kept_is_not_cleared_saying_why(tmp_path, capsys):
    """The history's directory is a file: nothing is read or cleared, and the status says the
    settings could not be used."""
    root = tmp_path / 'root'
    (root / 'var' / 'lib').mkdir(parents=True)
    (root / 'var' / 'lib' / 'gpuops').write_text('not a directory\n')
    variables = tmp_path / 'gpu_reset.yml'
    variables.write_text('gpu_reset_host_root: %s\n' % json.dumps(str(root)))
    args = _slurm_hook.parse_args(['--clear-history', 'all', '--vars-file', str(variables)])
    assert _hook_history.clear_history(args) == _hook_status.RUNNER_SETTINGS_UNREADABLE
    err = capsys.readouterr().err
    assert err.startswith('gpu_reset: the history was not cleared: state directory %s' % (root / 'var' / 'lib' / 'gpuops')), err
