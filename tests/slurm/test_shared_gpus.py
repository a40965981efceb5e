# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Jobs that share a GPU under real Slurm: gres/shard on every GPU (GresTypes=gpu,shard) and
proctrack/cgroup, so that slurmstepd puts each job's processes in its own cgroup
(freezer:/slurm_<node>/uid_U/job_N/...), as production nodes do. One job's Prolog and Epilog
leave the other job on the GPU alone, and the node stays in service."""

import os
import sys
import time

import pytest
import yaml

from gpusim.cgroups import available
from gpusim.state import is_alive as alive
from processes import gone
from test_slurm_hooks import TESTS, hold_command, memory, read_json

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = [pytest.mark.xdist_group('slurm'),
              pytest.mark.skipif(available(1) is not None, reason='proctrack/cgroup on cgroup v1: %s' % available(1))]


@pytest.fixture(scope='module')
def bench_options():
    return {'shards': 4, 'proctrack': 'cgroup'}


def test_a_shard_jobs_prolog_and_epilog_leave_the_other_job_on_its_gpu_alone(node):
    b_out = node.path('b.json')
    other = node.bench.sbatch('--gres=shard:1', '--output', node.path('b.out'), '--wrap',
                              hold_command(node, '$SLURM_JOB_GPUS', 4000, b_out) + '; sleep 600')
    b_holder = read_json(b_out, 90)
    assert node.wait_run('prolog', other).exit == 0
    a_out = node.path('a.json')
    job = node.bench.sbatch('--gres=shard:1', '--output', node.path('a.out'), '--wrap',
                            hold_command(node, '$SLURM_JOB_GPUS', 1000, a_out) + '; echo "GPUS=$SLURM_JOB_GPUS"')
    node.bench.wait_job(job, 'COMPLETED', 120)
    a_holder = read_json(a_out, 90)
    prolog, epilog = node.wait_run('prolog', job), node.wait_run('epilog', job)
    with open(node.path('a.out')) as handle:
        assert handle.read().split('GPUS=')[1].strip() == '0'
    for run in (prolog, epilog):
        assert (run.exit, run.hook_exit, run.gpus) == (0, 0, '0'), run
        assert run.report['outcome'] in ('clean', 'released'), run
        assert b_holder['pid'] not in [entry['pid'] for entry in run.report['signalled']], run
        assert [(entry['pid'], entry['job_id'], entry['why']) for entry in run.report['other_jobs']] == \
            [(b_holder['pid'], str(other), 'another_job')], run
        assert "GPU 0 shared with other jobs (gres.conf)" in '\n'.join(run.lines)
    # Slurm ended A's holder with A (its cgroup); B's runs on with its memory, its job running.
    assert gone(a_holder['pid'], 5)
    assert alive(b_holder['pid'])
    assert memory(node)[0] == 4000
    assert node.bench.job(other)['JobState'] == 'RUNNING'
    assert node.bench.node_state() == 'mixed'


def test_a_whole_gpu_job_beside_a_shard_job_stops_a_leftover_of_no_job(node):
    """A job of whole GPUs beside a shard job: its Prolog stops a leftover of no job (of the job's
    user) on its GPUs, and leaves the shard job alone."""
    b_out = node.path('b2.json')
    other = node.bench.sbatch('--gres=shard:1', '--output', node.path('b2.out'), '--wrap',
                              hold_command(node, '$SLURM_JOB_GPUS', 2000, b_out) + '; sleep 600')
    b_holder = read_json(b_out, 90)
    leftover = node.host.hold(gpus=[3], mib=3000)  # of no job: an orphan of one that ended
    job = node.bench.sbatch('--gres=gpu:7', '--output', node.path('a2.out'), '--wrap', 'true')
    node.bench.wait_job(job, 'COMPLETED', 120)
    prolog = node.wait_run('prolog', job)
    assert prolog.exit == 0 and '3' in prolog.gpus.split(','), prolog
    assert [entry['pid'] for entry in prolog.report['signalled']] == [leftover['pid']], prolog.lines
    assert gone(leftover['pid'], 5) and alive(b_holder['pid']), prolog.lines
    if '0' in prolog.gpus.split(','):  # Slurm 22.05 may give a shard's GPU whole to another job
        assert [entry['pid'] for entry in prolog.report['other_jobs']] == [b_holder['pid']]
    assert node.wait_run('epilog', job).exit == 0
    assert node.bench.job(other)['JobState'] == 'RUNNING'


def wait_for_text(path, text, seconds=60):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if os.path.exists(path):
            with open(path) as handle:
                found = handle.read()
            if text in found:
                return found
        time.sleep(0.1)
    raise AssertionError('no %r in %s within %s s' % (text, path, seconds))


def with_grace_period(node, seconds):
    """The installed hook with gpu_reset_grace_period set to seconds (a vars file of its own)."""
    with open(node.conf) as handle:
        installed = [line.split('=', 1)[1] for line in handle.read().splitlines() if line.startswith('GPU_RESET_VARS_FILE=')][0]
    with open(installed.strip("'")) as handle:
        variables = yaml.safe_load(handle)
    variables['gpu_reset_grace_period'] = seconds
    path = node.path('gpu_reset-grace.yml')
    with open(path, 'w') as handle:
        yaml.safe_dump(variables, handle)
    node.set_conf(vars_file=path)


def test_a_process_another_job_starts_during_an_epilog_is_never_signalled(node):
    """Job A's Epilog is kept waiting by a holder of no job on A's GPU that ignores SIGTERM; while it
    runs, job B (on another GPU) starts a client on every GPU of the node, A's included (devices
    not constrained, as on a node without cgroup device limits). The Epilog,
    whose first read of the node knew no such process, decides whose each process is at each
    signal: B's is never signalled, the holder of no job is killed, and B runs on. (Slurm 22.05
    starts no job on a node while a job there is completing, so the process comes from a job
    already running.)"""
    with_grace_period(node, 3)
    trigger, b_out = node.path('b3.go'), node.path('b3.json')
    client = 'PYTHONPATH=%s %s -m gpusim hold --root %s --gpus all --mib 64 > %s' % (
        TESTS, sys.executable, node.host.root, b_out)
    other = node.bench.sbatch('--gres=gpu:1', '--output', node.path('b3.out'), '--wrap',
                              'while [ ! -e %s ]; do sleep 0.05; done; %s; sleep 600' % (trigger, client))
    node.bench.wait_job(other, 'RUNNING', 60)
    job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('a3.out'), '--wrap',
                            'echo "GPUS=$SLURM_JOB_GPUS"; sleep 2')
    a_gpu = int(wait_for_text(node.path('a3.out'), 'GPUS=').split('GPUS=')[1].split()[0])
    stretcher = node.host.hold(gpus=[a_gpu], mib=500, ignore_term=True)
    wait_for_text(node.log, 'epilog job %s on' % job)
    open(trigger, 'w').close()
    b_holder = read_json(b_out, 30)
    # The client was up before the Epilog ended: the Epilog met it during its signals.
    assert [run.hook_exit for run in node.runs() if run.mode == 'epilog' and run.job == str(job)] == [None]
    epilog = node.wait_run('epilog', job)
    assert epilog.exit == 0, epilog
    assert [entry['pid'] for entry in epilog.report['signalled']] == [stretcher['pid']], epilog
    assert gone(stretcher['pid'], 5)
    assert [(entry['pid'], entry['job_id']) for entry in epilog.report['other_jobs']] == \
        [(b_holder['pid'], str(other))], '\n'.join(epilog.lines)
    assert alive(b_holder['pid'])
    assert node.bench.job(other)['JobState'] == 'RUNNING'
