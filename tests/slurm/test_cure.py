# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The cure a Prolog starts at once when it drains the node (slurm_hooks_cure), run by real Slurm
daemons with no health check at all (HealthCheckProgram unset): a node drained for a fault that
goes away is back in service in seconds; a node held for a person stays drained."""

import json
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


def test_a_node_held_for_a_person_stays_drained_after_its_cure(node, resets_allowed):
    """GPU 3 was held before (its history): the Prolog drains the node for a person; the cure
    starts, reads the hold and ends; the memory going away changes nothing. (A GPU is held when a
    reset is due: resets allowed.)"""
    uuid = node.host.state['gpus'][3]['uuid']
    assert History.for_host(node.host.root).record([(uuid, 3, 'held before')], 'cure_failed', outcome='held')
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
        node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=resume')


def set_variables(node, **values):
    """Set gpu_reset_* variables of the installed hook, until resets_allowed puts them back."""
    path = os.path.join(node.hooks, 'gpu_reset.yml')
    with open(path) as handle:
        variables = yaml.safe_load(handle)
    with open(path, 'w') as handle:
        handle.write(yaml.safe_dump(dict(variables, **values)))


def read_kernel_log(node):
    """The hook reads the simulated host's kernel log (its Xids)."""
    set_variables(node, gpu_reset_kernel_log=node.host.kernel_log)


def test_a_prolog_that_resets_a_mig_gpu_makes_its_instances_again_and_the_job_runs(node, resets_allowed):
    """An Xid that asks for a GPU reset on GPU 3, whose MIG instances no job uses: the job's Prolog
    resets it, which ends the instances, makes them again as they were (the same GPU instance ids,
    new MIG UUIDs) and proves them; the job runs, and the node stays in service."""
    read_kernel_log(node)
    before = node.host.mig(3, ['1g.18gb', '2g.35gb'])['instances']
    node.host.fault('xid', gpu=3, code=95)
    job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('mig.out'), '--wrap', 'true')
    node.bench.wait_job(job, 'COMPLETED', PROLOG_EPILOG_TIMEOUT + 30)
    prolog = node.wait_run('prolog', job)
    assert (prolog.exit, prolog.hook_exit) == (0, 0), prolog
    [mig] = prolog.report['escalation']['mig']
    assert mig['index'] == 3 and mig['restored']['ok'] is True, prolog
    after = node.host.state['gpus'][3]['mig']['instances']
    assert [(dev['gi'], dev['profile']) for dev in after] == [(dev['gi'], dev['profile']) for dev in before]
    assert not set(dev['uuid'] for dev in before) & set(dev['uuid'] for dev in after)
    node.bench.wait_idle(30)


def test_a_mig_layout_not_made_again_holds_the_node_for_a_person_whom_its_cure_leaves_it_to(node, resets_allowed):
    """The same reset, but the driver will not make GPU 3's instance again: GPU 3 then reads clean
    with no instance, so the Prolog drains the node for a person, and its cure, which finds the
    GPUs clean, leaves it drained."""
    read_kernel_log(node)
    uuid = node.host.state['gpus'][3]['uuid']
    node.host.mig(3, ['1g.18gb'])
    node.host.fault('xid', gpu=3, code=95)
    node.host.fault('mig-create', gpu=3, value='Insufficient Resources')
    try:
        job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('mig-held.out'), '--wrap', 'true')
        node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
        node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
        reason = node.bench.reason()
        assert reason.startswith('gpu_reset(hold): GPU 3 (%s): its MIG instances were not made again after its reset'
                                 % uuid), reason
        until = time.monotonic() + 30
        while time.monotonic() < until and not [run for run in cures(node) if run.hook_exit is not None]:
            time.sleep(0.5)
        [cure] = cures(node)
        assert cure.hook_exit == 0 and 'held by gpu_reset for a person' in log_after_cure(node), cure
        assert node.bench.node_state().startswith('drain') and node.bench.reason() == reason
    finally:
        node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=resume')


def test_a_refused_reset_is_cured_by_a_reload_of_the_driver_that_makes_its_device_nodes_again(node, resets_allowed):
    """Memory only a reset frees on GPU 3, whose reset the platform refuses, and the hook may reload
    the driver's modules instead. A reload does not fit in what is left of the Prolog's budget: the
    Prolog drains the node and its cure, outside the job's time, reloads them, which frees the
    memory and leaves /dev/nvidia-uvm stale, makes that node again with nvidia-modprobe, says that
    containers started before must be restarted, and resumes the node."""
    set_variables(node, gpu_reset_reload_modules=True)
    uvm = os.path.join(node.host.root, 'dev', 'nvidia-uvm')
    node.host.fault('reset-flr-refused', gpu=3, value='Insufficient Permissions')
    node.host.fault('stuck', gpu=3, mib=8192)
    job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('reload.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.exit, prolog.hook_exit) == (10, 1), '\n'.join(prolog.lines)
    assert 'kernel modules not reloaded: less than 10 s of the timeout left for it' in prolog.report['reason']
    node.bench.wait_state(lambda state: state == 'idle', CURE_WITHIN_S, 'the cure to resume the node')
    # The cure's report: it logs beside the job's Epilog, whose runs are told apart by their reports.
    assert 'resumed %s: its GPUs are clean' % node.bench.node in log_after_cure(node)
    reports = [json.loads(line) for line in log_after_cure(node).splitlines() if line.startswith('{"host"')]
    [cured] = [report for report in reports if report['outcome'] == 'released']
    reload = cured['escalation']['module_reload']
    assert reload['ok'] is True and reload['flr_refused'] == [3], reload
    assert reload['device_nodes']['made'] == ['/dev/nvidia-uvm'] and os.path.exists(uvm), reload
    assert 'containers started before the reload keep the old device nodes' in reload['message']
    assert node.host.memory_used()[3] <= 1
