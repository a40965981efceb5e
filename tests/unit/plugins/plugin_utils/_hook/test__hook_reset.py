# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_reset sequence on the node (plugin_utils/_hook/reset.py): the modules run in children
forked from the hook (as programs from a process with ansible-core's controller code, as pytest),
the probe, the drain of a node that is not clean or misconfigured, and a reboot asked of Slurm when
only a reboot cures the GPUs, run against simulated hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _brake, _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import health as _hook_health
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import reset as _hook_reset
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_reason
from gpusim.state import is_alive as alive


def test_a_modules_arguments_are_in_no_file_with_a_name(gpuhost, tmp_path, monkeypatch):
    """A hook killed while a module runs (SIGKILL: no finally block runs) leaves nothing in the
    temporary directory: a module run as a program (from a process with ansible-core's controller
    code, as this one) reads its arguments from a file without a name."""
    import ansible.errors  # noqa: F401  the controller's code, as in any test that loaded it before
    temp = tmp_path / 'tmp'
    temp.mkdir()
    monkeypatch.setattr(tempfile, 'tempdir', str(temp))
    seen = []
    run = _hook_reset.Runner.run

    def watched(runner, args, timeout=None, input_text=None):
        seen.append((args[-1], os.listdir(str(temp))))
        return run(runner, args, timeout, input_text)
    monkeypatch.setattr(_hook_reset.Runner, 'run', watched)
    args = dict(nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob],
                state_dir=gpuhost.state_dir, timeout=20)
    result = _hook_reset.ModuleRunner(time.monotonic() + 30)('nvidia_gpu_facts', args)
    assert len(result['ansible_facts']['nvidia_gpus']) == 8, result
    [(path, listed)] = seen
    assert path.startswith('/proc/self/fd/') and listed == []
    assert os.listdir(str(temp)) == []


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


# The hook's process, as the Slurm hook runs it: every mode imported, then one module run, which
# must not start a program.
AS_THE_HOOK = """
import json, sys, time
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import health, history, job, playbook, reset
controller = reset.CONTROLLER_CODE in sys.modules
reset.ModuleRunner._program = staticmethod(lambda *args: sys.exit('the module was started as a program'))
try:
    result = reset.ModuleRunner(time.monotonic() + float(sys.argv[2]))(sys.argv[1], json.loads(sys.argv[3]))
except Exception as exc:
    result = {'error': '%s: %s' % (type(exc).__name__, exc)}
print(json.dumps(dict(result, hook_has_controller_code=controller)))
"""


def run_as_the_hook(name, args, seconds):
    proc = subprocess.run([sys.executable, '-c', AS_THE_HOOK, name, str(seconds), json.dumps(args)],
                          capture_output=True, text=True, timeout=seconds + 30, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_hook_forks_its_modules_and_they_report_as_under_ansible(gpuhost):
    """The hook loads none of ansible-core's controller code, so its modules run forked from it and
    behave as AnsiballZ runs them: a warning comes back in the result, not on a display."""
    gpuhost.fault('no-devices', True)
    result = run_as_the_hook('nvidia_gpu_facts', dict(
        nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob],
        state_dir=gpuhost.state_dir, timeout=20), 30)
    assert result['hook_has_controller_code'] is False
    assert result['ansible_facts']['nvidia_gpu_count'] == 0, result
    assert any('No devices were found' in _sequence.warning_text(warning) for warning in result['warnings']), result


def test_a_forked_module_cut_off_takes_its_children_with_it(gpuhost):
    gpuhost.fault('hang', seconds=60)
    result = run_as_the_hook('nvidia_gpu_facts', dict(
        nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob], timeout=30,
        state_dir=gpuhost.state_dir), 1)
    assert result['hook_has_controller_code'] is False
    assert 'gave no result within 1.0 s and was stopped' in result['error'], result
    for dummy in range(40):
        if not smi_processes(gpuhost):
            break
        time.sleep(0.05)
    assert smi_processes(gpuhost) == []


def test_a_forked_module_refuses_what_it_does_not_know_as_under_ansible(gpuhost):
    result = run_as_the_hook('nvidia_gpu_facts', dict(
        nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob], state_dir=gpuhost.state_dir,
        timeout=20, no_such_option=True), 30)
    assert result['hook_has_controller_code'] is False
    # AnsibleModule's own refusal: a result that failed, as under Ansible.
    assert result['failed'] is True and 'no_such_option' in result['msg'], result


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


