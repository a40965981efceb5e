# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Slurm hook's runner: the gpu_reset role's usual path without ansible-playbook, run against
simulated hosts (the modules run as programs, as the hook runs them)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import (
    _brake,
    _hook_health,
    _hook_job,
    _hook_reset,
    _hook_slurm,
    _hook_status,
    _hook_vars,
    _sequence,
    _slurm_hook,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils import _jobs
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_command, drain_reason
from gpusim.state import is_alive as alive
from processes import gone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def test_settings_are_the_spec_defaults_then_the_file_then_the_hook(tmp_path):
    path = tmp_path / 'vars.yml'
    path.write_text('gpu_reset_grace_period: 2\ngpu_reset_timeout: 99\n')
    settings = _hook_vars.load_settings(str(path), {'gpu_reset_timeout': 7})
    assert settings['gpu_reset_grace_period'] == 2
    assert settings['gpu_reset_timeout'] == 7
    assert settings['gpu_reset_signals'] == ['TERM', 'KILL']


@pytest.mark.parametrize('text', [
    "gpu_reset_clean_query: length(nvidia_gpus) == `8`\n",
    "gpu_reset_drain_command: [/bin/true]\n",
    "gpu_reset_grace_period: '{{ 3 }}'\n",
])
def test_what_only_the_playbook_can_do_sends_the_hook_to_it(tmp_path, text):
    path = tmp_path / 'vars.yml'
    path.write_text(text)
    with pytest.raises(_hook_vars.NeedsPlaybook):
        _hook_vars.load_settings(str(path))
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(path)]) == _hook_status.RUNNER_NEEDS_PLAYBOOK


def identity_gres_conf(host):
    """A gres.conf line for the simulated host's GPUs in the order of their indexes."""
    return 'Name=gpu File=%s\n' % ','.join(host.dev_path(index) for index in range(len(host.memory_used())))


@pytest.fixture
def hook(gpuhost, tmp_path):
    """run(*args) -> (exit status, report, drain command's arguments or None): the runner as the
    hook starts it, on gpuhost, with a drain command that writes down its arguments, and
    tmp_path/gres.conf (the GPUs listed in index order unless a test writes its own)."""
    scontrol = tmp_path / 'scontrol'
    drained = tmp_path / 'drained.json'
    scontrol.write_text('#!%s\nimport json, sys\njson.dump(sys.argv[1:], open(%r, "w"))\n' % (sys.executable, str(drained)))
    scontrol.chmod(0o755)
    variables = tmp_path / 'gpu_reset.yml'
    gres_conf = tmp_path / 'gres.conf'
    gres_conf.write_text(identity_gres_conf(gpuhost))
    cuda = gpuhost.install_cuda()

    def run(*args, **more):
        """more: gpu_reset_* variables over the fixture's own."""
        variables.write_text(yaml.safe_dump(dict({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': cuda,
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}, **more)))
        proc = subprocess.run([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                               '--node', 'gpu07', '--vars-file', str(variables), '--scontrol', str(scontrol),
                               '--gres-conf', str(gres_conf)] + list(args),
                              capture_output=True, text=True, timeout=60, check=False)
        report = json.loads(proc.stdout) if proc.stdout.strip() else None
        return proc.returncode, report, json.loads(drained.read_text()) if drained.exists() else None
    return run


def test_a_clean_host_is_clean_and_nothing_is_drained(hook):
    rc, report, drained = hook('--timeout', '5')
    assert (rc, report['outcome'], report['signalled'], drained) == (0, 'clean', [], None)
    # Proven by allocation, every GPU.
    assert report['probe']['probed'] is True
    assert [(gpu['ok'], gpu['released']) for gpu in report['probe']['gpus']] == [(True, True)] * 8


@pytest.mark.parametrize('fault, reason', [
    (dict(kind='cuda', gpu=2, code='ECC_UNCORRECTABLE'),
     'Prove the GPUs by allocation: the allocation probe failed on 1 of 2 GPUs: GPU 2 (00000000:3A:00.0): '
     'CUDA_ERROR_ECC_UNCORRECTABLE at cuMemcpyDtoH_v2 (uncorrectable ECC error encountered)'),
    (dict(kind='cuda', gpu=1, code='DEVICE_UNAVAILABLE'),
     'Prove the GPUs by allocation: the allocation probe failed on 1 of 2 GPUs: GPU 1 (00000000:2A:00.0): '
     'CUDA_ERROR_DEVICE_UNAVAILABLE at cuCtxCreate_v2 (CUDA-capable device(s) is/are busy or unavailable)'),
    (dict(kind='stuck', gpu=1, mib=143200),
     None),  # orphaned memory: the counters already fail it, before any probe
    (dict(kind='cuda-init', code='CUDA_ERROR_NO_DEVICE'),
     'Prove the GPUs by allocation: the allocation probe failed on 2 of 2 GPUs: GPU 1 (00000000:2A:00.0): '
     'CUDA_ERROR_NO_DEVICE at cuInit (no CUDA-capable device is detected); GPU 2 (00000000:3A:00.0): '
     'CUDA_ERROR_NO_DEVICE at cuInit (no CUDA-capable device is detected)'),
])
def test_a_failed_probe_drains_with_the_cuda_error(gpuhost, hook, fault, reason):
    gpuhost.fault(fault.pop('kind'), **fault)
    rc, report, drained = hook('--gpus', '1,2', '--timeout', '5')
    assert rc == _hook_status.RUNNER_DRAINED and report['outcome'] == 'failed'
    if reason is None:
        assert 'probe' not in report and 'orphaned memory' in report['reason']
    else:
        assert report['reason'] == reason
    assert drained == ['update', 'nodename=gpu07', 'state=drain', 'reason=' + drain_reason(report['reason'])]


def test_a_hung_probe_drains_naming_the_timeout(gpuhost, hook):
    gpuhost.fault('cuda-hang', seconds=300)
    rc, report, drained = hook('--gpus', '0', '--timeout', '5', '--deadline', '8')
    assert rc == _hook_status.RUNNER_DRAINED
    assert 'GPU 0 (00000000:18:00.0): PROBE_TIMEOUT' in report['reason'] and drained


