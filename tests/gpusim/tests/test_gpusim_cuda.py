"""The simulated libcuda.so.1, driven through ctypes by a child process that allocates and waits:
what nvidia-smi and the fake NVML see of it, and the faults it answers with."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from gpusim.state import cuda_code

if not (shutil.which("gcc") or shutil.which("cc")):
    pytest.skip("no C compiler", allow_module_level=True)

# Allocates MIB on GPU of bus id BUS, says so, and frees (and exits) when a line comes on stdin.
ALLOCATOR = r'''
import ctypes, sys
bus, mib = sys.argv[1], int(sys.argv[2])
cuda = ctypes.CDLL("libcuda.so.1")
def call(name, *args):
    rc = getattr(cuda, name)(*args)
    if rc:
        text = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(text))
        print(name, text.value.decode(), flush=True)
        sys.exit(1)
call("cuInit", 0)
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
call("cuDeviceGetByPCIBusId", ctypes.byref(dev), bus.encode())
call("cuCtxCreate_v2", ctypes.byref(ctx), 0, dev)
call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
call("cuMemsetD32_v2", ptr, ctypes.c_uint(0xA5A5A5A5), ctypes.c_size_t(16))
word = ctypes.c_uint32()
call("cuMemcpyDtoH_v2", ctypes.byref(word), ptr, ctypes.c_size_t(4))
print("allocated %x" % word.value, flush=True)
sys.stdin.readline()
call("cuMemFree_v2", ptr)
call("cuCtxDestroy_v2", ctx)
print("freed", flush=True)
sys.stdin.readline()
'''


def start(host, gpu, mib=100):
    bus = host.state["gpus"][gpu]["pci_bus_id"]
    proc = subprocess.Popen([sys.executable, "-c", ALLOCATOR, bus, str(mib)], env=host.env(cuda=True),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def apps(host):
    out = host.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").stdout
    return [tuple(int(v) for v in line.split(", ")) for line in out.splitlines() if line.strip()]


@pytest.fixture
def cudahost(gpuhost_factory):
    host = gpuhost_factory(gpus=2, release_delay=0.5)
    host.install_cuda()
    return host


def test_an_allocation_is_a_compute_app_while_it_lives_and_is_released_with_the_delay(cudahost):
    proc, said = start(cudahost, 1, mib=300)
    try:
        assert said == "allocated a5a5a5a5"
        assert apps(cudahost) == [(proc.pid, 300)]
        assert cudahost.memory_used() == {0: 1, 1: 301}
        # The context holds the GPU's device node, as the real library's does.
        nodes = [os.readlink("/proc/%d/fd/%s" % (proc.pid, fd)) for fd in os.listdir("/proc/%d/fd" % proc.pid)]
        assert cudahost.dev_path(1) in nodes
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "freed"
        assert apps(cudahost) == []          # freed: no longer a compute app ...
        assert cudahost.memory_used()[1] == 301  # ... but the driver has not let the memory go yet
        time.sleep(0.6)
        assert cudahost.memory_used()[1] == 1
    finally:
        proc.kill()
        proc.wait()


def test_exclusive_process_gpu_with_another_compute_app_is_unavailable(cudahost):
    cudahost.fault("compute-mode", gpu=0, value="Exclusive_Process")
    first, said = start(cudahost, 0)
    try:
        assert said.startswith("allocated")
        second, said = start(cudahost, 0)
        second.wait()
        assert said == "cuCtxCreate_v2 CUDA_ERROR_DEVICE_UNAVAILABLE"
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("fault, said", [
    (dict(kind="cuda", gpu=1, code="ECC_UNCORRECTABLE"), "cuMemcpyDtoH_v2 CUDA_ERROR_ECC_UNCORRECTABLE"),
    (dict(kind="cuda", gpu=1, code="46"), "cuCtxCreate_v2 CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (dict(kind="stuck", gpu=1, mib=143200), "cuMemAlloc_v2 CUDA_ERROR_OUT_OF_MEMORY"),
    (dict(kind="cuda-init", code="CUDA_ERROR_NO_DEVICE"), "cuInit CUDA_ERROR_NO_DEVICE"),
    (dict(kind="no-devices", value=True), "cuInit CUDA_ERROR_NO_DEVICE"),
    (dict(kind="mismatch", value=True), "cuInit CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (dict(kind="lost", gpu=1, message="lost"), "cuDeviceGetByPCIBusId CUDA_ERROR_INVALID_DEVICE"),
])
def test_faults(cudahost, fault, said):
    cudahost.fault(fault.pop("kind"), **fault)
    proc, line = start(cudahost, 1)
    proc.kill()  # an allocation that did not fail waits for a line: never for ever
    proc.wait()
    assert line == said


def test_cuda_hang_sleeps_in_cuinit(cudahost):
    cudahost.fault("cuda-hang", seconds=30)
    proc = subprocess.Popen([sys.executable, "-c", ALLOCATOR, "0000:18:00.0", "1"], env=cudahost.env(cuda=True),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    finally:
        proc.kill()
        proc.wait()


def test_the_cli_sets_cuda_faults_by_name_or_number(cudahost):
    run = [sys.executable, "-m", "gpusim", "fault", "--root", cudahost.root]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run(run + ["cuda", "--gpu", "1", "--code", "CUDA_ERROR_ECC_UNCORRECTABLE"], env=env, check=True)
    subprocess.run(run + ["cuda-init", "--code", "803"], env=env, check=True)
    subprocess.run(run + ["compute-mode", "--gpu", "0", "Exclusive_Process"], env=env, check=True)
    faults = cudahost.state["faults"]
    assert (faults["cuda_gpu"], faults["cuda_init"]) == ({"1": 214}, 803)
    assert cudahost.state["gpus"][0]["compute_mode"] == "Exclusive_Process"
    assert json.loads(subprocess.run([sys.executable, "-m", "gpusim", "cuda", "--root", cudahost.root], env=env,
                                     check=True, capture_output=True, text=True).stdout)["lib"].endswith("libcuda.so.1")
    with pytest.raises(ValueError, match="unknown CUDA error"):
        cuda_code("CUDA_ERROR_NOT_A_THING")
