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

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_reason
from gpusim.state import is_alive as alive
from processes import gone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def test_settings_are_the_spec_defaults_then_the_file_then_the_hook(tmp_path):
    path = tmp_path / 'vars.yml'
    path.write_text('gpu_reset_grace_period: 2\ngpu_reset_timeout: 99\n')
    settings = _slurm_hook.load_settings(str(path), {'gpu_reset_timeout': 7})
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
    with pytest.raises(_slurm_hook.NeedsPlaybook):
        _slurm_hook.load_settings(str(path))
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(path)]) == _slurm_hook.RUNNER_NEEDS_PLAYBOOK


@pytest.fixture
def hook(gpuhost, tmp_path):
    """run(*args) -> (exit status, report, drain command's arguments or None): the runner as the
    hook starts it, on gpuhost, with a drain command that writes down its arguments."""
    scontrol = tmp_path / 'scontrol'
    drained = tmp_path / 'drained.json'
    scontrol.write_text('#!%s\nimport json, sys\njson.dump(sys.argv[1:], open(%r, "w"))\n' % (sys.executable, str(drained)))
    scontrol.chmod(0o755)
    variables = tmp_path / 'gpu_reset.yml'
    cuda = gpuhost.install_cuda()

    def run(*args, **more):
        """more: gpu_reset_* variables over the fixture's own."""
        variables.write_text(yaml.safe_dump(dict({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': cuda,
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}, **more)))
        proc = subprocess.run([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                               '--node', 'gpu07', '--vars-file', str(variables), '--scontrol', str(scontrol)] + list(args),
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
    assert rc == _slurm_hook.RUNNER_DRAINED and report['outcome'] == 'failed'
    if reason is None:
        assert 'probe' not in report and 'orphaned memory' in report['reason']
    else:
        assert report['reason'] == reason
    assert drained == ['update', 'nodename=gpu07', 'state=drain', 'reason=' + drain_reason(report['reason'])]


def test_a_hung_probe_drains_naming_the_timeout(gpuhost, hook):
    gpuhost.fault('cuda-hang', seconds=300)
    rc, report, drained = hook('--gpus', '0', '--timeout', '5', '--deadline', '8')
    assert rc == _slurm_hook.RUNNER_DRAINED
    assert 'GPU 0 (00000000:18:00.0): PROBE_TIMEOUT' in report['reason'] and drained


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
    assert rc == _slurm_hook.RUNNER_DRAINED
    assert 'libcuda-absent.so.1 cannot be loaded' in report['reason']


def test_only_the_jobs_gpus_are_released(gpuhost, hook):
    job = gpuhost.hold(gpus=[1], mib=2048)
    other = gpuhost.hold(gpus=[2], mib=2048)
    rc, report, drained = hook('--gpus', '0,1', '--timeout', '5')
    assert (rc, report['outcome'], drained) == (0, 'released', None)
    assert [p['pid'] for p in report['signalled']] == [job['pid']]
    assert gone(job['pid'])
    assert alive(other['pid'])


def test_orphaned_memory_fails_and_drains_with_the_reason(gpuhost, hook):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, drained = hook('--timeout', '3')
    assert rc == _slurm_hook.RUNNER_DRAINED
    assert report['outcome'] == 'failed' and report['drained'] is True
    # gpuhost's idle GPUs read 1 MiB.
    assert report['reason'].startswith('GPU 3: 4097 MiB held with no process left (orphaned memory')
    assert drained == ['update', 'nodename=gpu07', 'state=drain', 'reason=' + drain_reason(report['reason'])]


def test_a_misconfigured_hook_drains_with_the_reason(hook):
    """Unlike the role in a fleet run: a failed Prolog drains the node anyway, so with the reason."""
    rc, report, drained = hook('--timeout', '0')
    assert rc == _slurm_hook.RUNNER_DRAINED
    assert report['reason'].startswith('gpu_reset is misconfigured: gpu_reset_timeout must be more than 0')
    assert report['signalled'] == [] and report['gpus_before'] == []
    assert drained[-1] == 'reason=' + drain_reason(report['reason'])


def test_settings_that_cannot_be_read_are_an_error_of_their_own(tmp_path):
    path = tmp_path / 'vars.yml'
    path.write_text('gpu_reset_grace_period: [\n')
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(path)]) == _slurm_hook.RUNNER_SETTINGS_UNREADABLE
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(tmp_path / 'missing.yml')]) == \
        _slurm_hook.RUNNER_SETTINGS_UNREADABLE


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
    args = dict(nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob], timeout=30)
    with pytest.raises(_slurm_hook.ModuleError, match='gave no result within 1.0 s and was stopped'):
        _slurm_hook.ModuleRunner(time.monotonic() + 1)('nvidia_gpu_facts', args)
    for dummy in range(40):
        if not smi_processes(gpuhost):
            break
        time.sleep(0.05)
    assert smi_processes(gpuhost) == []


@pytest.mark.parametrize('text, indexes', [('0', [0]), ('0,1,5', [0, 1, 5]), ('0-3,6', [0, 1, 2, 3, 6]), (' 2 , 4 ', [2, 4])])
def test_the_jobs_gpus_as_slurm_gives_them(text, indexes):
    assert _slurm_hook.gpu_list(text) == indexes


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
    rc, report, drained = hook('--timeout', '1')
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
    argv = _slurm_hook.drain_command('scontrol', 'gpu07', reason)
    assert argv[:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain'] and len(argv) == 5
    assert argv[4].startswith('reason=gpu_reset: ') and not re.search(r'[\x00-\x1f\x7f-\x9f\u2028-\u202e]', argv[4])
    assert len(argv[4]) <= len('reason=gpu_reset: ') + 200 + len('...(199800 more characters)')


@pytest.mark.parametrize('text, indexes', [('0-2,1,2', [0, 1, 2]), ('63', [63]), ('0-63', list(range(64)))])
def test_the_jobs_gpus_are_each_named_once(text, indexes):
    assert _slurm_hook.gpu_list(text) == indexes


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
        _slurm_hook.gpu_list(text)
    assert time.monotonic() - started < 0.1


def test_garbage_gpus_are_a_settings_error_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as info:
        _slurm_hook.main(['--node', 'n1', '--gpus', '0-2000000'])
    assert info.value.code == _slurm_hook.RUNNER_SETTINGS_UNREADABLE
    err = capsys.readouterr().err
    assert 'argument --gpus: SLURM_JOB_GPUS: GPU 2000000 is past the 64 GPUs' in err and 'Traceback' not in err


def test_the_playbook_runner_gets_its_variables_as_json_built_in_python(tmp_path):
    """What the hook fixes for ansible-playbook (-e @FILE): the GPUs parsed as for the module
    runner, never spliced into a shell word (that is how a drain command could be injected)."""
    path = tmp_path / 'hook-vars.json'
    assert _slurm_hook.main(['--node', 'n1', '--gpus', '0-2,5', '--timeout', '7', '--playbook-vars', str(path)]) == 0
    assert json.loads(path.read_text()) == {'gpu_reset_on_failure': 'drain', 'gpu_reset_gpus': [0, 1, 2, 5],
                                            'gpu_reset_timeout': 7.0}
