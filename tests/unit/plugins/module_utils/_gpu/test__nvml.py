# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The NVML reader against a stand-in for pynvml (the real bindings run in the integration tests)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import threading
import time
from collections import namedtuple

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import backend as _backend
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import nvml as _nvml
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DriverHung, GpuopsError, PermanentReadError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nvml import NvmlReader, NvmlTimeout
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader

MIB = 1024 * 1024
Memory = namedtuple('Memory', 'total free used')
MemoryV2 = namedtuple('MemoryV2', 'version total reserved free used')
Rates = namedtuple('Rates', 'gpu memory')
Pci = namedtuple('Pci', 'busId')
Proc = namedtuple('Proc', 'pid usedGpuMemory')
BUSES = ['18', '2A', '3A', '5D']


class NVMLError(Exception):
    TEXTS = {3: 'Not Supported', 4: 'Insufficient Permissions', 9: 'Driver Not Loaded',
             15: 'GPU is lost', 999: 'Unknown Error'}

    def __init__(self, value):
        Exception.__init__(self, value)
        self.value = value

    def __str__(self):
        return self.TEXTS.get(self.value, 'error %d' % self.value)


class NVMLLibraryMismatchError(Exception):
    """pynvml's error for an unversioned call whose newest version the library lacks."""


class FakeNvml:
    """Answers like pynvml; faults: {(index or None, function name): NVML code}.

    A library without a versioned function: fault code 13 (NVML_ERROR_FUNCTION_NOT_FOUND) on
    nvmlDeviceGetMemoryInfo_v2 or nvmlDeviceGetComputeRunningProcesses_v3 / _v2. bindings_v2:
    False for an nvidia-ml-py without nvmlMemory_v2. names: {pid: bytes} process names.
    """

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError

    def __init__(self, gpus=4, faults=None, hang=0, init_error=None, bindings_v2=True, names=None):
        self.gpus = gpus
        self.faults = faults or {}
        self.hang = hang
        self.init_error = init_error
        self.calls = []
        self.nvmlMemory_v2 = 0x02000028 if bindings_v2 else None
        self.names = {5000: NVMLError(6)}
        self.names.update(names or {})

        def raw_name(pid):
            name = self.names.get(pid, b'python3')
            if isinstance(name, Exception):
                raise name
            return name

        def name(pid):
            return raw_name(pid).decode()  # pynvml decodes strictly
        name.__wrapped__ = raw_name
        self.nvmlSystemGetProcessName = name

    def _check(self, name, index=None):
        self.calls.append(name)
        code = self.faults.get((index, name)) or self.faults.get((None, name))
        if code:
            raise NVMLError(code)

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.calls.append('nvmlShutdown')

    def nvmlDeviceGetCount(self):
        time.sleep(self.hang)
        return self.gpus

    def nvmlSystemGetDriverVersion(self):
        self._check('nvmlSystemGetDriverVersion')
        return '550.127.05'

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check('nvmlDeviceGetHandleByIndex', index)
        return index

    def nvmlDeviceGetPciInfo(self, h):
        self._check('nvmlDeviceGetPciInfo', h)
        return Pci(('00000000:%s:00.0' % BUSES[h]).encode())

    def nvmlDeviceGetUUID(self, h):
        self._check('nvmlDeviceGetUUID', h)
        return 'GPU-%d' % h

    def nvmlDeviceGetName(self, h):
        self._check('nvmlDeviceGetName', h)
        return 'NVIDIA H200'

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        # As a real driver: v2 `used` is allocated memory, v1 `used` adds the 515 MiB reserved.
        self._check('nvmlDeviceGetMemoryInfo', h)
        free = (143771 - 515 - 76113) * MIB
        if version:
            self._check('nvmlDeviceGetMemoryInfo_v2', h)
            return MemoryV2(version, 143771 * MIB, 515 * MIB, free, 76113 * MIB)
        return Memory(143771 * MIB, free, (515 + 76113) * MIB)

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check('nvmlDeviceGetUtilizationRates', h)
        return Rates(0, 0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._check('nvmlDeviceGetTemperature', h)
        return 34

    def nvmlDeviceGetPersistenceMode(self, h):
        self._check('nvmlDeviceGetPersistenceMode', h)
        return 1

    def nvmlDeviceGetComputeMode(self, h):
        self._check('nvmlDeviceGetComputeMode', h)
        return 3

    def nvmlDeviceGetRemappedRows(self, h):
        self._check('nvmlDeviceGetRemappedRows', h)
        return (0, 2, 1, 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        self._check('nvmlDeviceGetRetiredPagesPendingStatus', h)
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h):
        self._check('nvmlDeviceGetComputeRunningProcesses_v3', h)
        return self._processes(h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h):
        self._check('nvmlDeviceGetComputeRunningProcesses_v2', h)
        return self._processes(h)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        # pynvml's unversioned call is _v3, and a missing _v3 is not an NVMLError.
        try:
            return self.nvmlDeviceGetComputeRunningProcesses_v3(h)
        except NVMLError as exc:
            if exc.value == 13:
                raise NVMLLibraryMismatchError('Unversioned function called and the pyNVML version does not match')
            raise

    def _processes(self, h):
        self._check('processes', h)
        return [Proc(4242 + h, 76113 * MIB), Proc(5000, None)]


def read(fake, timeout=5):
    reader = NvmlReader(timeout, nvml=fake).open()
    try:
        return reader.read()
    finally:
        reader.close()


def test_reads_every_fact_in_the_nvidia_smi_form():
    snapshot = read(FakeNvml())
    assert snapshot.driver_version == '550.127.05' and snapshot.warnings == []
    assert snapshot.gpus[1] == {
        'index': 1, 'uuid': 'GPU-1', 'name': 'NVIDIA H200', 'pci_bus_id': '00000000:2A:00.0',
        'memory_total_mib': 143771, 'memory_used_mib': 76113, 'memory_free_mib': 67143, 'memory_reserved_mib': 515,
        'utilization_gpu_pct': 0, 'temperature_c': 34, 'persistence_mode': True,
        'compute_mode': 'Exclusive_Process', 'remapped_rows_pending': True,
        'remapped_rows_failure': False, 'retired_pages_pending': False, 'error': None, 'driver_recovery_action': None,
        'processes': [{'pid': 4243, 'name': 'python3', 'used_memory_mib': 76113},
                      {'pid': 5000, 'name': None, 'used_memory_mib': None}],
    }


@pytest.mark.parametrize('code', [3, 13])
def test_unsupported_values_are_null(code):
    fake = FakeNvml(faults={(2, 'nvmlDeviceGetTemperature'): code, (2, 'nvmlDeviceGetMemoryInfo'): code,
                            (None, 'nvmlDeviceGetRetiredPagesPendingStatus'): 3})
    gpu = read(fake).gpus[2]
    assert gpu['error'] is None and gpu['uuid'] == 'GPU-2'
    assert (gpu['temperature_c'], gpu['memory_used_mib'], gpu['memory_total_mib']) == (None, None, None)
    assert gpu['memory_reserved_mib'] is None
    assert gpu['retired_pages_pending'] is None and gpu['utilization_gpu_pct'] == 0


@pytest.mark.parametrize('code, words, state', [
    (16, 'GPU requires reset', 'reset_required'), (999, 'Unknown Error', 'lost'),
    (4, 'Insufficient Permissions', 'lost')])
def test_an_nvml_code_that_is_a_verdict_is_an_error_of_that_gpu(code, words, state):
    # Before: every code but GPU_IS_LOST became null, so a GPU whose driver answers
    # NVML_ERROR_RESET_REQUIRED read as free.
    fake = FakeNvml(faults={(2, 'nvmlDeviceGetTemperature'): code, (2, 'nvmlDeviceGetUtilizationRates'): code})
    snapshot = read(fake)
    gpu = snapshot.gpus[2]
    assert gpu['error'] == 'the driver says: %s (for utilization.gpu, temperature.gpu)' % words
    assert gpu['memory_used_mib'] == 76113 and gpu['uuid'] == 'GPU-2'
    assert gpu_state(dict(gpu, processes=[])) == state
    assert [g['error'] for g in snapshot.gpus].count(None) == 3


def test_a_handle_refused_with_reset_required_is_reset_required():
    gpu = read(FakeNvml(faults={(1, 'nvmlDeviceGetHandleByIndex'): 16})).gpus[1]
    assert gpu['error'].endswith(': GPU requires reset') and gpu_state(gpu) == 'reset_required'


@pytest.mark.parametrize('function, code, text', [
    ('nvmlDeviceGetUUID', 999, 'Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error'),
    ('nvmlDeviceGetUUID', 15, 'Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost.  '
                              'Reboot the system to recover this GPU'),
    ('nvmlDeviceGetUtilizationRates', 15, 'Unable to determine the device handle for GPU0000:5D:00.0: GPU is '
                                          'lost.  Reboot the system to recover this GPU'),
])
def test_unreachable_gpu_reads_like_nvidia_smi(function, code, text):
    snapshot = read(FakeNvml(faults={(3, function): code}))
    lost = snapshot.gpus[3]
    assert lost['error'] == text and lost['pci_bus_id'] == '00000000:5D:00.0' and lost['index'] == 3
    assert all(lost[key] is None for key in ('uuid', 'name', 'memory_used_mib', 'remapped_rows_pending'))
    assert lost['processes'] == []
    assert [gpu['error'] for gpu in snapshot.gpus].count(None) == 3


def test_handle_failure_takes_the_bus_id_from_the_driver(monkeypatch, tmp_path):
    for bus in ('0000:5d:00.0', '0000:18:00.0', '0000:3a:00.0', '0000:2a:00.0'):
        (tmp_path / bus).mkdir()
    monkeypatch.setattr(_nvml, 'PROC_DRIVER_GPUS', str(tmp_path))
    gpu = read(FakeNvml(faults={(1, 'nvmlDeviceGetHandleByIndex'): 15})).gpus[1]
    assert gpu['pci_bus_id'] == '00000000:2A:00.0' and 'GPU0000:2A:00.0: GPU is lost' in gpu['error']


def test_driver_bus_ids_sorted_in_pci_order(tmp_path):
    for bus in ('0000:5d:00.0', '0000:18:00.0', 'not-a-bus'):
        (tmp_path / bus).mkdir()
    assert _nvml.driver_bus_ids(str(tmp_path)) == ['00000000:18:00.0', '00000000:5D:00.0']
    assert _nvml.driver_bus_ids(str(tmp_path / 'missing')) == []


def test_handle_failure_without_driver_list_names_the_index(monkeypatch):
    monkeypatch.setattr(_nvml, 'driver_bus_ids', lambda base=None: [])
    gpu = read(FakeNvml(faults={(1, 'nvmlDeviceGetHandleByIndex'): 999})).gpus[1]
    assert gpu['pci_bus_id'] is None
    assert gpu['error'] == 'Unable to determine the device handle for GPU 1: Unknown Error'


def test_no_devices_is_an_empty_snapshot():
    snapshot = read(FakeNvml(gpus=0))
    assert snapshot.gpus == [] and snapshot.driver_version is None
    assert snapshot.warnings == ['nvml: No devices were found']


def test_process_list_failure_is_a_warning():
    snapshot = read(FakeNvml(faults={(0, 'processes'): 3}))
    assert snapshot.gpus[0]['processes'] == []
    assert snapshot.warnings == ['process list of GPU 0 unavailable: Not Supported']


def test_memory_is_nvml_v2_used_with_reserved_beside_it():
    # Real readings (fastfetch-cli/fastfetch#1658, mayooot/detect-gpu#3): v1 `used` is reserved +
    # allocated, hundreds of MiB on an idle GPU; nvidia-smi and v2 show allocated only.
    fake = FakeNvml()
    snapshot = read(fake)
    assert [(g['memory_used_mib'], g['memory_reserved_mib'], g['memory_free_mib']) for g in snapshot.gpus] == [
        (76113, 515, 67143)] * 4
    assert 'nvmlDeviceGetMemoryInfo_v2' in fake.calls and snapshot.warnings == []


@pytest.mark.parametrize('fake, why', [
    (FakeNvml(faults={(None, 'nvmlDeviceGetMemoryInfo_v2'): 13}), "library has no nvmlDeviceGetMemoryInfo_v2"),
    (FakeNvml(bindings_v2=False), 'nvidia-ml-py has no nvmlMemory_v2'),
])
def test_without_memory_v2_used_is_v1_and_one_warning_says_so(fake, why):
    snapshot = read(fake)
    assert [(g['memory_used_mib'], g['memory_reserved_mib'], g['memory_free_mib']) for g in snapshot.gpus] == [
        (76113 + 515, None, 67143)] * 4
    assert len(snapshot.warnings) == 1 and why in snapshot.warnings[0]
    assert 'idle GPUs may read hundreds of MiB used' in snapshot.warnings[0]
    assert fake.calls.count('nvmlDeviceGetMemoryInfo_v2') <= 1


@pytest.mark.parametrize('missing, called', [
    (['nvmlDeviceGetComputeRunningProcesses_v3'], 'nvmlDeviceGetComputeRunningProcesses_v2'),
    # Bindings of another kind (no _nvmlGetFunctionPointer): their unversioned call.
    (['nvmlDeviceGetComputeRunningProcesses_v3', 'nvmlDeviceGetComputeRunningProcesses_v2'], None),
])
def test_an_older_library_without_the_v3_process_call_falls_back(missing, called):
    fake = FakeNvml(faults=dict(((None, name), 13) for name in missing))
    snapshot = read(fake)
    if called:
        assert snapshot.warnings == []
        assert [p['pid'] for p in snapshot.gpus[1]['processes']] == [4243, 5000]
        assert fake.calls.count(called) == 4 and fake.calls.count(missing[0]) == 1
    else:
        # The stand-in's unversioned call is _v3 (as pynvml's): the list is unavailable, not a traceback.
        assert snapshot.gpus[1]['processes'] == []
        assert snapshot.warnings[0].startswith('process list of GPU 0 unavailable: Unversioned function called')


def test_process_names_that_are_not_utf8_or_unknown():
    snapshot = read(FakeNvml(names={4242: b'\xffjob', 4243: b'[Not Found]', 4244: NVMLError(4)}))
    names = [[p['name'] for p in g['processes']] for g in snapshot.gpus]
    assert names == [[u'\ufffdjob', None], [None, None], [None, None], ['python3', None]]


def test_init_failure_is_explained():
    with pytest.raises(GpuopsError, match=r'NVML could not be initialised \(error 9, the NVIDIA driver is not loaded\)'):
        NvmlReader(5, nvml=FakeNvml(init_error=9)).open()


@pytest.mark.parametrize('code, permanent', [(9, True), (12, True), (18, True), (999, False), (4, False)])
def test_init_failures_no_retry_cures_are_permanent(code, permanent):
    with pytest.raises(GpuopsError, match=r'NVML could not be initialised \(error %d' % code) as info:
        NvmlReader(5, nvml=FakeNvml(init_error=code)).open()
    assert isinstance(info.value, PermanentReadError) is permanent


def test_a_hung_driver_call_times_out_and_is_not_called_again():
    fake = FakeNvml(hang=30)
    reader = NvmlReader(1.0, nvml=fake).open()
    started = time.monotonic()
    with pytest.raises(NvmlTimeout, match='did not answer within 1.0 s'):
        reader.read()
    with pytest.raises(NvmlTimeout, match='still stuck'):
        reader.read()
    reader.close()
    assert time.monotonic() - started < 10
    assert 'nvmlShutdown' not in fake.calls


def test_an_nvml_call_hung_in_the_driver_is_driver_hung(tmp_path, monkeypatch):
    # A real D state needs a kernel that blocks the thread: what /proc shows of one (state D, a
    # wchan in the driver's code) is written under a task directory of the test's own.
    monkeypatch.setattr(_nvml, 'TASKS', str(tmp_path))
    release = threading.Event()

    def in_the_driver():
        where = tmp_path / str(threading.get_native_id())
        where.mkdir()
        (where / 'stat').write_text('%d (python3) D 1 1 1 0 -1\n' % threading.get_native_id())
        (where / 'wchan').write_text('os_acquire_mutex')
        release.wait(30)
    try:
        with pytest.raises(DriverHung) as caught:
            _nvml.call_with_timeout(in_the_driver, 1, 'reading GPU 3')
    finally:
        release.set()
    assert re.match(r'^driver_hung: NVML, reading GPU 3, hung in the NVIDIA driver past its deadline \(thread \d+ in D '
                    r'state, in os_acquire_mutex\); only a reboot frees it$', str(caught.value)), str(caught.value)
    # One that only sleeps is a timeout, not the driver's.
    with pytest.raises(NvmlTimeout):
        _nvml.call_with_timeout(lambda: time.sleep(3), 1, 'reading GPU 3')


def test_call_with_timeout_returns_and_raises():
    assert _nvml.call_with_timeout(lambda: 42, 1, 'x') == 42
    with pytest.raises(ZeroDivisionError):
        _nvml.call_with_timeout(lambda: 1 // 0, 1, 'x')


def test_select_reader_nvml_without_the_library(monkeypatch):
    monkeypatch.setattr(_nvml, 'HAS_PYNVML', False)
    monkeypatch.setattr(_nvml, 'PYNVML_IMPORT_ERROR', 'Traceback: No module named pynvml')
    with pytest.raises(_backend.MissingLibraryError) as info:
        _backend.select_reader('nvml')
    assert 'nvidia-ml-py' in info.value.library and info.value.exception.startswith('Traceback')
    reader, warnings = _backend.select_reader('auto')
    assert isinstance(reader, SmiReader) and warnings == []


def test_select_reader_auto_falls_back_when_init_fails(monkeypatch):
    monkeypatch.setattr(_nvml, 'HAS_PYNVML', True)
    monkeypatch.setattr(_nvml, 'pynvml', FakeNvml(init_error=12))
    reader, warnings = _backend.select_reader('auto')
    assert isinstance(reader, SmiReader) and warnings == []
    with pytest.raises(GpuopsError, match='error 12'):
        _backend.select_reader('nvml')
    monkeypatch.setattr(_nvml, 'pynvml', FakeNvml())
    reader, warnings = _backend.select_reader('auto', timeout=3)
    assert reader.backend == 'nvml' and reader.timeout == 3
    reader.close()
    assert isinstance(_backend.select_reader('nvidia-smi')[0], SmiReader)
    with pytest.raises(GpuopsError, match='backend must be one of'):
        _backend.select_reader('cuda')


# -- light reads (the release's polls) ----------------------------------------------------------

HEALTH_CALLS = ('nvmlDeviceGetRemappedRows', 'nvmlDeviceGetRetiredPagesPendingStatus', 'nvmlDeviceGetTemperature',
                'nvmlDeviceGetPersistenceMode', 'nvmlDeviceGetComputeMode', 'nvmlDeviceGetName')


def open_reader(fake):
    return NvmlReader(5, nvml=fake).open()


def test_a_light_read_reads_memory_and_processes_and_keeps_the_health_of_the_full_read():
    fake = FakeNvml(faults={(2, 'nvmlDeviceGetTemperature'): 16})
    reader = open_reader(fake)
    full = reader.read()
    del fake.calls[:]
    light = reader.read(full=False)
    assert light.full is False and not set(HEALTH_CALLS) & set(fake.calls)
    assert 'nvmlDeviceGetMemoryInfo_v2' in fake.calls and 'processes' in fake.calls
    # The driver's word on GPU 2 (a reset) and the remapped rows of the full read stay.
    assert light.gpus[2]['reset_required'] is True and 'GPU requires reset' in light.gpus[2]['error']
    assert gpu_state(light.gpus[2]) == 'reset_required'
    assert [gpu['remapped_rows_pending'] for gpu in light.gpus] == [True] * 4
    assert [dict(gpu, processes=None) for gpu in light.gpus] == [dict(gpu, processes=None) for gpu in full.gpus]


@pytest.mark.parametrize('faults', [
    {(1, 'nvmlDeviceGetUtilizationRates'): 16},  # a new verdict of the driver
    {(3, 'nvmlDeviceGetUUID'): 15},  # a GPU lost since
])
def test_a_light_read_that_finds_something_new_reads_in_full(faults):
    fake = FakeNvml()
    reader = open_reader(fake)
    reader.read()
    fake.faults.update(faults)
    del fake.calls[:]
    snapshot = reader.read(full=False)
    assert snapshot.full is True and 'nvmlDeviceGetRemappedRows' in fake.calls
    assert [gpu['error'] is None for gpu in snapshot.gpus].count(False) == 1


def test_a_light_read_without_a_full_read_reads_in_full():
    fake = FakeNvml()
    snapshot = open_reader(fake).read(full=False)
    assert snapshot.full is True and 'nvmlDeviceGetRemappedRows' in fake.calls