def test_one_hung_gpu_of_eight_is_named_alone_and_the_others_are_proven(gpuhost, hook):
    gpuhost.fault('cuda-hang', gpu=3, seconds=300)
    rc, report, drained = hook('--timeout', '10', '--deadline', '20')
    assert rc == _hook_status.RUNNER_DRAINED and report['outcome'] == 'failed'
    probed = dict((gpu['index'], gpu) for gpu in report['probe']['gpus'])
    assert (probed[3]['ok'], probed[3]['error_name'], probed[3]['call']) == (False, 'PROBE_TIMEOUT', 'cuCtxCreate_v2')
    assert all(probed[index]['ok'] and probed[index]['released'] for index in range(8) if index != 3)
    assert 'GPU 3 (' in report['reason'] and 'failed on 1 of 8 GPUs' in report['reason']
    assert not any('GPU %d (' % index in report['reason'] for index in range(8) if index != 3)
    assert drained == ['update', 'nodename=gpu07', 'state=drain', 'reason=' + drain_reason(report['reason'])]


def test_the_probe_can_be_turned_off(gpuhost, hook):
    gpuhost.fault('cuda', gpu=0, code='ECC_UNCORRECTABLE')
    rc, report, drained = hook('--timeout', '5', gpu_reset_probe=False)
    assert (rc, report['outcome'], drained) == (0, 'clean', None)
    assert 'probe' not in report


def test_a_host_without_libcuda_is_noted_not_drained_unless_asked(hook):
    rc, report, drained = hook('--timeout', '5', gpu_reset_probe_cuda_library='libcuda-absent.so.1')
    assert (rc, report['outcome'], drained) == (0, 'clean', None)
    assert (report['probe']['probed'], report['probe']['library_missing']) == (False, True)
    rc, report, drained = hook('--timeout', '5', gpu_reset_probe_cuda_library='libcuda-absent.so.1',
                               gpu_reset_probe_missing_library='fail')
    assert rc == _hook_status.RUNNER_DRAINED
    assert 'libcuda-absent.so.1 cannot be loaded' in report['reason']


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


def test_orphaned_memory_fails_and_drains_with_the_reason(gpuhost, hook):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, drained = hook('--timeout', '3')
    assert rc == _hook_status.RUNNER_DRAINED
    assert report['outcome'] == 'failed' and report['drained'] is True
    # gpuhost's idle GPUs read 1 MiB.
    assert report['reason'].startswith('GPU 3: 4097 MiB held with no process left (orphaned memory')
    assert drained == ['update', 'nodename=gpu07', 'state=drain', 'reason=' + drain_reason(report['reason'])]


def test_a_misconfigured_hook_drains_with_the_reason(hook):
    """Unlike the role in a fleet run: a failed Prolog drains the node anyway, so with the reason."""
    rc, report, drained = hook('--timeout', '0')
    assert rc == _hook_status.RUNNER_DRAINED
    assert report['reason'].startswith('gpu_reset is misconfigured: gpu_reset_timeout must be more than 0')
    assert report['signalled'] == [] and report['gpus_before'] == []
    assert drained[-1] == 'reason=' + drain_reason(report['reason'])


@pytest.mark.parametrize('setting, words', [
    (dict(gpu_reset_probe_mib=0), 'gpu_reset_probe_mib must be 1 or more, got 0'),
    (dict(gpu_reset_stop_units=['*']), "gpu_reset_stop_units: '*' is no systemd unit name"),
])
def test_a_wrong_probe_or_reset_setting_is_found_before_anything_is_signalled(gpuhost, hook, setting, words):
    job = gpuhost.hold(gpus=[0], mib=1024)['pid']
    rc, report, drained = hook('--timeout', '5', **setting)
    assert rc == _hook_status.RUNNER_DRAINED
    assert report['reason'].startswith('gpu_reset is misconfigured: ' + words), report['reason']
    assert report['signalled'] == [] and alive(job)


def test_settings_that_cannot_be_read_are_an_error_of_their_own(tmp_path):
    path = tmp_path / 'vars.yml'
    path.write_text('gpu_reset_grace_period: [\n')
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(path)]) == _hook_status.RUNNER_SETTINGS_UNREADABLE
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(tmp_path / 'missing.yml')]) == \
        _hook_status.RUNNER_SETTINGS_UNREADABLE


def smi_processes(host):
    """The pids of the simulated host's nvidia-smi that are still running."""
    found = []
    for entry in os.listdir('/proc'):
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                if host.smi_path.encode() in handle.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def test_a_module_cut_off_takes_its_children_with_it(gpuhost):
    """A module stopped at the hook's deadline takes the nvidia-smi it started (in a session of
    its own) with it."""
    gpuhost.fault('hang', seconds=60)
    args = dict(nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob], timeout=30,
                state_dir=gpuhost.state_dir)
    with pytest.raises(_sequence.ModuleError, match='gave no result within 1.0 s and was stopped'):
        _hook_reset.ModuleRunner(time.monotonic() + 1)('nvidia_gpu_facts', args)
    for dummy in range(40):
        if not smi_processes(gpuhost):
            break
        time.sleep(0.05)
    assert smi_processes(gpuhost) == []


@pytest.mark.parametrize('text, indexes', [('0', [0]), ('0,1,5', [0, 1, 5]), ('0-3,6', [0, 1, 2, 3, 6]), (' 2 , 4 ', [2, 4])])
def test_the_jobs_gpus_as_slurm_gives_them(text, indexes):
    assert _hook_job.gpu_list(text) == indexes


# -- release safety: report names, drain reasons, exit statuses, the job's GPUs -----------------

def test_a_node_named_with_dot_dot_writes_its_report_inside_the_report_dir(hook, tmp_path):
    """SLURMD_NODENAME=../victim: the report is %2E.%2Fvictim.json in the report directory, and
    nothing is written beside it."""
    reports = tmp_path / 'reports'
    reports.mkdir()
    rc, report, drained = hook('--node', '../victim', '--timeout', '5', gpu_reset_report_dir=str(reports))
    assert (rc, report['outcome']) == (0, 'clean'), report
    assert os.listdir(str(reports)) == ['%2E.%2Fvictim.json']
    assert not (tmp_path / 'victim.json').exists()
    with open(str(reports / '%2E.%2Fvictim.json')) as handle:
        assert json.load(handle)['host'] == '../victim'


def test_a_node_name_that_cannot_name_a_report_fails_saying_so(hook, tmp_path):
    rc, report, drained = hook('--node', 'n' * 300, '--timeout', '5', gpu_reset_report_dir=str(tmp_path / 'reports'))
    assert report['outcome'] == 'failed'
    assert report['reason'].startswith('write the report on the controller: gpu_reset_report_dir: the report file '
                                       'of host %s...(220 more characters) would be named with 305 bytes' % ('n' * 80))


