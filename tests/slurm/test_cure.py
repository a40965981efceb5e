# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The cure a Prolog starts at once when it drains the node (slurm_hooks_cure), run by real Slurm
daemons with no health check at all (HealthCheckProgram unset): a node drained for a fault that
goes away is back in service in seconds; a node held for a person stays drained."""

import os
import time

import pytest
import yaml

from conftest import PROLOG_EPILOG_TIMEOUT
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

CURE_WITHIN_S = 120


@pytest.fixture(scope='module')
def hook_role_vars():
    return {'slurm_hooks_health_check': False, 'slurm_hooks_cure': True, 'slurm_hooks_cure_within_s': CURE_WITHIN_S}


def cures(node):
    return [run for run in node.runs() if run.mode == 'cure']


def log_after_cure(node):
    """The hook's log from the cure's first line on (it logs beside the job's Epilog)."""
    with open(node.log) as handle:
        log = handle.read()
    return log[log.index(' cure on %s' % node.bench.node):]


def test_a_node_drained_for_a_fault_that_goes_away_is_resumed_by_its_cure_without_a_health_check(node):
    """Memory held on GPU 3 by no process: the Prolog drains the node and starts its cure. The
    driver lets the memory go (a late release); the cure finds the GPUs clean, proves them and
    resumes the node, long before any health check could (none is configured)."""
    assert 'HealthCheckProgram' not in node.conf_text + open(node.bench.conf).read()
    node.host.fault('stuck', gpu=3, mib=4096)
    job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('late.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.exit, prolog.hook_exit) == (10, 1), prolog
    assert any('the cure of the node is started' in line for line in prolog.lines), prolog
    drained = time.monotonic()
    node.host.fault('stuck', gpu=3, mib=0)
    node.bench.wait_state(lambda state: state == 'idle', 60, 'the cure to resume the node')
    back = time.monotonic() - drained
    [cure] = [run for run in cures(node) if run.hook_exit is not None] or [None]
    assert cure is not None and (cure.exit, cure.hook_exit) == (0, 0), node.runs()
    assert 'resumed %s: its GPUs are clean' % node.bench.node in log_after_cure(node), open(node.log).read()
    print('drained to back in service: %.1f s' % back)


def test_a_node_held_for_a_person_stays_drained_after_its_cure(node):
    """GPU 3 was held before (its history): the Prolog drains the node for a person; the cure
    starts, reads the hold and ends; the memory going away changes nothing."""
    uuid = node.host.state['gpus'][3]['uuid']
    history = History.for_host(node.host.root)
    assert history.record([(uuid, 3, 'held before')], 'cure_failed', outcome='held')
    variables = os.path.join(node.hooks, 'gpu_reset.yml')
    with open(variables) as handle:
        original = handle.read()
    with open(variables, 'w') as handle:  # a GPU is held when a reset is due: resets allowed
        handle.write(yaml.safe_dump(dict(yaml.safe_load(original), gpu_reset_allow_gpu_reset=True)))
    try:
        node.host.fault('stuck', gpu=3, mib=4096)
        job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('held.out'), '--wrap', 'true')
        node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
        node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
        reason = node.bench.reason()
        assert reason.startswith('gpu_reset(hold): GPU 3 (%s)' % uuid), reason
        node.host.fault('stuck', gpu=3, mib=0)
        until = time.monotonic() + 30
        while time.monotonic() < until and not [run for run in cures(node) if run.hook_exit is not None]:
            time.sleep(0.5)
        [cure] = cures(node)
        assert cure.hook_exit == 0 and 'held by gpu_reset for a person' in log_after_cure(node), cure
        time.sleep(3)
        assert node.bench.node_state().startswith('drain') and node.bench.reason() == reason
    finally:
        with open(variables, 'w') as handle:
            handle.write(original)
        history.clear('all')
        node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=resume')
