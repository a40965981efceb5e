"""Each GPU's PCIe link, copy and HBM bandwidths (`gpusim fault slow`), through the real built libraries
(ctypes, in this process) and the fake nvidia-smi: copies and kernels timed through events, the link
loaded while a copy runs and for 0.5 s after it (gen 1 at the same width otherwise), the replays copies
add, a copy that hangs, the topology, and the CLI."""

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from gpusim.state import LINK_DEFAULTS, LINK_LOADED_AFTER_S, copy_gbps, link_loaded_until

if not (shutil.which("gcc") or shutil.which("cc")):
    pytest.skip("no C compiler", allow_module_level=True)

MIB = 1024 * 1024
JITTER = 0.02
GPUSIM_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A module with the probe's fill kernel, as the fake libcuda runs it by name.
FILL_PTX = b".version 8.4\n.target sm_50\n.address_size 64\n.visible .entry gpuops_fill()\n{\n ret;\n}\n"
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400


class Context:
    """A context of the host's fake libcuda on one GPU, in this process."""

    def __init__(self, lib, host, gpu):
        self.lib, self.host, self.gpu = lib, host, gpu
        device, self.handle = ctypes.c_int(), ctypes.c_void_p()
        assert lib.cuDeviceGetByPCIBusId(ctypes.byref(device), host.state["gpus"][gpu]["pci_bus_id"].encode()) == 0
        assert lib.cuCtxCreate_v2(ctypes.byref(self.handle), 0, device) == 0

    def current(self):
        assert self.lib.cuCtxSetCurrent(self.handle) == 0
        return self

    def alloc(self, size):
        pointer = ctypes.c_uint64()
        assert self.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) == 0
        return pointer.value

    def pinned(self, size):
        pointer = ctypes.c_void_p()
        assert self.lib.cuMemAllocHost_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) == 0
        return pointer.value

    def event(self, flags=0):
        event = ctypes.c_void_p()
        assert self.lib.cuEventCreate(ctypes.byref(event), flags) == 0
        return event

    def copy(self, direction, device, host, size):
        if direction == "h2d":
            return self.lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(device), ctypes.c_void_p(host), ctypes.c_size_t(size), None)
        return self.lib.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(host), ctypes.c_uint64(device), ctypes.c_size_t(size), None)

    def timed(self, work):
        """Milliseconds the events around work() measure."""
        start, end = self.event(), self.event()
        assert self.lib.cuEventRecord(start, None) == 0
        work()
        assert self.lib.cuEventRecord(end, None) == 0
        assert self.lib.cuEventSynchronize(end) == 0
        ms = ctypes.c_float()
        assert self.lib.cuEventElapsedTime(ctypes.byref(ms), start, end) == 0
        assert self.lib.cuEventDestroy_v2(start) == 0 and self.lib.cuEventDestroy_v2(end) == 0
        return ms.value


@pytest.fixture
def cuda(gpuhost_factory, monkeypatch):
    """(host of 8 GPUs, context(gpu)): contexts of its fake libcuda (context.lib), destroyed at the end."""
    host = gpuhost_factory()
    lib = ctypes.CDLL(host.install_cuda())
    monkeypatch.setenv("GPUSIM_ROOT", host.root)
    assert lib.cuInit(0) == 0
    contexts = []

    def context(gpu):
        contexts.append(Context(lib, host, gpu))
        return contexts[-1]

    context.lib = lib
    yield host, context
    for made in contexts:
        lib.cuCtxDestroy_v2(made.handle)


@pytest.fixture
def nvml(cuda):
    """The host's fake libnvidia-ml, initialised in this process: query(name, gpu) -> (rc, value)."""
    host = cuda[0]
    lib = ctypes.CDLL(host.install_nvml())
    assert lib.nvmlInit_v2() == 0

    def handle(gpu):
        found = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(gpu, ctypes.byref(found)) == 0
        return found

    def query(name, gpu):
        value = ctypes.c_uint()
        rc = getattr(lib, "nvmlDevice" + name)(handle(gpu), ctypes.byref(value))
        return rc, value.value

    def ancestor(first, second):
        level = ctypes.c_int()
        rc = lib.nvmlDeviceGetTopologyCommonAncestor(handle(first), handle(second), ctypes.byref(level))
        return rc, level.value

    query.ancestor = ancestor
    yield query
    lib.nvmlShutdown()


