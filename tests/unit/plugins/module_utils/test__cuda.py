# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import ctypes.util

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _cuda
from ansible_collections.gpuops.nvidia.plugins.module_utils._cuda import Cuda, CudaError, GpuProbe, LibraryError

NAMES = {2: ('CUDA_ERROR_OUT_OF_MEMORY', 'out of memory'), 214: ('CUDA_ERROR_ECC_UNCORRECTABLE', 'uncorrectable ECC')}


class FakeCuda:
    """Stands for Cuda: calls succeed unless failing names them (name -> CUresult); memory reads
    back what was written, or `readback` when set."""

    def __init__(self, failing=None, readback=None):
        self.failing = failing or {}
        self.readback = readback
        self.calls = []
        self.pattern = None

    def call(self, name, *args):
        self.calls.append(name)
        if name in self.failing:
            raise CudaError(name, self.failing[name])
        if name == 'cuCtxCreate_v2':
            args[0]._obj.value = 0x1000
        elif name == 'cuMemAlloc_v2':
            args[0]._obj.value = 1 << 40
        elif name == 'cuMemsetD32_v2':
            self.pattern = args[1]
        elif name == 'cuMemcpyDtoH_v2':
            for n in range(len(args[0])):
                args[0][n] = self.pattern if self.readback is None else self.readback

    def describe(self, code):
        return NAMES.get(code, ('CUresult %d' % code, None))


GPU = dict(index=3, pci_bus_id='00000000:5D:00.0')


def test_a_probe_makes_writes_reads_both_ends_and_tears_down():
    cuda = FakeCuda()
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['ok'], result['mib'], result['index'], result['pci_bus_id']) == (True, 4, 3, '00000000:5D:00.0')
    assert cuda.calls == ['cuDeviceGetByPCIBusId', 'cuCtxCreate_v2', 'cuMemAlloc_v2', 'cuMemsetD32_v2',
                          'cuMemcpyDtoH_v2', 'cuMemcpyDtoH_v2', 'cuMemFree_v2', 'cuCtxDestroy_v2']
    assert cuda.pattern == _cuda.PATTERN and result['ms'] >= 0


def test_a_failed_allocation_destroys_the_context_and_names_the_error():
    cuda = FakeCuda(failing={'cuMemAlloc_v2': 2})
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['ok'], result['call'], result['error_name'], result['error_string'], result['mib']) == (
        False, 'cuMemAlloc_v2', 'CUDA_ERROR_OUT_OF_MEMORY', 'out of memory', 0)
    assert cuda.calls[-1] == 'cuCtxDestroy_v2' and 'cuMemFree_v2' not in cuda.calls


def test_an_ecc_error_reading_back_still_frees():
    cuda = FakeCuda(failing={'cuMemcpyDtoH_v2': 214})
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['call'], result['error_code']) == ('cuMemcpyDtoH_v2', 214)
    assert cuda.calls[-2:] == ['cuMemFree_v2', 'cuCtxDestroy_v2']


def test_a_pattern_that_does_not_come_back_fails():
    result = GpuProbe(FakeCuda(readback=0), GPU, 4).run()
    assert (result['ok'], result['error_name']) == (False, 'PATTERN_MISMATCH')
    assert result['error_string'] == 'read back 0x00000000 at word 0, wrote 0x%08x' % _cuda.PATTERN


def test_a_failed_teardown_fails_a_probe_that_had_passed():
    result = GpuProbe(FakeCuda(failing={'cuCtxDestroy_v2': 999}), GPU, 4).run()
    assert (result['ok'], result['call'], result['error_name']) == (False, 'cuCtxDestroy_v2', 'CUresult 999')


def test_unexpected_errors_in_a_thread_become_a_result(monkeypatch):
    class Broken(GpuProbe):
        def run(self):
            raise ValueError('bad bus id')

    monkeypatch.setattr(_cuda, 'Cuda', lambda library: FakeCuda())
    monkeypatch.setattr(_cuda, 'GpuProbe', Broken)
    found = _cuda.probe_all(dict(mib=4, gpus=[GPU]))
    assert (found['gpus'][0]['error_name'], found['gpus'][0]['error_string']) == ('PROBE_ERROR', 'ValueError: bad bus id')


def test_probe_all_probes_each_gpu_in_its_own_thread(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(_cuda, 'Cuda', lambda library: cuda)
    gpus = [dict(index=n, pci_bus_id='00000000:%02X:00.0' % n) for n in range(4)]
    found = _cuda.probe_all(dict(mib=4, gpus=gpus))
    assert [g['index'] for g in found['gpus']] == [0, 1, 2, 3] and all(g['ok'] for g in found['gpus'])
    assert cuda.calls.count('cuCtxCreate_v2') == 4 and cuda.calls[0] == 'cuInit'


def test_cuinit_failure_is_the_answer(monkeypatch):
    monkeypatch.setattr(_cuda, 'Cuda', lambda library: FakeCuda(failing={'cuInit': 2}))
    found = _cuda.probe_all(dict(mib=4, gpus=[GPU]))
    assert found['gpus'] == [] and found['init']['call'] == 'cuInit'


def test_a_library_that_is_not_there_is_said():
    with pytest.raises(LibraryError, match=r'^libcuda-none\.so\.1 cannot be loaded \('):
        Cuda('libcuda-none.so.1')
    assert _cuda.probe_all(dict(library='libcuda-none.so.1', mib=4, gpus=[GPU]))['library_error']


def test_a_library_without_the_entry_points_is_said():
    libc = ctypes.util.find_library('c')
    with pytest.raises(LibraryError, match=r'has no cu[A-Za-z_0-9]+: not an NVIDIA driver library'):
        Cuda(libc)