def test_the_hold_threshold_is_a_setting_checked_before_anything_is_done(gpuhost, hook):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    rc, report, drained = hook('--timeout', '10', gpu_reset_allow_gpu_reset=True, gpu_reset_hold_after_cures=0)
    assert rc == _hook_status.RUNNER_DRAINED and 'gpu_reset_hold_after_cures must be between 1 and 100' in report['reason']
    assert report['escalation'] is None


# -- a reboot when only a reboot helps ------------------------------------------------------------

def test_a_lost_gpu_asks_slurm_for_a_reboot_once_its_evidence_is_collected(gpuhost, hook, tmp_path):
    """The node is drained for its reboot at once; a process of its own session collects
    nvidia-bug-report.sh (gpusim's), outside the hook's time, then asks Slurm for the reboot with
    the report's path in the reason."""
    gpuhost.fault('lost', gpu=2, message='lost')
    stamp = tmp_path / 'state' / 'reboot-requested'
    reports = tmp_path / 'reports'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                               gpu_reset_bug_report_dir=str(reports))
    assert rc == _hook_status.RUNNER_DRAINED, report['reason']
    assert command[:4] == ['update', 'nodename=gpu07', 'state=drain', 'reason=gpu_reset(reboot): GPU 2 lost or unreadable'] \
        or command[3].startswith('reason=gpu_reset(reboot): GPU 2'), command
    assert report['reboot_requested'] is True and report['drained'] is True and report['evidence']['directory'] == str(reports)
    assert stamp.exists()
    reboot = hook.reboot()
    assert reboot[:3] == ['reboot', 'ASAP', 'nextstate=resume'] and reboot[-1] == 'gpu07' and len(reboot) == 5, reboot
    [written] = os.listdir(str(reports))
    assert re.match(r'reason=gpu_reset: GPU 2 lost or unreadable.*; evidence: %s$' % re.escape(str(reports / written)),
                    reboot[3]), reboot
    # Before the reboot (the Epilog of the same job): not asked again, which would cut its evidence.
    rc, report, again = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                             gpu_reset_bug_report_dir=str(reports))
    assert (rc, again, report['reboot_requested']) == (_hook_status.RUNNER_DRAINED, None, True), again
    assert 'follows its evidence' in report['reason']
    assert len([call for call in hook.calls() if call[:1] == ['reboot']]) == 1


def test_a_report_that_hangs_is_cut_and_the_reboot_still_asked(gpuhost, hook, tmp_path):
    gpuhost.fault('lost', gpu=2, message='lost')
    gpuhost.fault('bug-report-hang', seconds=60)
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(tmp_path / 'stamp'),
                               gpu_reset_bug_report_dir=str(tmp_path / 'reports'), gpu_reset_bug_report_timeout=2)
    assert rc == _hook_status.RUNNER_DRAINED and command[3].startswith('reason=gpu_reset(reboot): '), command
    reboot = hook.reboot()
    assert reboot is not None and '; evidence: none (nvidia-bug-report.sh was not run to the end' in reboot[3], reboot


def test_a_node_resumed_meanwhile_is_not_rebooted(gpuhost, hook, tmp_path):
    """Someone resumes the node (or drains it for a reason of their own) while its report is
    collected: the node is read again before the reboot, which is not asked for."""
    gpuhost.fault('lost', gpu=2, message='lost')
    (tmp_path / 'node.json').write_text(json.dumps({'state': 'IDLE+DRAIN', 'reason': 'maintenance'}))
    (tmp_path / 'node.pinned').write_text('')
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(tmp_path / 'stamp'),
                               gpu_reset_bug_report_dir=str(tmp_path / 'reports'))
    assert rc == _hook_status.RUNNER_DRAINED and report['evidence']
    until = time.monotonic() + 30
    while time.monotonic() < until and not [call for call in hook.calls() if call[:2] == ['show', 'node']]:
        time.sleep(0.1)
    time.sleep(1)
    assert [call[0] for call in hook.calls()] == ['update', 'show'] and os.listdir(str(tmp_path / 'reports'))