# A process named with a terminal escape and a newline (its comm, which the lock's "who holds
# it" names) that holds the release lock.
LOCK_HOLDER = r'''
import ctypes, fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
ctypes.CDLL(None).prctl(15, b'\x1b]0;pwn\x07\nfake', 0, 0, 0)
print('ready', flush=True)
time.sleep(60)
'''


@pytest.fixture
def escaped_lock_holder(tmp_path):
    proc = subprocess.Popen([sys.executable, '-c', LOCK_HOLDER, str(tmp_path / 'release.lock')], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'ready'
    yield proc
    proc.kill()
    proc.wait()


def test_control_characters_in_the_reason_are_escaped_in_the_drain(hook, escaped_lock_holder):
    """The reason names the process that holds the lock by its name, which its owner chose."""
    rc, report, drained = hook('--timeout', '2')
    assert report['outcome'] == 'failed' and '(\\x1b]0;pwn\\x07' in report['reason'], report['reason']
    assert len(drained) == 4 and drained[:3] == ['update', 'nodename=gpu07', 'state=drain']
    assert '(\\x1b]0;pwn\\x07' in drained[3], drained
    assert not re.search(r'[\x00-\x1f\x7f-\x9f]', drained[3])


@pytest.mark.parametrize('reason', [
    'GPU 1: held by pid 5 (x\n\x1b]0;t\x07\x9b2J\u202e)',
    'x state=resume nodename=gpu[00-99] reason=forged',
    '-h --help',
    'y' * 200000,
])
def test_the_drain_reason_is_one_escaped_capped_argument(reason):
    argv = drain_command('scontrol', 'gpu07', reason)
    assert argv[:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain'] and len(argv) == 5
    assert argv[4].startswith('reason=gpu_reset: ') and not re.search(r'[\x00-\x1f\x7f-\x9f\u2028-\u202e]', argv[4])
    assert len(argv[4]) <= len('reason=gpu_reset: ') + 200 + len('...(199800 more characters)')


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


def test_garbage_gpus_are_a_settings_error_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as info:
        _slurm_hook.main(['--node', 'n1', '--gpus', '0-2000000'])
    assert info.value.code == _hook_status.RUNNER_SETTINGS_UNREADABLE
    err = capsys.readouterr().err
    assert 'argument --gpus: SLURM_JOB_GPUS: GPU 2000000 is past the 64 GPUs' in err and 'Traceback' not in err


def playbook_runner_args(host, tmp_path, gres_text):
    variables = tmp_path / 'gpu_reset.yml'
    variables.write_text('gpu_reset_host_root: %s\n' % json.dumps(host.root))
    gres_conf = tmp_path / 'gres.conf'
    gres_conf.write_text(gres_text)
    return ['--node', 'n1', '--vars-file', str(variables), '--gres-conf', str(gres_conf)]


def test_the_playbook_runner_gets_its_variables_as_json_built_in_python(gpuhost, tmp_path):
    """What the hook fixes for ansible-playbook (-e @FILE): the GPUs parsed and mapped as for the
    module runner, never spliced into a shell word (that is how a drain command could be injected)."""
    path = tmp_path / 'hook-vars.json'
    args = playbook_runner_args(gpuhost, tmp_path, identity_gres_conf(gpuhost))
    assert _slurm_hook.main(args + ['--gpus', '0-2,5', '--timeout', '7', '--playbook-vars', str(path)]) == 0
    assert json.loads(path.read_text()) == {'gpu_reset_on_failure': 'drain', 'gpu_reset_gpus': [0, 1, 2, 5],
                                            'gpu_reset_timeout': 7.0, 'gpu_reset_max_drained': '100%'}


def test_the_playbook_runner_is_not_started_when_the_jobs_gpus_cannot_be_told(gpuhost, tmp_path, capsys):
    """gres.conf names a GPU the host does not have: the node is drained with why, and no
    variables are written for a playbook that would release some other GPU."""
    path = tmp_path / 'hook-vars.json'
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!/bin/sh\necho "$@" > %s\n' % (tmp_path / 'drained'))
    scontrol.chmod(0o755)
    args = playbook_runner_args(gpuhost, tmp_path, 'Name=gpu File=%s/dev/nvidia9\n' % gpuhost.root)
    rc = _slurm_hook.main(args + ['--gpus', '0', '--scontrol', str(scontrol), '--playbook-vars', str(path)])
    assert rc == _hook_status.RUNNER_DRAINED
    assert not path.exists()
    reason = (tmp_path / 'drained').read_text()
    assert reason.startswith("update nodename=n1 state=drain reason=gpu_reset: SLURM_JOB_GPUS=0: gres.conf's "
                             '%s/dev/nvidia9 cannot be read' % gpuhost.root), reason
    assert 'Traceback' not in capsys.readouterr().err


# -- the health check: what Slurm says about the node ---------------------------------------------

SHOW_NODE = '''NodeName=gpu07 Arch=x86_64 CoresPerSocket=2
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.57
   OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC Debian
   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
{reason}
'''


def show_node(state='IDLE+DRAIN', reason='gpu_reset: GPU 3: 4096 MiB held with no process left [root@2026-12-01T11:59:46]'):
    return SHOW_NODE.format(state=state, reason='   Reason=' + reason if reason else '')


def test_the_nodes_state_and_reason_as_scontrol_shows_them():
    state, reason, line = _hook_health.parse_node(show_node(), 'gpu07')
    assert (state, reason) == ('IDLE+DRAIN', 'gpu_reset: GPU 3: 4096 MiB held with no process left')
    assert line == 'Reason=gpu_reset: GPU 3: 4096 MiB held with no process left [root@2026-12-01T11:59:46]'
    assert _hook_health.parse_node(show_node('IDLE', None), 'gpu07') == ('IDLE', '', '')


@pytest.mark.parametrize('text', [
    '',
    'slurm_load_node error: Invalid node name specified\n',
    'Node gpu07 not found\n',
    show_node().replace('NodeName=gpu07', 'NodeName=gpu08'),
    show_node() + show_node().replace('gpu07', 'gpu08'),
    show_node().replace('   State=', '   Stat='),
    show_node() + '   State=IDLE+DRAIN\n',
    show_node() + '   Reason=gpu_reset: again\n',
    show_node(state=''),
    '{"nodes": [{"name": "gpu07", "state": ["IDLE", "DRAIN"]}]}',
    '\x00\x1b[2J' * 50,
])
def test_scontrol_output_that_cannot_be_read_is_refused(text):
    with pytest.raises(_hook_slurm.SlurmUnreadable):
        _hook_health.parse_node(text, 'gpu07')


def test_an_unreadable_node_name_is_escaped_in_the_message():
    with pytest.raises(_hook_slurm.SlurmUnreadable) as caught:
        _hook_health.parse_node('NodeName=x\x1b[2J\n', 'gpu07')
    assert '\x1b' not in str(caught.value) and '\\x1b[2J' in str(caught.value)


@pytest.mark.parametrize('state, reason, expected', [
    ('IDLE+DRAIN', 'gpu_reset: GPU 3: orphaned memory', None),
    ('IDLE', '', 'is not drained'),
    ('MIXED', '', 'is not drained'),
    ('IDLE+DRAIN', 'maintenance: new firmware', "not this collection's"),
    ('IDLE+DRAIN', 'Prolog error', "not this collection's"),
    ('IDLE+DRAIN', 'GPU_RESET: shouted', "not this collection's"),
    ('IDLE+DRAIN', 'gpu_reset:no space', "not this collection's"),
    ('MIXED+DRAIN', 'gpu_reset: GPU 3', 'a job still runs or ends there'),
    ('ALLOCATED+DRAIN', 'gpu_reset: GPU 3', 'a job still runs or ends there'),
    ('IDLE+COMPLETING+DRAIN', 'gpu_reset: GPU 3', 'a job still runs or ends there'),
    ('IDLE+DRAIN+REBOOT_REQUESTED', 'gpu_reset: GPU 3', 'State=IDLE+DRAIN+REBOOT_REQUESTED'),
    ('DOWN+DRAIN', 'gpu_reset: GPU 3', 'State=DOWN+DRAIN'),
    # Held for a person: a reboot asked for within a day did not cure it; also as an older version
    # drained such a node, before the hold prefix.
    ('IDLE+DRAIN', 'gpu_reset(hold): not rebooted (a reboot asked for at 2026-12-01T10:00:00Z did not cure it): '
                   'GPU 1 needs a reboot (Xid 79 since the last cure)', 'for a person'),
    ('IDLE+DRAIN', 'gpu_reset(hold): GPU 3 Xid 95 came back after 2 cures', 'until an operator resumes it'),
    ('IDLE+DRAIN', 'gpu_reset: not rebooted (a reboot asked for at 2026-12-01T10:00:00Z did not cure it): GPU 1 '
                   'fell off the bus', 'for a person'),
    ('IDLE+DRAIN', 'gpu_reset(hold)x: not ours', "not this collection's"),
])
def test_only_a_node_this_collection_drained_and_idle_is_healed(state, reason, expected):
    why = _hook_health.why_not_heal('gpu07', state, reason)
    assert why is None if expected is None else expected in why, why


@pytest.fixture
def slurm(tmp_path):
    """A fake scontrol and squeue: they print what the test gives them and write down their calls."""
    calls = tmp_path / 'calls.jsonl'
    script = ('#!%s\nimport json, os, sys\n'
              'open(%r, "a").write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")\n'
              'name = os.path.basename(sys.argv[0])\n'
              'if sys.argv[1:2] == ["update"]:\n    sys.exit(0)\n'
              'sys.stdout.write(open(os.path.join(os.path.dirname(sys.argv[0]), name + ".out")).read())\n'
              % (sys.executable, str(calls)))
    for name in ('scontrol', 'squeue', 'sinfo'):
        (tmp_path / name).write_text(script)
        (tmp_path / name).chmod(0o755)
        (tmp_path / (name + '.out')).write_text('')

    class Slurm:
        scontrol = str(tmp_path / 'scontrol')

        def says(self, scontrol=None, squeue=None, sinfo=None):
            if scontrol is not None:
                (tmp_path / 'scontrol.out').write_text(scontrol)
            if squeue is not None:
                (tmp_path / 'squeue.out').write_text(squeue)
            if sinfo is not None:
                (tmp_path / 'sinfo.out').write_text(sinfo)

        def calls(self):
            return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

        def check(self, capsys, *more):
            rc = _slurm_hook.main(['--health-check', '--node', 'gpu07', '--scontrol', self.scontrol,
                                   '--deadline', '20'] + list(more))
            return rc, capsys.readouterr()
    return Slurm()


@pytest.mark.parametrize('text', ['', 'garbage\n', show_node().replace('State=', 'Stat=')])
def test_garbage_from_scontrol_means_no_action(slurm, capsys, text):
    slurm.says(scontrol=text)
    rc, out = slurm.check(capsys, '--vars-file', '/nonexistent')
    assert rc == _hook_status.HEALTH_UNREADABLE
    assert 'nothing done' in out.err
    assert out.out == ''  # no sequence ran, so no report
    assert [call[:2] for call in slurm.calls()] == [['scontrol', 'show']]


def test_a_node_drained_by_someone_else_is_only_read(slurm, capsys):
    slurm.says(scontrol=show_node(reason='bad DIMM, ticket 4711 [alice@2026-12-01T10:00:00]'))
    rc, out = slurm.check(capsys, '--vars-file', '/nonexistent')
    assert rc == 0 and 'left to whoever drained it' in out.err
    assert [call[:2] for call in slurm.calls()] == [['scontrol', 'show']]


@pytest.mark.parametrize('squeue', ['42 RUNNING\n', '42 COMPLETING\n', 'garbage\n'])
def test_a_node_where_squeue_names_a_job_is_only_read(slurm, capsys, squeue):
    slurm.says(scontrol=show_node(), squeue='41 COMPLETED\n' + squeue)
    rc, out = slurm.check(capsys, '--vars-file', '/nonexistent')
    assert rc == 0 and 'runs jobs' in out.err, out.err
    assert [call[0] for call in slurm.calls()] == ['scontrol', 'squeue']
    assert slurm.calls()[1][1:] == ['-h', '-w', 'gpu07', '-t', 'all', '-o', '%i %T']


def test_a_node_name_that_is_a_list_is_refused_before_any_call(slurm, capsys):
    rc = _slurm_hook.main(['--health-check', '--node', 'gpu07,gpu08', '--scontrol', slurm.scontrol])
    assert rc == _hook_status.HEALTH_UNREADABLE
    assert slurm.calls() == []


def test_a_drained_node_whose_gpus_are_clean_is_resumed(slurm, capsys, hook_vars):
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5')
    assert rc == 0, out.err
    assert json.loads(out.out)['outcome'] == 'clean'
    assert 'resumed gpu07' in out.err
    assert slurm.calls()[-1] == ['scontrol', 'update', 'nodename=gpu07', 'state=resume']


def test_observe_mode_says_it_would_resume_and_changes_nothing(gpuhost, slurm, capsys, hook_vars):
    """--observe (GPU_RESET_MODE=observe): the drained node's GPUs are read, a holder is named as
    one that would be signalled, and the node would be resumed; nothing is signalled, no update."""
    holder = gpuhost.hold(gpus=[0], mib=1024)['pid']
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5', '--observe')
    assert rc == 0, out.err
    report = json.loads(out.out)
    assert report['outcome'] == 'would_release' and report['check_mode'] is True
    assert [entry['pid'] for entry in report['signalled']] == [holder] and alive(holder)
    assert 'observe mode: would resume gpu07 (its GPUs would be released first)' in out.err, out.err
    assert [call for call in slurm.calls() if call[1:2] == ['update']] == []


def test_observe_mode_says_a_node_that_is_not_clean_would_stay_drained(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('lost', gpu=1)
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5', '--observe')
    assert rc == 0, out.err
    assert json.loads(out.out)['would_drain'] is True
    assert 'observe mode: gpu07 would stay drained: GPU 1 lost or unreadable' in out.err, out.err
    assert [call for call in slurm.calls() if call[1:2] == ['update']] == []


def test_a_drained_node_whose_gpus_are_still_dirty_stays_drained_with_the_new_reason(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('stuck', gpu=1, mib=2048)
    slurm.says(scontrol=show_node(), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5')
    assert rc == _hook_status.RUNNER_DRAINED, out.err
    update = slurm.calls()[-1]
    assert update[:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain']
    assert re.match(r'reason=gpu_reset: GPU 1: \d+ MiB held with no process left', update[4]), update
    assert 'state=resume' not in json.dumps(slurm.calls())


def test_a_node_drained_again_meanwhile_is_neither_resumed_nor_drained(gpuhost, slurm, capsys, hook_vars, monkeypatch):
    """Someone drains the node with a reason of their own while the sequence runs."""
    slurm.says(scontrol=show_node(), squeue='')
    reset = _hook_health.reset

    def reset_then_redrain(*args, **kwargs):
        result = reset(*args, **kwargs)
        slurm.says(scontrol=show_node(reason='maintenance [bob@2026-12-01T12:00:00]'))
        return result
    monkeypatch.setattr(_hook_health, 'reset', reset_then_redrain)
    rc, out = slurm.check(capsys, '--vars-file', hook_vars(), '--timeout', '5')
    assert rc == 0 and 'not resumed' in out.err, out.err
    # Read, the sequence, read again: the reason is someone else's now, so no update.
    assert [call[:2] for call in slurm.calls()] == [['scontrol', 'show'], ['squeue', '-h'], ['scontrol', 'show']]


@pytest.fixture
def hook_vars(gpuhost, tmp_path):
    """hook_vars() -> a gpu_reset.yml for gpuhost, as the hook fixture writes it."""
    def write():
        path = tmp_path / 'health.yml'
        path.write_text(yaml.safe_dump({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': gpuhost.install_cuda(),
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}))
        return str(path)
    return write


# -- the fleet brake -----------------------------------------------------------------------------

def sinfo_lines(nodes, drained=(), other=(), at=None):
    """sinfo -h -N -o '%N|%t|%H|%E' (SLURM_TIME_FORMAT=%s) of nodes gpu01..gpuNN in two partitions:
    drained, with a gpu_reset reason given at `at` (seconds since the epoch; default an hour ago);
    other, drained for a reason of someone else's."""
    at = int(time.time() - 3600 if at is None else at)
    lines = []
    for partition in ('batch', 'debug'):
        for number in range(1, nodes + 1):
            name = 'gpu%02d' % number
            if name in drained:
                lines.append('%s|drain|%d|gpu_reset: GPU 1: 900 MiB held with no process left | pid 7' % (name, at))
            elif name in other:
                lines.append('%s|drain*|%d|bad DIMM' % (name, at))
            else:
                lines.append('%s|idle|Unknown|none' % name)
        if partition == 'debug':
            lines = lines[:nodes + 2]  # the debug partition holds only two of the nodes
    return '\n'.join(lines) + '\n'


def prolog(slurm, capsys, hook_vars, *more):
    rc = _slurm_hook.main(['--node', 'gpu07', '--scontrol', slurm.scontrol, '--vars-file', hook_vars(),
                           '--timeout', '5', '--deadline', '30'] + list(more))
    out = capsys.readouterr()
    return rc, json.loads(out.out), [call for call in slurm.calls() if call[1:2] == ['update']]


def test_past_the_cap_a_node_that_can_run_jobs_stays_in_service(gpuhost, slurm, capsys, hook_vars):
    """A probe that fails on every node (a driver update, a bug) must not empty the cluster: with
    one of 20 nodes drained by gpu_reset already and a cap of 1, the node stays in service."""
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(20, drained=('gpu03',), other=('gpu05',)))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '1')
    assert rc == _hook_status.RUNNER_BRAKE_HELD and updates == []
    assert report['outcome'] == 'failed' and report['drained'] is False
    assert report['brake'] == {'held': True, 'drained_nodes': 1, 'nodes': 20, 'cap': 1, 'rule': 'count'}
    assert report['reason'].endswith('; not drained: the brake holds (count: 1 of 20 nodes drained by gpu_reset already, '
                                     'at most 1)'), report['reason']


def test_under_the_cap_the_node_is_drained(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(30, drained=('gpu03', 'gpu07'), other=('gpu05',)))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '10%')
    # 10 % of 30 nodes is 3; one other node is drained by gpu_reset (this one does not count).
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'drained_nodes': 1, 'nodes': 30, 'cap': 3}


def test_a_node_where_no_job_can_run_is_drained_past_the_cap_saying_so(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('lost', gpu=1)
    slurm.says(sinfo=sinfo_lines(4, drained=('gpu01', 'gpu02')))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '1')
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'drained_nodes': 2, 'nodes': 4, 'cap': 1, 'rule': 'count', 'overridden': True}
    assert updates[0][-1].startswith('reason=gpu_reset: the brake (count: 2 of 4 nodes drained by gpu_reset already, at most 1) '
                                     'is overridden, no job can run here: GPU 1 lost'), updates[0][-1]


@pytest.mark.parametrize('sinfo', ['', 'garbage; rm -rf /\n'])
def test_a_cluster_sinfo_cannot_tell_is_drained_as_without_a_brake(gpuhost, slurm, capsys, hook_vars, sinfo):
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo)
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '1')
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'why': 'the drained nodes could not be counted: sinfo listed no node'}


