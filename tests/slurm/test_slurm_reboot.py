# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A fault only a reboot cures, with GPU_RESET_REBOOT=asap, run by real Slurm daemons: the hook
drains the node for its reboot, collects nvidia-bug-report.sh outside the Prolog's time, then asks
Slurm for the reboot instead of a plain drain. A cluster of its own, without the health check,
so that no health check runs beside the Prolog it reads."""

import os
import time

import pytest

from conftest import PROLOG_EPILOG_TIMEOUT

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')


def test_a_gpu_only_a_reboot_cures_asks_slurm_for_a_reboot(node):
    """GPU 2 is lost ("Reboot the system to recover this GPU") and the hook may ask for a reboot
    (GPU_RESET_REBOOT=asap): the Prolog asks Slurm for one instead of a plain drain, and Slurm runs
    its RebootProgram (which only writes down that it was called) once the node is idle. The only
    test of its cluster: the node then waits for a reboot that never comes."""
    stamp = node.path('reboot-requested')
    node.set_conf(reboot='asap', reboot_stamp=stamp)
    node.host.fault('lost', gpu=2, message='lost')
    job = node.bench.sbatch('--gres=gpu:8', '--output', node.path('lost.out'), '--wrap', 'true')
    prolog = node.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.exit, prolog.hook_exit) == (10, 1), prolog
    assert prolog.report['reboot_requested'] is True, prolog.report['reason']
    assert os.path.exists(stamp)
    reboots = node.path('reboots')
    until = time.monotonic() + 120
    while not os.path.exists(reboots) and time.monotonic() < until:
        time.sleep(0.5)
    assert os.path.exists(reboots), (node.bench.node_info(), node.bench.logs())
    info = node.bench.node_info()
    assert info['Reason'].startswith('gpu_reset: GPU 2 lost or unreadable'), info
    # The report collected first, outside the Prolog's time, is named in the reason.
    reports = os.path.join(node.host.root, 'var', 'lib', 'gpuops', 'bug-reports')
    [report] = os.listdir(reports)
    assert '; evidence: %s' % os.path.join(reports, report) in info['Reason'], info
    assert 'REBOOT' in info['State'], info
