# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The allocation probe's child: the CUDA driver API (libcuda.so.1, installed with every NVIDIA
driver) through ctypes, one thread and one context per GPU.

_probe runs answer() in a process of its own for each GPU (forked), bounded by a deadline: a
cuInit or a context creation that hangs in the driver cannot be interrupted from Python, and
killing the process frees every context it made. Standard library only, so that it also runs as
a program of its own (python -c, a JSON request in argv[1]). The request names the library, mib,
level and gpus; the answer is one JSON object on stdout. The memory is written and checked by two kernels of the probe's own (PTX
below), on the GPU: only their counts cross the bus.

Signatures and CUresult numbers: cuda.h of CUDA 12.4 (the _v2 entry points are the ones its
macros name since CUDA 3.2).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import json
import os
import struct
import sys
import threading
import time

LIBRARY = 'libcuda.so.1'
MIB = 1024 * 1024

# What the probe covers (the option probe_level): `allocation` writes and checks probe_mib MiB,
# `memory` every MiB the driver calls free but MEMORY_MARGIN_MIB.
LEVELS = ('allocation', 'memory')
DEFAULT_LEVEL = 'allocation'
# Left unallocated at the memory level: the driver takes what a launch needs (the module's code,
# its constants) from the free memory, and a job starting at the same moment finds room for its
# context.
MEMORY_MARGIN_MIB = 256
# The memory level allocates in chunks of this (more for a GPU so large that MAX_CHUNKS would not
# cover it): an allocation that big is still one call, and a chunk tells where a mismatch was.
CHUNK_MIB = 4096
MAX_CHUNKS = 64

# The probe's own error names, where no CUDA call failed (the parent's own are in _probe).
MISMATCH = 'PROBE_MISMATCH'              # a word read back differs from what the fill kernel wrote
KERNEL_NOT_RUN = 'PROBE_KERNEL_NOT_RUN'  # the launches returned success but a kernel did not do its work
NO_FREE_MEMORY = 'PROBE_NO_FREE_MEMORY'  # the memory level found nothing free beyond its margin
PROBE_ERROR = 'PROBE_ERROR'              # anything else in the child, said in words

# The probe's kernels, written here, compiled by the driver when the module is loaded (no toolkit
# on the node). Both take (data, words, seed, result) and walk the words of [data, data + 4 * words)
# in a grid-stride loop. gpuops_fill writes each word with a value of its own address and the
# run's seed: ((address mod 2^32 XOR seed) * 0x9E3779B1 + address div 2^32) mod 2^32, so no two
# words of 4 GiB hold the same value, every bit takes both values, and memory that a fill did not
# reach holds a previous run's values, never this run's. gpuops_check reads every word back and
# compares. Each adds to the chunk's result, four 64-bit words: the mismatches, the lowest word
# index that mismatched (set to ~0 first), the words the fill wrote and the words the check read.
# The last two are the canary: they start at 0, so a launch that silently did nothing shows.
#
# .version 7.0 / .target sm_50, from the release history in NVIDIA's PTX ISA document: ISA 7.0 came
# with CUDA 11.0 (driver branch R450), so every driver for CUDA 11.0 or newer can JIT it. That is
# below the oldest driver this collection has real samples of (520.61.05, CUDA 11.8, ISA 7.8) and
# the 535 and 550 branches it names, with room for the R450/R470 long-term branches still in
# fleets. sm_50 (Maxwell) is the oldest target CUDA 12's ptxas assembles; PTX for an older target
# is compiled for any newer GPU (Volta to Hopper and on). Nothing newer is needed: global loads
# and stores, 32/64-bit integer arithmetic, red.add.u64 and red.min.u64 are all older than sm_50.
# tests/unit/plugins/module_utils/_probe/test__cuda_ptx.py assembles this text with NVIDIA's ptxas for
# sm_50 and for sm_90 (H100, H200).
PTX_VERSION = '7.0'
PTX_TARGET = 'sm_50'
PTX_SINCE_CUDA = '11.0'
KERNELS = ('gpuops_fill', 'gpuops_check')
_PTX_INDEX = '''
    ld.param.u64 %rd1, [data];
    ld.param.u64 %rd2, [words];
    ld.param.u32 %r1, [seed];
    ld.param.u64 %rd3, [result];
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %nctaid.x;
    mul.wide.u32 %rd5, %r2, %r3;
    cvt.u64.u32 %rd6, %r4;
    add.u64 %rd5, %rd5, %rd6;
    mul.wide.u32 %rd6, %r5, %r3;
    mov.u64 %rd7, 0;
    mov.u64 %rd12, 0;
    mov.u64 %rd13, -1;
    setp.ge.u64 %p1, %rd5, %rd2;
    @%p1 bra DONE;
LOOP:
    shl.b64 %rd8, %rd5, 2;
    add.u64 %rd9, %rd1, %rd8;
    cvt.u32.u64 %r6, %rd9;
    shr.u64 %rd10, %rd9, 32;
    cvt.u32.u64 %r7, %rd10;
    xor.b32 %r6, %r6, %r1;
    mul.lo.u32 %r6, %r6, 0x9E3779B1;
    add.u32 %r6, %r6, %r7;
    add.u64 %rd11, %rd4, %rd8;'''
