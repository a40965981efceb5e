# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A job's Prolog or Epilog (plugin_utils/_hook/job.py): the job's GPUs as Slurm gives them
(SLURM_JOB_GPUS through gres.conf, or the MIG instances of CUDA_VISIBLE_DEVICES), the GPUs it
shares with other jobs and the jobs still on the node, run against simulated hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import job as _hook_job
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_reason
from gpusim.state import is_alive as alive
from processes import gone
from slurm_texts import identity_gres_conf


def test_only_the_jobs_gpus_are_released(gpuhost, hook):
    job = gpuhost.hold(gpus=[1], mib=2048)
    other = gpuhost.hold(gpus=[2], mib=2048)
    rc, report, drained = hook('--gpus', '0,1', '--timeout', '5')
    assert (rc, report['outcome'], drained) == (0, 'released', None)
    assert [p['pid'] for p in report['signalled']] == [job['pid']]
    assert gone(job['pid'])
    assert alive(other['pid'])


def test_the_jobs_gpus_are_found_by_their_device_nodes_whatever_the_order_of_gres_conf(gpuhost, hook, tmp_path):
    """Slurm's GPU 0 is gres.conf's first device node, nvidia3; on this host that is minor 3, the
    GPU of index 7. Only its holder is stopped: not the one on GPU 0 (Slurm's number taken for an
    index), nor the one on GPU 3 (the number in the node's name taken for an index)."""
    gpuhost.init(minors=[4, 5, 6, 7, 0, 1, 2, 3])
    (tmp_path / 'gres.conf').write_text('# out of order\nName=gpu Type=h200 File=%s/dev/nvidia[3,1,0,2,7,6,5,4] '
                                        'Cores=0-1\n' % gpuhost.root)
    job = gpuhost.hold(gpus=[7], mib=2048)
    by_number = gpuhost.hold(gpus=[0], mib=1024)
    by_name = gpuhost.hold(gpus=[3], mib=1024)
    rc, report, drained = hook('--gpus', '0', '--timeout', '5')
    assert (rc, report['outcome'], drained) == (0, 'released', None), report
    assert [p['pid'] for p in report['signalled']] == [job['pid']]
    assert [gpu['index'] for gpu in report['probe']['gpus']] == [7]
    assert gone(job['pid'])
    assert alive(by_number['pid']) and alive(by_name['pid'])


@pytest.mark.parametrize('gres, message', [
    (None, 'cannot read {tmp}/gres.conf (No such file or directory)'),
    ('AutoDetect=nvml\n', 'gres.conf line 1: AutoDetect=nvml, so Slurm orders the GPUs itself'),
    ('Name=gpu File={root}/dev/nvidia[0-1]\n', 'Slurm gave the job GPU 2, but {tmp}/gres.conf lists 2 GPUs for gpu07'),
    ('Name=gpu File={root}/dev/nvidia[0-1],{root}/dev/nvidia-uvm\n', "gres.conf's {root}/dev/nvidia-uvm is not a GPU"),
])
def test_a_job_gpu_that_cannot_be_told_drains_naming_why_and_releases_nothing(gpuhost, hook, tmp_path, gres, message):
    if gres is None:
        (tmp_path / 'gres.conf').unlink()
    else:
        (tmp_path / 'gres.conf').write_text(gres.format(root=gpuhost.root))
    holder = gpuhost.hold(gpus=[2], mib=1024)
    rc, report, drained = hook('--gpus', '2', '--timeout', '5')
    assert rc == _hook_status.RUNNER_DRAINED
    assert report['reason'].startswith('SLURM_JOB_GPUS=2: ' + message.format(
        root=gpuhost.root, tmp=tmp_path)), report['reason']
    assert (report['signalled'], report['steps']) == ([], [])
    assert drained[-1] == 'reason=' + drain_reason(report['reason'])
    assert alive(holder['pid'])


@pytest.mark.parametrize('text, indexes', [('0', [0]), ('0,1,5', [0, 1, 5]), ('0-3,6', [0, 1, 2, 3, 6]), (' 2 , 4 ', [2, 4])])
def test_the_jobs_gpus_as_slurm_gives_them(text, indexes):
    assert _hook_job.gpu_list(text) == indexes


@pytest.mark.parametrize('text, indexes', [('0-2,1,2', [0, 1, 2]), ('63', [63]), ('0-63', list(range(64)))])
def test_the_jobs_gpus_are_each_named_once(text, indexes):
    assert _hook_job.gpu_list(text) == indexes


