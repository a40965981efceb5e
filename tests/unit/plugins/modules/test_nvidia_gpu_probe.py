# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpuops.nvidia.plugins.modules import nvidia_gpu_probe


def run_module(capsys, host, check_mode=False, **args):
    """Run main() in-process; return the JSON it printed."""
    params = dict(nvidia_smi_path=host.smi_path, backend='nvidia-smi', host_root=host.root,
                  cuda_library=host.install_cuda(), _ansible_check_mode=check_mode)
    params.update(args)
    with patch_module_args(params):
        with pytest.raises(SystemExit):
            nvidia_gpu_probe.main()
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize('args, message', [
    (dict(probe_mib=0), 'probe_mib must be 1 or more, got 0'),
    (dict(timeout=-1), 'timeout must be more than 0 seconds'),
    (dict(gpus=[]), 'gpus is an empty list'),
    (dict(missing_library='ignore'), 'value of missing_library must be one of: fail, skip'),
    (dict(expected_gpus=9), 'expected_gpus: 9 GPUs expected, 8 seen'),
])
def test_bad_options_fail_cleanly(capsys, gpuhost, args, message):
    result = run_module(capsys, gpuhost, **args)
    assert result['failed'] is True and message in result['msg']
    assert 'exception' not in result and 'Traceback' not in result['msg']


@pytest.mark.parametrize('level', ['allocation', 'performance'])
def test_a_clean_host_returns_every_documented_value(capsys, gpuhost, level):
    result = run_module(capsys, gpuhost, gpus=[0, 3], probe_level=level)
    documented = yaml.safe_load(nvidia_gpu_probe.RETURN)
    assert set(result) - set(["invocation", "warnings"]) == set(documented) | set(["changed"])
    per_gpu = documented['gpus']['contains']
    assert set(result['gpus'][0]) == set(key for key, doc in per_gpu.items()
                                         if level == 'performance' or 'performance' not in doc.get('returned', ''))
    assert [(gpu['index'], gpu['ok'], gpu['released']) for gpu in result['gpus']] == [(0, True, True), (3, True, True)]


def test_check_mode_probes_nothing(capsys, gpuhost):
    result = run_module(capsys, gpuhost, check_mode=True)
    assert (result['changed'], result['probed']) == (False, False)
    assert [gpu['ok'] for gpu in result['gpus']] == [None] * 8
    assert not [rec for rec in gpuhost.ps() if rec.get('cuda')]


def test_a_failed_probe_fails_with_every_result(capsys, gpuhost):
    gpuhost.fault('cuda', gpu=1, code='CUDA_ERROR_ECC_UNCORRECTABLE')
    result = run_module(capsys, gpuhost, gpus=[0, 1])
    assert result['failed'] is True
    assert result['msg'] == ('the allocation probe failed on 1 of 2 GPUs: GPU 1 (00000000:2A:00.0): '
                             'CUDA_ERROR_ECC_UNCORRECTABLE at cuMemcpyDtoH_v2 (uncorrectable ECC error encountered)')
    assert [gpu['ok'] for gpu in result['gpus']] == [True, False]
