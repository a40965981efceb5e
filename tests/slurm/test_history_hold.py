# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A GPU's history through real Slurm daemons: each cure the hook makes is remembered by the
GPU's UUID, a fault that comes back after two cures within the window drains the node for a
person, and the health check (role slurm_hooks, HealthCheckNodeState=IDLE) leaves that node
drained, although its GPUs would read clean, until an operator resumes it."""

import json
import os

import pytest
import yaml

from conftest import PROLOG_EPILOG_TIMEOUT

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

INTERVAL_S = 5
WAIT_S = 60


@pytest.fixture(scope='module')
def hook_role_vars():
    return {'slurm_hooks_health_check_interval': INTERVAL_S}


def job_after_orphaned_memory(node, name):
    """Memory held on GPU 3 by no process (only a reset frees it), then a job on every GPU: its id.
    What the Prolog did is read from Slurm and the history, not from the hook's log, where the
    health checks' lines come between its own."""
    node.host.fault('stuck', gpu=3, mib=4096)
    return node.bench.sbatch('--gres=gpu:8', '--output', node.path(name + '.out'), '--wrap', 'true')


def resets(history, uuid):
    if not os.path.exists(history):
        return 0
    with open(history) as handle:
        return [event['kind'] for event in json.load(handle)['gpus'].get(uuid, [])].count('reset')


def test_a_fault_back_after_two_cures_is_held_for_a_person_and_never_healed(node, resets_allowed):
    uuid = node.host.state['gpus'][3]['uuid']
    for cures in (1, 2):
        job = job_after_orphaned_memory(node, 'cure%d' % cures)
        node.wait_run('epilog', job, 2 * PROLOG_EPILOG_TIMEOUT + 10)  # the job ran: its Prolog reset GPU 3
        node.bench.wait_idle(30)
        assert resets(resets_allowed, uuid) == cures
        assert node.host.memory_used()[3] == 0

    job_after_orphaned_memory(node, 'held')
    node.bench.wait_state(lambda state: state.startswith('drain'), PROLOG_EPILOG_TIMEOUT + 30, 'the node to drain')
    reason = node.bench.reason()
    assert reason.startswith('gpu_reset(hold): ') and 'GPU 3 (%s): needs a reset (orphaned memory), back after 2 cure(s)' % uuid in reason, reason
    assert resets(resets_allowed, uuid) == 2  # not reset a third time

    # The memory goes (a late release by the driver): clean GPUs prove nothing of a fault that came
    # back twice; the health check leaves the node drained, its reason as it was.
    node.host.fault('stuck', gpu=3, mib=0)
    kept = node.wait_health(node.health_mark(), WAIT_S, 'left drained until an operator resumes it')
    assert kept.hook_exit == 0, kept
    assert node.bench.reason() == reason
    node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=resume')


def test_a_gpu_past_its_reset_budget_is_held_for_a_person(node, resets_allowed):
    """gpu_reset_reset_budget 1, gpu_reset_hold_after_cures 5 (the hold by cures would wait): the
    first fault is reset and the job runs; the second is not reset, the node is held for a person
    with the budget in the reason, and the GPU's history records the reset cured and the hold."""
    path = os.path.join(node.hooks, 'gpu_reset.yml')
    with open(path) as handle:
        variables = yaml.safe_load(handle)
    with open(path, 'w') as handle:
        handle.write(yaml.safe_dump(dict(variables, gpu_reset_reset_budget=1, gpu_reset_hold_after_cures=5)))
    uuid = node.host.state['gpus'][3]['uuid']
    job = job_after_orphaned_memory(node, 'budget1')
    node.wait_run('epilog', job, 2 * PROLOG_EPILOG_TIMEOUT + 10)
    node.bench.wait_idle(30)
    assert resets(resets_allowed, uuid) == 1

    job_after_orphaned_memory(node, 'budget2')
    node.bench.wait_state(lambda state: state.startswith('drain'), PROLOG_EPILOG_TIMEOUT + 30, 'the node to drain')
    reason = node.bench.reason()
    assert reason.startswith('gpu_reset(hold): GPU 3 (%s): needs a reset (orphaned memory), its reset budget is spent'
                             % uuid), reason
    assert resets(resets_allowed, uuid) == 1
    with open(resets_allowed) as handle:
        events = json.load(handle)['gpus'][uuid]
    assert [event.get('outcome') for event in events if event['kind'] in ('reset', 'cure_failed')] == ['cured', 'held']
    node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=resume')