def test_every_state_that_takes_no_jobs_counts_when_gpu_reset_gave_the_reason(slurm):
    slurm.says(sinfo='gpu01|failg|1796214743|gpu_reset: GPU 1 lost\ngpu02|drng*|Unknown|gpu_reset: GPU 2 lost\n'
                     'gpu03|down~|2026-12-02T12:32:23|gpu_reset: x\n'
                     'gpu04|idle|Unknown|none\ngpu05|drain|1|bad DIMM\ngpu06|alloc|1|gpu_reset: an old reason\n'
                     'gpu07|drain|1|gpu_reset(hold): not rebooted (a reboot asked for at 2026-12-01T10:00:00Z did not '
                     'cure it): GPU 1 needs a reboot\ngpu08|drain|1|gpu_reset(holdout): not ours\n')
    nodes, drained = _brake.parse_listing(_hook_reset.read_listing(slurm.scontrol, 5))
    assert sorted(nodes) == ['gpu0%d' % number for number in range(1, 9)]
    # A node held for a person is out of service for gpu_reset as much as a drained one.
    assert sorted(drained) == ['gpu01', 'gpu02', 'gpu03', 'gpu07']
    assert drained['gpu01'] == 1796214743 and drained['gpu02'] is None and drained['gpu07'] == 1
    # A Slurm that ignores SLURM_TIME_FORMAT prints its local time.
    assert drained['gpu03'] == time.mktime(time.strptime('2026-12-02T12:32:23', '%Y-%m-%dT%H:%M:%S'))
    assert slurm.calls()[-1] == ['sinfo', '-h', '-N', '-o', '%N|%t|%H|%E']


