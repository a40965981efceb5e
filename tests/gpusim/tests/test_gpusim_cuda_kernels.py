"""The simulated libcuda.so.1 running the probe's own kernels: the probe's child (the source of
plugins/module_utils/_probe/cuda.py, run as _probe runs it) against gpusim's state, with the kernel
faults the probe must name: a flipped bit anywhere in the probed memory, a JIT error, a launch
that fails, a launch that silently does nothing."""

import ctypes
import json
import os
import shutil
import subprocess
import sys

import pytest

if not (shutil.which("gcc") or shutil.which("cc")):
    pytest.skip("no C compiler", allow_module_level=True)

CHILD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                     "plugins", "module_utils", "_probe", "cuda.py")
MIB = 1024 * 1024


@pytest.fixture
def cudahost(gpuhost_factory):
    host = gpuhost_factory(gpus=2)
    host.install_cuda()
    return host


def probe(host, gpu=1, mib=64, level="allocation", env=None):
    """The child's answer for one GPU, as _probe asks it (python -I -S -c SOURCE REQUEST)."""
    with open(CHILD) as handle:
        source = handle.read()
    request = dict(library="libcuda.so.1", mib=mib, level=level,
                   gpus=[dict(index=gpu, pci_bus_id=host.state["gpus"][gpu]["pci_bus_id"])])
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", source, json.dumps(request)], env=env or host.env(cuda=True),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["init"] is None and answer["library_error"] is None, answer
    return answer["gpus"][0]


def free_mib(host, gpu):
    used = host.memory_used()[gpu]
    return host.state["gpus"][gpu]["memory_total_mib"] - host.state["gpus"][gpu].get("reserved_mib", 0) - used


def test_a_clean_gpu_passes_with_every_byte_written_and_checked(cudahost):
    found = probe(cudahost)
    assert (found["ok"], found["kernel"], found["level"], found["mib"]) == (True, True, "allocation", 64), found
    assert found["bytes_checked"] == 64 * MIB and found["error_name"] is None