def test_a_node_past_its_reboot_budget_is_drained_for_a_person(gpuhost, hook, tmp_path):
    """Two reboots asked for within the week (the node's history) spend the default budget: a GPU
    lost again is not rebooted a third time; gpu_reset_reboot_budget 3 allows it, and records it."""
    history = History.for_host(gpuhost.root)
    for days in (5, 2):
        assert history.record_node('reboot_asked', 'GPU 2 lost', when=time.time() - days * 86400,
                                   outcome='escalated', to='reboot')
    gpuhost.fault('lost', gpu=2, message='lost')
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp))
    assert rc == _hook_status.RUNNER_DRAINED and command[:3] == ['update', 'nodename=gpu07', 'state=drain'], command
    assert command[3].startswith('reason=gpu_reset(hold): the node needs a reboot, its reboot budget is spent: '
                                 '2 reboot(s) within 7 days ('), command
    assert report['held_for_person'] is True and 'reboot_requested' not in report and not stamp.exists()
    assert [event['outcome'] for event in history.node_events()] == ['escalated', 'escalated', 'held']

    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp), gpu_reset_reboot_budget=3,
                               gpu_reset_bug_report_dir=str(tmp_path / 'reports'))
    assert command[3].startswith('reason=gpu_reset(reboot): ') and report['reboot_requested'] is True, command
    assert hook.reboot()[:3] == ['reboot', 'ASAP', 'nextstate=resume']
    assert [event.get('to') for event in history.node_events()][-1] == 'reboot'
    assert len([event for event in history.node_events() if event['kind'] == 'reboot_asked']) == 3


def test_an_xid_79_in_the_kernels_words_asks_for_a_reboot(gpuhost, hook, tmp_path):
    # Before: the GPU read clean, recovery_action null, no reboot asked for, even with resets allowed.
    gpuhost.fault('xid', gpu=1, code=79)
    stamp = tmp_path / 'state' / 'reboot-requested'
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp),
                               gpu_reset_kernel_log=gpuhost.kernel_log, gpu_reset_allow_gpu_reset=True,
                               gpu_reset_bug_report_dir=str(tmp_path / 'reports'))
    assert rc == _hook_status.RUNNER_DRAINED, report['reason']
    assert command[3].startswith('reason=gpu_reset(reboot): '), command
    reboot = hook.reboot()
    assert reboot[:3] == ['reboot', 'ASAP', 'nextstate=resume'] and reboot[-1] == 'gpu07', reboot
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
    assert command[3].startswith('reason=gpu_reset(reboot): '), command
    reboot = hook.reboot()  # after the evidence, in the simulated host's /var/lib/gpuops/bug-reports
    assert reboot[:3] == ['reboot', 'ASAP', 'nextstate=resume'] and reboot[-1] == 'gpu07', reboot
    assert os.listdir(os.path.join(gpuhost.root, 'var', 'lib', 'gpuops', 'bug-reports'))
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
    history = (History.for_host(str(tmp_path / 'root')), {})
    _hook_reset.ask_reboot(result, slurm.scontrol, 'gpu07', 10, str(stamp), history, (str(tmp_path / 'reports'), 5, 'true'))
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


def test_a_reboot_stamp_in_a_directory_others_can_write_asks_for_no_reboot(gpuhost, hook, tmp_path):
    """Where another user could plant or remove the stamp, a reboot cannot be remembered: no
    reboot is asked for (it could loop), the node is drained for a person, saying why."""
    shared = tmp_path / 'shared'
    shared.mkdir()
    os.chmod(str(shared), 0o777)
    stamp = shared / 'reboot-requested'
    assert 'could not be remembered' in _hook_reset.why_not_reboot('gpu07', str(stamp))
    gpuhost.fault('lost', gpu=2, message='lost')
    rc, report, command = hook('--timeout', '5', '--reboot', '--reboot-stamp', str(stamp))
    assert command[:3] == ['update', 'nodename=gpu07', 'state=drain'], command
    assert 'a reboot could not be remembered' in command[3] and 'reboot_requested' not in report
    assert not stamp.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason='a link of another user is made by root')
def test_a_link_planted_as_the_stamps_directory_is_not_followed(tmp_path):
    target = tmp_path / 'elsewhere'
    target.mkdir(mode=0o700)
    (tmp_path / 'state').symlink_to(target)
    os.lchown(str(tmp_path / 'state'), 65534, 65534)  # a link of another user's
    result = _hook_reset.note_reboot({'reason': 'GPU 2 lost'}, str(tmp_path / 'state' / 'reboot-requested'))
    assert 'the reboot could not be noted' in result['reason'] and not list(target.iterdir())