def within_jitter(ms, size, gbps):
    expected = size / (gbps * 1e9) * 1000
    return expected * (1 - JITTER) - 1e-6 <= ms <= expected * (1 + JITTER) + 1e-6


def smi_link(host, gpu, nounits=False):
    out = host.smi("--query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max",
                   "--format=csv,noheader" + (",nounits" if nounits else ""), "-i", str(gpu))
    assert out.returncode == 0, out.stdout
    return out.stdout.strip()


def test_an_idle_link_runs_at_gen_1_at_its_width(cuda, nvml):
    host = cuda[0]
    assert [nvml(name, 0) for name in ("GetCurrPcieLinkGeneration", "GetCurrPcieLinkWidth", "GetMaxPcieLinkGeneration",
                                       "GetMaxPcieLinkWidth", "GetGpuMaxPcieLinkGeneration")] == [
        (0, 1), (0, 16), (0, 5), (0, 16), (0, 5)]
    assert smi_link(host, 0) == smi_link(host, 0, nounits=True) == "1, 5, 16, 16"
    host.slow(3, link=(3, 8))
    assert smi_link(host, 3) == "1, 5, 8, 16"
    assert (nvml("GetCurrPcieLinkGeneration", 3), nvml("GetCurrPcieLinkWidth", 3)) == ((0, 1), (0, 8))


def test_a_copy_loads_the_link_while_it_runs_and_for_half_a_second_after(cuda, nvml):
    host, context = cuda
    host.slow(1, link=(3, 8), h2d=0.5)
    ctx = context(1)
    device, pinned, size = ctx.alloc(256 * MIB), ctx.pinned(256 * MIB), 256 * MIB
    done = []

    def copy():
        ctx.current()
        done.append(ctx.copy("h2d", device, pinned, size))

    worker = threading.Thread(target=copy)
    started = time.time()
    worker.start()
    time.sleep(0.15)
    during = (nvml("GetCurrPcieLinkGeneration", 1), nvml("GetCurrPcieLinkWidth", 1))
    running = worker.is_alive()
    worker.join()
    ended = time.time()
    after = nvml("GetCurrPcieLinkGeneration", 1)
    assert done == [0]
    assert ended - started >= size / 0.5e9 * (1 - JITTER)
    if running:  # a host too loaded to read before the copy ended reads the half second after it
        assert during == ((0, 3), (0, 8))
    until = link_loaded_until(host.paths, 1)
    assert abs(until - (ended + LINK_LOADED_AFTER_S)) < 0.2
    if time.time() < until:
        assert after == (0, 3)
        assert smi_link(host, 1).startswith("3, 5, 8, ") or time.time() >= until
    time.sleep(max(0.0, until - time.time()) + 0.05)
    assert nvml("GetCurrPcieLinkGeneration", 1) == (0, 1)
    assert smi_link(host, 1) == "1, 5, 8, 16"
    # The other GPUs' links idle throughout.
    assert nvml("GetCurrPcieLinkGeneration", 0) == (0, 1)


def test_copies_take_size_over_bandwidth_on_the_events(cuda):
    host, context = cuda
    ctx = context(0)
    size = 256 * MIB
    device, pinned = ctx.alloc(size), ctx.pinned(size)
    gpu = host.state["gpus"][0]
    # A healthy H200's copies: 55 GB/s configured, capped by 0.85 x Gen5 x16 (53.6 GB/s).
    assert copy_gbps(gpu, "h2d") == pytest.approx(0.85 * 3.938 * 16)
    for direction in ("h2d", "d2h"):
        wall = time.monotonic()
        ms = ctx.timed(lambda: ctx.copy(direction, device, pinned, size))
        assert within_jitter(ms, size, copy_gbps(gpu, direction)), (direction, ms)
        assert time.monotonic() - wall >= size / (copy_gbps(gpu, direction) * 1e9) * (1 - JITTER)
    host.slow(0, h2d=20)
    assert within_jitter(ctx.timed(lambda: ctx.copy("h2d", device, pinned, size)), size, 20)
    assert within_jitter(ctx.timed(lambda: ctx.copy("d2h", device, pinned, size)), size, 0.85 * 3.938 * 16)


