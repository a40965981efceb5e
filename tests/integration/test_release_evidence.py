# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Evidence read at the moment of the act: what a tenant with a job on the node gets through when
the release decides on what it read earlier.

Each test runs in a private PID namespace (see test_release_adversarial.py); the tenant's own
processes run as user nobody where the case allows it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import subprocess
import threading

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._release import holders as _holders
from gpusim.cgroups import available, enter, job_cgroup
from gpusim.state import is_alive as alive
from integration import test_release_adversarial as adversarial
from integration.test_release_adversarial import release, start
from processes import await_ready, gone, in_private_pid_namespace

# The simulated host every user can reach (its device nodes 0666), for the tenants run as nobody.
public_host = adversarial.public_host

cgroups_v1 = pytest.mark.skipif(available(1) is not None, reason='job cgroups v1: %s' % available(1))


def nobody():
    return pwd.getpwnam('nobody').pw_uid


def job(job_id, uid=None, live=None, scontrol=None):
    return {'id': str(job_id), 'uid': uid, 'shared_gpus': [], 'live_jobs': live, 'scontrol': scontrol}


def later(seconds, action):
    """action() run seconds from now, in a thread; its result in the returned list once it ran."""
    done = []
    timer = threading.Timer(seconds, lambda: done.append(action()))
    timer.start()
    return timer, done


# -- a job Slurm starts while another job's Epilog runs ----------------------------------------------

@in_private_pid_namespace
@cgroups_v1
def test_a_job_slurm_starts_during_the_epilog_is_never_signalled_though_no_list_names_it(gpuhost):
    # The ending job's leftover ignores TERM and stretches the Epilog. Meanwhile Slurm starts job 43,
    # whose NVML client (nvidia-smi, gpustat) opens every GPU's node (no ConstrainDevices), GPU 1
    # among them, and allocates nothing: the driver places it on no GPU. slurmd's list was read when
    # the Epilog began: job 43 is on no list.
    leftover = gpuhost.hold(gpus=[1], mib=500, cgroup=job_cgroup(5), ignore_term=True)
    timer, started = later(0.5, lambda: gpuhost.hold(gpus=[], open_gpus=[0, 1], cgroup=job_cgroup(43)))
    try:
        result = release(gpuhost, job=job(5, live={'5': [leftover['pid']]}), gpus=[1], grace_period=2, timeout=10)
    finally:
        timer.join()
    newcomer = started[0]
    assert gone(leftover['pid'])
    assert alive(newcomer['pid'])
    assert [entry['pid'] for entry in result.signalled] == [leftover['pid']]
    assert (newcomer['pid'], '43', 'another_job') in [(entry['pid'], entry['job_id'], entry['why'])
                                                      for entry in result.other_jobs], result.other_jobs


def fake_scontrol(tmp_path):
    """An scontrol whose listpids prints the file it returns (the test writes slurmd's answer there)."""
    listing = tmp_path / 'listpids'
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!/bin/sh\n[ "$1" = listpids ] && exec cat %s\nexit 1\n' % listing)
    scontrol.chmod(0o755)
    return str(scontrol), listing


def listpids(listing, jobs):
    listing.write_text('PID JOBID STEPID LOCALID GLOBALID\n' + ''.join(
        '%d %s 0 0 0\n' % (pid, job_id) for job_id, pids in jobs.items() for pid in pids))


@in_private_pid_namespace
def test_without_cgroups_slurmds_list_is_read_again_before_the_signals(gpuhost, tmp_path):
    # A node that tracks jobs without cgroups: only slurmd's list says whose a process is. Job 43's
    # process, of the same user as the ending job, starts after the list was first read.
    scontrol, listing = fake_scontrol(tmp_path)
    leftover = gpuhost.hold(gpus=[1], mib=500, ignore_term=True)
    listpids(listing, {'5': [leftover['pid']]})

    def start_job_43():
        newcomer = gpuhost.hold(gpus=[], open_gpus=[0, 1])
        listpids(listing, {'5': [leftover['pid']], '43': [newcomer['pid']]})
        return newcomer

    timer, started = later(0.5, start_job_43)
    try:
        result = release(gpuhost, job=job(5, uid=os.getuid(), live={'5': [leftover['pid']]}, scontrol=scontrol),
                         gpus=[1], grace_period=2, timeout=10)
    finally:
        timer.join()
    newcomer = started[0]
    assert gone(leftover['pid'])
    assert alive(newcomer['pid']), result.signalled
    assert [entry['pid'] for entry in result.signalled] == [leftover['pid']]
    assert (newcomer['pid'], '43') in [(entry['pid'], entry['job_id']) for entry in result.other_jobs]


