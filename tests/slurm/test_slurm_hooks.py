# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Prolog and Epilog of the role gpuops.nvidia.slurm_hooks, installed by it, run
by real Slurm daemons (sbatch, scontrol, sinfo) against a simulated host whose GPU indexes are
Slurm's."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_clocks import clock_problems
from bench import BenchError, deploy_hooks
from conftest import BUDGET_S, PLAYBOOK_BUDGET_S, PROLOG_EPILOG_TIMEOUT
from gpusim.state import is_alive as alive
from processes import gone

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hold_command(cluster, gpus, mib, out):
    """A shell command that starts a gpusim holder on gpus (a shell word) that escapes Slurm: the
    launcher forks a monitor in a new session (setsid) that forks the holder, and exits."""
    return 'PYTHONPATH=%s %s -m gpusim hold --root %s --gpus %s --mib %d > %s' % (
        TESTS, sys.executable, cluster.host.root, gpus, mib, out)


def read_json(path, seconds=30):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if os.path.exists(path) and os.path.getsize(path):
            with open(path) as handle:
                return json.load(handle)
        time.sleep(0.1)
    raise AssertionError('nothing in %s' % path)


def memory(cluster):
    return cluster.host.memory_used()


@pytest.mark.parametrize('runner', ['module', 'playbook'])
def test_prolog_frees_gpus_a_leftover_holds_before_the_job_starts(node, runner):
    """A holder Slurm does not know of sits on GPUs 2 and 5; a job asking for all 8 GPUs runs
    only after the Prolog stopped it, and sees every GPU at 0 MiB."""
    node.set_runner(runner)
    leftover = node.host.hold(gpus=[2, 5], mib=4096)
    assert memory(node)[2] == 4096 and memory(node)[5] == 4096
    out = node.path('job-%s.out' % runner)
    job = node.bench.sbatch('--gres=gpu:8', '--output', out, '--wrap',
                            '%s --query-gpu=index,memory.used --format=csv,noheader,nounits; '
                            'echo "GPUS=$CUDA_VISIBLE_DEVICES"' % node.host.smi_path)
    node.bench.wait_job(job, 'COMPLETED', 2 * PLAYBOOK_BUDGET_S)
    prolog = node.wait_run('prolog', job)
    assert (prolog.exit, prolog.hook_exit) == (0, 0), prolog
    assert prolog.gpus == '0,1,2,3,4,5,6,7'
    with open(out) as handle:
        lines = handle.read().split()
    assert lines == ['%d,' % (i // 2) if i % 2 == 0 else '0' for i in range(16)] + ['GPUS=0,1,2,3,4,5,6,7'], lines
    assert gone(leftover['pid'], 5)
    if runner == 'module':
        assert prolog.report['outcome'] == 'released'
        assert [p['pid'] for p in prolog.report['signalled']] == [leftover['pid']]
    else:
        assert 'PLAY RECAP' in '\n'.join(prolog.lines)
    assert node.wait_run('epilog', job, PLAYBOOK_BUDGET_S).exit == 0
    node.bench.wait_idle(30)


def test_epilog_stops_what_escaped_the_job_and_leaves_another_job_alone(node):
    """Job A's holder double-forks into a session of its own, so Slurm's process tracking loses
    it and it keeps A's GPUs when A ends; A's Epilog stops exactly it, and job B's holder on
    B's GPUs runs on."""
    b_out = node.path('b.json')
    other = node.bench.sbatch('--gres=gpu:2', '--output', node.path('b.out'), '--wrap',
                              hold_command(node, '$SLURM_JOB_GPUS', 2048, b_out) + '; sleep 600')
    b_holder = read_json(b_out)
    assert node.wait_run('prolog', other).exit == 0
    a_out = node.path('a.json')
    job = node.bench.sbatch('--gres=gpu:2', '--output', node.path('a.out'), '--wrap',
                            hold_command(node, '$SLURM_JOB_GPUS', 4096, a_out) + '; echo "GPUS=$SLURM_JOB_GPUS"')
    node.bench.wait_job(job, 'COMPLETED', 60)
    a_holder = read_json(a_out)
    epilog = node.wait_run('epilog', job)
    assert epilog.exit == 0, epilog
    with open(node.path('a.out')) as handle:
        a_gpus = [int(i) for i in handle.read().split('GPUS=')[1].split(',')]
    b_run = node.runs()[0]
    assert b_run.job == str(other)
    b_gpus = [int(i) for i in b_run.gpus.split(',')]
    assert len(a_gpus) == 2 and not set(a_gpus) & set(b_gpus)
    assert epilog.gpus == ','.join(str(i) for i in a_gpus)
    # The Epilog, not Slurm, stopped A's holder: it was still there for the Epilog to signal.
    assert [p['pid'] for p in epilog.report['signalled']] == [a_holder['pid']], epilog
    assert gone(a_holder['pid'], 5)
    used = memory(node)
    assert [used[i] for i in a_gpus] == [0, 0]
    assert alive(b_holder['pid'])
    assert [used[i] for i in b_gpus] == [2048, 2048]
    assert node.bench.job(other)['JobState'] == 'RUNNING'
    assert node.bench.node_state() == 'mixed'


def test_a_job_without_gpus_leaves_the_gpus_alone(node):
    """On a shared node the GPUs belong to other jobs: the hook of a job without GPUs does
    nothing to them."""
    holder = node.host.hold(gpus=[0], mib=1024)
    job = node.bench.sbatch('--output', node.path('nogpu.out'), '--wrap', 'true')
    node.bench.wait_job(job, 'COMPLETED', 60)
    node.bench.wait_idle(30)
    assert alive(holder['pid'])
    assert memory(node)[0] == 1024
    assert node.runs() == []


def test_orphaned_memory_drains_the_node_with_the_reason_and_requeues_the_job(node):
    """Memory held on GPU 3 with no process left: the Prolog fails, the node is drained with a
    reason naming the GPU and why (not Slurm's bare 'Prolog error'), and the batch job is
    requeued and held, not lost."""
    node.host.fault('stuck', gpu=3, mib=4096)
    job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('orphan.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    # The runner drained the node with the reason (10); the hook tells slurmd 1.
    assert (prolog.exit, prolog.hook_exit) == (10, 1), prolog
    assert prolog.report['outcome'] == 'failed'
    assert prolog.report['drained'] is True, prolog.report['reason']
    node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    reason = node.bench.reason()
    assert reason.startswith('gpu_reset: GPU 3: 4096 MiB held with no process left (orphaned memory'), reason
    # The job is COMPLETING while its Epilog runs (and fails the same way), then PENDING again.
    info = node.bench.wait_job(job, 'PENDING', PROLOG_EPILOG_TIMEOUT + 10)
    assert info['Reason'] == 'launch_failed_requeued_held', (info['JobState'], info['Reason'])
    assert int(info['Restarts']) >= 1
    assert not os.path.exists(node.path('orphan.out'))


def test_a_hung_nvidia_smi_drains_the_node_before_slurm_kills_the_hook(node):
    """nvidia-smi never answers: the hook gives up within its own budget, below
    PrologEpilogTimeout, and drains the node saying why; the job is requeued."""
    node.host.fault('hang', seconds=3600)
    started = time.monotonic()
    job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('hung.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    took = time.monotonic() - started
    # Ended by itself (not cut off at the budget, 124), within the budget, below Slurm's limit.
    assert (prolog.exit, prolog.hook_exit) == (10, 1), prolog
    assert prolog.seconds <= BUDGET_S < PROLOG_EPILOG_TIMEOUT, prolog.seconds
    assert took < PROLOG_EPILOG_TIMEOUT, took
    node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    reason = node.bench.reason()
    assert reason.startswith('gpu_reset: ') and 'nvidia-smi' in reason, reason
    assert 'Prolog error' not in reason
    assert node.bench.wait_job(job, 'PENDING', PROLOG_EPILOG_TIMEOUT + 10)['Reason'] == 'launch_failed_requeued_held'


def test_a_hook_that_cannot_run_its_checks_drains_the_node_saying_so(node):
    """A Python that is not there (a node set up half-way): the hook still drains the node with a
    reason that names it and points to its log, rather than Slurm's bare 'Prolog error'."""
    node.set_conf(python=node.path('no-such-python'))
    job = node.bench.sbatch('--gres=gpu:2', '--output', node.path('nopython.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.exit, prolog.hook_exit) == (127, 2), prolog
    assert node.bench.wait_job(job, 'PENDING', PROLOG_EPILOG_TIMEOUT + 10)['Reason'] == 'launch_failed_requeued_held'
    # The Epilog, which fails the same way, has drained the node again by now.
    assert node.wait_run('epilog', job).exit == 127
    node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    assert re.match(r'gpu_reset: (prolog|epilog) hook cannot run GPU_RESET_PYTHON %s: no such executable; set '
                    r'GPU_RESET_PYTHON to the Python that has ansible-core \(job %s, GPUs [0-9,]+\), see %s$'
                    % (re.escape(node.path('no-such-python')), job, re.escape(node.log)),
                    node.bench.reason()), node.bench.reason()


# -- release safety: the hook's exit statuses and drain reasons --------------------------------

def test_a_hook_whose_python_cannot_import_the_collection_drains_saying_so(node):
    """Python starts, cannot import the collection and exits 1 itself, as the hook once did after
    draining: the hook now exits 2 and drains the node saying it could not run its checks, rather
    than leaving Slurm's bare 'Prolog error'."""
    node.set_conf(collections_path=node.path('no-collection'))
    job = node.bench.sbatch('--gres=gpu:2', '--output', node.path('nocollection.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert node.bench.wait_job(job, 'PENDING', PROLOG_EPILOG_TIMEOUT + 10)['Reason'] == 'launch_failed_requeued_held'
    node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    assert re.match(r'gpu_reset: (prolog|epilog) hook GPU_RESET_PYTHON \S+ cannot import gpuops.nvidia; install '
                    r'the collection for it or set GPU_RESET_COLLECTIONS_PATH \(job %s, GPUs [0-9,]+\), see %s$'
                    % (job, re.escape(node.log)), node.bench.reason()), node.bench.reason()
    # Python's own 1, which once read as "drained with the reason".
    assert (prolog.exit, prolog.hook_exit) == (1, 2), prolog
    assert 'No module named' in '\n'.join(prolog.lines), prolog


# Holds the release lock under a process name (its comm) with a terminal escape and a bell.
LOCK_HOLDER = r'''
import ctypes, fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
ctypes.CDLL(None).prctl(15, b'\x1b]0;pwn\x07\x1b[2J', 0, 0, 0)
print('ready', flush=True)
time.sleep(600)
'''


def test_control_characters_in_the_reason_reach_slurm_escaped(node):
    """The release cannot get its lock, held by a process whose name carries terminal escapes: the
    node is drained with a reason naming it, escaped, as scontrol and sinfo -R show it."""
    holder = subprocess.Popen([sys.executable, '-c', LOCK_HOLDER, os.path.join(node.dir, 'release.lock')],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'ready'
        job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('locked.out'), '--wrap', 'true')
        prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
        node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
        reason = node.bench.node_info()['Reason']
        assert reason.startswith('gpu_reset: Release the GPUs: another process still holds the lock file'), reason
        assert '(\\x1b]0;pwn\\x07\\x1b[2J, user root (uid 0))' in reason, reason
        assert not re.search(r'[\x00-\x1f\x7f-\x9f]', reason + node.bench.reason()), reason
        assert (prolog.exit, prolog.hook_exit) == (10, 1), prolog
    finally:
        holder.kill()
        holder.wait()


def test_slurm_runs_with_the_hooks_clocks(node):
    """The role's slurm.conf lines, as the real slurmctld reads them: Slurm gives a Prolog
    PrologEpilogTimeout, and a batch job's launch (its Prolog included) as long before it is taken
    for missing (BatchStartTimeout, 10 s by default)."""
    config = node.bench.command('scontrol', 'show', 'config').stdout
    values = dict(re.findall(r'^(PrologEpilogTimeout|BatchStartTimeout)\s*=\s*(\d+)', config, re.MULTILINE))
    assert values == {'PrologEpilogTimeout': str(PROLOG_EPILOG_TIMEOUT), 'BatchStartTimeout': str(PROLOG_EPILOG_TIMEOUT)}, config
    # What the role checks them by: the values are the lines' own, nothing to say.
    with open(os.path.join(node.hooks, 'slurm-hooks.conf')) as handle:
        written = handle.read()
    assert clock_problems(config, written, PROLOG_EPILOG_TIMEOUT) == []
    # The same running values, had a line of slurm.conf read after the Include set them.
    theirs = re.sub(r'(?m)^(PrologEpilogTimeout|BatchStartTimeout)=.*$', r'\1=%d' % (2 * PROLOG_EPILOG_TIMEOUT), written)
    assert clock_problems(config, theirs, 2 * PROLOG_EPILOG_TIMEOUT) == [
        'Slurm runs with %s=%d, which gives %s less than the %d s the hooks need: a line of slurm.conf read after the '
        'Include sets it; set it to %d or more, or remove it'
        % (name, PROLOG_EPILOG_TIMEOUT, what, 2 * PROLOG_EPILOG_TIMEOUT, 2 * PROLOG_EPILOG_TIMEOUT)
        for name, what in (('PrologEpilogTimeout', 'a Prolog and an Epilog'),
                           ('BatchStartTimeout', "a batch job's launch, its Prolog included"))]


def test_the_role_deployed_again_on_a_running_node_checks_slurm_s_running_clocks(node, tmp_path):
    """The role reads scontrol show config once Slurm reads its lines: on the node as it runs, the
    values are the lines' own and the role passes; had a later line of slurm.conf set them lower
    than the hooks need, it fails naming each."""
    with open(os.path.join(node.hooks, 'deploy-vars.json')) as handle:
        deployed = dict(json.load(handle), slurm_hooks_check_running_clocks=True)
    deploy_hooks(node.hooks, deployed['slurm_hooks_gpu_reset_vars'],
                 **dict((name, value) for name, value in deployed.items()
                        if name not in ('slurm_hooks_gpu_reset_vars',)))
    # Another directory, whose slurm.conf lines set more than the running node has: the running
    # values are then not the lines' own.
    with open(os.path.join(node.hooks, 'slurm-hooks.conf')) as handle:
        written = handle.read()
    lines = tmp_path / 'slurm-hooks.conf'
    more_lines = written.replace('PrologEpilogTimeout=%d' % PROLOG_EPILOG_TIMEOUT, 'PrologEpilogTimeout=200')
    lines.write_text(more_lines)
    more = dict(deployed, slurm_hooks_dir=str(tmp_path / 'hooks'), slurm_hooks_slurm_conf=str(lines),
                slurm_hooks_prolog_epilog_timeout=200)
    with pytest.raises(BenchError) as failed:
        deploy_hooks(str(tmp_path / 'hooks'), more.pop('slurm_hooks_gpu_reset_vars'), **more)
    assert 'Slurm runs with PrologEpilogTimeout=%d, which gives a Prolog and an Epilog less than the 200 s the hooks need' \
        % PROLOG_EPILOG_TIMEOUT in str(failed.value), str(failed.value)
    assert lines.read_text() == more_lines  # not rewritten: the role stopped before it