def test_a_degraded_link_caps_the_copies(cuda):
    host, context = cuda
    host.slow(2, link=(3, 8))
    ctx = context(2)
    size = 64 * MIB
    device, pinned = ctx.alloc(size), ctx.pinned(size)
    assert copy_gbps(host.state["gpus"][2], "d2h") == pytest.approx(6.698)
    assert within_jitter(ctx.timed(lambda: ctx.copy("d2h", device, pinned, size)), size, 6.698)


def test_the_events_count_the_gpus_work_not_the_hosts_delays(cuda):
    host, context = cuda
    ctx = context(0)
    size = 32 * MIB
    device, pinned = ctx.alloc(size), ctx.pinned(size)

    def two_copies_with_a_busy_host_between():
        assert ctx.copy("h2d", device, pinned, size) == 0
        time.sleep(0.1)
        assert ctx.copy("h2d", device, pinned, size) == 0

    ms = ctx.timed(two_copies_with_a_busy_host_between)
    assert within_jitter(ms, 2 * size, copy_gbps(host.state["gpus"][0], "h2d"))


def test_small_synchronous_copies_stay_instant_and_larger_ones_take_their_time(cuda):
    host, context = cuda
    host.slow(0, h2d=0.1)
    ctx = context(0)
    words = (ctypes.c_uint32 * 8)(*range(8))
    small, large = ctx.alloc(32), ctx.alloc(256 * 1024)
    buffer = ctypes.create_string_buffer(256 * 1024)
    assert ctx.timed(lambda: ctx.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(small), words, ctypes.c_size_t(32))) == 0.0
    back = (ctypes.c_uint32 * 8)()
    assert ctx.lib.cuMemcpyDtoH_v2(back, ctypes.c_uint64(small), ctypes.c_size_t(32)) == 0
    assert list(back) == list(range(8))
    ms = ctx.timed(lambda: ctx.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(large), buffer, ctypes.c_size_t(256 * 1024)))
    assert within_jitter(ms, 256 * 1024, 0.1)


def test_kernels_sweep_memory_at_the_hbm_bandwidth(cuda):
    host, context = cuda
    host.slow(1, hbm=100)
    ctx = context(1)
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    assert ctx.lib.cuModuleLoadData(ctypes.byref(module), FILL_PTX) == 0
    assert ctx.lib.cuModuleGetFunction(ctypes.byref(function), module, b"gpuops_fill") == 0
    data, result = ctx.alloc(1024 * MIB), ctx.alloc(32)
    values = [ctypes.c_uint64(data), ctypes.c_uint64(256 * MIB), ctypes.c_uint32(7), ctypes.c_uint64(result)]
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(value) for value in values])

    def fill():
        assert ctx.lib.cuLaunchKernel(function, 1024, 1, 1, 256, 1, 1, 0, None, params, None) == 0

    assert within_jitter(ctx.timed(fill), 1024 * MIB, 100)
    host.slow(1, clear=True)
    assert within_jitter(ctx.timed(fill), 1024 * MIB, LINK_DEFAULTS["hbm_gbps"])
    assert ctx.lib.cuModuleUnload(module) == 0


def test_replays_grow_with_each_copy_until_cleared(cuda, nvml):
    host, context = cuda
    host.slow(1, replays=3)
    one, zero = context(1), context(0)
    for ctx in (one, one, zero):
        ctx.current()
        assert ctx.copy("h2d", ctx.alloc(MIB), ctx.pinned(MIB), MIB) == 0
    assert (nvml("GetPcieReplayCounter", 1), nvml("GetPcieReplayCounter", 0)) == ((0, 6), (0, 0))
    host.slow(1, clear=True)
    assert nvml("GetPcieReplayCounter", 1) == (0, 0)
    host.slow(1, replays=2)
    one.current()
    assert one.copy("d2h", one.alloc(MIB), one.pinned(MIB), MIB) == 0
    assert nvml("GetPcieReplayCounter", 1) == (0, 2)
    host.fault("clear")
    assert nvml("GetPcieReplayCounter", 1) == (0, 0)
    assert host.state["gpus"][1]["replays"] == 0


