# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The NVML backend: reads the GPUs through nvidia-ml-py (pynvml), with a deadline.

It produces the same facts as the nvidia-smi backend (field names, units, nulls, and the
error text nvidia-smi prints for a GPU it cannot read), so callers cannot tell them apart.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import os
import threading
import traceback

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    CALL_FLOOR_S, EXIT_CODES, UNREPORTED_PROCESS_NAMES, DriverHung, GpuopsError, PermanentReadError, check_time_left)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import nvml_read
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import driver_hung
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import how_stuck, in_driver, process_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import normalize_bus_id
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import (
    DRIVER_RECOVERY_ACTIONS,
    RESET_REQUIRED_TEXT,
    GpuReader,
    Snapshot,
    driver_error,
    light_base,
    light_gpu,
    recovery_verdict,
)

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

HAS_PYNVML = pynvml is not None

# Where this process's threads are listed: an NVML call past its deadline is read there (its
# thread's state, wchan and kernel stack), so that one hung in the driver is driver_hung.
TASKS = '/proc/self/task'

MIB = 1024 * 1024

# NVML return codes (nvml.h, nvmlReturn_t); fixed by the ABI, so not looked up in pynvml.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
# The return codes that mean "does not apply to this GPU" (nvidia-smi prints [N/A] or
# [Not Supported]): the value is null. Every other code is the driver's verdict on the GPU.
NOT_APPLICABLE_CODES = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)
# nvidia-smi's words for the codes that are a verdict (its cells say [GPU requires reset], ...).
VERDICT_WORDS = {NVML_ERROR_RESET_REQUIRED: RESET_REQUIRED_TEXT, NVML_ERROR_NO_PERMISSION: 'Insufficient Permissions',
                 NVML_ERROR_UNKNOWN: 'Unknown Error'}
# nvmlDeviceGetFieldValues field id of the driver's GPU Recovery Action (drivers 565 and later;
# see _reader.DRIVER_RECOVERY_ACTIONS). Fixed by the ABI, like the return codes.
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

# nvmlComputeMode_t -> the name nvidia-smi prints.
COMPUTE_MODES = {0: 'Default', 1: 'Exclusive_Thread', 2: 'Prohibited', 3: 'Exclusive_Process'}

# What nvidia-smi prints for a GPU whose device handle it cannot get; the NVML reader prints
# the same, so that the facts do not depend on the backend.
HANDLE_ERROR = 'Unable to determine the device handle for GPU%s: %s'
GPU_LOST_TEXT = 'GPU is lost.  Reboot the system to recover this GPU'

# Where the kernel driver lists the GPUs it has attached, one directory per PCI bus id.
PROC_DRIVER_GPUS = '/proc/driver/nvidia/gpus'

GPU_FACTS = ('index', 'uuid', 'name', 'pci_bus_id', 'memory_total_mib', 'memory_used_mib',
             'memory_free_mib', 'utilization_gpu_pct', 'temperature_c', 'persistence_mode',
             'compute_mode', 'remapped_rows_pending', 'remapped_rows_failure',
             'retired_pages_pending', 'memory_reserved_mib', 'driver_recovery_action')

# The running-process calls, newest first; a driver's library has the ones of its time. The
# unversioned call (v1 struct) every library has is the last resort (_processes_v1).
PROCESS_CALLS = ('nvmlDeviceGetComputeRunningProcesses_v3', 'nvmlDeviceGetComputeRunningProcesses_v2')
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

MEMORY_V1_WARNING = ('NVML: %s, so memory_used_mib is NVML v1 `used`, which includes the memory the driver '
                     'reserves (memory_reserved_mib is null): idle GPUs may read hundreds of MiB used and look '
                     'like orphaned memory; raise memory_threshold_mib above their idle reading')


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t, filled by the unversioned nvmlDeviceGetComputeRunningProcesses."""
    _fields_ = [('pid', ctypes.c_uint), ('usedGpuMemory', ctypes.c_ulonglong)]


class _Process:
    def __init__(self, pid, used):
        self.pid = pid
        self.usedGpuMemory = used


class NvmlTimeout(GpuopsError):
    """An NVML call did not return within its deadline."""


class _GpuUnreadable(Exception):
    def __init__(self, error):
        Exception.__init__(self, error)
        self.error = error


def error_code(exc):
    """The NVML return code carried by a pynvml.NVMLError, or None."""
    return getattr(exc, 'value', None)


def error_text(exc):
    """nvidia-smi's wording for an NVML error."""
    if error_code(exc) == NVML_ERROR_GPU_IS_LOST:
        return GPU_LOST_TEXT
    if error_code(exc) == NVML_ERROR_RESET_REQUIRED:
        return RESET_REQUIRED_TEXT
    try:
        return str(exc)
    except Exception:  # pynvml asks the library for unknown codes; it may be gone
        return 'NVML error %s' % error_code(exc)


