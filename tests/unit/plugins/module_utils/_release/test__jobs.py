# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which Slurm job a process belongs to, and whom a job's release may signal."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import runs_root_owned_program
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.jobs import (
    ANOTHER_JOB, MPS_IN_USE, NOT_THIS_JOB, JobScope, check_job, job_of_cgroups, parse_listpids)


@pytest.mark.parametrize('text, job', [
    # cgroup v1 (proctrack/cgroup): the freezer and the other controllers name the job.
    ('12:freezer:/slurm/uid_1000/job_4711/step_0/task_0\n11:memory:/slurm/uid_1000/job_4711/step_0\n0::/\n', '4711'),
    ('6:freezer:/slurm_gpu07/uid_0/job_1/step_batch\n', '1'),
    # cgroup v2: slurmstepd.scope, also with the node's name for several slurmd on one host.
    ('0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n', '42'),
    ('0::/system.slice/gpu07_slurmstepd.scope/job_42/step_extern/user\n', '42'),
    # Not a job: a unit, a container, a user's own cgroup that only looks like one.
    ('0::/system.slice/nvidia-dcgm.service\n', None),
    ('0::/user.slice/user-1000.slice/job_5\n', None),
    ('0::/system.slice/slurmstepd.scope/system\n', None),
    ('0::/slurm/uid_0/job_x/step_0\n', None),
    # A cgroup a user made in a subtree delegated to them, named like a job's.
    ('0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_6/step_0\n', None),
    ('0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_6\n', None),
    # The v1 layout on the unified line, or the v2 one on a controller's, is no job either.
    ('0::/slurm/uid_0/job_7/step_0\n', None),
    ('4:freezer:/system.slice/slurmstepd.scope/job_7\n', None),
    ('', None),
])
def test_a_processs_job_is_read_from_slurms_own_cgroup_paths(text, job):
    assert job_of_cgroups(text) == job


def proc_with(tmp_path, pid, cgroup_text=None, ppid=1):
    """A /proc of files for pid: its stat (with ppid) and, when given, its cgroup."""
    base = tmp_path / str(pid)
    base.mkdir(parents=True)
    (base / 'stat').write_text('%d (job) S %d %d %d 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n' % (pid, ppid, pid, pid, 100 + pid))
    (base / 'cmdline').write_bytes(b'job\0')
    if cgroup_text is not None:
        (base / 'cgroup').write_text(cgroup_text)
    return str(tmp_path)


class Holder:
    """A holder as the rule sees it; its program is this test's own (root's Python, as root)."""

    def __init__(self, uid, exe_name='python3'):
        self.uid, self.exe_name, self.pid = uid, exe_name, os.getpid()


def scope(proc, shared=(), uid=None, live=None, job='5'):
    return JobScope(check_job({'id': job, 'uid': uid, 'shared_gpus': list(shared), 'live_jobs': live}), proc)


def test_a_cgroup_names_the_job_before_slurmds_pids_and_a_fork_of_a_listed_pid_is_its_jobs(tmp_path):
    proc = proc_with(tmp_path, 300, '0::/system.slice/slurmstepd.scope/job_6/step_0\n')
    proc_with(tmp_path, 400)
    proc_with(tmp_path, 401, ppid=400)
    jobs = scope(proc, live={'6': [], '7': [400, 300]})
    assert jobs.job_of(300) == '6'  # its cgroup, whatever slurmd lists
    assert jobs.job_of(401) == '7'  # forked from a pid slurmd lists for job 7
    assert jobs.job_of(999) is None  # gone


def test_another_job_is_left_alone_wherever_it_is_listed_or_not():
    jobs = JobScope(check_job({'id': '5', 'live_jobs': {'6': []}}), '/nonexistent')
    assert jobs.why_left_alone(Holder(0), '6', [1], set()) == ANOTHER_JOB
    # A job slurmd did not list when the list was read: one started since (during this Epilog), or
    # one that ended (slurmstepd ends its processes itself). Its cgroup says it is not this job's.
    assert jobs.why_left_alone(Holder(0), '4', [1], set()) == ANOTHER_JOB
    unknown = JobScope(check_job({'id': '5'}), '/nonexistent')
    assert unknown.why_left_alone(Holder(0), '4', [1], set()) == ANOTHER_JOB
    assert jobs.why_left_alone(Holder(0), '5', [1], set()) is None


def test_slurmds_pid_table_names_each_jobs_processes():
    table = ('PID      JOBID    STEPID   LOCALID GLOBALID\n'
             '4021     42       batch    0       0\n'
             '4100     42       0        0       0\n'
             '4200     43       extern   -       -\n'
             'garbage line\n'
             '1        44       0        0       0\n')
    assert parse_listpids(table) == {'42': [4021, 4100], '43': [4200]}


def fake_scontrol(tmp_path, script):
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!/bin/sh\n%s\n' % script)
    scontrol.chmod(0o755)
    return str(scontrol)


