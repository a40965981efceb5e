# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The health check of the role slurm_hooks (Slurm's HealthCheckProgram, installed by the role
gpuops.nvidia.slurm_hooks with HealthCheckInterval and HealthCheckNodeState=IDLE), run by real
Slurm daemons: a node the hook drained returns to service by itself once its GPUs are clean, and
any other node is only read."""

import os
import subprocess
import sys

import pytest

from conftest import PROLOG_EPILOG_TIMEOUT
from gpusim.state import is_alive as alive

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Seconds between two health checks, and how long a test waits for the next one that says what
# it waits for (a run of the sequence on a drained node included).
INTERVAL_S = 5
WAIT_S = 60


@pytest.fixture(scope='module')
def hook_role_vars():
    return {'slurm_hooks_health_check_interval': INTERVAL_S}


def drained(cluster):
    cluster.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    return cluster.bench.reason()


def test_a_node_the_hook_drained_returns_to_service_once_its_gpu_is_freed(node):
    """Orphaned memory on GPU 3: the Prolog drains the node; the health check finds it still
    dirty and keeps it drained; once the memory is gone (a late driver release), the next health
    check puts the GPUs back, proves them and resumes the node, with no person."""
    with open(os.path.join(node.hooks, 'slurm-hooks.conf')) as handle:
        conf = handle.read()
    assert 'HealthCheckProgram=%s/health-check.sh\n' % node.hooks in conf
    assert 'HealthCheckInterval=%d\nHealthCheckNodeState=IDLE\n' % INTERVAL_S in conf
    node.host.fault('stuck', gpu=3, mib=4096)
    job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('orphan.out'), '--wrap', 'true')
    assert node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10).exit == 10
    assert drained(node).startswith('gpu_reset: GPU 3: 4096 MiB held with no process left')
    before = node.health_mark()
    kept = node.wait_health(before, WAIT_S, 'stays drained')
    assert (kept.exit, kept.hook_exit) == (10, 1), kept
    assert kept.report['outcome'] == 'failed' and kept.report['drained'] is True
    assert node.bench.reason().startswith('gpu_reset: GPU 3: 4096 MiB held with no process left')

    node.host.fault('stuck', gpu=3, mib=0)
    after = node.health_mark()
    healed = node.wait_health(after, WAIT_S, 'resumed %s: its GPUs are clean' % node.bench.node)
    assert (healed.exit, healed.hook_exit) == (0, 0), healed
    assert healed.gpus == 'all' and healed.report['outcome'] == 'clean'
    assert healed.seconds < 60
    node.bench.wait_idle(10)
    assert node.bench.reason() == ''
    # The job the failed Prolog requeued stays held: releasing it is a person's call.
    assert node.bench.job(job)['Reason'] == 'launch_failed_requeued_held'


def test_a_node_drained_by_an_operator_stays_drained(node):
    """An operator drains the node for a reason of their own: health checks read it, leave it
    drained with that reason and stop nothing, even a process that holds a GPU."""
    holder = node.host.hold(gpus=[1], mib=1024)
    node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=drain',
                       'reason=bad DIMM, ticket 4711 (gpu_reset: not ours)')
    assert drained(node) == 'bad DIMM, ticket 4711 (gpu_reset: not ours)'
    before = node.health_mark()
    for seen in range(2):
        run = node.wait_health(before + seen, WAIT_S, 'left to whoever drained it')
        assert (run.exit, run.hook_exit, run.report) == (0, 0, None), run
    assert node.bench.node_state() == 'drained'
    assert node.bench.reason() == 'bad DIMM, ticket 4711 (gpu_reset: not ours)'
    assert alive(holder['pid']) and node.host.memory_used()[1] == 1024


def hold_in_job(cluster, out):
    """A job's GPU holder (gpusim hold) on the job's GPUs, in the job, then a long sleep."""
    return 'PYTHONPATH=%s %s -m gpusim hold --root %s --gpus $SLURM_JOB_GPUS --mib 2048 > %s; sleep 600' % (
        TESTS, sys.executable, cluster.host.root, out)


def run_health_check(cluster):
    """health-check.sh as slurmd runs it: as root, with SLURMD_NODENAME and nothing else. Slurm
    itself runs it only on idle nodes here (HealthCheckNodeState=IDLE); HealthCheckNodeState=ANY
    runs it on a node with a job too, where it must only read."""
    return subprocess.run(['env', '-i', 'SLURMD_NODENAME=%s' % cluster.bench.node,
                           os.path.join(cluster.hooks, 'health-check.sh')],
                          capture_output=True, text=True, timeout=70, check=False)


@pytest.mark.parametrize('reason', [None, 'gpu_reset: GPU 0: 2048 MiB held by python3 (pid 1)'])
def test_a_health_check_during_a_running_job_signals_nothing(node, reason):
    """A job holds its GPUs; the node is not drained, or is draining with a reason of this
    collection: the health check reads the node, says a job runs there, and stops nothing."""
    import json
    import time

    out = node.path('held-%s.json' % ('draining' if reason else 'running'))
    job = node.bench.sbatch('--gres=gpu:2', '--output', node.path('held.out'), '--wrap', hold_in_job(node, out))
    node.bench.wait_job(job, 'RUNNING', 60)
    until = time.monotonic() + 30
    while not (os.path.exists(out) and os.path.getsize(out)) and time.monotonic() < until:
        time.sleep(0.1)
    with open(out) as handle:
        holder = json.load(handle)
    if reason:
        node.bench.command('scontrol', 'update', 'nodename=%s' % node.bench.node, 'state=drain', 'reason=' + reason)
        node.bench.wait_state(lambda state: state == 'draining', 30, 'the node to be draining')
    before = node.health_mark()
    proc = run_health_check(node)
    assert proc.returncode == 0, proc.stderr
    run = node.wait_health(before, 10)
    assert run.report is None, run  # the sequence never ran
    said = '\n'.join(run.lines)
    assert ('a job still runs or ends there' if reason else 'is not drained') in said, said
    assert alive(holder['pid'])
    used = node.host.memory_used()
    assert sorted(used.values())[-2:] == [2048, 2048] and sum(used.values()) == 4096, used
    assert node.bench.job(job)['JobState'] == 'RUNNING'
    assert node.bench.node_state() == ('draining' if reason else 'mixed')
