# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The allocation probe's child: the CUDA driver API (libcuda.so.1, installed with every NVIDIA
driver) through ctypes, one thread and one context per GPU.

_probe runs this file's source as a program (python -c) in a process of its own, bounded by a
deadline: a cuInit or a context creation that hangs in the driver cannot be interrupted from
Python, and killing the process frees every context it made. Standard library only, so the
child starts in milliseconds. It reads a JSON request (argv[1]) and prints one JSON object.

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
# What the probe writes into every 32-bit word of its allocation: alternating bits, so that a
# stuck bit of either value shows, and not a value freshly freed memory often holds (0, ~0).
PATTERN = 0xA5C35A3C
# Read back at each end of the allocation: enough to see the pattern land across many pages,
# small enough to cost nothing (two copies of 1 MiB).
READBACK_BYTES = 1024 * 1024
MIB = 1024 * 1024

# Entry point -> (argument types); every one returns a CUresult (an int).
SIGNATURES = {
    'cuInit': (ctypes.c_uint,),
    'cuDeviceGetByPCIBusId': (ctypes.POINTER(ctypes.c_int), ctypes.c_char_p),
    'cuCtxCreate_v2': (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int),
    'cuMemAlloc_v2': (ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t),
    'cuMemsetD32_v2': (ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t),
    'cuMemcpyDtoH_v2': (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t),
    'cuMemFree_v2': (ctypes.c_uint64,),
    'cuCtxDestroy_v2': (ctypes.c_void_p,),
    'cuGetErrorName': (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    'cuGetErrorString': (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


class LibraryError(Exception):
    """libcuda.so.1 cannot be loaded, or lacks an entry point the probe calls."""


class CudaError(Exception):
    """A CUDA call returned an error: the call and its CUresult."""

    def __init__(self, call, code):
        super(CudaError, self).__init__(call, code)
        self.call = call
        self.code = code


class Cuda:
    """The entry points of libcuda.so.1 the probe calls, each checked: an error raises CudaError."""

    def __init__(self, library=LIBRARY):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise LibraryError('%s cannot be loaded (%s): no NVIDIA driver installed, or its library '
                               'is not on the loader path' % (library, exc))
        self.functions = {}
        for name, argtypes in SIGNATURES.items():
            try:
                function = getattr(self.lib, name)
            except AttributeError:
                raise LibraryError('%s has no %s: not an NVIDIA driver library, or one too old for the '
                                   'probe' % (library, name))
            function.argtypes = argtypes
            function.restype = ctypes.c_int
            self.functions[name] = function

    def call(self, name, *args):
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
    return dict(ok=False, call=exc.call, error_code=exc.code, error_name=name, error_string=text)


def check_pattern(buffer):
    """None when every word read back is the pattern, else the error fields of a mismatch. The
    words are compared as bytes (in C): a loop over them in Python would hold the interpreter
    lock for milliseconds per GPU and serialise the GPUs' threads."""
    if bytes(buffer) == struct.pack('=I', PATTERN) * len(buffer):
        return None
    for offset, word in enumerate(buffer):
        if word != PATTERN:
            return dict(ok=False, call='cuMemcpyDtoH_v2', error_code=None, error_name='PATTERN_MISMATCH',
                        error_string='read back 0x%08x at word %d, wrote 0x%08x' % (word, offset, PATTERN))
    return None


class GpuProbe:
    """One GPU's probe: context, allocate, write the pattern, read both ends back, free, destroy."""

    def __init__(self, cuda, gpu, mib):
        self.cuda = cuda
        self.gpu = gpu
        self.size = mib * MIB
        self.context = ctypes.c_void_p()
        self.pointer = ctypes.c_uint64()

    def run(self):
        started = time.monotonic()
        result = dict(index=self.gpu.get('index'), pci_bus_id=self.gpu['pci_bus_id'], ok=True, call=None,
                      error_code=None, error_name=None, error_string=None, mib=0)
        try:
            result.update(self._steps(result))
        except CudaError as exc:
            result.update(failure(self.cuda, exc))
        result.update(self._teardown(result))
        result['ms'] = round((time.monotonic() - started) * 1000.0, 3)
        return result

    def _steps(self, result):
        device = ctypes.c_int()
        self.cuda.call('cuDeviceGetByPCIBusId', ctypes.byref(device), self.gpu['pci_bus_id'].encode('ascii'))
        self.cuda.call('cuCtxCreate_v2', ctypes.byref(self.context), 0, device)
        self.cuda.call('cuMemAlloc_v2', ctypes.byref(self.pointer), self.size)
        result['mib'] = self.size // MIB
        self.cuda.call('cuMemsetD32_v2', self.pointer, PATTERN, self.size // 4)
        return self._read_back() or {}

    def _read_back(self):
        length = min(READBACK_BYTES, self.size)
        for offset in sorted(set([0, self.size - length])):
            buffer = (ctypes.c_uint32 * (length // 4))()
            self.cuda.call('cuMemcpyDtoH_v2', buffer, self.pointer.value + offset, length)
            mismatch = check_pattern(buffer)
            if mismatch:
                return mismatch
        return None

    def _teardown(self, result):
        """Free and destroy what was made; a failure here fails a probe that had passed."""
        outcome = {}
        for name, handle in (('cuMemFree_v2', self.pointer), ('cuCtxDestroy_v2', self.context)):
            if handle.value:
                try:
                    self.cuda.call(name, handle)
                except CudaError as exc:
                    outcome = outcome or (failure(self.cuda, exc) if result['ok'] else {})
        return outcome


def probe_all(request):
    """Probe every GPU of the request in parallel; the answer the child prints."""
    answer = dict(pid=os.getpid(), library_error=None, init=None, gpus=[])
    try:
        cuda = Cuda(request.get('library') or LIBRARY)
    except LibraryError as exc:
        answer['library_error'] = str(exc)
        return answer
    try:
        cuda.call('cuInit', 0)
    except CudaError as exc:
        answer['init'] = failure(cuda, exc)
        return answer
    probes = [GpuProbe(cuda, gpu, int(request['mib'])) for gpu in request['gpus']]
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
                                 call=None, error_code=None, error_name='PROBE_ERROR', mib=0, ms=None,
                                 error_string='%s: %s' % (type(exc).__name__, exc))


def main(argv=None):
    argv = sys.argv if argv is None else argv
    sys.stdout.write(json.dumps(probe_all(json.loads(argv[1]))) + '\n')
    sys.stdout.flush()


if __name__ == '__main__':
    main()