@pytest.mark.parametrize('text, message', [
    ('0-2000000', r'SLURM_JOB_GPUS: GPU 2000000 is past the 64 GPUs a node can have \(indexes 0-63\)'),
    ('64', r'GPU 64 is past the 64 GPUs'),
    ('3-1', r'SLURM_JOB_GPUS: the range 3-1 ends before it starts'),
    ('0,1]}, "gpu_reset_drain_command": ["/bin/sh", "-c", "id"], "x": [1',
     r"SLURM_JOB_GPUS: '1]}' is not a GPU index or a range of them \(such as 0,1,5 or 0-3,6\)"),
    ('', r"SLURM_JOB_GPUS: '' is not a GPU index"),
    ('0,,1', r"SLURM_JOB_GPUS: '' is not a GPU index"),
    ('-1', r"SLURM_JOB_GPUS: '-1' is not a GPU index"),
    ('\u0663', r"SLURM_JOB_GPUS: '\u0663' is not a GPU index"),
    ('gpu0\x1b[2J', r"SLURM_JOB_GPUS: 'gpu0\\x1b\[2J' is not a GPU index"),
    ('9' * 5000, r"SLURM_JOB_GPUS: '9{40}\.\.\.\(4960 more characters\)' is not a GPU index"),
])
def test_garbage_in_the_jobs_gpus_is_refused_naming_it(text, message):
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        _hook_job.gpu_list(text)
    assert time.monotonic() - started < 5  # refused at once, not after expanding or backtracking over it


# -- GPUs shared between jobs, and the jobs on the node --------------------------------------------

@pytest.fixture
def shard_node(gpuhost, tmp_path):
    """run(job, *args) -> (exit status, report, drains): the runner in job's Epilog on a node whose GPU 0
    gres/shard shares, with an scontrol that lists the pids of the jobs it is told of (listpids) and
    writes down every other call."""
    listed = tmp_path / 'listpids.out'
    drains = tmp_path / 'drains.jsonl'
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!%s\nimport json, sys\nif sys.argv[1:] == ["listpids"]:\n'
                        '    sys.stdout.write(open(%r).read())\n    sys.exit(0)\n'
                        'open(%r, "a").write(json.dumps(sys.argv[1:]) + "\\n")\n'
                        % (sys.executable, str(listed), str(drains)))
    scontrol.chmod(0o755)
    gres_conf = tmp_path / 'gres.conf'
    gres_conf.write_text(identity_gres_conf(gpuhost) + 'Name=shard Count=8 File=%s\n' % gpuhost.dev_path(0))
    variables = tmp_path / 'gpu_reset.yml'
    cuda = gpuhost.install_cuda()

    def run(jobs, job_id, *args, **more):
        variables.write_text(yaml.safe_dump(dict({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': cuda,
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}, **more)))
        listed.write_text('PID JOBID STEPID LOCALID GLOBALID\n' + ''.join(
            '%d %s 0 0 0\n' % (pid, job) for job, pids in jobs.items() for pid in pids))
        proc = subprocess.run([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                               '--node', 'gpu07', '--vars-file', str(variables), '--scontrol', str(scontrol),
                               '--gres-conf', str(gres_conf)] + list(args),
                              env=dict(os.environ, SLURM_JOB_ID=job_id, SLURM_JOB_UID=str(os.getuid())),
                              capture_output=True, text=True, timeout=60, check=False)
        report = json.loads(proc.stdout) if proc.stdout.strip() else None
        calls = [json.loads(line) for line in drains.read_text().splitlines()] if drains.exists() else []
        return proc.returncode, report, calls, proc.stderr
    return run


def test_the_epilog_of_a_shard_job_leaves_the_other_job_on_its_gpu_running(gpuhost, shard_node):
    neighbour = gpuhost.hold(gpus=[0], mib=4000)
    mine = gpuhost.hold(gpus=[0], mib=1000)
    rc, report, calls, log = shard_node({'5': [mine['monitor_pid']], '6': [neighbour['monitor_pid']]}, '5',
                                        '--gpus', '0', '--timeout', '5')
    assert (rc, report['outcome'], calls) == (0, 'released', []), (report, log)
    assert gone(mine['pid']) and alive(neighbour['pid'])
    assert [(job['pid'], job['job_id'], job['why']) for job in report['other_jobs']] == \
        [(neighbour['pid'], '6', 'another_job')]
    assert "GPU 0 shared with other jobs (gres.conf): only the job's own processes are released there" in log
    # GPU 0 is shared: it is not probed while another job may use it.
    assert 'probe' not in report