def describe_init_failure(exc):
    code = error_code(exc)
    # nvidia-smi's exit codes are NVML return codes (NVML_ERROR_UNKNOWN becomes 255).
    meaning = EXIT_CODES.get(255 if code == NVML_ERROR_UNKNOWN else code, 'unexpected error')
    return 'NVML could not be initialised (error %s, %s): %s' % (code, meaning, error_text(exc))


def call_with_timeout(func, timeout, what):
    """Run func() in a worker thread; return its result or raise what it raised.

    NVML calls can block inside the driver (uninterruptible) on a sick GPU, and nothing can
    cancel them: after timeout seconds the thread is abandoned (it is a daemon thread, so it
    does not keep the process alive) and NvmlTimeout is raised, or DriverHung when the thread is
    then in D state in the driver's code (TASKS). With less than a call is given
    at least, nothing is called (NoTimeLeft).
    """
    check_time_left('call NVML while %s' % what, timeout)
    outcome = {}

    def run():
        outcome['thread'] = threading.get_native_id() if hasattr(threading, 'get_native_id') else None
        try:
            outcome['value'] = func()
        except BaseException as exc:  # handed to the caller's thread
            outcome['error'] = exc

    worker = threading.Thread(target=run, name='gpuops-nvml')
    worker.daemon = True
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        stuck = process_state(outcome['thread'], TASKS) if outcome.get('thread') else None
        if stuck and in_driver(stuck):
            exc = DriverHung(driver_hung('NVML, %s,' % what, how_stuck(stuck, 'thread')))
        else:
            exc = NvmlTimeout('NVML did not answer within %.1f s while %s; the driver may be stuck on a '
                              'sick GPU' % (timeout, what))
        exc.worker = worker
        raise exc
    if 'error' in outcome:
        raise outcome['error']
    return outcome.get('value')


def driver_bus_ids(base=None):
    """PCI bus ids of the GPUs the kernel driver attached, in NVML's enumeration order."""
    try:
        names = os.listdir(base or PROC_DRIVER_GPUS)
    except OSError:
        return []
    ids = []
    for name in names:
        try:
            ids.append(normalize_bus_id(name))
        except ValueError:
            continue
    return sorted(ids)


