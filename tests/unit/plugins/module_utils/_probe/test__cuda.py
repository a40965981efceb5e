# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import ctypes.util
import threading

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.cuda import MIB, Cuda, CudaError, GpuProbe, LibraryError

NAMES = {2: ('CUDA_ERROR_OUT_OF_MEMORY', 'out of memory'), 214: ('CUDA_ERROR_ECC_UNCORRECTABLE', 'uncorrectable ECC'),
         222: ('CUDA_ERROR_UNSUPPORTED_PTX_VERSION', 'the provided PTX was compiled with an unsupported toolchain.')}
GIB = 1024 * MIB


def parameters(params, count):
    return [ctypes.cast(params[n], ctypes.POINTER(ctypes.c_uint64)).contents.value for n in range(count)]


class FakeCuda:
    """Stands for Cuda: calls succeed unless failing names them (name -> CUresult). Its kernels
    count as the probe's do on a sound GPU (every word written, every word read back the same),
    but for `mismatches` (word indexes of a chunk that read back different) and `idle` (kernel
    names whose launches do nothing). The free memory is `free`; the JIT's log is `log`. What one
    probe made is its thread's (probes of several GPUs run at once)."""

    def __init__(self, failing=None, mismatches=(), idle=(), free=80 * GIB, log=b''):
        self.failing = failing or {}
        self.mismatches, self.idle, self.free, self.log = list(mismatches), set(idle), free, log
        self.calls = []
        self.mine = threading.local()

    def __getattr__(self, name):
        if name in ('launches', 'sizes', 'image', 'counts'):
            return getattr(self.mine, name)
        raise AttributeError(name)

    def call(self, name, *args):
        self.calls.append(name)
        if not hasattr(self.mine, 'sizes'):
            self.mine.launches, self.mine.sizes, self.mine.image, self.mine.counts = [], {}, None, None
        if name in self.failing:
            if name == 'cuModuleLoadDataEx':
                ctypes.memmove(args[4][0], self.log, len(self.log))
            raise CudaError(name, self.failing[name])
        handler = getattr(self, '_' + name, None)
        if handler:
            handler(*args)

    def _cuCtxCreate_v2(self, context, *dummy):
        context._obj.value = 0x1000

    def _cuDriverGetVersion(self, version):
        version._obj.value = 12040

    def _cuModuleLoadDataEx(self, module, image, *dummy):
        module._obj.value, self.mine.image = 0x2000, image

    def _cuModuleGetFunction(self, function, module, name):
        function._obj.value = 0x3000 + _cuda.KERNELS.index(name.decode())

    def _cuMemGetInfo_v2(self, free, total):
        free._obj.value, total._obj.value = self.free, 80 * GIB

    def _cuMemAlloc_v2(self, pointer, size):
        pointer._obj.value = (len(self.sizes) + 1) << 40
        self.sizes[pointer._obj.value] = size

    def _cuMemcpyHtoD_v2(self, dst, src, size):
        self.mine.counts = list(src)

    def _cuLaunchKernel(self, kernel, *args):
        name = _cuda.KERNELS[kernel.value - 0x3000]
        data, words, seed, result = parameters(args[8], 4)
        self.launches.append((name, data, words, args[0] * args[3]))
        if name in self.idle:
            return
        slot = (result - list(self.sizes)[0]) // 8
        self.counts[slot + (2 if name == 'gpuops_fill' else 3)] += words
        bad = [index for index in self.mismatches if index < words] if name == 'gpuops_check' else []
        if bad:
            self.counts[slot] += len(bad)
            self.counts[slot + 1] = min(bad)

    def _cuMemcpyDtoH_v2(self, dst, src, size):
        for n, value in enumerate(self.counts):
            dst[n] = value

    def describe(self, code):
        return NAMES.get(code, ('CUresult %d' % code, None))


GPU = dict(index=3, pci_bus_id='00000000:5D:00.0')
TEARDOWN = ['cuMemFree_v2', 'cuMemFree_v2', 'cuModuleUnload', 'cuCtxDestroy_v2']


