# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The action gpuops.nvidia.gpu_reset on simulated hosts. Only _execute_module, Ansible's
transport to the host, is replaced: by the real modules run as programs on this machine (the
Slurm hook's runner), with the check and diff flags Ansible would add."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.gpuops.nvidia.plugins.action.gpu_reset import ActionModule
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import ModuleRunner
from gpusim.state import is_alive as alive


class Shell:
    tmpdir = None


class Connection:
    _shell = Shell()


class Role:
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


class Task:
    """What the action reads of its task."""

    def __init__(self, args, check_mode=False, diff=False, role=None):
        self.args = args
        self.check_mode = check_mode
        self.diff = diff
        self.async_val = 0
        self.action = 'gpuops.nvidia.gpu_reset'
        self._role = Role(role) if role else None


def action_run(gpuhost, tmp_path, check_mode=False, diff=False, role=None, task_vars=None, **args):
    """(result, modules run): the action's result for args on gpuhost."""
    args = dict(dict(nvidia_smi_path=gpuhost.smi_path, host_root=gpuhost.root, backend='nvidia-smi',
                     lock_file=str(tmp_path / 'release.lock'), grace_period=0.5,
                     timeout=10, probe_cuda_library=gpuhost.install_cuda()), **args)
    task_vars = dict(task_vars or {}, inventory_hostname='node1')
    loader = DataLoader()
    action = ActionModule(Task(args, check_mode, diff, role), Connection(), None, loader,
                          Templar(loader=loader, variables=task_vars), None)
    ran = []

    def execute_module(module_name, module_args, task_vars):
        ran.append(module_name)
        flags = dict(_ansible_check_mode=check_mode, _ansible_diff=diff)
        return ModuleRunner(time.monotonic() + 30)(module_name.split('.')[-1], dict(module_args, **flags))
    action._execute_module = execute_module
    return action.run(task_vars=task_vars), ran


def test_a_hung_job_is_released_in_one_module_call(gpuhost, tmp_path):
    job = gpuhost.hold(gpus=[0, 1], mib=4096)
    result, ran = action_run(gpuhost, tmp_path)
    assert ran == ['gpuops.nvidia.nvidia_device_release']
    assert result['outcome'] == 'released' and result['changed'] is True and 'failed' not in result
    assert [entry['pid'] for entry in result['signalled']] == [job['pid']] and not alive(job['pid'])
    # The probe (on by default) ran inside the release: still one module call.
    assert result['steps'] == ['Release the GPUs']
    assert result['probe']['probed'] is True and [gpu['ok'] for gpu in result['probe']['gpus']] == [True] * 8


def test_a_clean_host_changes_nothing(gpuhost, tmp_path):
    result, ran = action_run(gpuhost, tmp_path)
    assert result['outcome'] == 'clean' and result['changed'] is False and result['reason'] is None


def test_check_mode_signals_nothing_and_diff_shows_the_holders(gpuhost, tmp_path):
    job = gpuhost.hold(gpus=[2], mib=1024)
    result, ran = action_run(gpuhost, tmp_path, check_mode=True, diff=True)
    assert result['outcome'] == 'would_release' and result['changed'] is True and alive(job['pid'])
    assert str(job['pid']) in result['diff']['before'] and str(job['pid']) not in result['diff']['after']
    # would_release is no failure, also when asserting.
    assert 'failed' not in result


def test_a_dirty_host_fails_naming_the_gpu_unless_told_not_to(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result, ran = action_run(gpuhost, tmp_path, timeout=3)
    assert result['failed'] is True and result['outcome'] == 'failed'
    assert result['msg'].startswith('node1 is not clean: GPU 3: 4097 MiB held with no process left'), result['msg']
    result, ran = action_run(gpuhost, tmp_path, timeout=3, assert_clean=False)
    assert 'failed' not in result and result['outcome'] == 'failed'


def test_a_wrong_option_fails_before_any_module_runs(gpuhost, tmp_path):
    job = gpuhost.hold(gpus=[0], mib=1024)
    result, ran = action_run(gpuhost, tmp_path, timeout='5s')
    assert ran == [] and alive(job['pid'])
    # Ansible names the host; the message is the same on every host with the same mistake.
    assert result['failed'] is True and result['outcome'] == 'failed'
    assert result['msg'] == "gpu_reset is misconfigured: timeout is '5s', expected a number"
    # In the role, the settings are named by the role's variables.
    result, ran = action_run(gpuhost, tmp_path, timeout='5s', role='gpuops.nvidia.gpu_reset')
    assert result['msg'] == "gpu_reset is misconfigured: gpu_reset_timeout is '5s', expected a number"


def test_a_wrong_option_fails_the_task_also_when_the_caller_judges(gpuhost, tmp_path):
    # assert_clean false leaves the verdict on the GPUs to the caller; a misconfiguration is none.
    result, ran = action_run(gpuhost, tmp_path, grace_period=-1, assert_clean=False)
    assert ran == [] and result['failed'] is True
    assert result['msg'] == 'gpu_reset is misconfigured: grace_period must be zero or more, got -1.0'


def test_a_failure_the_playbook_defers_is_recorded_not_failed(gpuhost, tmp_path):
    # reset_gpus.yml fails its hosts in its last play, so that no serial batch ends the play.
    deferred = {'gpu_reset__defer_failure': True}
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result, ran = action_run(gpuhost, tmp_path, timeout=3, task_vars=deferred)
    assert 'failed' not in result and 'msg' not in result and result['outcome'] == 'failed'
    result, ran = action_run(gpuhost, tmp_path, grace_period=-1, task_vars=deferred)
    assert ran == [] and 'failed' not in result
    assert result['reason'] == 'gpu_reset is misconfigured: grace_period must be zero or more, got -1.0'


def test_an_unknown_option_is_refused(gpuhost, tmp_path):
    with pytest.raises(AnsibleActionFail, match='timout'):
        action_run(gpuhost, tmp_path, timout=5)


def test_a_mistyped_role_variable_is_warned_about(gpuhost, tmp_path):
    result, ran = action_run(gpuhost, tmp_path, task_vars={'gpu_reset_timout': 600, 'gpu_reset_timeout': 60,
                                                           'gpu_reset_on_failure': 'fail'})
    assert result['warnings'] == [
        'node1: gpu_reset_timout is no setting of gpu_reset (a typo of gpu_reset_timeout?); it is ignored']


def test_a_modules_warning_names_the_host(gpuhost, tmp_path):
    gpuhost.fault('lost', gpu=1)
    result, ran = action_run(gpuhost, tmp_path, timeout=3)
    assert result['warnings'] and all(warning.startswith('node1: ') for warning in result['warnings'])
    assert any('could not read every GPU' in warning for warning in result['warnings']), result['warnings']


def test_the_role_s_finishing_settings_are_checked_too(gpuhost, tmp_path):
    result, ran = action_run(gpuhost, tmp_path, role='gpu_reset', task_vars={'gpu_reset_on_failure': 'reboot'})
    assert ran == [] and "gpu_reset_on_failure is 'reboot', expected one of fail, drain" in result['msg']


def test_a_mistyped_variable_with_control_characters_is_named_escaped(gpuhost, tmp_path):
    result, ran = action_run(gpuhost, tmp_path, task_vars={'gpu_reset_x\x1b[2J': 1})
    assert result['warnings'] == ['node1: gpu_reset_x\\x1b[2J is no setting of gpu_reset (a typo?); it is ignored']


def test_a_gpu_whose_xid_calls_for_a_reset_is_reset_and_the_report_says_why(gpuhost, tmp_path):
    gpuhost.fault('xid', gpu=6, code=119)
    result, ran = action_run(gpuhost, tmp_path, allow_gpu_reset=True, kernel_log=gpuhost.kernel_log)
    assert result['outcome'] == 'released' and 'failed' not in result, result
    assert result['escalation']['reasons'] == [{'index': 6, 'reasons': ['Xid 119 since the last cure']}]
    assert result['escalation']['reset_ok'] is True and result['escalation']['problems'] == []


@pytest.mark.parametrize('check_mode', [False, True])
def test_an_xid_that_calls_for_a_reboot_fails_the_host_as_the_facts_judge_it(gpuhost, tmp_path, check_mode):
    # Before: an Xid 79 in the kernel's own words left the host clean, the GPU's recovery_action
    # null, where nvidia_gpu_facts on the same host said reboot.
    gpuhost.fault('xid', gpu=1, code=79)
    result, ran = action_run(gpuhost, tmp_path, check_mode=check_mode, allow_gpu_reset=True, kernel_log=gpuhost.kernel_log)
    assert result['outcome'] == 'failed' and result['escalation'] is None, result
    # The facts read after the release call a GPU the kernel log says fell off the bus lost.
    assert 'GPU 1 lost or unreadable (the kernel log says this GPU has fallen off the bus)' in result['reason']
    assert [(gpu['index'], gpu['recovery_action']) for gpu in result['gpus'] if gpu['index'] in (0, 1)] == [
        (0, 'none'), (1, 'reboot')]
    assert 'probe' not in result


def test_an_xid_that_calls_for_a_reset_fails_the_host_where_resets_are_not_allowed(gpuhost, tmp_path):
    gpuhost.fault('xid', gpu=6, code=119)
    result, ran = action_run(gpuhost, tmp_path, kernel_log=gpuhost.kernel_log)
    assert result['outcome'] == 'failed' and result['escalation'] is None, result
    assert 'GPU 6 needs a GPU reset (Xid 119 since the last cure; set gpu_reset_allow_gpu_reset to allow it)' \
        in result['reason']
    assert [gpu['recovery_action'] for gpu in result['gpus'] if gpu['index'] == 6] == ['reset_gpu']


def test_a_fabric_that_does_not_come_back_fails_the_host(gpuhost, tmp_path):
    gpuhost.fault('fabric', value='on', seconds=0.2)
    gpuhost.fault('fabric', gpu=3, value='stuck')
    gpuhost.fault('stuck', gpu=3, mib=4096)
    result, ran = action_run(gpuhost, tmp_path, allow_gpu_reset=True, timeout=6)
    assert result['failed'] is True and result['outcome'] == 'failed'
    assert 'GPU 3: the NVLink fabric is not back after the GPU reset (state In Progress' in result['msg'], result['msg']
    assert result['escalation']['fabric'][0]['ok'] is False