@in_private_pid_namespace
def test_when_slurmds_list_cannot_be_read_again_no_other_users_process_of_no_job_is_signalled(public_host, tmp_path):
    scontrol, listing = fake_scontrol(tmp_path)
    stray = start(['bash', '-c', 'exec 3<>"$1"; echo ready; exec sleep 120', '-', public_host.dev_path(1)], user=nobody())
    # listing never written: every read of slurmd's list fails.
    result = release(public_host, job=job(5, uid=4242, live={}, scontrol=scontrol), gpus=[1], timeout=3)
    assert stray.poll() is None and result.signalled == []
    assert result.released is False
    assert (stray.pid, 'jobs_unknown') in [(entry['pid'], entry['why']) for entry in result.other_jobs]
    assert any('scontrol listpids could not be read again' in warning for warning in result.warnings)


# -- a leftover that moves its descriptor past what is read of a process ----------------------------

HIGH_FD = r'''
import os, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
null = os.open(os.devnull, os.O_RDONLY)
kept = [os.dup(null) for dummy in range(1100)]
node = os.open(sys.argv[1], os.O_RDWR)
os.dup2(node, 5000)
os.close(node)
print('ready', flush=True)
time.sleep(120)
'''


def high_fd_holder(path, cgroup=None, host=None):
    """A process of user nobody holding path at descriptor 5000, behind 1,100 others; in cgroup."""
    def become():
        if cgroup is not None:
            enter(host.paths, cgroup)
        os.setgid(nobody())
        os.setuid(nobody())
    # The system's Python: the tests' own environment may be out of nobody's reach.
    proc = subprocess.Popen(['/usr/bin/python3', '-c', HIGH_FD, path], stdout=subprocess.PIPE, process_group=0,
                            preexec_fn=become)
    await_ready(proc, 'a holder at descriptor 5000')
    return proc


@pytest.fixture
def no_spare_descriptors(monkeypatch):
    """Each process read up to its own bound alone, as when a flood has used the scan's spare pool."""
    monkeypatch.setattr(_holders, 'SPARE_DESCRIPTORS', 0)


@in_private_pid_namespace
def test_a_descriptor_past_the_bound_is_found_through_the_spare_pool(public_host):
    hidden = high_fd_holder(public_host.dev_path(0))
    result = release(public_host, gpus=[0], timeout=5)
    assert gone(hidden.pid)
    assert [entry['pid'] for entry in result.signalled] == [hidden.pid] and result.unreadable == []
    assert result.released is True, result.failure


@in_private_pid_namespace
@cgroups_v1
def test_a_jobs_leftover_that_hides_its_descriptor_past_the_bound_is_released(public_host, no_spare_descriptors):
    hidden = high_fd_holder(public_host.dev_path(0), job_cgroup(5, uid=nobody()), public_host)
    result = release(public_host, job=job(5, uid=nobody(), live={}), gpus=[0], timeout=5)
    assert gone(hidden.pid)
    assert [entry['pid'] for entry in result.signalled] == [hidden.pid]
    assert result.released is True, result.failure


@in_private_pid_namespace
def test_a_process_read_in_part_that_may_hold_the_gpu_keeps_it_from_being_called_released(
        public_host, no_spare_descriptors):
    hidden = high_fd_holder(public_host.dev_path(0))
    result = release(public_host, job=job(5, uid=4242, live={}), gpus=[0], timeout=5)
    assert hidden.poll() is None and result.signalled == []
    assert result.released is False
    assert [(entry['pid'], entry['why']) for entry in result.unreadable] == [(hidden.pid, 'too_many_descriptors')]
    assert 'pid %d (user nobody' % hidden.pid in result.failure and 'may hold a GPU in scope' in result.failure
    # Waiting cannot help: the release ends at once.
    assert result.elapsed_s < 4
