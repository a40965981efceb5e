"""The simulated libnvidia-ml.so.1, called directly through ctypes (no nvidia-ml-py needed)."""

import ctypes
import os
import shutil

import pytest

from gpusim import nvml_build

if not (shutil.which("gcc") or shutil.which("cc")):
    pytest.skip("no C compiler", allow_module_level=True)

MIB = 1024 * 1024


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


MEMORY_V2 = ctypes.sizeof(MemoryV2) | (2 << 24)   # pynvml's nvmlMemory_v2 (0x02000028)


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def load(host, flavor="current"):
    # Each host has its own copy (its own path), so each loads separately and finds its root.
    lib = ctypes.CDLL(host.install_nvml(flavor=flavor))
    lib.nvmlErrorString.restype = ctypes.c_char_p
    return lib


def handle(lib, index):
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) == 0
    return h


def used_mib(lib, index):
    mem = Memory()
    rc = lib.nvmlDeviceGetMemoryInfo(handle(lib, index), ctypes.byref(mem))
    return rc, mem.used // MIB


def test_build_is_cached_and_installs_under_root(gpuhost, tmp_path):
    first = nvml_build.build(str(tmp_path))
    assert nvml_build.build(str(tmp_path)) == first
    path = gpuhost.install_nvml()
    assert path == os.path.join(gpuhost.root, "lib", "libnvidia-ml.so.1")
    assert gpuhost.env(nvml=True)["LD_LIBRARY_PATH"].split(os.pathsep)[0] == os.path.join(gpuhost.root, "lib")
    assert "LD_LIBRARY_PATH" not in gpuhost.env(base={})


def test_flat_twins_follow_every_write(gpuhost):
    state = os.path.join(gpuhost.root, "var", "lib", "gpusim", "state.nvml")
    gpuhost.fault("stuck", gpu=2, mib=512)
    assert [line for line in open(state) if line.startswith("gpu 2 ")][0].split()[6] == "512"
    info = gpuhost.hold(gpus="1", mib=64, name="a b,c")
    twin = open(os.path.join(gpuhost.root, "var", "lib", "gpusim", "procs", "%d.nvml" % info["pid"])).read()
    assert "mib 64\n" in twin and "gpus 1\n" in twin and "name a b,c\n" in twin


def test_memory_processes_and_faults(gpuhost):
    lib = load(gpuhost)
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())) == 1  # before init
    assert lib.nvmlInitWithFlags(0) == 0
    info = gpuhost.hold(gpus="0,1", mib=2048, util=40)
    # v1 `used` is reserved (515) + allocated (the idle 1 MiB + 2048), as real drivers report it.
    assert used_mib(lib, 0) == (0, 515 + 1 + 2048)
    count = ctypes.c_uint(0)
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(handle(lib, 1), ctypes.byref(count), None) == 7
    assert count.value == 1
    procs = (ProcessInfo * 4)()
    count.value = 4
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(handle(lib, 1), ctypes.byref(count), procs) == 0
    assert (count.value, procs[0].pid, procs[0].usedGpuMemory) == (1, info["pid"], 2048 * MIB)
    count.value = 0
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(handle(lib, 2), ctypes.byref(count), None) == 0

    gpuhost.fault("lost", gpu=1, message="lost")
    gpuhost.fault("na", field="memory.used", gpu=0, value="[Insufficient Permissions]")
    assert used_mib(lib, 0)[0] == 4
    assert used_mib(lib, 1)[0] == 15
    assert lib.nvmlErrorString(15) == b"GPU is lost"
    gpuhost.fault("no-devices", value="on")
    n = ctypes.c_uint(9)
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value == 0
    gpuhost.fault("clear")
    gpuhost.fault("driver-not-loaded", value="on")
    assert lib.nvmlInitWithFlags(0) == 9
    assert lib.nvmlShutdown() == 0


