# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Jobs on MIG instances under real Slurm: GPU 0 of the simulated host split in two 1g instances,
each a GRES of gres.conf as Slurm's AutoDetect=nvml writes one (MultipleFiles= the GPU's node and
the caps nodes of its GPU and compute instance; character devices, as slurmd requires, of the
minors the simulated driver lists). Two jobs run on the two instances; one ends, and its Epilog
frees its instance while the other job runs on."""

import sys

import pytest

from gpusim.mig import ci_minor, gi_minor
from gpusim.state import is_alive as alive
from processes import gone
from test_slurm_hooks import TESTS, read_json

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

# The GPU instance ids gpusim (as a driver) gives two 1g instances of a GPU: Slurm's places 0 and 1.
GIS = (7, 8)
CAPS = '{gres_dir}/nvidia-caps/nvidia-cap%d'


@pytest.fixture(scope='module')
def bench_options():
    lines = ['Name=gpu MultipleFiles={gres_dir}/nvidia0,%s,%s' % (CAPS % gi_minor(0, gi), CAPS % ci_minor(0, gi, 0))
             for gi in GIS]
    return {'gpus': len(GIS), 'gres_conf': '\n'.join(lines) + '\n'}


def hold_on_instance(node, mib, out):
    """A gpusim holder on the instance of the job's GRES (SLURM_JOB_GPUS: its place) that escapes
    Slurm (a monitor in a new session forks it), as a leftover of a job does."""
    return 'PYTHONPATH=%s %s -m gpusim hold --root %s --gpus 0 --mig $((%d + SLURM_JOB_GPUS)) --mib %d > %s' % (
        TESTS, sys.executable, node.host.root, GIS[0], mib, out)


def test_the_epilog_of_a_job_on_one_instance_frees_it_and_the_job_on_the_other_runs_on(node):
    # The caps nodes' minors in gres.conf are those the simulated driver gives these instances.
    devices = node.host.mig(0, ['1g.18gb', '1g.18gb'])['instances']
    assert [dev['gi'] for dev in devices] == list(GIS)
    b_out = node.path('mig-b.json')
    other = node.bench.sbatch('--gres=gpu:1', '--output', node.path('mig-b.out'), '--wrap',
                              hold_on_instance(node, 5000, b_out) + '; sleep 600')
    b_holder = read_json(b_out, 90)
    assert node.wait_run('prolog', other).exit == 0
    a_out = node.path('mig-a.json')
    job = node.bench.sbatch('--gres=gpu:1', '--output', node.path('mig-a.out'), '--wrap',
                            hold_on_instance(node, 3000, a_out))
    node.bench.wait_job(job, 'COMPLETED', 120)
    a_holder = read_json(a_out, 90)
    epilog = node.wait_run('epilog', job)
    assert (epilog.exit, epilog.hook_exit) == (0, 0), epilog
    assert epilog.report['outcome'] == 'released', epilog
    assert [entry['pid'] for entry in epilog.report['signalled']] == [a_holder['pid']], epilog
    a_gi = GIS[int(epilog.gpus)]
    a_device = [dev for dev in devices if dev['gi'] == a_gi][0]
    assert 'MIG instance 0:%d:0' % a_gi in '\n'.join(epilog.lines), epilog
    assert [(gpu['index'], gpu['mig_instance']['uuid'], gpu['memory_used_mib']) for gpu in epilog.report['gpus_after']] == \
        [(0, a_device['uuid'], 0)], epilog
    assert gone(a_holder['pid'], 5)
    assert alive(b_holder['pid'])
    assert node.bench.job(other)['JobState'] == 'RUNNING'
    assert node.bench.node_state() == 'mixed'
