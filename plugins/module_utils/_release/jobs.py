# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Jobs on a node: which Slurm job a process belongs to, and whom a job's release may signal.

A process's job is read on the host, never taken from what the process says: its cgroup, which
only root can set (slurmstepd puts every task in ``/slurm/uid_<uid>/job_<id>/...`` on cgroup v1
and in ``/system.slice/slurmstepd.scope/job_<id>/...`` on cgroup v2), else the pids slurmd lists for
the job (``scontrol listpids``, for nodes that track jobs without cgroups), a process forked
from one of them included.

The rule (JobScope.why_left_alone): a process of another job is never signalled, whatever it
holds, live or ended (slurmstepd ends an ended job's processes itself), listed by slurmd or not (a
job Slurm starts while this one's Epilog runs is on no list read before it started). On a GPU
that Slurm shares between jobs (gres/shard, gres/mps) only the job's own processes are: those in
its cgroup, or, outside every live job, those of the job's user. An MPS daemon is stopped only
when no other job's process is on its GPU.

Membership is decided when the signal goes out, not when the holders were first found: the
cgroup is read again, and, where slurmd's list is used (nodes without cgroups), the list is read
again before each round of signals (JobScope.refresh).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import read_process, runs_root_owned_program
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

# Anchored at the hierarchy's root, where only root makes cgroups: a user who may make cgroups of
# their own (a delegated systemd subtree) cannot make one that reads as a job's.
# v1 (a controller's line): /slurm/uid_<uid>/job_<id>, or /slurm_<node>/... for several slurmd on a host.
SLURM_V1_RE = re.compile(r'^/slurm(?:_[^/]+)?/uid_[0-9]+/job_([0-9]+)(?:/|$)')
# v2 (the 0:: line): slurmstepd.scope in system.slice (or at the root), <node>_slurmstepd.scope for several.
SLURM_V2_RE = re.compile(r'^(?:/system\.slice)?/(?:[^/]+_)?slurmstepd\.scope/job_([0-9]+)(?:/|$)')
JOB_ID_RE = re.compile(r'^[0-9]{1,12}\Z')
# What scontrol listpids says (exit 1) on a node where no job runs a step.
NO_STEPS = 'No job steps exist on this node'
# The most a read of scontrol listpids may take, and how much of its output is read.
LISTPIDS_TIMEOUT_S = 2.0
MPS_DAEMONS = frozenset(('nvidia-cuda-mps-server', 'nvidia-cuda-mps-control'))

# Why a holder is left alone for a job (other_jobs[].why).
ANOTHER_JOB = 'another_job'
NOT_THIS_JOB = 'not_this_job'
MPS_IN_USE = 'mps_in_use'
JOBS_UNKNOWN = 'jobs_unknown'


def job_of_cgroups(text):
    """The Slurm job id named by the lines of a /proc/PID/cgroup, or None."""
    for line in text.splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        match = (SLURM_V2_RE if parts[0] == '0' and parts[1] == '' else SLURM_V1_RE).match(parts[2])
        if match:
            return match.group(1)
    return None


def read_job(pid, proc='/proc'):
    """The Slurm job id of pid's cgroup, or None (no job, or pid is gone)."""
    try:
        with open(os.path.join(proc, str(pid), 'cgroup')) as handle:
            return job_of_cgroups(handle.read(65536))
    except (IOError, OSError):
        return None


KEYS = ('id', 'uid', 'shared_gpus', 'live_jobs', 'scontrol')


def check_job(job):
    """job (the release option) checked and normalised; GpuopsError naming what is wrong."""
    if job is None:
        return None
    if not isinstance(job, dict):
        raise GpuopsError('job must be a mapping (id, uid, shared_gpus, live_jobs), got %r' % (job,))
    unknown = sorted(set(job) - set(KEYS))
    if unknown:
        raise GpuopsError('job: unknown key(s) %s (known: %s)' % (', '.join(unknown), ', '.join(KEYS)))
    job_id = _job_id(job.get('id'), 'job.id')
    uid = job.get('uid')
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or uid < 0):
        raise GpuopsError('job.uid must be a user id (a whole number, 0 or more), got %r' % (uid,))
    shared = job.get('shared_gpus') or []
    if not isinstance(shared, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in shared):
        raise GpuopsError('job.shared_gpus must be a list of GPU indexes, got %r' % (shared,))
    live = job.get('live_jobs')
    if live is not None:
        if not isinstance(live, dict):
            raise GpuopsError('job.live_jobs must map job ids to the pids slurmd lists for them, got %r' % (live,))
        live = dict((_job_id(key, 'job.live_jobs'), _pids(pids, key)) for key, pids in live.items())
    scontrol = job.get('scontrol')
    if scontrol is not None and (not isinstance(scontrol, str) or not scontrol.strip() or '\0' in scontrol):
        raise GpuopsError('job.scontrol must be the scontrol program (a name or a path), got %r' % (scontrol,))
    return {'id': job_id, 'uid': uid, 'shared_gpus': sorted(set(shared)), 'live_jobs': live, 'scontrol': scontrol}


