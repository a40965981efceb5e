# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The job's GPUs by device node, with real Slurm daemons: gres.conf lists the device nodes out of
order and the simulated GPUs' minor numbers are not their indexes, so none of Slurm's number, the
number in a device node's name and the nvidia-smi index agree. A cluster of its own."""

import pytest

from conftest import PROLOG_EPILOG_TIMEOUT
from gpusim.state import is_alive as alive
from processes import gone

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

# gres.conf lists nvidia3 first, ...: Slurm's GPU p is the device node nvidia<GRES_ORDER[p]>.
GRES_ORDER = [3, 1, 0, 2, 7, 6, 5, 4]
# The GPU of index i has minor number MINORS[i] (its /dev/nvidiaN).
MINORS = [4, 5, 6, 7, 0, 1, 2, 3]


@pytest.fixture(scope='module')
def gres_order():
    return GRES_ORDER


@pytest.fixture(scope='module')
def host_minors():
    return MINORS


def index_of(place):
    """The nvidia-smi index of Slurm's GPU at place: its device node's minor number, that GPU."""
    return MINORS.index(GRES_ORDER[place])


def test_slurm_numbers_the_gpus_by_their_place_in_gres_conf(node):
    """What the mapping rests on, as this Slurm does it: the first job gets GPU 0, gres.conf's
    first device node (nvidia3), not the node named nvidia0."""
    job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('place.out'), '--wrap', 'echo "GPUS=$SLURM_JOB_GPUS"')
    node.bench.wait_job(job, 'COMPLETED', 60)
    with open(node.path('place.out')) as handle:
        assert handle.read().split() == ['GPUS=0']
    prolog = node.wait_run('prolog', job)
    assert prolog.gpus == '0' and prolog.exit == 0, prolog
    assert "SLURM_JOB_GPUS 0: 0 is %s/nvidia3 (minor 3), nvidia-smi GPU 7" % node.bench.gres_dir in '\n'.join(prolog.lines)


@pytest.mark.parametrize('runner', ['module', 'playbook'])
def test_the_prolog_frees_the_gpu_slurm_gave_the_job_and_no_other(node, runner):
    """A holder Slurm does not know of sits on the GPU the job is given (index 7: gres.conf's first
    node, nvidia3, minor 3) and two more on GPUs of other jobs: on index 0 (Slurm's number taken
    for an index) and on index 3 (the number in nvidia3 taken for one). The Prolog stops only the
    first; the job runs; the others keep their memory."""
    node.set_runner(runner)
    assert index_of(0) == 7
    leftover = node.host.hold(gpus=[7], mib=4096)
    by_number = node.host.hold(gpus=[0], mib=1024)
    by_name = node.host.hold(gpus=[3], mib=2048)
    job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('job-%s.out' % runner), '--wrap', 'true')
    node.bench.wait_job(job, 'COMPLETED', 2 * PROLOG_EPILOG_TIMEOUT)
    prolog = node.wait_run('prolog', job)
    assert (prolog.gpus, prolog.exit, prolog.hook_exit) == ('0', 0, 0), prolog
    assert gone(leftover['pid'], 5)
    assert alive(by_number['pid']) and alive(by_name['pid'])
    used = node.host.memory_used()
    assert (used[7], used[0], used[3]) == (0, 1024, 2048), used
    if runner == 'module':
        assert [p['pid'] for p in prolog.report['signalled']] == [leftover['pid']]
    assert node.wait_run('epilog', job, 2 * PROLOG_EPILOG_TIMEOUT).exit == 0
    node.bench.wait_idle(30)


def test_orphaned_memory_on_the_jobs_gpu_drains_and_on_another_is_left_alone(node):
    """Memory no process holds on index 0 and 3, GPUs of no job here: a job given Slurm's GPU 0
    (index 7) runs. The same memory on index 5 (Slurm's GPU 1, nvidia1, minor 1): the next job,
    given GPUs 0 and 1, is held back and the node drained naming GPU 5."""
    node.host.fault('stuck', gpu=0, mib=4096)
    node.host.fault('stuck', gpu=3, mib=4096)
    job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('clean.out'), '--wrap', 'true')
    node.bench.wait_job(job, 'COMPLETED', PROLOG_EPILOG_TIMEOUT + 10)
    assert node.wait_run('prolog', job).exit == 0
    assert node.wait_run('epilog', job).exit == 0
    assert index_of(1) == 5
    node.host.fault('stuck', gpu=5, mib=4096)
    job = node.bench.sbatch('--gres=gpu:2', '--output', node.path('dirty.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.gpus, prolog.exit, prolog.hook_exit) == ('0,1', 10, 1), prolog
    node.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    reason = node.bench.reason()
    assert reason.startswith('gpu_reset: GPU 5: 4096 MiB held with no process left (orphaned memory'), reason
    assert 'GPU 0' not in reason and 'GPU 3' not in reason
