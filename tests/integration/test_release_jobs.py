# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A release for one job on a node where other jobs run: real processes in real cgroups.

Each job's processes run where slurmstepd puts them (cgroup v1 ``/slurm/uid_U/job_N/...``, v2
``/system.slice/slurmstepd.scope/job_N/...``), made by gpusim as root and removed by it; every
test runs in a private PID namespace, so a test that went wrong signals only its own processes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions
from gpusim.cgroups import available, job_cgroup
from gpusim.state import is_alive as alive
from integration.test_release_adversarial import release
from processes import gone, in_private_pid_namespace


def cgroups(version):
    why = available(version)
    return pytest.mark.skipif(why is not None, reason='job cgroups v%d: %s' % (version, why))


def job(job_id, shared=(), uid=None, live=None):
    return {'id': str(job_id), 'uid': uid, 'shared_gpus': list(shared), 'live_jobs': live}


def pids(entries):
    return sorted(entry['pid'] for entry in entries)


@in_private_pid_namespace
@pytest.mark.parametrize('version', [pytest.param(1, marks=cgroups(1)), pytest.param(2, marks=cgroups(2))])
def test_the_epilog_of_a_shard_job_leaves_the_other_job_on_its_gpu_alone(gpuhost, version):
    mine = gpuhost.hold(gpus=[0], mib=1000, cgroup=job_cgroup(5, version))
    neighbour = gpuhost.hold(gpus=[0], mib=4000, cgroup=job_cgroup(6, version))
    result = release(gpuhost, job=job(5, shared=[0]), gpus=[0])
    assert gone(mine['pid'])
    assert alive(neighbour['pid'])
    assert result.released is True, result.failure
    assert pids(result.signalled) == [mine['pid']]
    assert [(entry['pid'], entry['job_id'], entry['why'], entry['gpus']) for entry in result.other_jobs] == \
        [(neighbour['pid'], '6', 'another_job', [0])]
    assert not result.protected and not result.survivors
    assert neighbour['pid'] not in [int(line.split('pid ')[1].split()[0]) for line in result.logged if 'pid ' in line]
    # The neighbour's 4000 MiB are its own: the GPU is not reset, not orphaned.
    assert result.orphaned_gpus == [] and result.escalation is None


@in_private_pid_namespace
@cgroups(1)
def test_another_live_job_is_never_signalled_even_on_a_gpu_slurm_does_not_share(gpuhost):
    # Without ConstrainDevices a job's CUDA opens every GPU's node; the driver places it on GPU 0 here.
    neighbour = gpuhost.hold(gpus=[0], mib=3000, cgroup=job_cgroup(6))
    result = release(gpuhost, job=job(5), gpus=[0], timeout=20)
    assert alive(neighbour['pid'])
    assert result.signalled == []
    assert result.released is False
    assert 'GPU 0: 3001 MiB used, held by pid %d (python3, user root, job 6; another_job)' % neighbour['pid'] \
        in result.failure, result.failure
    assert pids(result.other_jobs) == [neighbour['pid']]
    # Waiting cannot help: the release ends at once, not at its timeout.
    assert result.elapsed_s < 10


@in_private_pid_namespace
@cgroups(1)
def test_a_process_whose_cgroup_names_another_job_is_never_signalled_listed_or_not(gpuhost):
    # Job 4 is on no list: it ended (slurmstepd ends its processes itself), or Slurm started it
    # after the list was read. Its cgroup says it is not this job's.
    stray = gpuhost.hold(gpus=[1], mib=500, cgroup=job_cgroup(4))
    result = release(gpuhost, job=job(5, live={'6': []}), gpus=[1], timeout=3)
    assert alive(stray['pid']) and result.signalled == []
    assert result.released is False
    assert [(entry['pid'], entry['job_id'], entry['why']) for entry in result.other_jobs] == \
        [(stray['pid'], '4', 'another_job')]