_PTX_NEXT = '''
    add.u64 %rd7, %rd7, 1;
    add.u64 %rd5, %rd5, %rd6;
    setp.lt.u64 %p1, %rd5, %rd2;
    @%p1 bra LOOP;
DONE:'''
_PTX_ENTRY = '''
.visible .entry %s(
    .param .u64 data,
    .param .u64 words,
    .param .u32 seed,
    .param .u64 result
)
{
    .reg .pred %%p<3>;
    .reg .b32 %%r<9>;
    .reg .b64 %%rd<14>;
%s
}
'''
PTX = '.version %s\n.target %s\n.address_size 64\n' % (PTX_VERSION, PTX_TARGET) + _PTX_ENTRY % (
    'gpuops_fill', _PTX_INDEX + '''
    st.global.u32 [%rd11], %r6;''' + _PTX_NEXT + '''
    red.global.add.u64 [%rd3+16], %rd7;
    ret;''') + _PTX_ENTRY % ('gpuops_check', _PTX_INDEX + '''
    ld.global.u32 %r8, [%rd11];
    setp.ne.u32 %p2, %r8, %r6;
    @%p2 add.u64 %rd12, %rd12, 1;
    @%p2 min.u64 %rd13, %rd13, %rd5;''' + _PTX_NEXT + '''
    red.global.add.u64 [%rd3+24], %rd7;
    setp.eq.u64 %p2, %rd12, 0;
    @%p2 bra END;
    red.global.add.u64 [%rd3], %rd12;
    red.global.min.u64 [%rd3+8], %rd13;
END:
    ret;''')
# A launch: blocks of BLOCK_THREADS threads, at most GRID_BLOCKS of them (about as many threads as
# an H100 keeps resident, enough to run at memory bandwidth); the loop covers the rest.
BLOCK_THREADS = 256
GRID_BLOCKS = 1024
RESULT_WORDS = 4
# cuModuleLoadDataEx's options for the JIT's error log (CUjit_option in cuda.h).
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
JIT_LOG_BYTES = 4096
# What the child writes to stderr before each CUDA call, followed by the entry point's name.
CALLING = 'calling '