@pytest.mark.parametrize('text, nodes, cap', [('10%', 30, 3), ('10%', 5, 1), ('25%', 10, 3), ('4', 100, 4), ('0', 9, 1)])
def test_the_cap_is_a_number_or_a_share_of_the_cluster_at_least_one(text, nodes, cap):
    assert _brake.brake_cap(text, nodes) == cap


@pytest.mark.parametrize('text', ['', '10 %', '%', '5%%', '-1', '1e3', 'ten'])
def test_a_cap_that_is_neither_a_number_nor_a_percentage_is_refused(text, capsys):
    with pytest.raises(SystemExit):
        _slurm_hook.parse_args(['--node', 'gpu07', '--max-drained', text])
    assert 'GPU_RESET_MAX_DRAINED: %r is neither a number of nodes nor a percentage' % text in capsys.readouterr().err


def test_past_the_rate_a_node_that_can_run_jobs_stays_in_service(gpuhost, slurm, capsys, hook_vars):
    """Two nodes drained by gpu_reset a minute ago, at most 2 in 10 minutes: held by the rate,
    far under the count's cap."""
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(40, drained=('gpu03', 'gpu04'), other=('gpu05',), at=time.time() - 60))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '50%', '--max-drain-rate', '2/10m')
    assert rc == _hook_status.RUNNER_BRAKE_HELD and updates == []
    assert report['brake'] == {'held': True, 'drained_nodes': 2, 'nodes': 40, 'cap': 20, 'rate': '2/10m',
                               'recent_drains': 2, 'rule': 'rate'}
    assert report['reason'].endswith('; not drained: the brake holds (rate: 2 nodes drained by gpu_reset within '
                                     '600 s, at most 2/10m)'), report['reason']