@in_private_pid_namespace
@cgroups(1)
def test_on_a_shared_gpu_only_the_jobs_own_are_signalled(gpuhost):
    neighbour = gpuhost.hold(gpus=[0], mib=4000, cgroup=job_cgroup(6))
    # A process in no job: of the job's user (the job's cgroup is gone) it is the job's; of
    # another user it is left alone on a GPU others use.
    own_orphan = gpuhost.hold(gpus=[0], mib=200)
    result = release(gpuhost, job=job(5, shared=[0], uid=0, live={'6': []}), gpus=[0])
    assert gone(own_orphan['pid']) and alive(neighbour['pid'])
    assert result.released is True, result.failure

    # Without slurmd's list of the jobs' pids, a process of no job's cgroup may be another job's
    # (tracked without cgroups): on a GPU others use it is left alone, and named.
    unknown = gpuhost.hold(gpus=[0], mib=200)
    result = release(gpuhost, job=job(5, shared=[0], uid=0), gpus=[0])
    assert alive(unknown['pid']) and result.signalled == []
    assert (unknown['pid'], 'not_this_job') in [(entry['pid'], entry['why']) for entry in result.other_jobs]
    gpuhost.stop()
    gpuhost.init()
    neighbour = gpuhost.hold(gpus=[0], mib=4000, cgroup=job_cgroup(6))

    other_users = gpuhost.hold(gpus=[0], mib=200)
    result = release(gpuhost, job=job(5, shared=[0], uid=4242), gpus=[0])
    assert alive(other_users['pid']) and alive(neighbour['pid'])
    assert result.signalled == []
    assert result.released is True, result.failure
    assert sorted((entry['pid'], entry['why']) for entry in result.other_jobs) == sorted(
        [(neighbour['pid'], 'another_job'), (other_users['pid'], 'not_this_job')])


@in_private_pid_namespace
@cgroups(1)
def test_a_job_process_that_ignores_term_on_a_shared_gpu_fails_for_that_job_alone(gpuhost):
    neighbour = gpuhost.hold(gpus=[0], mib=4000, cgroup=job_cgroup(6))
    stuck = gpuhost.hold(gpus=[0], mib=1000, cgroup=job_cgroup(5), ignore_term=True)
    result = release(gpuhost, job=job(5, shared=[0]), gpus=[0], signals=['TERM'], timeout=3)
    assert alive(stuck['pid']) and alive(neighbour['pid'])
    assert result.released is False
    assert 'pid %d' % stuck['pid'] in result.failure
    assert 'pid %d' % neighbour['pid'] not in result.failure, result.failure


@in_private_pid_namespace
def test_slurmd_s_pids_name_the_job_where_no_cgroup_does(gpuhost):
    # proctrack/linuxproc: no job cgroups, scontrol listpids names the job's processes.
    neighbour = gpuhost.hold(gpus=[0], mib=4000, children=1)
    mine = gpuhost.hold(gpus=[0], mib=1000)
    listed = {'5': [mine['monitor_pid']], '6': [neighbour['monitor_pid']]}
    result = release(gpuhost, job=job(5, shared=[0], uid=0, live=listed), gpus=[0])
    assert gone(mine['pid'])
    assert alive(neighbour['pid']) and all(alive(pid) for pid in neighbour['children'])
    assert result.released is True, result.failure
    assert sorted(pids(result.other_jobs)) == sorted([neighbour['pid']] + neighbour['children'])


@in_private_pid_namespace
@cgroups(1)
def test_an_mps_server_stays_while_another_jobs_client_uses_the_gpu(gpuhost):
    server = gpuhost.hold(gpus=[0], mib=300, name='nvidia-cuda-mps-server', daemon=True, cgroup=job_cgroup(5))
    client = gpuhost.hold(gpus=[0], mib=2000, cgroup=job_cgroup(6))
    mine = gpuhost.hold(gpus=[0], mib=1000, cgroup=job_cgroup(5))
    result = release(gpuhost, job=job(5, shared=[0]), gpus=[0])
    assert gone(mine['pid']) and alive(server['pid']) and alive(client['pid'])
    assert result.released is True, result.failure
    assert sorted((entry['pid'], entry['why']) for entry in result.other_jobs) == sorted(
        [(server['pid'], 'mps_in_use'), (client['pid'], 'another_job')])

    gpuhost.stop()  # the other job ends: its client is gone, the server is the job's to stop
    gpuhost.init()
    server = gpuhost.hold(gpus=[0], mib=300, name='nvidia-cuda-mps-server', daemon=True, cgroup=job_cgroup(5))
    result = release(gpuhost, job=job(5, shared=[0]), gpus=[0])
    assert gone(server['pid'])
    assert result.released is True, result.failure


@pytest.mark.parametrize('bad, said', [
    ({'id': 'x5'}, 'job.id must be a Slurm job id'),
    ({'id': '5', 'uid': -1}, 'job.uid'),
    ({'id': '5', 'shared_gpus': ['a']}, 'job.shared_gpus'),
    ({'id': '5', 'live_jobs': {'6': [1]}}, 'job.live_jobs'),
    ({'id': '5', 'live_jobs': {'six': []}}, 'job.live_jobs must be a Slurm job id'),
    ({'id': '5', 'color': 'red'}, 'unknown key'),
])
def test_a_malformed_job_is_refused_naming_what_is_wrong(gpuhost, bad, said):
    with pytest.raises(GpuopsError, match=said.replace('.', r'\.')):
        ReleaseOptions(devices=[gpuhost.dev_glob], job=bad)