def test_a_copy_hang_stalls_that_gpus_copies_alone(cuda):
    host, context = cuda
    host.slow(1, copy_hang=0.4)
    for gpu, slow in ((1, True), (0, False)):
        ctx = context(gpu).current()
        device, pinned = ctx.alloc(MIB), ctx.pinned(MIB)
        wall = time.monotonic()
        ms = ctx.timed(lambda: ctx.copy("h2d", device, pinned, MIB))
        assert (time.monotonic() - wall >= 0.4) == slow
        # A hang in the driver call, not time on the GPU.
        assert within_jitter(ms, MIB, copy_gbps(host.state["gpus"][gpu], "h2d"))


def test_pinned_memory_and_events_answer_as_the_driver_does(cuda):
    host, context = cuda
    lib = context.lib
    pointer = ctypes.c_void_p()
    assert lib.cuMemAllocHost_v2(ctypes.byref(pointer), ctypes.c_size_t(MIB)) == CUDA_ERROR_INVALID_CONTEXT
    ctx = context(0)
    rss = rss_kib()
    pinned = ctx.pinned(256 * MIB)
    device = ctx.alloc(256 * MIB)
    assert ctx.copy("d2h", device, pinned, 256 * MIB) == 0
    assert rss_kib() - rss < 64 * 1024  # the 256 MiB were never touched
    assert lib.cuMemFreeHost(ctypes.c_void_p(pinned)) == 0
    assert lib.cuMemFreeHost(ctypes.c_void_p(pinned)) == CUDA_ERROR_INVALID_VALUE
    ms = ctypes.c_float()
    start, end, untimed = ctx.event(), ctx.event(), ctx.event(flags=2)
    assert lib.cuEventElapsedTime(ctypes.byref(ms), start, end) == CUDA_ERROR_INVALID_HANDLE  # never recorded
    assert lib.cuEventElapsedTime(None, start, end) == CUDA_ERROR_INVALID_VALUE
    assert lib.cuEventElapsedTime(ctypes.byref(ms), None, end) == CUDA_ERROR_INVALID_HANDLE
    assert lib.cuEventRecord(start, ctypes.c_void_p(0x1234)) == CUDA_ERROR_INVALID_HANDLE  # only the null stream
    assert ctx.copy("h2d", device, ctx.pinned(MIB), MIB) == 0
    assert lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(device), ctypes.c_void_p(pinned), ctypes.c_size_t(1),
                                    ctypes.c_void_p(0x1234)) == CUDA_ERROR_INVALID_HANDLE
    for event in (start, end, untimed):
        assert lib.cuEventRecord(event, None) == 0
    assert lib.cuEventElapsedTime(ctypes.byref(ms), start, end) == 0 and ms.value == 0.0
    assert lib.cuEventElapsedTime(ctypes.byref(ms), start, untimed) == CUDA_ERROR_INVALID_HANDLE
    assert lib.cuEventDestroy_v2(start) == 0
    assert lib.cuEventDestroy_v2(start) == CUDA_ERROR_INVALID_HANDLE
    assert lib.cuEventSynchronize(None) == CUDA_ERROR_INVALID_HANDLE


def rss_kib():
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0]


def test_topology_switches_and_numa_nodes(cuda, nvml):
    host = cuda[0]
    assert [nvml.ancestor(0, other) for other in (0, 1, 3, 4)] == [(0, 0), (0, 10), (0, 40), (0, 50)]
    assert [nvml.ancestor(6, other) for other in (7, 5, 2)] == [(0, 10), (0, 40), (0, 50)]
    out = host.smi("topo", "-m")
    lines = out.stdout.split("\n")
    assert out.returncode == 0
    assert lines[0] == "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert lines[1] == "GPU0\t X \tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A"
    assert lines[8] == "GPU7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPIX\t X \t56-111,168-223\t1\t\tN/A"
    assert lines[9:12] == ["", "Legend:", ""]
    assert [line[:6] for line in lines[12:19]] == ["  X   ", "  SYS ", "  NODE", "  PHB ", "  PXB ", "  PIX ", "  NV# "]
    assert host.smi("topo").returncode == 2