def test_drains_older_than_the_window_leave_the_rate_alone(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('cuda', gpu=2, code='ECC_UNCORRECTABLE')
    slurm.says(sinfo=sinfo_lines(40, drained=('gpu03', 'gpu04'), at=time.time() - 700))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '50%', '--max-drain-rate', '2/10m')
    assert rc == _hook_status.RUNNER_DRAINED and len(updates) == 1
    assert report['brake'] == {'held': False, 'drained_nodes': 2, 'nodes': 40, 'cap': 20, 'rate': '2/10m', 'recent_drains': 0}


def test_a_node_where_no_job_can_run_is_drained_past_the_rate_saying_which_rule(gpuhost, slurm, capsys, hook_vars):
    gpuhost.fault('lost', gpu=1)
    slurm.says(sinfo=sinfo_lines(40, drained=('gpu03',), at=time.time() - 5))
    rc, report, updates = prolog(slurm, capsys, hook_vars, '--max-drained', '50%', '--max-drain-rate', '1/1h')
    assert rc == _hook_status.RUNNER_DRAINED and report['brake']['overridden'] and report['brake']['rule'] == 'rate'
    assert updates[0][-1].startswith('reason=gpu_reset: the brake (rate: 1 nodes drained by gpu_reset within 3600 s, '
                                     'at most 1/1h) is overridden, no job can run here: GPU 1 lost'), updates[0][-1]


@pytest.mark.parametrize('text', ['', '5', '5/10', '5/10d', '0/10m', '5/0m', '5/200h', '-5/10m', '5 /10m', '5/10m;x'])
def test_a_rate_that_is_not_nodes_per_window_is_refused_naming_the_variable(text, capsys):
    with pytest.raises(SystemExit):
        _slurm_hook.parse_args(['--node', 'gpu07', '--max-drained', '10%', '--max-drain-rate=' + text])
    err = capsys.readouterr().err
    assert 'error: argument --max-drain-rate: GPU_RESET_MAX_DRAIN_RATE: %r ' % text in err.strip().splitlines()[-1], err


@pytest.mark.parametrize('text, seconds', [('5/10m', 600), ('1/30s', 30), ('12/2h', 7200), ('1/168h', 7 * 24 * 3600)])
def test_a_rate_window_is_seconds_minutes_or_hours(text, seconds):
    assert _brake.drain_rate_problem(text) is None and _brake.window_s(text) == seconds


# -- a reboot when only a reboot helps ------------------------------------------------------------

def test_a_lost_gpu_asks_slurm_for_a_reboot_once(gpuhost, hook, tmp_path):
    gpuhost.fault('lost', gpu=2, message='lost')
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp))
    assert rc == _hook_status.RUNNER_DRAINED, report['reason']
    assert command[:3] == ['reboot', 'ASAP', 'nextstate=resume'] and command[-1] == 'gpu07', command
    assert command[3].startswith('reason=gpu_reset: GPU 2') and len(command) == 5, command
    assert report['reboot_requested'] is True and report['drained'] is True
    assert stamp.exists()
    # Before the reboot (the Epilog of the same job): asked for again, the same way.
    rc, report, again = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp))
    assert (rc, again[:3], report['reboot_requested']) == (_hook_status.RUNNER_DRAINED, command[:3], True)