def test_memory_v2_reports_reserved_apart_and_v1_includes_it(gpuhost):
    lib = load(gpuhost)
    assert lib.nvmlInitWithFlags(0) == 0
    gpuhost.hold(gpus="1", mib=300)
    for index, allocated in ((0, 1), (1, 301)):
        mem = MemoryV2(version=MEMORY_V2)
        assert lib.nvmlDeviceGetMemoryInfo_v2(handle(lib, index), ctypes.byref(mem)) == 0
        assert (mem.total, mem.reserved, mem.used) == (143771 * MIB, 515 * MIB, allocated * MIB)
        assert mem.free == (143771 - 515 - allocated) * MIB
        v1 = Memory()
        assert lib.nvmlDeviceGetMemoryInfo(handle(lib, index), ctypes.byref(v1)) == 0
        assert (v1.used, v1.free) == ((515 + allocated) * MIB, mem.free)
    mem = MemoryV2(version=1)
    assert lib.nvmlDeviceGetMemoryInfo_v2(handle(lib, 0), ctypes.byref(mem)) == 25  # argument version mismatch


def test_old_libraries_lack_the_newer_symbols(gpuhost_factory):
    old = load(gpuhost_factory("old"), "old")
    oldest = load(gpuhost_factory("oldest"), "oldest")
    assert not hasattr(old, "nvmlDeviceGetMemoryInfo_v2") and not hasattr(old, "nvmlDeviceGetComputeRunningProcesses_v3")
    assert hasattr(old, "nvmlDeviceGetComputeRunningProcesses_v2") and hasattr(old, "nvmlDeviceGetMemoryInfo")
    assert not hasattr(oldest, "nvmlDeviceGetComputeRunningProcesses_v2")
    assert hasattr(oldest, "nvmlDeviceGetComputeRunningProcesses")


def test_unversioned_process_call_fills_v1_structs(gpuhost):
    lib = load(gpuhost)
    assert lib.nvmlInitWithFlags(0) == 0
    first = gpuhost.hold(gpus="2", mib=100)
    second = gpuhost.hold(gpus="2", mib=200)
    procs = (ProcessInfoV1 * 4)()
    count = ctypes.c_uint(4)
    assert lib.nvmlDeviceGetComputeRunningProcesses(handle(lib, 2), ctypes.byref(count), procs) == 0
    assert [(p.pid, p.usedGpuMemory // MIB) for p in procs[:count.value]] == [(first["pid"], 100), (second["pid"], 200)]


def test_process_name_that_is_not_utf8_comes_back_as_its_bytes(gpuhost):
    lib = load(gpuhost)
    assert lib.nvmlInitWithFlags(0) == 0
    info = gpuhost.hold(gpus="0", mib=64, name="\udcff\udcfejob")
    name = ctypes.create_string_buffer(64)
    assert lib.nvmlSystemGetProcessName(info["pid"], name, 64) == 0
    assert name.value == b"\xff\xfejob"


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", ctypes.c_ulonglong)]


def recovery(lib, index):
    device = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) == 0
    value = FieldValue(fieldId=230)
    assert lib.nvmlDeviceGetFieldValues(device, 1, ctypes.byref(value)) == 0
    return value.nvmlReturn, value.value & 0xFFFFFFFF


def test_recovery_action_field_and_reset_required(gpuhost_factory):
    host = gpuhost_factory(name="new", gpus=3, driver_version="570.172.08")
    host.fault("recovery", gpu=1, value="drain-p2p")
    host.fault("reset-required", gpu=2)
    lib = load(host)
    assert lib.nvmlInit_v2() == 0
    assert [recovery(lib, index) for index in range(3)] == [(0, 0), (0, 3), (0, 1)]
    device = ctypes.c_void_p()
    lib.nvmlDeviceGetHandleByIndex_v2(2, ctypes.byref(device))
    temp = ctypes.c_uint()
    assert lib.nvmlDeviceGetTemperature(device, 0, ctypes.byref(temp)) == 16
    old = gpuhost_factory(name="old", gpus=1)
    lib = load(old)
    assert lib.nvmlInit_v2() == 0 and recovery(lib, 0)[0] == 3