def test_a_probe_runs_the_fill_and_check_kernels_over_every_word_and_tears_down():
    cuda = FakeCuda()
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['ok'], result['mib'], result['index'], result['pci_bus_id']) == (True, 4, 3, '00000000:5D:00.0')
    assert (result['level'], result['kernel'], result['bytes_checked']) == ('allocation', True, 4 * MIB)
    assert cuda.calls == ['cuDeviceGetByPCIBusId', 'cuCtxCreate_v2', 'cuModuleLoadDataEx', 'cuModuleGetFunction',
                          'cuModuleGetFunction', 'cuMemAlloc_v2', 'cuMemAlloc_v2', 'cuMemcpyHtoD_v2', 'cuLaunchKernel',
                          'cuLaunchKernel', 'cuCtxSynchronize', 'cuMemcpyDtoH_v2'] + TEARDOWN
    data = list(cuda.sizes)[1]
    # Both kernels over the whole allocation (1 Mi words), enough threads to run at bandwidth.
    assert cuda.launches == [('gpuops_fill', data, MIB, 1024 * 256), ('gpuops_check', data, MIB, 1024 * 256)]
    assert cuda.image == _cuda.PTX.encode('ascii') and result['ms'] >= 0 and result['kernel_ms'] >= 0


def test_a_failed_allocation_destroys_the_context_and_names_the_error():
    cuda = FakeCuda(failing={'cuMemAlloc_v2': 2})
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['ok'], result['call'], result['error_name'], result['error_string'], result['mib']) == (
        False, 'cuMemAlloc_v2', 'CUDA_ERROR_OUT_OF_MEMORY', 'out of memory', 0)
    assert cuda.calls[-2:] == ['cuModuleUnload', 'cuCtxDestroy_v2'] and 'cuMemFree_v2' not in cuda.calls
    assert 'cuLaunchKernel' not in cuda.calls and result['kernel'] is False


def test_an_ecc_error_reading_the_counts_back_still_frees():
    cuda = FakeCuda(failing={'cuMemcpyDtoH_v2': 214})
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['call'], result['error_code'], result['kernel']) == ('cuMemcpyDtoH_v2', 214, False)
    assert cuda.calls[-4:] == TEARDOWN


def test_a_word_read_back_different_in_the_middle_fails_with_its_offset():
    result = GpuProbe(FakeCuda(mismatches=[512 * 1024 + 3]), GPU, 4).run()
    assert (result['ok'], result['error_name'], result['call'], result['kernel']) == (False, 'PROBE_MISMATCH', None, True)
    assert result['error_string'] == ('1 of the 1048576 words written read back different; the first at byte %d of '
                                      'the 4 MiB probed' % (4 * (512 * 1024 + 3)))


@pytest.mark.parametrize('idle', ['gpuops_fill', 'gpuops_check'])
def test_a_kernel_that_did_not_run_fails(idle):
    result = GpuProbe(FakeCuda(idle=[idle]), GPU, 4).run()
    assert (result['ok'], result['error_name'], result['kernel'], result['bytes_checked']) == (
        False, 'PROBE_KERNEL_NOT_RUN', False, 0)
    assert 'a kernel did not run' in result['error_string']


def test_a_jit_failure_names_the_ptx_the_driver_and_the_log():
    log = b"ptxas application ptx input, line 1; fatal   : Unsupported .version 7.0; current version is '6.4'"
    cuda = FakeCuda(failing={'cuModuleLoadDataEx': 222}, log=log)
    result = GpuProbe(cuda, GPU, 4).run()
    assert (result['call'], result['error_name'], result['error_code']) == (
        'cuModuleLoadDataEx', 'CUDA_ERROR_UNSUPPORTED_PTX_VERSION', 222)
    assert result['error_string'] == (
        "the provided PTX was compiled with an unsupported toolchain.; the probe's PTX is ISA 7.0 for sm_50, which "
        "drivers for CUDA 11.0 and newer compile; this driver is for CUDA 12.4; the JIT said: ptxas application ptx "
        "input, line 1; fatal : Unsupported .version 7.0; current version is '6.4'")
    assert cuda.calls[-1] == 'cuCtxDestroy_v2' and 'cuModuleUnload' not in cuda.calls