def test_a_fault_a_reboot_did_not_cure_is_drained_for_a_person(gpuhost, hook, tmp_path):
    stamp = tmp_path / 'reboot-requested'
    stamp.write_text('')
    boot = _hook_reset.boot_time()
    os.utime(str(stamp), (boot - 60, boot - 60))
    assert 'did not cure it' in _hook_reset.why_not_reboot('gpu07', str(stamp), boot=boot, now=boot + 3600)
    assert _hook_reset.why_not_reboot('gpu07', str(stamp), boot=boot, now=boot + 2 * 86400) is None
    assert _hook_reset.why_not_reboot('gpu07', str(stamp), boot=boot - 120, now=boot) is None  # still to come
    if time.time() - (boot - 60) < _hook_reset.REBOOT_AT_MOST_EVERY_S:
        gpuhost.fault('lost', gpu=2, message='lost')
        rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp))
        assert command[:3] == ['update', 'nodename=gpu07', 'state=drain'], command
        assert re.match(r'reason=gpu_reset\(hold\): not rebooted \(a reboot asked for at \S+Z did not cure it\): '
                        r'GPU 2 lost', command[3]), command
        assert 'reboot_requested' not in report and report['held_for_person'] is True
        # The health check that finds the GPUs clean later leaves the node drained.
        assert 'for a person' in _hook_health.why_not_heal('gpu07', 'IDLE+DRAIN', command[3][len('reason='):])


def test_an_xid_79_in_the_kernels_words_asks_for_a_reboot(gpuhost, hook, tmp_path):
    # Before: the GPU read clean, recovery_action null, no reboot asked for, even with resets allowed.
    gpuhost.fault('xid', gpu=1, code=79)
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                               gpu_reset_kernel_log=gpuhost.kernel_log, gpu_reset_allow_gpu_reset=True)
    assert rc == _hook_status.RUNNER_DRAINED, report['reason']
    assert command[:3] == ['reboot', 'ASAP', 'nextstate=resume'] and command[-1] == 'gpu07', command
    assert [gpu['recovery_action'] for gpu in report['gpus'] if gpu['index'] == 1] == ['reboot']
    assert report['reboot_requested'] is True and report['escalation'] is None and stamp.exists()


def test_a_hung_driver_line_that_names_no_gpu_asks_for_nothing_by_itself(gpuhost, hook, tmp_path):
    # Before: the driver's assertions of a full-chip reset that hung, which name no bus id, made every
    # GPU need a reboot and the hook asked for one, on a line anyone who can write the log could add.
    gpuhost.fault('driver-hung', count=50)
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                               gpu_reset_kernel_log=gpuhost.kernel_log, gpu_reset_allow_gpu_reset=True)
    assert rc == 0 and command is None, report['reason']
    assert set(gpu['recovery_action'] for gpu in report['gpus']) == set(['none'])
    assert 'reboot_requested' not in report and not stamp.exists()


def test_a_hung_driver_in_the_kernel_log_asks_for_a_reboot_where_a_gpus_own_read_bears_it_out(gpuhost, hook, tmp_path):
    # GPU 5 reads as requiring a reset while the driver asserts it hung in a full-chip reset: a
    # reset would hang in it too; the reboot is asked for, and nothing is reset.
    gpuhost.fault('reset-required', gpu=5)
    gpuhost.fault('driver-hung', count=50)
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                               gpu_reset_kernel_log=gpuhost.kernel_log, gpu_reset_allow_gpu_reset=True)
    assert rc == _hook_status.RUNNER_DRAINED, report['reason']
    assert command[:3] == ['reboot', 'ASAP', 'nextstate=resume'] and command[-1] == 'gpu07', command
    assert [(gpu['index'], gpu['recovery_action']) for gpu in report['gpus'] if gpu['recovery_action'] != 'none'] == [
        (5, 'reboot')]
    assert report['reboot_requested'] is True and report['escalation'] is None


def test_what_roots_userspace_writes_to_kmsg_asks_for_nothing(gpuhost, hook, tmp_path):
    # `echo '<3>NVRM: Xid ...: 79, ...' > /dev/kmsg` is filed as the user facility: not the driver's word.
    gpuhost.write_kmsg("<3>NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                               gpu_reset_kernel_log=gpuhost.kernel_log, gpu_reset_allow_gpu_reset=True)
    assert rc == 0 and command is None, report['reason']
    assert set(gpu['recovery_action'] for gpu in report['gpus']) == set(['none']) and not stamp.exists()


def test_an_xid_that_calls_for_a_reset_gets_one_through_the_hook_where_allowed(gpuhost, hook):
    gpuhost.fault('xid', gpu=2, code=119)
    rc, report, command = hook('--timeout', '8', gpu_reset_kernel_log=gpuhost.kernel_log, gpu_reset_allow_gpu_reset=True)
    assert rc == 0 and command is None, report['reason']
    assert report['escalation']['reasons'] == [{'index': 2, 'reasons': ['Xid 119 since the last cure']}]
    assert [gpu['recovery_action'] for gpu in report['gpus'] if gpu['index'] == 2] == ['none']
    # Not allowed: the node is drained, saying how to allow it. (The run's probe cured every GPU it
    # proved; the kernel log's times are whole seconds: the next Xid comes a second later.)
    time.sleep(1.1)
    gpuhost.fault('xid', gpu=3, code=119)
    rc, report, command = hook('--timeout', '8', gpu_reset_kernel_log=gpuhost.kernel_log)
    assert rc == _hook_status.RUNNER_DRAINED and command[:3] == ['update', 'nodename=gpu07', 'state=drain'], report
    assert 'GPU 3 needs a GPU reset (Xid 119 since the last cure; set gpu_reset_allow_gpu_reset to allow it)' in command[3]


def test_an_xid_of_a_gpu_with_mig_drains_naming_the_gpu_and_its_instances(gpuhost, hook):
    layout = gpuhost.mig(3, ['1g.18gb', '2g.35gb'])
    gpuhost.fault('xid', gpu=3, code=119)
    rc, report, command = hook('--timeout', '8', gpu_reset_kernel_log=gpuhost.kernel_log)
    assert rc == _hook_status.RUNNER_DRAINED and command[:3] == ['update', 'nodename=gpu07', 'state=drain'], report
    # The ids within the drain reason's length; the report has the MIG UUIDs too.
    assert command[3].startswith('reason=gpu_reset: GPU 3 needs a GPU reset (Xid 119 since the last cure; set '
                                 'gpu_reset_allow_gpu_reset to allow it); GPU 3 is the parent of MIG instance GI 3 CI 0, '
                                 'GI 7 CI 0, each affected'), command
    assert '(%s)' % ', '.join(dev['uuid'] for dev in layout['instances']) in report['reason']


def test_a_hold_is_drained_with_its_own_prefix_and_never_healed(slurm, tmp_path, monkeypatch):
    # The host booted a minute after the reboot was asked for, and the GPU is lost again: whatever
    # the machine's own uptime, ask_reboot drains the node for a person.
    stamp = tmp_path / 'reboot-requested'
    stamp.write_text('')
    os.utime(str(stamp), (time.time() - 90, time.time() - 90))
    monkeypatch.setattr(_hook_reset, 'boot_time', lambda: time.time() - 30)
    result = {'reason': 'GPU 2 needs a reboot (Xid 79 since the last cure)', 'gpus': [{'index': 2, 'recovery_action': 'reboot'}]}
    _hook_reset.ask_reboot(result, slurm.scontrol, 'gpu07', 10, str(stamp))
    updates = [call for call in slurm.calls() if call[1:2] == ['update']]
    assert result['drained'] is True and result['held_for_person'] is True and 'reboot_requested' not in result
    assert updates == [['scontrol', 'update', 'nodename=gpu07', 'state=drain',
                        'reason=gpu_reset(hold): not rebooted (a reboot asked for at %s did not cure it): GPU 2 needs a '
                        'reboot (Xid 79 since the last cure)' % time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(
                            os.stat(str(stamp)).st_mtime))]]
    reason = updates[0][-1][len('reason='):]
    assert 'until an operator resumes it' in _hook_health.why_not_heal('gpu07', 'IDLE+DRAIN', reason)
    # The brake counts it among the nodes out of service for gpu_reset.
    slurm.says(sinfo='gpu07|drain|1796214743|%s\ngpu08|idle|Unknown|none\n' % reason)
    assert _brake.parse_listing(_hook_reset.read_listing(slurm.scontrol, 5)) == (set(['gpu07', 'gpu08']), {'gpu07': 1796214743})