def test_a_lost_gpu_and_na_faults(cuda, nvml):
    host = cuda[0]
    host.fault("na", field="pcie.link.gen.current", gpu=2)
    assert nvml("GetCurrPcieLinkGeneration", 2) == (3, 0)
    assert smi_link(host, 2) == "[N/A], 5, 16, 16"
    host.fault("lost", gpu=3)
    assert nvml("GetCurrPcieLinkWidth", 3)[0] == 999
    assert nvml("GetPcieReplayCounter", 3)[0] == 999
    assert nvml.ancestor(0, 3)[0] == 999


def gpusim(*args):
    env = dict(os.environ, PYTHONPATH=GPUSIM_PARENT)
    return subprocess.run([sys.executable, "-m", "gpusim"] + list(args), env=env, capture_output=True, text=True,
                          check=False)


def test_the_cli_sets_and_clears_a_gpus_link(gpuhost_factory):
    host = gpuhost_factory(gpus=2)
    fault = ["fault", "--root", host.root, "slow", "--gpu", "1"]
    done = gpusim(*fault + ["--link", "3,8", "--h2d", "20", "--d2h", "21.5", "--hbm", "900", "--replays", "2",
                            "--copy-hang", "0.25"])
    assert done.returncode == 0, done.stderr
    gpu = host.state["gpus"][1]
    assert [gpu[key] for key in ("max_gen", "max_width", "loaded_gen", "loaded_width", "h2d_gbps", "d2h_gbps",
                                 "hbm_gbps", "replays", "copy_hang_s")] == [5, 16, 3, 8, 20.0, 21.5, 900.0, 2, 0.25]
    assert "link 1 5 16 3 8 20.0 21.5 900.0 2 0.25\n" in open(os.path.join(host.root, "var/lib/gpusim/state.nvml")).read()
    assert gpusim(*fault + ["--clear"]).returncode == 0
    assert {key: host.state["gpus"][1][key] for key in LINK_DEFAULTS} == LINK_DEFAULTS
    assert host.state["gpus"][1]["loaded_gen"] == 5
    assert gpusim(*fault + ["--h2d", "1"]).returncode == 0
    assert gpusim("fault", "--root", host.root, "clear").returncode == 0
    assert host.state["gpus"][1]["h2d_gbps"] == 55.0


@pytest.mark.parametrize("args, code, said", [
    (["--link", "3x8"], 2, "gpusim fault slow: error: argument --link: expected GEN,WIDTH, e.g. 3,8; got '3x8'"),
    (["--link", "6,16"], 2, "argument --link: PCIe generation 6: expected 1 to 5"),
    (["--link", "3,7"], 2, "argument --link: width 7: expected one of 1, 2, 4, 8, 12, 16, 32"),
    (["--h2d", "-5"], 2, "argument --h2d: expected a positive number of GB/s, got '-5'"),
    (["--hbm", "0"], 2, "argument --hbm: expected a positive number of GB/s, got '0'"),
    (["--replays", "-1"], 2, "argument --replays: expected a count of 0 or more, got '-1'"),
    (["--copy-hang", "soon"], 2, "argument --copy-hang: expected 0 or more seconds, got 'soon'"),
    (["--link", "5,32"], 1, "gpusim: link: width x32: a PCIe link is x1, x2, x4, x8, x12, x16, x32 wide, this GPU's "
                            "x16 at most"),
    ([], 1, "gpusim: slow: give link, h2d, d2h, hbm, replays or copy_hang, or clear"),
])
def test_the_cli_refuses_bad_settings(gpuhost_factory, args, code, said):
    host = gpuhost_factory(gpus=2)
    done = gpusim("fault", "--root", host.root, "slow", "--gpu", "1", *args)
    assert (done.returncode, said in done.stderr) == (code, True), done.stderr
    assert host.state["gpus"][1]["loaded_width"] == 16


def test_the_api_refuses_a_gpu_it_does_not_have(gpuhost_factory):
    host = gpuhost_factory(gpus=2)
    with pytest.raises(ValueError, match="no GPU 5 on this host"):
        host.slow(5, h2d=10)
    with pytest.raises(ValueError, match="link: expected GEN,WIDTH"):
        host.slow(0, link="fast")