def test_the_memory_level_checks_all_that_is_free_but_the_margin_in_chunks():
    cuda = FakeCuda(free=10 * GIB)
    result = GpuProbe(cuda, GPU, 4, level='memory').run()
    assert (result['ok'], result['level'], result['kernel']) == (True, 'memory', True)
    assert result['mib'] == 10 * 1024 - _cuda.MEMORY_MARGIN_MIB
    assert result['bytes_checked'] == result['mib'] * MIB
    sizes = [size // MIB for size in list(cuda.sizes.values())[1:]]
    assert sizes == [4096, 4096, 10 * 1024 - 256 - 8192]
    # Every chunk filled, then every chunk checked.
    assert [name for name, data, words, threads in cuda.launches] == ['gpuops_fill'] * 3 + ['gpuops_check'] * 3
    assert cuda.calls.count('cuMemFree_v2') == 4


def test_a_mismatch_in_a_later_chunk_is_placed_in_the_whole():
    cuda = FakeCuda(free=10 * GIB, mismatches=[1000])
    result = GpuProbe(cuda, GPU, 4, level='memory').run()
    assert result['error_name'] == 'PROBE_MISMATCH'
    assert 'the first at byte 4000 of the %d MiB probed' % (10 * 1024 - 256) in result['error_string']


def test_the_memory_level_with_nothing_free_fails():
    result = GpuProbe(FakeCuda(free=100 * MIB), GPU, 4, level='memory').run()
    assert (result['ok'], result['error_name'], result['mib']) == (False, 'PROBE_NO_FREE_MEMORY', 0)


def test_an_allocation_the_memory_level_cannot_make_says_how_far_it_got():
    cuda = FakeCuda(free=10 * GIB)
    real = cuda._cuMemAlloc_v2

    def third_fails(pointer, size):
        if len(cuda.sizes) == 3:
            raise CudaError('cuMemAlloc_v2', 2)
        real(pointer, size)

    cuda._cuMemAlloc_v2 = third_fails
    result = GpuProbe(cuda, GPU, 4, level='memory').run()
    assert result['error_string'] == 'out of memory; after 8192 of the 9984 MiB the driver called free (less 256 MiB)'


@pytest.mark.parametrize('free, chunks', [
    (0, []),
    (256 * MIB, []),
    (257 * MIB + 5, [1]),
    (80 * GIB, [4096] * 19 + [81920 - 256 - 19 * 4096]),
    # More than MAX_CHUNKS chunks of CHUNK_MIB: larger chunks.
    (1024 * GIB, [16380] * 64),
])
def test_chunk_sizes(free, chunks):
    assert [size // MIB for size in _cuda.chunk_sizes(free)] == chunks
    assert sum(_cuda.chunk_sizes(free)) == max(0, free - 256 * MIB) // MIB * MIB


def test_an_unknown_level_is_a_probe_error(monkeypatch):
    monkeypatch.setattr(_cuda, 'Cuda', lambda library, signatures=None: FakeCuda())
    found = _cuda.probe_all(dict(mib=4, level='everything', gpus=[GPU]))
    assert found['gpus'][0]['error_name'] == 'PROBE_ERROR'
    assert "unknown probe level 'everything'" in found['gpus'][0]['error_string']


def test_a_failed_teardown_fails_a_probe_that_had_passed():
    result = GpuProbe(FakeCuda(failing={'cuCtxDestroy_v2': 999}), GPU, 4).run()
    assert (result['ok'], result['call'], result['error_name']) == (False, 'cuCtxDestroy_v2', 'CUresult 999')


def test_unexpected_errors_in_a_thread_become_a_result(monkeypatch):
    class Broken(GpuProbe):
        def run(self):
            raise ValueError('bad bus id')

    monkeypatch.setattr(_cuda, 'Cuda', lambda library, signatures=None: FakeCuda())
    monkeypatch.setattr(_cuda, 'GpuProbe', Broken)
    found = _cuda.probe_all(dict(mib=4, gpus=[GPU]))
    assert (found['gpus'][0]['error_name'], found['gpus'][0]['error_string']) == ('PROBE_ERROR', 'ValueError: bad bus id')


def test_probe_all_probes_each_gpu_in_its_own_thread(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(_cuda, 'Cuda', lambda library, signatures=None: cuda)
    gpus = [dict(index=n, pci_bus_id='00000000:%02X:00.0' % n) for n in range(4)]
    found = _cuda.probe_all(dict(mib=4, gpus=gpus))
    assert [g['index'] for g in found['gpus']] == [0, 1, 2, 3] and all(g['ok'] for g in found['gpus'])
    assert cuda.calls.count('cuCtxCreate_v2') == 4 and cuda.calls[0] == 'cuInit'


def test_cuinit_failure_is_the_answer(monkeypatch):
    monkeypatch.setattr(_cuda, 'Cuda', lambda library, signatures=None: FakeCuda(failing={'cuInit': 2}))
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