# Entry point -> (argument types); every one returns a CUresult (an int).
SIGNATURES = {
    'cuInit': (ctypes.c_uint,),
    'cuDeviceGetByPCIBusId': (ctypes.POINTER(ctypes.c_int), ctypes.c_char_p),
    'cuCtxCreate_v2': (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int),
    'cuDriverGetVersion': (ctypes.POINTER(ctypes.c_int),),
    'cuModuleLoadDataEx': (ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_uint,
                           ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)),
    'cuModuleGetFunction': (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p),
    'cuMemGetInfo_v2': (ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)),
    'cuMemAlloc_v2': (ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t),
    'cuMemcpyHtoD_v2': (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t),
    'cuLaunchKernel': (ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_void_p)),
    'cuCtxSynchronize': (),
    'cuMemcpyDtoH_v2': (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t),
    'cuMemFree_v2': (ctypes.c_uint64,),
    'cuModuleUnload': (ctypes.c_void_p,),
    'cuCtxDestroy_v2': (ctypes.c_void_p,),
    'cuGetErrorName': (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    'cuGetErrorString': (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


class LibraryError(Exception):
    """libcuda.so.1 cannot be loaded, or lacks an entry point the probe calls."""


def not_loaded(library, exc):
    """Why the driver library cannot be used, in words (the child's and the parent's)."""
    return '%s cannot be loaded (%s): no NVIDIA driver installed, or its library is not on the loader path' % (
        library, exc)


class CudaError(Exception):
    """A CUDA call returned an error: the call, its CUresult, and what the probe knows beside it."""

    def __init__(self, call, code, detail=None):
        super(CudaError, self).__init__(call, code)
        self.call = call
        self.code = code
        self.detail = detail


class Cuda:
    """The entry points of libcuda.so.1 the probe calls, each checked: an error raises CudaError."""

    def __init__(self, library=LIBRARY, signatures=None):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise LibraryError(not_loaded(library, exc))
        self.functions = {}
        for name, argtypes in (signatures or SIGNATURES).items():
            try:
                function = getattr(self.lib, name)
            except AttributeError:
                raise LibraryError('%s has no %s: not an NVIDIA driver library, or one too old for the '
                                   'probe' % (library, name))
            function.argtypes = argtypes
            function.restype = ctypes.c_int
            self.functions[name] = function

    def call(self, name, *args):
        # Said before the call: a parent that kills a hung child names the call it hung in.
        sys.stderr.write('%s%s\n' % (CALLING, name))
        sys.stderr.flush()
        code = self.functions[name](*args)
        if code != 0:
            raise CudaError(name, code)

    def describe(self, code):
        """(name, text) of a CUresult, from cuGetErrorName and cuGetErrorString."""
        return self._text('cuGetErrorName', code) or 'CUresult %d' % code, self._text('cuGetErrorString', code)

    def _text(self, name, code):
        out = ctypes.c_char_p()
        if self.functions[name](code, ctypes.byref(out)) != 0 or not out.value:
            return None
        return out.value.decode('utf-8', 'replace')


def failure(cuda, exc):
    """The fields of a failed CUDA call, for a result."""
    name, text = cuda.describe(exc.code)
    if exc.detail:
        text = '%s; %s' % (text or name, exc.detail)
    return dict(ok=False, call=exc.call, error_code=exc.code, error_name=name, error_string=text)


def chunk_sizes(free, margin=MEMORY_MARGIN_MIB * MIB):
    """The memory level's allocations, in bytes: what is free but the margin, in whole MiB, cut in
    chunks of CHUNK_MIB (larger where MAX_CHUNKS of them would not cover it)."""
    left = max(0, free - margin) // MIB * MIB
    chunk = max(CHUNK_MIB * MIB, -(-left // MAX_CHUNKS // MIB) * MIB)
    sizes = []
    while left > 0:
        sizes.append(min(chunk, left))
        left -= sizes[-1]
    return sizes


def jit_words(cuda, log):
    """What a failed module load is said with: the PTX's ISA and target, the driver's CUDA version
    (cuDriverGetVersion), and the JIT's own log."""
    version = ctypes.c_int()
    try:
        cuda.call('cuDriverGetVersion', ctypes.byref(version))
        driver = 'this driver is for CUDA %d.%d' % (version.value // 1000, version.value % 1000 // 10)
    except CudaError:
        driver = "this driver's CUDA version is unknown (cuDriverGetVersion failed)"
    words = "the probe's PTX is ISA %s for %s, which drivers for CUDA %s and newer compile; %s" % (
        PTX_VERSION, PTX_TARGET, PTX_SINCE_CUDA, driver)
    text = log.decode('utf-8', 'replace').strip() if log else ''
    return '%s; the JIT said: %s' % (words, ' '.join(text.split())[:500]) if text else words


class GpuProbe:
    """One GPU's probe: context, the probe's module (JIT-compiled by the driver), memory (probe_mib
    MiB, or all that is free at the memory level), the fill kernel over every byte of it and the
    check kernel reading every byte back, on the GPU; then only the counts are copied back. Free,
    unload and destroy whatever happens."""

    def __init__(self, cuda, gpu, mib, level=DEFAULT_LEVEL):
        self.cuda = cuda
        self.gpu = gpu
        self.level = level
        self.size = mib * MIB
        self.seed = struct.unpack('=I', os.urandom(4))[0]
        self.context = ctypes.c_void_p()
        self.module = ctypes.c_void_p()
        self.results = ctypes.c_uint64()
        self.chunks = []
        self.kernel_ms = None

    def run(self):
        started = time.monotonic()
        result = dict(index=self.gpu.get('index'), pci_bus_id=self.gpu['pci_bus_id'], ok=True, call=None,
                      error_code=None, error_name=None, error_string=None, mib=0, level=self.level, kernel=False,
                      bytes_checked=0, kernel_ms=None)
        try:
            result.update(self._steps(result))
        except CudaError as exc:
            result.update(failure(self.cuda, exc))
        result.update(self._teardown(result))
        result['ms'] = round((time.monotonic() - started) * 1000.0, 3)
        return result

    def _steps(self, result):
        if self.level not in LEVELS:
            raise ValueError('unknown probe level %r (known: %s)' % (self.level, ', '.join(LEVELS)))
        self._open()
        return self._prove(result)

    def _open(self):
        """The GPU's context, current in this thread."""
        device = ctypes.c_int()
        self.cuda.call('cuDeviceGetByPCIBusId', ctypes.byref(device), self.gpu['pci_bus_id'].encode('ascii'))
        self.cuda.call('cuCtxCreate_v2', ctypes.byref(self.context), 0, device)

    def _prove(self, result):
        """The probe's module loaded, its memory allocated, written and checked by the kernels."""
        kernels = self._load()
        self.cuda.call('cuMemAlloc_v2', ctypes.byref(self.results), MAX_CHUNKS * RESULT_WORDS * 8)
        sizes = self._sizes()
        if not sizes:
            return dict(ok=False, error_name=NO_FREE_MEMORY, error_string='no memory is free beyond the %d MiB the '
                        'memory level leaves to the driver' % MEMORY_MARGIN_MIB)
        self._allocate(sizes, result)
        return self._judge(self._run_kernels(kernels, sizes), sizes, result)

    def _load(self):
        """The probe's module, compiled by the driver's JIT; its error log goes with a failure."""
        log = ctypes.create_string_buffer(JIT_LOG_BYTES)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.addressof(log), JIT_LOG_BYTES)
        try:
            self.cuda.call('cuModuleLoadDataEx', ctypes.byref(self.module), PTX.encode('ascii'), 2, options, values)
        except CudaError as exc:
            exc.detail = jit_words(self.cuda, log.value)
            raise
        kernels = {}
        for name in KERNELS:
            kernels[name] = ctypes.c_void_p()
            self.cuda.call('cuModuleGetFunction', ctypes.byref(kernels[name]), self.module, name.encode('ascii'))
        return kernels

    def _sizes(self):
        if self.level == 'allocation':
            return [self.size]
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.cuda.call('cuMemGetInfo_v2', ctypes.byref(free), ctypes.byref(total))
        return chunk_sizes(free.value)

    def _allocate(self, sizes, result):
        for size in sizes:
            pointer = ctypes.c_uint64()
            try:
                self.cuda.call('cuMemAlloc_v2', ctypes.byref(pointer), size)
            except CudaError as exc:
                if len(sizes) > 1:
                    exc.detail = 'after %d of the %d MiB the driver called free (less %d MiB)' % (
                        result['mib'], sum(sizes) // MIB, MEMORY_MARGIN_MIB)
                raise
            self.chunks.append(pointer)
            result['mib'] += size // MIB

    def _run_kernels(self, kernels, sizes):
        """Every chunk filled, then every chunk checked (the time between lets the cache go), one
        synchronisation, the counts copied back: RESULT_WORDS per chunk."""
        counts = (ctypes.c_uint64 * (RESULT_WORDS * len(sizes)))(*([0, (1 << 64) - 1, 0, 0] * len(sizes)))
        self.cuda.call('cuMemcpyHtoD_v2', self.results, counts, ctypes.sizeof(counts))
        started = time.monotonic()
        self._launch_all(kernels, sizes)
        self.cuda.call('cuCtxSynchronize')
        self.kernel_ms = round((time.monotonic() - started) * 1000.0, 3)
        self.cuda.call('cuMemcpyDtoH_v2', counts, self.results, ctypes.sizeof(counts))
        return [tuple(counts[n:n + RESULT_WORDS]) for n in range(0, len(counts), RESULT_WORDS)]

    def _launch_all(self, kernels, sizes):
        for name in KERNELS:
            for number, (pointer, size) in enumerate(zip(self.chunks, sizes)):
                self._launch(kernels[name], pointer.value, size // 4, self.results.value + number * RESULT_WORDS * 8)

    def _launch(self, kernel, data, words, result):
        values = [ctypes.c_uint64(data), ctypes.c_uint64(words), ctypes.c_uint32(self.seed), ctypes.c_uint64(result)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(value) for value in values])
        blocks = max(1, min(GRID_BLOCKS, -(-words // BLOCK_THREADS)))
        self.cuda.call('cuLaunchKernel', kernel, blocks, 1, 1, BLOCK_THREADS, 1, 1, 0, None, params, None)

    def _judge(self, counts, sizes, result):
        """The result's fields from the chunks' counts: a kernel that did not cover its chunk first
        (it proves nothing), then the mismatches, with the first one's byte offset."""
        words = [size // 4 for size in sizes]
        short = [(n, c) for n, c in enumerate(counts) if c[2] != words[n] or c[3] != words[n]]
        if short:
            n, (dummy, dummy, written, checked) = short[0]
            return dict(ok=False, error_name=KERNEL_NOT_RUN, kernel_ms=self.kernel_ms, error_string=(
                'the launches succeeded but the fill kernel wrote %d and the check kernel read %d of the %d words of '
                'chunk %d (of %d): a kernel did not run' % (written, checked, words[n], n + 1, len(sizes))))
        fields = dict(kernel=True, bytes_checked=4 * sum(c[3] for c in counts), kernel_ms=self.kernel_ms)
        bad = [(n, c) for n, c in enumerate(counts) if c[0]]
        if bad:
            n, (dummy, first, dummy, dummy) = bad[0]
            fields.update(ok=False, error_name=MISMATCH, error_string=(
                '%d of the %d words written read back different; the first at byte %d of the %d MiB probed' % (
                    sum(c[0] for c in counts), sum(words), sum(sizes[:n]) + 4 * first, sum(sizes) // MIB)))
        return fields

    def _teardown(self, result):
        """Free, unload and destroy what was made; a failure here fails a probe that had passed."""
        outcome = {}
        handles = [('cuMemFree_v2', pointer) for pointer in reversed(self.chunks)]
        handles += [('cuMemFree_v2', self.results), ('cuModuleUnload', self.module), ('cuCtxDestroy_v2', self.context)]
        for name, handle in handles:
            if handle.value:
                try:
                    self.cuda.call(name, handle)
                except CudaError as exc:
                    outcome = outcome or (failure(self.cuda, exc) if result['ok'] else {})
        return outcome


def probe_all(request, make_probe=None, signatures=None):
    """Probe every GPU of the request in parallel; the answer the child prints. make_probe: what
    probes a GPU (GpuProbe's arguments; GpuProbe by default), with the entry points signatures."""
    answer = dict(pid=os.getpid(), library_error=None, init=None, gpus=[])
    make_probe = make_probe or GpuProbe
    try:
        cuda = Cuda(request.get('library') or LIBRARY, signatures)
    except LibraryError as exc:
        answer['library_error'] = str(exc)
        return answer
    try:
        cuda.call('cuInit', 0)
    except CudaError as exc:
        answer['init'] = failure(cuda, exc)
        return answer
    level = request.get('level') or DEFAULT_LEVEL
    probes = [make_probe(cuda, gpu, int(request['mib']), level) for gpu in request['gpus']]
    results = [None] * len(probes)
    threads = [threading.Thread(target=_store, args=(results, n, probe)) for n, probe in enumerate(probes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answer['gpus'] = results
    return answer


def _store(results, position, probe):
    try:
        results[position] = probe.run()
    except Exception as exc:  # anything but a CUDA error: said, never a traceback
        results[position] = dict(index=probe.gpu.get('index'), pci_bus_id=probe.gpu['pci_bus_id'], ok=False,
                                 call=None, error_code=None, error_name=PROBE_ERROR, mib=0, ms=None,
                                 error_string='%s: %s' % (type(exc).__name__, exc))


def answer(request):
    """The probe's child: the request's GPUs probed, the answer one JSON line on stdout."""
    sys.stdout.write(json.dumps(probe_all(request)) + '\n')
    sys.stdout.flush()


def main(argv=None):
    answer(json.loads((sys.argv if argv is None else argv)[1]))


if __name__ == '__main__':
    main()