@pytest.mark.parametrize("offset", [0, 32 * MIB + 4 * 12345 + 2, 64 * MIB - 1])
def test_a_flipped_bit_anywhere_fails_that_gpu_only(cudahost, offset):
    cudahost.fault("cuda-flip", gpu=1, offset=offset, bit=5)
    found = probe(cudahost, gpu=1)
    assert (found["ok"], found["error_name"], found["kernel"], found["call"]) == (False, "PROBE_MISMATCH", True, None)
    assert found["error_string"] == ("1 of the %d words written read back different; the first at byte %d of the 64 MiB "
                                     "probed" % (16 * MIB, offset // 4 * 4))
    assert probe(cudahost, gpu=0)["ok"] is True


def test_a_flip_beyond_the_allocation_is_not_seen_but_the_memory_level_finds_it(cudahost):
    cudahost.fault("cuda-flip", gpu=0, offset=100 * 1024 * MIB)
    assert probe(cudahost, gpu=0, mib=64)["ok"] is True
    found = probe(cudahost, gpu=0, level="memory")
    assert (found["ok"], found["error_name"], found["level"]) == (False, "PROBE_MISMATCH", "memory")
    assert "the first at byte %d of the" % (100 * 1024 * MIB) in found["error_string"]


def test_the_memory_level_checks_all_free_memory_but_the_margin(cudahost):
    free = free_mib(cudahost, 1)
    found = probe(cudahost, gpu=1, level="memory")
    assert (found["ok"], found["kernel"], found["level"]) == (True, True, "memory"), found
    # Free once the probe's context holds its counts (gpusim rounds that allocation to 1 MiB), less the margin.
    assert found["mib"] == free - 1 - 256
    assert found["bytes_checked"] == found["mib"] * MIB


@pytest.mark.parametrize("code, name", [
    ("CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_INVALID_PTX"),
    ("222", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
])
def test_a_jit_error_is_named_with_the_ptx_and_the_driver(cudahost, code, name):
    cudahost.fault("cuda-jit", gpu=1, code=code)
    found = probe(cudahost, gpu=1)
    assert (found["ok"], found["call"], found["error_name"], found["kernel"]) == (False, "cuModuleLoadDataEx", name, False)
    assert ("the probe's PTX is ISA 7.0 for sm_50, which drivers for CUDA 11.0 and newer compile; this driver is for "
            "CUDA 12.4; the JIT said: ptxas application ptx input: gpusim fault cuda-jit --gpu 1") in found["error_string"]
    assert probe(cudahost, gpu=0)["ok"] is True


@pytest.mark.parametrize("code, call", [
    ("CUDA_ERROR_LAUNCH_FAILED", "cuCtxSynchronize"),
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "cuCtxSynchronize"),
    ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuLaunchKernel"),
])
def test_a_launch_failure_is_named(cudahost, code, call):
    cudahost.fault("cuda-launch", gpu=1, code=code)
    found = probe(cudahost, gpu=1)
    assert (found["ok"], found["call"], found["error_name"], found["kernel"]) == (False, call, code, False)


def test_a_kernel_that_did_not_run_fails(cudahost):
    cudahost.fault("cuda-idle", gpu=1, value=True)
    found = probe(cudahost, gpu=1)
    assert (found["ok"], found["error_name"], found["kernel"], found["bytes_checked"]) == (
        False, "PROBE_KERNEL_NOT_RUN", False, 0)
    assert "the fill kernel wrote 0 and the check kernel read 0 of the %d words" % (16 * MIB) in found["error_string"]
    cudahost.fault("cuda-idle", gpu=1, value=False)
    assert probe(cudahost, gpu=1)["ok"] is True


def test_the_jit_refuses_a_ptx_newer_than_the_driver(cudahost):
    lib = ctypes.CDLL(cudahost.install_cuda())
    os.environ["GPUSIM_ROOT"] = cudahost.root
    try:
        assert lib.cuInit(0) == 0
        device, context, module = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        bus = cudahost.state["gpus"][0]["pci_bus_id"].encode()
        assert lib.cuDeviceGetByPCIBusId(ctypes.byref(device), bus) == 0
        assert lib.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0
        log = ctypes.create_string_buffer(256)
        options = (ctypes.c_int * 2)(5, 6)
        values = (ctypes.c_void_p * 2)(ctypes.addressof(log), 256)
        ptx = b".version 9.9\n.target sm_50\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n"
        assert lib.cuModuleLoadDataEx(ctypes.byref(module), ptx, 2, options, values) == 222
        assert log.value == b"ptxas application ptx input, line 1; fatal   : Unsupported .version 9.9; current version is '8.4'"
        assert lib.cuModuleLoadDataEx(ctypes.byref(module), ptx.replace(b"9.9", b"8.4"), 0, None, None) == 0
        function = ctypes.c_void_p()
        assert lib.cuModuleGetFunction(ctypes.byref(function), module, b"k") == 0
        assert lib.cuModuleGetFunction(ctypes.byref(function), module, b"gpuops_fill") == 500
        assert lib.cuModuleUnload(module) == 0
        assert lib.cuCtxDestroy_v2(context) == 0
    finally:
        del os.environ["GPUSIM_ROOT"]


def test_the_cli_sets_the_kernel_faults(cudahost):
    run = [sys.executable, "-m", "gpusim", "fault", "--root", cudahost.root]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run(run + ["cuda-jit", "--gpu", "1"], env=env, check=True)
    subprocess.run(run + ["cuda-launch", "--gpu", "0", "--code", "700"], env=env, check=True)
    subprocess.run(run + ["cuda-idle", "--gpu", "0"], env=env, check=True)
    subprocess.run(run + ["cuda-flip", "--gpu", "1", "--offset", "4096", "--bit", "3"], env=env, check=True)
    faults = cudahost.state["faults"]
    assert faults["cuda_gpu_kernel"] == {"1": {"jit": 218}, "0": {"launch": 700, "idle": True}}
    assert faults["cuda_gpu_flip"] == {"1": [[4096, 3]]}
    subprocess.run(run + ["cuda-flip", "--gpu", "1", "--offset", "-1"], env=env, check=True)
    subprocess.run(run + ["cuda-jit", "--gpu", "1", "--code", "0"], env=env, check=True)
    faults = cudahost.state["faults"]
    assert faults["cuda_gpu_flip"] == {} and faults["cuda_gpu_kernel"] == {"0": {"launch": 700, "idle": True}}