def test_a_shard_job_that_leaves_a_process_behind_drains_naming_it_not_the_neighbour(gpuhost, shard_node):
    neighbour = gpuhost.hold(gpus=[0], mib=4000)
    stuck = gpuhost.hold(gpus=[0], mib=1000, ignore_term=True)
    rc, report, calls, log = shard_node({'5': [stuck['monitor_pid']], '6': [neighbour['monitor_pid']]}, '5',
                                        '--gpus', '0', '--timeout', '3', gpu_reset_signals=['TERM'])
    assert alive(neighbour['pid'])
    assert rc == _hook_status.RUNNER_DRAINED, (report, log)
    assert 'pid %d' % stuck['pid'] in report['reason'] and 'pid %d' % neighbour['pid'] not in report['reason'], \
        report['reason']
    assert len(calls) == 1 and calls[0][:3] == ['update', 'nodename=gpu07', 'state=drain']


@pytest.mark.parametrize('script, jobs', [
    ('echo "PID JOBID STEPID LOCALID GLOBALID"; echo "4021 42 batch 0 0"', {'42': [4021]}),
    # No job runs a step here: slurmd says so with exit status 1.
    ('echo "No job steps exist on this node." >&2; exit 1', {}),
    # slurmd does not answer: which jobs live is not known.
    ('echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1', None),
])
def test_the_jobs_on_the_node_as_slurmd_lists_them(tmp_path, script, jobs):
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!/bin/sh\n%s\n' % script)
    scontrol.chmod(0o755)
    assert _hook_job.live_jobs(str(scontrol), 5) == jobs


# -- a job on a MIG instance --------------------------------------------------------------------

def mig_gres_conf(host, devices):
    """gres.conf as Slurm's AutoDetect=nvml writes a MIG GPU: per instance the GPU's node and the caps
    nodes of its GPU and compute instance."""
    from gpusim.mig import ci_minor, gi_minor
    caps = '%s/dev/nvidia-caps/nvidia-cap%%d' % host.root
    return ''.join('Name=gpu Type=1g.18gb MultipleFiles=%s,%s,%s\n' % (
        host.dev_path(0), caps % gi_minor(0, dev['gi']), caps % ci_minor(0, dev['gi'], dev['ci'])) for dev in devices)


@pytest.mark.parametrize('told_by', ['gres.conf', 'CUDA_VISIBLE_DEVICES'])
def test_the_epilog_of_a_mig_job_frees_its_instance_and_leaves_the_sibling_alone(gpuhost, hook, tmp_path, monkeypatch, told_by):
    devices = gpuhost.mig(0, ['1g.18gb', '1g.18gb'])['instances']
    job = gpuhost.hold(gpus='0', mib=3000, mig=devices[1]['gi'])
    sibling = gpuhost.hold(gpus='0', mib=5000, mig=devices[0]['gi'])
    if told_by == 'gres.conf':
        (tmp_path / 'gres.conf').write_text(mig_gres_conf(gpuhost, devices))
    else:
        # A gres.conf the hook cannot follow: slurmd's CUDA_VISIBLE_DEVICES names the instance.
        (tmp_path / 'gres.conf').write_text('AutoDetect=nvml\n')
        monkeypatch.setenv('CUDA_VISIBLE_DEVICES', devices[1]['uuid'])
    rc, report, drained = hook('--gpus', '1', '--timeout', '8')
    assert (rc, report['outcome'], drained) == (0, 'released', None), report
    assert [p['pid'] for p in report['signalled']] == [job['pid']]
    assert gone(job['pid']) and alive(sibling['pid'])
    assert [gpu['mig_instance']['uuid'] for gpu in report['gpus_after']] == [devices[1]['uuid']]
    # The instance is proven by the release's reading of it; the probe of GPU 0 would meet the sibling.
    assert not (report.get('probe') or {}).get('gpus')


def test_a_mig_job_whose_instance_is_gone_is_a_clear_failure(gpuhost, hook, tmp_path, monkeypatch):
    gpuhost.mig(0, ['1g.18gb'])
    (tmp_path / 'gres.conf').write_text('AutoDetect=nvml\n')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', 'MIG-00000000-0000-0000-0000-000000000000')
    rc, report, drained = hook('--gpus', '0', '--timeout', '5')
    assert rc == _hook_status.RUNNER_DRAINED
    assert 'no MIG instance MIG-00000000-0000-0000-0000-000000000000 on this host' in report['reason'], report['reason']
    assert report['signalled'] == []
