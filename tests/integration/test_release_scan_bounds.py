# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""No tenant can stall the release: crowds of user nobody that the scan of /proc must get through
within the timeout, beside one job on GPU 0 that TERM frees. Each test runs in a private PID
namespace of its own (see test_release_adversarial.py), so /proc holds only its crowd, and
everything the test started ends with it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pwd
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import DESCRIPTORS_READ_AT_MOST
from crowd import Crowd
from gpusim.state import is_alive as alive
from integration.test_release_adversarial import in_private_pid_namespace, release

# 10,000 processes of its own, which every other test's scan of /proc would meet (the private PID
# namespace hides none of them from the machine's /proc), and a bound on the release's time that
# a busy machine would eat into: scripts/test.sh runs these tests after the others, one at a time.
pytestmark = pytest.mark.alone

# A scan of 10,000 processes takes about 0.5 s on a quiet 2-core machine and several seconds on a
# loaded one: the timeout leaves room for both (benchmarks/scan.py measures the scan itself).
TIMEOUT = 10
# What the deadline logic bounds: the release ends by its timeout, and this much more is for the
# work after it (the lock, the result); a loaded machine makes the release slower, never later.
AFTER_THE_DEADLINE_S = 1.0


@pytest.fixture
def nobody_crowd():
    with Crowd(pwd.getpwnam('nobody').pw_uid) as crowd:
        yield crowd


def release_one_job(gpuhost):
    job = gpuhost.hold(gpus=[0], mib=4000)
    started = time.monotonic()
    result = release(gpuhost, timeout=TIMEOUT, grace_period=1)
    return job, result, time.monotonic() - started


# The settle window counts from the job's exit, not from the scan that saw it.
@in_private_pid_namespace
def test_ten_thousand_processes_do_not_keep_a_freed_gpu_from_being_released(gpuhost, nobody_crowd):
    nobody_crowd.start_sleepers(10000)
    job, result, took = release_one_job(gpuhost)
    assert result.released is True, result.failure
    assert [entry['pid'] for entry in result.signalled] == [job['pid']] and not alive(job['pid'])
    assert result.unreadable == []
    assert took < TIMEOUT + AFTER_THE_DEADLINE_S, took


@in_private_pid_namespace
def test_ten_thousand_processes_and_a_job_that_ignores_term_are_released(gpuhost, nobody_crowd):
    # The first scan reads every process; the rescans while the job is signalled and after it exits
    # read only what changed (benchmarks/scan.py prints both), so the KILL and the settle window fit.
    nobody_crowd.start_sleepers(10000)
    job = gpuhost.hold(gpus=[0], mib=4000, ignore_term=True)
    started = time.monotonic()
    result = release(gpuhost, timeout=TIMEOUT, grace_period=0.5)
    took = time.monotonic() - started
    assert result.released is True, result.failure
    assert [entry['signals_sent'] for entry in result.signalled] == [['TERM', 'KILL']] and not alive(job['pid'])
    assert took < TIMEOUT + AFTER_THE_DEADLINE_S, took


@in_private_pid_namespace
def test_fifty_tenants_of_twenty_thousand_descriptors_are_named_not_waited_for(gpuhost, nobody_crowd):
    nobody_crowd.start_tenants(50, 20000)
    job, result, took = release_one_job(gpuhost)
    # What their descriptors past the bound hold is not known: the GPUs are not called released,
    # and none of them is signalled (no job says they are the release's to stop).
    assert result.released is False
    assert 'could not all be read: it may hold a GPU in scope' in result.failure, result.failure
    assert [entry['pid'] for entry in result.signalled] == [job['pid']] and not alive(job['pid'])
    # The scan's spare pool (SPARE_DESCRIPTORS) reads the first few of them whole; the others are named.
    tenants = sorted(proc.pid for proc in nobody_crowd.starters)
    unread = [entry['pid'] for entry in result.unreadable]
    assert set(unread) <= set(tenants) and len(unread) >= 40, (unread, tenants)
    assert set((entry['user'], entry['why']) for entry in result.unreadable) == set([('nobody', 'too_many_descriptors')])
    assert any('%d process(es) were read only in part (more than %d descriptors' % (len(unread), DESCRIPTORS_READ_AT_MOST)
               in warning for warning in result.warnings), result.warnings
    assert took < TIMEOUT + AFTER_THE_DEADLINE_S, took