@pytest.mark.parametrize('reboot', [False, True])
def test_what_a_reboot_is_not_needed_for_is_drained(gpuhost, hook, tmp_path, reboot):
    """Without the option, a lost GPU is drained; with it, orphaned memory (a reset cures it) is too."""
    if reboot:
        gpuhost.fault('stuck', gpu=1, mib=2048)
    else:
        gpuhost.fault('lost', gpu=2, message='lost')
    rc, report, command = hook('--timeout', '5', *(['--reboot', '--reboot-stamp', str(tmp_path / 'stamp')] if reboot else []))
    assert rc == _hook_status.RUNNER_DRAINED
    assert command[:3] == ['update', 'nodename=gpu07', 'state=drain'], command
    assert not (tmp_path / 'stamp').exists()


@pytest.mark.parametrize('node', ['ALL', 'all', 'gpu[01-99]', 'gpu07,gpu08'])
def test_a_reboot_is_asked_for_one_node_only(node, tmp_path):
    assert 'not one node name' in _hook_reset.why_not_reboot(node, str(tmp_path / 'stamp'))
    assert _hook_reset.why_not_reboot('gpu07', str(tmp_path / 'stamp')) is None


def test_slurmds_pid_table_names_each_jobs_processes():
    table = ('PID      JOBID    STEPID   LOCALID GLOBALID\n'
             '4021     42       batch    0       0\n'
             '4100     42       0        0       0\n'
             '4200     43       extern   -       -\n'
             'garbage line\n'
             '1        44       0        0       0\n')
    assert _jobs.parse_listpids(table) == {'42': [4021, 4100], '43': [4200]}


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


# -- a fault that returns after its cures goes to a person ----------------------------------------

def test_a_third_recurrence_after_two_cures_is_held_for_a_person_until_cleared(gpuhost, slurm, capsys, hook_vars):
    variables = hook_vars()
    with open(variables, 'a') as handle:
        handle.write('gpu_reset_allow_gpu_reset: true\n')

    def prolog_run():
        rc = _slurm_hook.main(['--node', 'gpu07', '--scontrol', slurm.scontrol, '--vars-file', variables,
                               '--timeout', '10', '--deadline', '40'])
        return rc, json.loads(capsys.readouterr().out), [call for call in slurm.calls() if call[1:2] == ['update']]

    for cure in range(2):
        gpuhost.fault('stuck', gpu=3, mib=4096)
        rc, report, updates = prolog_run()
        assert (rc, report['outcome'], updates) == (0, 'released', []), report['reason']
        assert report['escalation']['gpus'] == [3]
    uuid = [gpu['uuid'] for gpu in report['gpus'] if gpu['index'] == 3][0]
    counts = report['history'][uuid]['counts']['7d']
    # Two resets, each a cure (a probe whose bytes the kernel checked cures too), and the probes passed.
    assert counts['reset'] == 2 and counts['cure'] >= 2 and counts['probe'] >= 1, report['history']
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, updates = prolog_run()
    assert rc == _hook_status.RUNNER_DRAINED and report['escalation'] is None and report['held_for_person'] is True
    assert len(updates) == 1 and updates[0][:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain']
    reason = updates[0][4][len('reason='):]
    assert reason.startswith('gpu_reset(hold): GPU 3 (%s): needs a reset (' % uuid), reason
    assert 'back after 2 cure(s) within 7 days' in reason and report['held'][0]['index'] == 3
    assert gpuhost.memory_used()[3] >= 4096  # not reset a third time
    # The health check leaves it drained, whatever its GPUs read.
    slurm.says(scontrol=show_node(reason=reason), squeue='')
    rc, out = slurm.check(capsys, '--vars-file', variables, '--timeout', '5')
    assert rc == 0 and 'held by gpu_reset for a person' in out.err
    assert len([call for call in slurm.calls() if call[1:2] == ['update']]) == 1
    # Until an operator clears the GPU's history: then a reset is tried again.
    assert _slurm_hook.main(['--clear-history', uuid, '--vars-file', variables]) == 0
    assert uuid in capsys.readouterr().err
    rc, report, dummy = prolog_run()
    assert (rc, report['outcome'], report['escalation']['gpus']) == (0, 'released', [3]), report['reason']


def test_the_hold_threshold_is_a_setting_checked_before_anything_is_done(gpuhost, hook):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, drained = hook('--timeout', '10', gpu_reset_allow_gpu_reset=True, gpu_reset_hold_after_cures=0)
    assert rc == _hook_status.RUNNER_DRAINED and 'gpu_reset_hold_after_cures must be between 1 and 100' in report['reason']
    assert report['escalation'] is None


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
