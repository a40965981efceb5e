# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A site's own Prolog and Epilog kept beside the hook (the role's slurm_hooks_site_prolog and
slurm_hooks_site_epilog, run by chain.sh), under real Slurm daemons: the site's scripts run after
the GPU reset, with what slurmd gave them, and a failure of either fails the hook as Slurm
expects (the node drained, the batch job requeued held)."""

import os
import re
import shutil
import tempfile
import time

import pytest

from conftest import PROLOG_EPILOG_TIMEOUT
from gpusim.state import is_alive as alive

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

# A site's Prolog or Epilog: it writes down the job, its environment and working directory, and
# exits with the status in the file STATUS (0 when there is none).
SITE_SCRIPT = '''#!/bin/sh
{
  echo "job=${SLURM_JOB_ID:-} pwd=$(pwd)"
  echo "PYTHONPATH=${PYTHONPATH-unset} ANSIBLE_COLLECTIONS_PATH=${ANSIBLE_COLLECTIONS_PATH-unset}"
} >> %(record)s
exit "$(cat %(status)s 2>/dev/null || echo 0)"
'''


@pytest.fixture(scope='module')
def site():
    """The site's Prolog and Epilog, in a directory of their own."""
    directory = tempfile.mkdtemp(prefix='gpuops-site-')
    scripts = {}
    for mode in ('prolog', 'epilog'):
        scripts[mode] = os.path.join(directory, 'site-%s' % mode)
        with open(scripts[mode], 'w') as handle:
            handle.write(SITE_SCRIPT % {'record': scripts[mode] + '.record', 'status': scripts[mode] + '.status'})
        os.chmod(scripts[mode], 0o755)
    yield scripts
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope='module')
def hook_role_vars(site):
    return {'slurm_hooks_health_check': False, 'slurm_hooks_site_prolog': site['prolog'],
            'slurm_hooks_site_epilog': site['epilog']}


@pytest.fixture
def chained(node, site):
    """The node, the site's scripts succeeding and their records empty."""
    for script in site.values():
        for suffix in ('.record', '.status'):
            if os.path.exists(script + suffix):
                os.unlink(script + suffix)
    return node


def site_run(cluster, mode, job, seconds=PROLOG_EPILOG_TIMEOUT + 10):
    """The site script's status for job, as chain.sh logs it once it has run."""
    pattern = re.compile(r'^=== %s job %s: site %s (\S+) exit (\d+)$' % (mode, job, mode), re.M)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        with open(cluster.log, errors='replace') as handle:
            found = pattern.search(handle.read())
        if found:
            return found.group(1), int(found.group(2))
        time.sleep(0.1)
    raise AssertionError('no site %s for job %s within %s s:\n%s' % (mode, job, seconds, cluster.bench.logs()))


def records(script):
    with open(script + '.record') as handle:
        return handle.read().splitlines()


def log_lines(cluster):
    with open(cluster.log, errors='replace') as handle:
        return handle.read().splitlines()


def test_the_role_names_the_site_scripts_in_the_hook_settings(chained, site):
    assert "GPU_RESET_SITE_PROLOG=%s\n" % site['prolog'] in chained.conf_text
    assert "GPU_RESET_SITE_EPILOG=%s\n" % site['epilog'] in chained.conf_text


def test_the_site_prolog_and_epilog_run_after_the_gpu_reset(chained, site):
    """A holder Slurm does not know of sits on GPU 2: the job starts after the hook stopped it and
    the site's Prolog ran, in slurmd's environment (not the hook's); the site's Epilog runs after
    the hook's Epilog."""
    leftover = chained.host.hold(gpus=[2], mib=4096)
    job = chained.bench.sbatch('--gres=gpu:8', '--output', chained.path('chain.out'), '--wrap', 'true')
    chained.bench.wait_job(job, 'COMPLETED', 2 * PROLOG_EPILOG_TIMEOUT)
    prolog = chained.wait_run('prolog', job)
    assert (prolog.exit, prolog.hook_exit) == (0, 0), prolog
    assert [p['pid'] for p in prolog.report['signalled']] == [leftover['pid']]
    assert site_run(chained, 'prolog', job) == (site['prolog'], 0)
    assert site_run(chained, 'epilog', job) == (site['epilog'], 0)
    lines = log_lines(chained)
    for mode in ('prolog', 'epilog'):
        hook_end = lines.index('=== %s job %s: hook exit 0' % (mode, job))
        assert lines.index('=== %s job %s: site %s %s exit 0' % (mode, job, mode, site[mode])) > hook_end
        ran = records(site[mode])
        assert ran[0].startswith('job=%s pwd=' % job), ran
        # Not the hook's settings: the collection's paths stay the hook's own.
        assert ran[1] == 'PYTHONPATH=unset ANSIBLE_COLLECTIONS_PATH=unset', ran
    assert chained.bench.node_state() == 'idle'


def test_a_failing_site_prolog_drains_the_node_and_requeues_the_job(chained, site):
    """The GPUs are clean, the site's Prolog fails: the hook exits with the site's status, Slurm
    drains the node with its own reason and requeues the batch job held; the site's Epilog runs
    too."""
    with open(site['prolog'] + '.status', 'w') as handle:
        handle.write('7\n')
    job = chained.bench.sbatch('--gres=gpu:2', '--output', chained.path('failing.out'), '--wrap', 'true')
    prolog = chained.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.exit, prolog.hook_exit) == (0, 0), prolog
    assert site_run(chained, 'prolog', job) == (site['prolog'], 7)
    info = chained.bench.wait_job(job, 'PENDING', PROLOG_EPILOG_TIMEOUT + 10)
    assert info['Reason'] == 'launch_failed_requeued_held', (info['JobState'], info['Reason'])
    chained.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    assert chained.bench.reason().startswith('Prolog error'), chained.bench.reason()
    assert not os.path.exists(chained.path('failing.out'))


def test_a_failing_gpu_reset_still_runs_the_site_epilog_and_drains_with_its_reason(chained, site):
    """Orphaned memory on GPU 3: the hook's Prolog and Epilog fail and drain the node with the
    GPU's reason; the site's Prolog and Epilog still run (a site's cleanup is never skipped) and
    succeed, and the hook's status is the one slurmd gets."""
    chained.host.fault('stuck', gpu=3, mib=4096)
    holder = chained.host.hold(gpus=[1], mib=1024)
    job = chained.bench.sbatch('--gres=gpu:8', '--output', chained.path('orphan.out'), '--wrap', 'true')
    prolog = chained.wait_run('prolog', job, PROLOG_EPILOG_TIMEOUT + 10)
    assert (prolog.exit, prolog.hook_exit) == (10, 1), prolog
    assert site_run(chained, 'prolog', job) == (site['prolog'], 0)
    assert site_run(chained, 'epilog', job) == (site['epilog'], 0)
    assert chained.bench.wait_job(job, 'PENDING', PROLOG_EPILOG_TIMEOUT + 10)['Reason'] == 'launch_failed_requeued_held'
    chained.bench.wait_state(lambda state: state.startswith('drain'), 30, 'the node to drain')
    reason = chained.bench.reason()
    assert reason.startswith('gpu_reset: GPU 3: 4096 MiB held with no process left'), reason
    assert not alive(holder['pid'])