class NvmlReader(GpuReader):
    """Reads GPU state through NVML. open() must succeed before read()."""

    backend = 'nvml'

    def __init__(self, timeout=10.0, nvml=None):
        self.nvml = nvml if nvml is not None else pynvml
        self.timeout = timeout
        self._open = False
        self._stuck = None
        # Why this library has no v2 memory call (a sentence), once found out; and the
        # process calls it lacks.
        self._no_memory_v2 = None
        self._missing_calls = set()
        # The driver's verdicts on the GPU being read ({words: [values]}), for driver_error.
        self._said = {}
        # The last full read, for light reads to build on: {index: GPU}, and its driver version.
        self._base = None
        self._base_driver = None

    def _call(self, func, timeout, what):
        if self._stuck is not None and self._stuck.is_alive():
            raise NvmlTimeout('an earlier NVML call is still stuck in the driver; not calling NVML '
                              'again (%s)' % what)
        timeout = self.timeout if timeout is None else timeout
        try:
            return call_with_timeout(func, timeout, what)
        except (NvmlTimeout, DriverHung) as exc:
            self._stuck = exc.worker
            raise

    def open(self, timeout=None):
        """nvmlInit; raise GpuopsError when NVML cannot be used."""
        if self.nvml is None:
            raise GpuopsError('the nvidia-ml-py Python library (pynvml) is not installed')
        try:
            self._call(self.nvml.nvmlInit, timeout, 'initialising NVML')
        except self.nvml.NVMLError as exc:
            if error_code(exc) in (9, 12, 18):  # driver not loaded, library not found, version mismatch
                raise PermanentReadError(describe_init_failure(exc))
            raise GpuopsError(describe_init_failure(exc))
        self._open = True
        return self

    def close(self):
        if not self._open:
            return
        self._open = False
        try:
            self._call(self.nvml.nvmlShutdown, max(min(self.timeout or 2.0, 2.0), CALL_FLOOR_S), 'shutting NVML down')
        except Exception:  # nothing left to do about a library that will not shut down
            pass

    def read(self, timeout=None, full=True):
        if not self._open:
            self.open(timeout)
        if not full and self._base is not None:
            snapshot = self._call(self._read_light, timeout, 'reading the GPUs')
            if snapshot is not None:
                return snapshot
        snapshot = self._call(self._read, timeout, 'reading the GPUs')
        self._base = light_base(snapshot) or None
        self._base_driver = snapshot.driver_version
        return snapshot

    def read_mig(self, gpus, timeout=None):
        if not self._open:
            return {}, []
        try:
            return self._call(lambda: self._read_mig(gpus), timeout, 'reading the MIG devices')
        except GpuopsError as exc:
            return {}, ['MIG devices unavailable: %s' % exc]

    def _read_mig(self, gpus):
        nv = self.nvml
        migs, warnings = {}, []
        for index in [gpu['index'] for gpu in gpus if gpu.get('index') is not None and not gpu.get('error')]:
            try:
                migs[index] = nvml_read(nv, nv.nvmlDeviceGetHandleByIndex(index), lambda mig: self._read_processes(mig)[0])
            except nv.NVMLError as exc:
                warnings.append('GPU %d: MIG devices unavailable: %s' % (index, error_text(exc)))
        return migs, warnings

    def _read_light(self):
        """Memory, utilisation and processes on top of the last full read (see GpuReader.read);
        None when NVML says anything but a plain reading of the same GPUs."""
        nv = self.nvml
        base, driver = self._base, self._base_driver
        try:
            if nv.nvmlDeviceGetCount() != len(base):
                return None
        except nv.NVMLError:
            return None
        gpus, warnings = [], []
        for index in sorted(base):
            gpu = self._light_gpu(base, index)
            if gpu is None:
                return None
            gpu['processes'], problem = self._read_processes(gpu.pop('_handle'))
            if problem:
                warnings.append('process list of GPU %d unavailable: %s' % (index, problem))
            gpus.append(gpu)
        if self._no_memory_v2:
            warnings.append(MEMORY_V1_WARNING % self._no_memory_v2)
        return Snapshot(gpus, driver, warnings, full=False)

    def _light_gpu(self, base, index):
        nv = self.nvml
        values = {}
        self._said = {}
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            self._read_memory(handle, values)
            rates = self._field(lambda: nv.nvmlDeviceGetUtilizationRates(handle), what='utilization.gpu')
        except (nv.NVMLError, _GpuUnreadable):
            return None
        values['utilization_gpu_pct'] = None if rates is None else int(rates.gpu)
        gpu = light_gpu(base, index, uuid, values, self._said)
        if gpu is not None:
            gpu['_handle'] = handle
        return gpu

    # -- the read itself, in the worker thread -------------------------------------------------
    def _read(self):
        nv = self.nvml
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise GpuopsError('NVML could not count the GPUs: %s' % error_text(exc))
        if count == 0:
            return Snapshot([], None, ['nvml: No devices were found'])
        warnings = []
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = None
        gpus = []
        for index in range(count):
            gpu = self._read_gpu(index, count)
            if gpu['error'] is None:
                gpu['processes'], problem = self._read_processes(gpu['_handle'])
                if problem:
                    warnings.append('process list of GPU %d unavailable: %s' % (index, problem))
            gpu.pop('_handle', None)
            gpus.append(gpu)
        if self._no_memory_v2:
            warnings.append(MEMORY_V1_WARNING % self._no_memory_v2)
        return Snapshot(gpus, driver, warnings)

    def _read_gpu(self, index, count):
        nv = self.nvml
        gpu = dict((fact, None) for fact in GPU_FACTS)
        gpu.update(index=index, error=None, processes=[])
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            return self._unreadable(gpu, self._fallback_bus_id(index, count), exc)
        try:
            gpu['pci_bus_id'] = normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        except nv.NVMLError as exc:
            if error_code(exc) == NVML_ERROR_GPU_IS_LOST:
                return self._unreadable(gpu, self._fallback_bus_id(index, count), exc)
        except ValueError:
            pass
        try:
            # The UUID is the identity every GPU has: when even that fails with "lost" or
            # "unknown error", the GPU is unreachable, as nvidia-smi reports it.
            gpu['uuid'] = _text(nv.nvmlDeviceGetUUID(handle))
        except nv.NVMLError as exc:
            if error_code(exc) in (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN):
                return self._unreadable(gpu, gpu['pci_bus_id'], exc)
        self._said = {}
        try:
            self._read_fields(handle, gpu)
        except _GpuUnreadable as lost:
            return self._unreadable(gpu, gpu['pci_bus_id'], lost.error)
        driver_error(gpu, self._said)
        recovery_verdict(gpu, self._recovery_action(handle))
        gpu['_handle'] = handle
        return gpu

    def _recovery_action(self, handle):
        """The driver's GPU Recovery Action (None where the driver has no such field)."""
        nv = self.nvml
        if not hasattr(nv, 'nvmlDeviceGetFieldValues'):
            return None
        values = self._field(lambda: nv.nvmlDeviceGetFieldValues(handle, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]),
                             what='gpu_recovery_action')
        if not values or values[0].nvmlReturn != 0:
            # Not supported by this driver (before 565), or not for this GPU.
            return None
        code = int(values[0].value.uiVal)
        return DRIVER_RECOVERY_ACTIONS.get(code, 'unknown')

    def _read_fields(self, handle, gpu):
        nv = self.nvml
        gpu['name'] = self._field(lambda: _text(nv.nvmlDeviceGetName(handle)), what='name')
        self._read_memory(handle, gpu)
        rates = self._field(lambda: nv.nvmlDeviceGetUtilizationRates(handle), what='utilization.gpu')
        gpu['utilization_gpu_pct'] = None if rates is None else int(rates.gpu)
        gpu['temperature_c'] = self._field(lambda: int(nv.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU)),
                                           what='temperature.gpu')
        mode = self._field(lambda: nv.nvmlDeviceGetPersistenceMode(handle), what='persistence_mode')
        gpu['persistence_mode'] = None if mode is None else bool(mode)
        compute = self._field(lambda: nv.nvmlDeviceGetComputeMode(handle), what='compute_mode')
        gpu['compute_mode'] = None if compute is None else COMPUTE_MODES.get(compute, str(compute))
        # nvidia-smi before 590 reads remapped rows with a query of their own, whose verdicts it
        # does not put beside the others: they are left out here too, so both backends agree.
        remapped = self._field(lambda: nv.nvmlDeviceGetRemappedRows(handle))
        if remapped is not None:
            gpu['remapped_rows_pending'] = bool(remapped[2])
            gpu['remapped_rows_failure'] = bool(remapped[3])
        retired = self._field(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle), what='retired_pages.pending')
        gpu['retired_pages_pending'] = None if retired is None else bool(retired)
        if hasattr(nv, 'nvmlDeviceGetMinorNumber'):
            # Checked against the driver's /proc entry by _host.apply_host, which sets minor_number.
            gpu['nvml_minor_number'] = self._field(lambda: int(nv.nvmlDeviceGetMinorNumber(handle)), what='minor_number')

    def _read_memory(self, handle, gpu):
        """Memory as nvidia-smi shows it: v2 `used` is allocated memory, `reserved` beside it.

        v1 `used` is reserved plus allocated (an idle GPU reads hundreds of MiB); it is the
        fallback for a library or binding without v2, and the read then carries a warning.
        """
        nv = self.nvml
        version = getattr(nv, 'nvmlMemory_v2', None)
        if version is None and self._no_memory_v2 is None:
            self._no_memory_v2 = 'the installed nvidia-ml-py has no nvmlMemory_v2'
        if not self._no_memory_v2:
            try:
                memory = self._field(lambda: nv.nvmlDeviceGetMemoryInfo(handle, version=version), missing=True,
                                     what='memory')
            except _FunctionMissing:
                self._no_memory_v2 = "the driver's NVML library has no nvmlDeviceGetMemoryInfo_v2 (an older driver)"
            else:
                if memory is not None:
                    gpu['memory_reserved_mib'] = memory.reserved // MIB
                    self._set_memory(gpu, memory)
                return
        memory = self._field(lambda: nv.nvmlDeviceGetMemoryInfo(handle), what='memory')
        if memory is not None:
            self._set_memory(gpu, memory)

    @staticmethod
    def _set_memory(gpu, memory):
        gpu['memory_total_mib'] = memory.total // MIB
        gpu['memory_used_mib'] = memory.used // MIB
        gpu['memory_free_mib'] = memory.free // MIB

    def _field(self, call, missing=False, what=None):
        """One query: its value, None when the driver does not report it, or _GpuUnreadable.

        A code that is the driver's verdict on the GPU (reset required, unknown error, no
        permission, ...) is kept, under what, for driver_error; the value is None."""
        nv = self.nvml
        try:
            return call()
        except nv.NVMLError as exc:
            code = error_code(exc)
            if code == NVML_ERROR_GPU_IS_LOST:
                raise _GpuUnreadable(exc)
            if missing and code == NVML_ERROR_FUNCTION_NOT_FOUND:
                raise _FunctionMissing()
            if code not in NOT_APPLICABLE_CODES and what is not None:
                words = VERDICT_WORDS.get(code) or 'NVML error %s' % code
                getattr(self, '_said', {}).setdefault(words, []).append(what)
            return None

    def _read_processes(self, handle):
        nv = self.nvml
        try:
            infos = self._running_processes(handle)
        except (nv.NVMLError, getattr(nv, 'NVMLLibraryMismatchError', ())) as exc:
            return [], error_text(exc)
        processes = []
        for info in infos:
            name = self._process_name(info.pid)
            used = info.usedGpuMemory
            processes.append({'pid': int(info.pid), 'name': name,
                              'used_memory_mib': None if used is None else int(used) // MIB})
        return processes, None

    def _running_processes(self, handle):
        """The compute processes on a GPU, through the newest call the library has."""
        nv = self.nvml
        # pynvml's unversioned call raises NVMLLibraryMismatchError (not an NVMLError) for a
        # missing _v3; the versioned calls raise NVMLError(FUNCTION_NOT_FOUND).
        mismatch = getattr(nv, 'NVMLLibraryMismatchError', ())
        for name in PROCESS_CALLS:
            call = getattr(nv, name, None)
            if call is None or name in self._missing_calls:
                continue
            try:
                return call(handle)
            except nv.NVMLError as exc:
                if error_code(exc) != NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
            except mismatch:
                pass
            self._missing_calls.add(name)
        return _processes_v1(nv, handle)

    def _process_name(self, pid):
        """The process's name; None when the driver cannot say. Bytes that are not UTF-8
        become replacement characters (pynvml decodes strictly, and raises)."""
        nv = self.nvml
        try:
            name = _text(nv.nvmlSystemGetProcessName(pid))
        except nv.NVMLError:
            return None
        except UnicodeDecodeError:
            raw = getattr(nv.nvmlSystemGetProcessName, '__wrapped__', None)
            if raw is None:
                return None
            try:
                name = _text(raw(pid))
            except (nv.NVMLError, UnicodeDecodeError):
                return None
        return None if name in UNREPORTED_PROCESS_NAMES else name

    @staticmethod
    def _unreadable(gpu, bus_id, exc):
        for fact in GPU_FACTS:
            if fact != 'index':
                gpu[fact] = None
        gpu['pci_bus_id'] = bus_id
        where = bus_id[4:] if bus_id else ' %d' % gpu['index']
        gpu['error'] = HANDLE_ERROR % (where, error_text(exc))
        gpu['reset_required'] = error_code(exc) == NVML_ERROR_RESET_REQUIRED or None
        gpu['processes'] = []
        gpu.pop('_handle', None)
        return gpu

    @staticmethod
    def _fallback_bus_id(index, count):
        # Without a handle NVML gives no bus id; the driver's own list, in the same (PCI)
        # order, does when it has exactly the GPUs NVML counts.
        ids = driver_bus_ids()
        return ids[index] if len(ids) == count else None


class _FunctionMissing(Exception):
    """The driver's NVML library does not have the function called."""


def _processes_v1(nv, handle):
    """The unversioned nvmlDeviceGetComputeRunningProcesses (nvmlProcessInfo_v1_t), which
    pynvml does not wrap any more: called through the library it loaded."""
    lookup = getattr(nv, '_nvmlGetFunctionPointer', None)
    if lookup is None:  # bindings of another kind: their own unversioned call
        return nv.nvmlDeviceGetComputeRunningProcesses(handle)
    func = lookup('nvmlDeviceGetComputeRunningProcesses')
    count = ctypes.c_uint(0)
    ret = func(handle, ctypes.byref(count), None)
    if ret == 0:
        return []
    if ret != NVML_ERROR_INSUFFICIENT_SIZE:
        raise nv.NVMLError(ret)
    # Room for processes started since the first call, as pynvml does.
    count.value = count.value * 2 + 5
    infos = (_ProcessInfoV1 * count.value)()
    ret = func(handle, ctypes.byref(count), infos)
    if ret != 0:
        raise nv.NVMLError(ret)
    return [_Process(info.pid, None if info.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else info.usedGpuMemory)
            for info in infos[:count.value]]


def _text(value):
    if isinstance(value, bytes):
        return value.decode('utf-8', 'replace')
    return value