def test_slurmds_list_is_read_again_and_a_pid_counts_only_under_the_latest_list(tmp_path):
    proc = proc_with(tmp_path, 400)
    listing = tmp_path / 'listing'
    listing.write_text('PID JOBID STEPID LOCALID GLOBALID\n400 5 batch 0 0\n')
    scontrol = fake_scontrol(tmp_path, 'cat %s' % listing)
    jobs = JobScope(check_job({'id': '5', 'uid': 1000, 'live_jobs': {'5': [400]}, 'scontrol': scontrol}), proc)
    assert jobs.job_of(400) == '5'
    # Slurm started job 43 meanwhile, and its process took a pid the old list gave job 5.
    listing.write_text('PID JOBID STEPID LOCALID GLOBALID\n400 43 0 0 0\n')
    assert jobs.job_of(400) == '5'  # nothing is read again until asked
    assert jobs.refresh() is None
    assert jobs.job_of(400) == '43' and jobs.live == {'43': [400]}
    assert jobs.why_left_alone(Holder(1000), jobs.job_of(400), [0], set()) == ANOTHER_JOB


def test_a_list_that_cannot_be_read_again_lists_no_pid(tmp_path):
    proc = proc_with(tmp_path, 400)
    scontrol = fake_scontrol(tmp_path, 'echo "Unable to contact slurm controller" >&2; exit 1')
    jobs = JobScope(check_job({'id': '5', 'uid': 1000, 'live_jobs': {'5': [400]}, 'scontrol': scontrol}), proc)
    problem = jobs.refresh()
    assert 'Unable to contact slurm controller' in problem
    assert jobs.job_of(400) is None and jobs.live is None


def test_a_list_never_known_that_still_cannot_be_read_changes_nothing(tmp_path):
    proc = proc_with(tmp_path, 400)
    scontrol = fake_scontrol(tmp_path, 'echo "scontrol: not found" >&2; exit 127')
    jobs = JobScope(check_job({'id': '5', 'uid': 1000, 'scontrol': scontrol}), proc)
    assert jobs.refresh() is None and jobs.live is None


def test_a_process_of_the_job_is_its_cgroups_or_its_users_in_no_live_job():
    jobs = JobScope(check_job({'id': '5', 'uid': 1000, 'live_jobs': {}}), '/nonexistent')
    assert jobs.is_own(Holder(2000), '5')
    assert jobs.is_own(Holder(1000), None)
    assert not jobs.is_own(Holder(2000), None)
    assert not jobs.is_own(Holder(1000), '6')
    unknown = JobScope(check_job({'id': '5', 'uid': 1000}), '/nonexistent')
    assert not unknown.is_own(Holder(1000), None)  # which jobs live is not known


def test_on_a_shared_gpu_only_the_jobs_own_processes_may_be_signalled():
    jobs = JobScope(check_job({'id': '5', 'uid': 1000, 'shared_gpus': [0], 'live_jobs': {}}), '/proc')
    assert jobs.why_left_alone(Holder(1000), '5', [0], set()) is None
    assert jobs.why_left_alone(Holder(1000), None, [0], set()) is None  # its cgroup is gone: the job's user
    # Which jobs live not known (no slurmd list): a process of no job's cgroup may be another's.
    unknown = JobScope(check_job({'id': '5', 'uid': 1000, 'shared_gpus': [0]}), '/nonexistent')
    assert unknown.why_left_alone(Holder(1000), None, [0], set()) == NOT_THIS_JOB
    assert jobs.why_left_alone(Holder(2000), None, [0], set()) == NOT_THIS_JOB
    # A process that also holds a GPU of this job alone is released as without jobs.
    assert jobs.why_left_alone(Holder(2000), None, [0, 1], set()) is None
    # The MPS daemons stay while another job's process is on their GPU (a program root installed).
    if not runs_root_owned_program(os.getpid()):
        pytest.skip("this test's Python is not a root-owned program")
    assert jobs.why_left_alone(Holder(1000, 'nvidia-cuda-mps-server'), '5', [0], set([0])) == MPS_IN_USE
    assert jobs.why_left_alone(Holder(1000, 'nvidia-cuda-mps-control'), '5', [0], set()) is None


@pytest.mark.parametrize('job, said', [
    ('5', 'job must be a mapping'),
    ({'uid': 0}, 'job.id must be a Slurm job id'),
    ({'id': '5; rm -rf /'}, 'job.id must be a Slurm job id'),
    ({'id': True}, 'job.id must be a Slurm job id'),
    ({'id': '5', 'uid': 'root'}, 'job.uid must be a user id'),
    ({'id': '5', 'shared_gpus': [0, -1]}, 'job.shared_gpus must be a list of GPU indexes'),
    ({'id': '5', 'scontrol': ''}, 'job.scontrol must be the scontrol program'),
    ({'id': '5', 'scontrol': 42}, 'job.scontrol must be the scontrol program'),
    ({'id': '5', 'live_jobs': [6]}, 'job.live_jobs must map job ids'),
    ({'id': '5', 'live_jobs': {'6': [0]}}, r'job.live_jobs\[6\] must be a list of pids'),
    ({'id': '5', 'color': 'red'}, r'job: unknown key\(s\) color'),
])
def test_a_malformed_job_is_refused_naming_the_part(job, said):
    with pytest.raises(GpuopsError, match=said):
        check_job(job)


def test_a_job_id_given_as_a_number_is_its_digits():
    assert check_job({'id': 42, 'live_jobs': {7: [os.getpid()]}}) == {
        'id': '42', 'uid': None, 'shared_gpus': [], 'live_jobs': {'7': set([os.getpid()])}, 'scontrol': None}


@pytest.mark.parametrize('job_id', ['12\n', '12\n13', ''])
def test_a_job_id_that_is_not_one_number_alone_is_refused(job_id):
    with pytest.raises(GpuopsError):
        check_job({'id': job_id})
