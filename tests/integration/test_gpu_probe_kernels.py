# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_gpu_probe's kernels, through the ansible CLI against gpusim's libcuda.so.1: a flipped bit
in the middle of the probed memory, a JIT error, a launch failure and a kernel that never ran each
fail their GPU alone, named; the memory level checks all free memory."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from adhoc import run_module

MIB = 1024 * 1024


@pytest.fixture
def cudahost(gpuhost):
    gpuhost.install_cuda()
    return gpuhost


def run_probe(host, **options):
    args = dict(nvidia_smi_path=host.smi_path, backend='nvidia-smi', host_root=host.root, timeout=60)
    args.update(options)
    return run_module('nvidia_gpu_probe', args, env=host.env(cuda=True))


def by_index(result):
    return dict((gpu['index'], gpu) for gpu in result['gpus'])


def only_failed(result, index):
    """The failing GPU's result, once it is shown to be the only one that failed."""
    gpus = by_index(result)
    assert [i for i, gpu in sorted(gpus.items()) if not gpu['ok']] == [index], result.get('msg')
    assert result['msg'].startswith('the allocation probe failed on 1 of %d GPUs: GPU %d (' % (len(gpus), index))
    return gpus[index]


def test_a_clean_host_passes_with_the_kernels(cudahost):
    result, proc = run_probe(cudahost, gpus=[0, 5], probe_mib=256)
    assert proc.returncode == 0, proc.stdout
    assert [(gpu['ok'], gpu['mib'], gpu['released']) for gpu in result['gpus']] == [(True, 256, True)] * 2


def test_a_bit_flipped_in_the_middle_fails_that_gpu_only(cudahost):
    cudahost.fault('cuda-flip', gpu=2, offset=512 * MIB + 12345, bit=7)
    result, proc = run_probe(cudahost)
    assert result['failed'], proc.stdout
    gpu = only_failed(result, 2)
    assert (gpu['error_name'], gpu['call'], gpu['released']) == ('PROBE_MISMATCH', None, True)
    assert 'the first at byte %d of the 1024 MiB probed' % (512 * MIB + 12344) in gpu['error_string']
    assert 'GPU 2 (%s): PROBE_MISMATCH' % cudahost.state['gpus'][2]['pci_bus_id'] in result['msg']


@pytest.mark.parametrize('fault, call, name', [
    (dict(kind='cuda-jit', code='CUDA_ERROR_UNSUPPORTED_PTX_VERSION'), 'cuModuleLoadDataEx',
     'CUDA_ERROR_UNSUPPORTED_PTX_VERSION'),
    (dict(kind='cuda-jit', code='CUDA_ERROR_INVALID_PTX'), 'cuModuleLoadDataEx', 'CUDA_ERROR_INVALID_PTX'),
    (dict(kind='cuda-launch', code='CUDA_ERROR_LAUNCH_FAILED'), 'cuCtxSynchronize', 'CUDA_ERROR_LAUNCH_FAILED'),
    (dict(kind='cuda-idle', value=True), None, 'PROBE_KERNEL_NOT_RUN'),
])
def test_a_kernel_fault_is_named_on_its_gpu(cudahost, fault, call, name):
    cudahost.fault(fault.pop('kind'), gpu=6, **fault)
    result, proc = run_probe(cudahost, gpus=[1, 6], probe_mib=64)
    assert result['failed'], proc.stdout
    gpu = only_failed(result, 6)
    assert (gpu["call"], gpu["error_name"]) == (call, name), gpu["error_string"]
    if call == 'cuModuleLoadDataEx':
        assert "the probe's PTX is ISA 7.0 for sm_50" in gpu['error_string'] and 'CUDA 12.4' in gpu['error_string']


def test_the_memory_level_checks_all_free_memory(cudahost):
    # A flip 100 GiB in: beyond the default allocation, inside the free memory of an H200.
    cudahost.fault('cuda-flip', gpu=3, offset=100 * 1024 * MIB)
    result, proc = run_probe(cudahost, gpus=[3, 4])
    assert proc.returncode == 0, proc.stdout
    result, proc = run_probe(cudahost, gpus=[3, 4], probe_level='memory')
    assert result['failed'], proc.stdout
    gpus = by_index(result)
    assert gpus[3]['error_name'] == 'PROBE_MISMATCH'
    free = 143771 - 515 - 1  # total, reserved, the idle reading
    # All that is free once the probe's counts are allocated (1 MiB in gpusim), but the 256 MiB margin.
    assert (gpus[4]['ok'], gpus[4]['mib'], gpus[4]['released']) == (True, free - 1 - 256, True)


def test_an_unknown_level_is_refused(cudahost):
    result, proc = run_probe(cudahost, probe_level='everything')
    assert result['failed'] and 'probe_level' in result['msg'] and 'allocation, memory' in result['msg']