def parse_listpids(text):
    """{job id: [pids]} of scontrol listpids' table (PID JOBID STEPID LOCALID GLOBALID); lines
    that are not a pid and a job id are left out."""
    jobs = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and JOB_ID_RE.match(parts[1]) and int(parts[0]) > 1:
            jobs.setdefault(parts[1], []).append(int(parts[0]))
    return jobs


def read_listpids(scontrol, timeout):
    """({job id: [pids]}, None) of the jobs slurmd runs on this node (scontrol listpids), or
    (None, why not)."""
    try:
        rc, stdout, stderr = Runner(scontrol, timeout).run(['listpids'])
    except GpuopsError as exc:
        return None, printable(str(exc), 200)
    if rc != 0 and NO_STEPS in (stderr or ''):
        return {}, None
    if rc != 0:
        return None, printable((stderr or '').strip() or 'rc %s' % rc, 200)
    return parse_listpids(stdout), None


def _job_id(value, what):
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not JOB_ID_RE.match(text):
        raise GpuopsError('%s must be a Slurm job id (digits), got %r' % (what, printable(str(value), 40)))
    return text


def _pids(pids, key):
    if not isinstance(pids, list) or any(isinstance(p, bool) or not isinstance(p, int) or p <= 1 for p in pids):
        raise GpuopsError('job.live_jobs[%s] must be a list of pids, got %r' % (printable(str(key), 40), pids))
    return set(pids)


class JobScope:
    """The job a release runs for (the checked job option), and the jobs still on the node.

    live_jobs None: which jobs are still on the node is not known. scontrol: where slurmd's list
    is read again (refresh); None: live_jobs as given is all there is."""

    def __init__(self, job, proc='/proc', own=()):
        self.id = job['id']
        self.uid = job['uid']
        self.shared = set(job['shared_gpus'])
        self.scontrol = job.get('scontrol')
        self.proc = proc
        self.own = set(own)  # the release and its ancestors: never a job's process
        self.ever_listed = False  # whether slurmd's list was ever known to this release
        self._list(job['live_jobs'])

    def _list(self, live):
        self.ever_listed = self.ever_listed or live is not None
        self.live = live
        self.listed = {}
        for job_id, pids in (live or {}).items():
            for pid in pids:
                self.listed.setdefault(pid, job_id)

    def refresh(self, timeout=LISTPIDS_TIMEOUT_S):
        """Read slurmd's list of the jobs' pids again (with scontrol); None, or why it could not be
        read, when the list is then unknown (no pid counts as listed under any job). A list that was
        never known (live_jobs None) is only read again: its failure changes nothing."""
        if not self.scontrol:
            return None
        live, problem = read_listpids(self.scontrol, timeout)
        if live is None and not self.ever_listed:
            return None
        self._list(live)
        return problem

    def job_of(self, pid):
        """The job pid belongs to, or None: its cgroup's, else that of the first of it and its
        ancestors that slurmd lists (a process forked from a job's task)."""
        if pid is None:
            return None
        found = read_job(pid, self.proc)
        if found is not None or not self.listed:
            return found
        seen = set()
        while pid and pid not in seen and pid not in self.own:
            if pid in self.listed:
                return self.listed[pid]
            seen.add(pid)
            info = read_process(pid, self.proc)
            pid = info.ppid if info else None
        return None

    def is_other(self, job_id):
        """Whether job_id (a cgroup's or slurmd's) is a job other than this one."""
        return job_id is not None and job_id != self.id

    def is_own(self, holder, job_id):
        """Whether holder (of job job_id, a cgroup's or slurmd's) is this job's process."""
        return job_id == self.id or self._orphan_of_the_job(holder, job_id)

    def _orphan_of_the_job(self, holder, job_id):
        """Whether a process of no job's cgroup is the job's own (its cgroup gone): of the job's
        user, and in no live job, which only slurmd's list of the jobs' pids can tell."""
        return job_id is None and self.uid is not None and holder.uid == self.uid and self.live is not None

    def why_left_alone(self, holder, job_id, held, busy):
        """Why the job's release leaves holder alone (ANOTHER_JOB, NOT_THIS_JOB, MPS_IN_USE), or
        None when it may be signalled. held: the indexes of the GPUs in scope it holds; busy: the
        indexes of the shared GPUs another live job's process is on."""
        if self.is_other(job_id):
            return ANOTHER_JOB
        if not held or not set(held) <= self.shared:
            return None  # it holds a GPU of this job alone: as without jobs
        if job_id != self.id and not self._orphan_of_the_job(holder, job_id):
            return NOT_THIS_JOB
        if holder.exe_name in MPS_DAEMONS and set(held) & busy and runs_root_owned_program(holder.pid, self.proc):
            return MPS_IN_USE
        return None
