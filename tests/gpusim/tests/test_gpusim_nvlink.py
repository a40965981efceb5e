"""NVLink (`gpusim nvlink`), peer copies and the row remapper's histogram, through the real built libraries
(ctypes, in this process) and the fake nvidia-smi: topo -m on an HGX board, link states and error counters
through NVML and `nvidia-smi nvlink`, links down, peer access and peer copies timed by events with one
context per GPU in one process (at 370 GB/s, scaled and capped by faults, or over PCIe), the errors peer
copies add, the histogram through NVML and `nvidia-smi -q -d ROW_REMAPPER`, and the CLI."""

import ctypes
import os
import shutil
import subprocess
import sys
import time

import pytest

from gpusim.state import NVLINK_PEER_GBPS, REMAP_HISTOGRAM_DEFAULT, copy_gbps, link_loaded_until, peer_gbps

if not (shutil.which("gcc") or shutil.which("cc")):
    pytest.skip("no C compiler", allow_module_level=True)

MIB = 1024 * 1024
JITTER = 0.02
GPUSIM_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA, DL_ECC_DATA = range(5)


class Context:
    """A context of the host's fake libcuda on one GPU (by CUDA ordinal), in this process."""

    def __init__(self, lib, ordinal):
        self.lib, self.device, self.handle = lib, ctypes.c_int(), ctypes.c_void_p()
        assert lib.cuDeviceGet(ctypes.byref(self.device), ordinal) == 0
        assert lib.cuCtxCreate_v2(ctypes.byref(self.handle), 0, self.device) == 0

    def current(self):
        assert self.lib.cuCtxSetCurrent(self.handle) == 0
        return self

    def alloc(self, size):
        self.current()
        pointer = ctypes.c_uint64()
        assert self.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) == 0
        return pointer.value

    def enable(self, peer):
        """cuCtxEnablePeerAccess from this context (made current) to peer."""
        self.current()
        return self.lib.cuCtxEnablePeerAccess(peer.handle, 0)

    def timed(self, work):
        """Milliseconds the events of this context (current) measure around work()."""
        self.current()
        start, end, ms = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_float()
        for event in (start, end):
            assert self.lib.cuEventCreate(ctypes.byref(event), 0) == 0
        assert self.lib.cuEventRecord(start, None) == 0
        work()
        assert self.lib.cuEventRecord(end, None) == 0
        assert self.lib.cuEventSynchronize(end) == 0
        assert self.lib.cuEventElapsedTime(ctypes.byref(ms), start, end) == 0
        assert self.lib.cuEventDestroy_v2(start) == 0 and self.lib.cuEventDestroy_v2(end) == 0
        return ms.value


def copy_peer(lib, dst_ctx, dst, src_ctx, src, size):
    """cuMemcpyPeerAsync on the null stream; asserts it succeeds."""
    assert lib.cuMemcpyPeerAsync(ctypes.c_uint64(dst), dst_ctx.handle, ctypes.c_uint64(src), src_ctx.handle,
                                 ctypes.c_size_t(size), None) == 0


@pytest.fixture
def hgx(gpuhost_factory, monkeypatch):
    """(host of 8 GPUs with 18 NVLinks each, context(ordinal), lib): contexts of its fake libcuda,
    destroyed at the end."""
    host = gpuhost_factory()
    host.nvlink(18)
    lib = ctypes.CDLL(host.install_cuda())
    monkeypatch.setenv("GPUSIM_ROOT", host.root)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert lib.cuInit(0) == 0
    contexts = []

    def context(ordinal):
        contexts.append(Context(lib, ordinal))
        return contexts[-1]

    yield host, context, lib
    for made in contexts:
        lib.cuCtxDestroy_v2(made.handle)


@pytest.fixture
def nvml(hgx):
    """The host's fake libnvidia-ml, initialised in this process."""
    lib = ctypes.CDLL(hgx[0].install_nvml())
    assert lib.nvmlInit_v2() == 0

    def handle(gpu):
        found = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(gpu, ctypes.byref(found)) == 0
        return found

    def state(gpu, link):
        active = ctypes.c_int(-1)
        return lib.nvmlDeviceGetNvLinkState(handle(gpu), link, ctypes.byref(active)), active.value

    def errors(gpu, link, counter):
        value = ctypes.c_ulonglong(12345)
        return lib.nvmlDeviceGetNvLinkErrorCounter(handle(gpu), link, counter, ctypes.byref(value)), value.value

    def histogram(gpu):
        values = (ctypes.c_uint * 5)()
        return lib.nvmlDeviceGetRowRemapperHistogram(handle(gpu), values), tuple(values)

    def ancestor(first, second):
        level = ctypes.c_int()
        assert lib.nvmlDeviceGetTopologyCommonAncestor(handle(first), handle(second), ctypes.byref(level)) == 0
        return level.value

    yield state, errors, histogram, ancestor
    lib.nvmlShutdown()


def within_jitter(ms, size, gbps):
    expected = size / (gbps * 1e9) * 1000
    return expected * (1 - JITTER) - 1e-6 <= ms <= expected * (1 + JITTER) + 1e-6


def gpusim(*args):
    env = dict(os.environ, PYTHONPATH=GPUSIM_PARENT)
    return subprocess.run([sys.executable, "-m", "gpusim"] + list(args), env=env, capture_output=True, text=True,
                          check=False)


# ---------------------------------------------------------------- topology, link states, counters

def test_topo_shows_nv18_between_every_pair_and_nvml_keeps_the_pcie_path(hgx, nvml):
    host = hgx[0]
    lines = host.smi("topo", "-m").stdout.split("\n")
    assert lines[1] == "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t0-55,112-167\t0\t\tN/A"
    assert lines[8] == "GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \t56-111,168-223\t1\t\tN/A"
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in lines
    ancestor = nvml[3]
    assert [ancestor(0, other) for other in (1, 3, 4)] == [10, 40, 50]  # the PCIe topology, unchanged
    host.nvlink(0)
    assert host.smi("topo", "-m").stdout.split("\n")[1].startswith("GPU0\t X \tPIX\tNODE\tNODE\tSYS\t")


def test_link_states_and_counters_through_nvml(hgx, nvml):
    state, errors, _histogram, _ancestor = nvml
    assert [state(0, link) for link in (0, 17)] == [(0, 1), (0, 1)]
    assert state(0, 18)[0] == NVML_ERROR_INVALID_ARGUMENT
    assert [errors(3, link, counter) for link, counter in ((0, DL_REPLAY), (5, DL_CRC_FLIT), (17, DL_ECC_DATA))] == [
        (0, 0)] * 3
    assert errors(3, 0, 5)[0] == NVML_ERROR_INVALID_ARGUMENT  # NVML_NVLINK_ERROR_COUNT is no counter
    assert errors(3, 18, DL_REPLAY)[0] == NVML_ERROR_INVALID_ARGUMENT
    hgx[0].nvlink(12)
    assert state(0, 11) == (0, 1) and state(0, 12)[0] == NVML_ERROR_INVALID_ARGUMENT
    hgx[0].nvlink(0)
    assert state(0, 0)[0] == NVML_ERROR_NOT_SUPPORTED
    assert errors(0, 0, DL_CRC_FLIT)[0] == NVML_ERROR_NOT_SUPPORTED


def test_nvidia_smi_nvlink_status_and_error_counters(hgx):
    host = hgx[0]
    gpu = host.state["gpus"][2]
    status = host.smi("nvlink", "-s", "-i", "2")
    assert status.returncode == 0
    lines = status.stdout.split("\n")
    assert lines[0] == "GPU 2: NVIDIA H200 (UUID: %s)" % gpu["uuid"]
    assert lines[1:19] == ["\t Link %d: 26.562 GB/s" % link for link in range(18)]
    assert lines[19:] == [""]
    everyone = host.smi("nvlink", "--status").stdout.split("\n")
    assert [line for line in everyone if line.startswith("GPU ")] == [
        "GPU %d: NVIDIA H200 (UUID: %s)" % (g["index"], g["uuid"]) for g in host.state["gpus"]]
    counters = host.smi("nvlink", "-e", "-i", "2").stdout.split("\n")
    assert counters[:8] == ["GPU 2: NVIDIA H200 (UUID: %s)" % gpu["uuid"], "\t Link 0: Replay Errors: 0",
                            "\t Link 0: Recovery Errors: 0", "\t Link 0: CRC Errors: 0", "",
                            "\t Link 1: Replay Errors: 0", "\t Link 1: Recovery Errors: 0", "\t Link 1: CRC Errors: 0"]
    assert counters[-4:] == ["\t Link 17: Replay Errors: 0", "\t Link 17: Recovery Errors: 0",
                             "\t Link 17: CRC Errors: 0", ""]
    assert host.smi("nvlink").returncode == 2
    assert host.smi("nvlink", "-s", "-e").returncode == 2
    assert host.smi("nvlink", "-s", "-i", "9").returncode == 6
    host.nvlink(0)
    nothing = host.smi("nvlink", "-s")
    assert (nothing.returncode, nothing.stdout) == (0, "")
    assert host.smi("nvlink", "-e", "-i", "1").stdout == ""


def test_a_link_down(hgx, nvml):
    host, state = hgx[0], nvml[0]
    host.slow(1, nvlink_down=[3, 17])
    assert [state(1, link) for link in (2, 3, 17)] == [(0, 1), (0, 0), (0, 0)]
    assert state(0, 3) == (0, 1)
    lines = host.smi("nvlink", "-s", "-i", "1").stdout.split("\n")
    assert lines[3:6] == ["\t Link 2: 26.562 GB/s", "\t Link 3: <inactive>", "\t Link 4: 26.562 GB/s"]
    assert lines[18] == "\t Link 17: <inactive>"
    # The pairs with GPU 1 share the 16 links it has left (a guess: no capture of a real one).
    assert host.smi("topo", "-m").stdout.split("\n")[1].split("\t")[2:4] == ["NV16", "NV18"]
    host.slow(1, clear=True)
    assert state(1, 3) == (0, 1)


# ---------------------------------------------------------------- devices, peer access

def test_devices_and_ordinals_follow_cuda_visible_devices(hgx, monkeypatch):
    host, _context, lib = hgx
    count, device = ctypes.c_int(), ctypes.c_int()
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value == 8
    assert lib.cuDeviceGet(ctypes.byref(device), 7) == 0 and device.value == 7
    assert lib.cuDeviceGet(ctypes.byref(device), 8) == CUDA_ERROR_INVALID_DEVICE
    assert lib.cuDeviceGet(None, 0) == CUDA_ERROR_INVALID_VALUE
    uuids = [g["uuid"] for g in host.state["gpus"]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "%s,%s" % (uuids[5], uuids[2]))
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value == 2
    assert [lib.cuDeviceGet(ctypes.byref(device), ordinal) == 0 and device.value for ordinal in (0, 1)] == [5, 2]
    # As the real library does, enumeration stops at the first entry that names no GPU.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,9,1")
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value == 1
    can = ctypes.c_int()
    assert lib.cuDeviceCanAccessPeer(ctypes.byref(can), 3, 1) == CUDA_ERROR_INVALID_DEVICE


def test_peer_access_in_nvlink_mode_and_over_pcie(hgx):
    host, context, lib = hgx
    can = ctypes.c_int()

    def access(dev, peer):
        assert lib.cuDeviceCanAccessPeer(ctypes.byref(can), dev, peer) == 0
        return can.value

    assert [access(0, peer) for peer in (0, 1, 2, 7)] == [0, 1, 1, 1]
    host.nvlink(0)
    # Without NVLink only GPUs under one PCIe switch reach each other (P2P over PCIe).
    assert [access(0, peer) for peer in (1, 2, 7)] == [1, 0, 0]
    assert [access(6, 7), access(5, 6)] == [1, 0]
    zero, one, two = context(0), context(1), context(2)
    assert zero.enable(two) == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
    assert zero.enable(one) == 0
    assert zero.enable(one) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    assert one.enable(zero) == 0  # per current context
    assert zero.enable(zero) == CUDA_ERROR_INVALID_CONTEXT
    assert lib.cuCtxEnablePeerAccess(ctypes.c_void_p(0x1234), 0) == CUDA_ERROR_INVALID_CONTEXT
    assert lib.cuCtxEnablePeerAccess(two.handle, 1) == CUDA_ERROR_INVALID_VALUE  # Flags must be 0
    zero.current()
    assert lib.cuCtxDisablePeerAccess(one.handle) == 0
    assert lib.cuCtxDisablePeerAccess(one.handle) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
    assert zero.enable(one) == 0
    host.nvlink(18)
    assert zero.enable(two) == 0


def test_all_links_down_leave_a_gpu_to_pcie(hgx):
    host, _context, lib = hgx
    host.slow(2, nvlink_down=list(range(18)))
    can = ctypes.c_int()
    assert [lib.cuDeviceCanAccessPeer(ctypes.byref(can), 2, peer) == 0 and can.value for peer in (3, 4)] == [1, 0]
    assert host.smi("topo", "-m").stdout.split("\n")[3].split("\t")[1:6] == ["NODE", "NODE", " X ", "PIX", "SYS"]
    assert host.smi("topo", "-m").stdout.split("\n")[1].split("\t")[2:5] == ["NV18", "NODE", "NV18"]


# ---------------------------------------------------------------- peer copies

def test_two_contexts_in_one_process_copy_at_the_nvlink_bandwidth(hgx):
    host, context, lib = hgx
    zero, three = context(0), context(3)
    size = 512 * MIB
    src, dst = zero.alloc(size), three.alloc(size)
    assert three.enable(zero) == 0
    state = host.state
    assert peer_gbps(state, state["gpus"][0], state["gpus"][3]) == NVLINK_PEER_GBPS
    ms = three.timed(lambda: copy_peer(lib, three, dst, zero, src, size))
    assert within_jitter(ms, size, 370), ms
    # The other context's events never saw it: the copy ran on the current context's stream.
    assert zero.timed(lambda: None) == 0.0
    # Over NVLink: no PCIe link loaded.
    assert (link_loaded_until(host.paths, 0), link_loaded_until(host.paths, 3)) == (0.0, 0.0)

    # Back, synchronously, on the other context's stream: peer access enabled in either context makes it direct.
    def back():
        assert lib.cuMemcpyPeer(ctypes.c_uint64(src), zero.handle, ctypes.c_uint64(dst), three.handle,
                                ctypes.c_size_t(size)) == 0

    assert within_jitter(zero.timed(back), size, 370)


def test_small_peer_copies_carry_the_bytes(hgx):
    _host, context, lib = hgx
    zero, one = context(0), context(1)
    src, dst = zero.alloc(64), one.alloc(64)
    words = (ctypes.c_uint32 * 16)(*range(100, 116))
    zero.current()
    assert lib.cuMemcpyHtoD_v2(ctypes.c_uint64(src), words, ctypes.c_size_t(64)) == 0
    assert lib.cuMemcpyPeer(ctypes.c_uint64(dst), one.handle, ctypes.c_uint64(src), zero.handle,
                            ctypes.c_size_t(64)) == 0
    back = (ctypes.c_uint32 * 16)()
    one.current()
    assert lib.cuMemcpyDtoH_v2(back, ctypes.c_uint64(dst), ctypes.c_size_t(64)) == 0
    assert list(back) == list(range(100, 116))
    # An address outside the context's allocations, or a context that is not one.
    assert lib.cuMemcpyPeer(ctypes.c_uint64(dst + 4096), one.handle, ctypes.c_uint64(src), zero.handle,
                            ctypes.c_size_t(64)) == CUDA_ERROR_INVALID_VALUE
    assert lib.cuMemcpyPeer(ctypes.c_uint64(dst), ctypes.c_void_p(0x1234), ctypes.c_uint64(src), zero.handle,
                            ctypes.c_size_t(64)) == CUDA_ERROR_INVALID_CONTEXT


def test_links_down_scale_and_p2p_caps_the_peer_bandwidth(hgx):
    host, context, lib = hgx
    one, four = context(1), context(4)
    size = 256 * MIB
    src, dst = one.alloc(size), four.alloc(size)
    assert four.enable(one) == 0
    host.slow(1, nvlink_down="0,1,2,3,4,5,6,7,8")  # half its links
    assert within_jitter(four.timed(lambda: copy_peer(lib, four, dst, one, src, size)), size, 185)
    host.slow(4, p2p=100)
    assert within_jitter(four.timed(lambda: copy_peer(lib, four, dst, one, src, size)), size, 100)
    host.slow(4, p2p=300)
    assert within_jitter(four.timed(lambda: copy_peer(lib, four, dst, one, src, size)), size, 185)
    host.fault("clear")
    assert within_jitter(four.timed(lambda: copy_peer(lib, four, dst, one, src, size)), size, 370)


def test_without_peer_access_a_copy_is_staged_through_host_memory(hgx):
    host, context, lib = hgx
    two, five = context(2), context(5)
    size = 128 * MIB
    src, dst = two.alloc(size), five.alloc(size)
    gpus = host.state["gpus"]
    staged = min(copy_gbps(gpus[2], "d2h"), copy_gbps(gpus[5], "h2d"))
    assert within_jitter(five.timed(lambda: copy_peer(lib, five, dst, two, src, size)), size, staged)
    # Both PCIe links carried it.
    assert link_loaded_until(host.paths, 2) > 0 and link_loaded_until(host.paths, 5) > 0


def test_pcie_only_peers_copy_at_the_slower_links_bandwidth(hgx):
    host, context, lib = hgx
    host.nvlink(0)
    host.slow(7, link=(4, 16), replays=2)
    six, seven = context(6), context(7)
    size = 64 * MIB
    src, dst = six.alloc(size), seven.alloc(size)
    assert seven.enable(six) == 0
    state = host.state
    gbps = peer_gbps(state, state["gpus"][6], state["gpus"][7])
    assert gbps == pytest.approx(0.85 * 1.969 * 16)
    assert within_jitter(seven.timed(lambda: copy_peer(lib, seven, dst, six, src, size)), size, gbps)
    assert os.path.exists(host.paths.replay_file(7)) and open(host.paths.replay_file(7)).read().strip() == "2"
    host.slow(6, p2p=5)
    assert within_jitter(seven.timed(lambda: copy_peer(lib, seven, dst, six, src, size)), size, 5)


def test_each_peer_copy_adds_the_gpus_errors_to_its_link_0(hgx, nvml):
    host, context, lib = hgx
    errors = nvml[1]
    host.slow(0, nvlink_errors=3)
    zero, one, two = context(0), context(1), context(2)
    a, b, c = zero.alloc(MIB), one.alloc(MIB), two.alloc(MIB)
    assert one.enable(zero) == 0 and two.enable(one) == 0
    one.current()
    copy_peer(lib, one, b, zero, a, MIB)
    copy_peer(lib, zero, a, one, b, MIB)
    two.current()
    copy_peer(lib, two, c, one, b, MIB)  # GPU 0 not in it
    assert errors(0, 0, DL_CRC_FLIT) == (0, 6)
    assert [errors(0, 0, DL_REPLAY), errors(0, 1, DL_CRC_FLIT), errors(1, 0, DL_CRC_FLIT)] == [(0, 0)] * 3
    lines = host.smi("nvlink", "-e", "-i", "0").stdout.split("\n")
    assert lines[1:4] == ["\t Link 0: Replay Errors: 0", "\t Link 0: Recovery Errors: 0", "\t Link 0: CRC Errors: 6"]
    host.slow(0, clear=True)
    assert errors(0, 0, DL_CRC_FLIT) == (0, 0)
    assert host.state["gpus"][0]["nvlink_errors"] == 0


def test_a_copy_hang_of_either_gpu_stalls_a_peer_copy(hgx):
    host, context, lib = hgx
    host.slow(5, copy_hang=0.3)
    four, five = context(4), context(5)
    src, dst = four.alloc(MIB), five.alloc(MIB)
    assert four.enable(five) == 0
    four.current()
    wall = time.monotonic()
    ms = four.timed(lambda: copy_peer(lib, five, dst, four, src, MIB))
    assert time.monotonic() - wall >= 0.3
    assert within_jitter(ms, MIB, 370)  # a hang in the call, not time on the GPU


# ---------------------------------------------------------------- the row remapper's histogram

def test_the_histogram_through_nvml_and_nvidia_smi(hgx, nvml):
    host, histogram = hgx[0], nvml[2]
    assert histogram(0) == (0, REMAP_HISTOGRAM_DEFAULT) == (0, (3072, 0, 0, 0, 0))
    host.fault("remap", gpu=1, correctable=2, pending=True, histogram=(3070, 2, 0, 0, 0))
    assert histogram(1) == (0, (3070, 2, 0, 0, 0))
    out = host.smi("-q", "-d", "ROW_REMAPPER", "-i", "1")
    assert out.returncode == 0
    lines = out.stdout.split("\n")
    assert lines[lines.index("GPU 00000000:2A:00.0"):] == [
        "GPU 00000000:2A:00.0",
        "    Remapped Rows",
        "        Correctable Error                 : 2",
        "        Uncorrectable Error               : 0",
        "        Pending                           : Yes",
        "        Remapping Failure Occurred        : No",
        "        Bank Remap Availability Histogram",
        "            Max                           : 3070 bank(s)",
        "            High                          : 2 bank(s)",
        "            Partial                       : 0 bank(s)",
        "            Low                           : 0 bank(s)",
        "            None                          : 0 bank(s)",
        "",
        ""]
    assert "Product Name" not in out.stdout and "FB Memory Usage" not in out.stdout
    everything = host.smi("-q").stdout
    assert everything.count("    Remapped Rows\n") == 8
    assert "            Max                           : 3072 bank(s)" in everything
    assert "FB Memory Usage" in host.smi("-q", "-d", "MEMORY,ROW_REMAPPER").stdout
    assert host.smi("-q", "-d", "BOGUS").returncode == 2
    assert host.smi("-d", "ROW_REMAPPER").returncode == 2
    host.fault("reset-required", gpu=1)
    assert histogram(1)[0] == 16  # NVML_ERROR_RESET_REQUIRED, as for the remapped rows
    host.fault("clear")
    assert histogram(1) == (0, (3072, 0, 0, 0, 0))


# ---------------------------------------------------------------- the CLI

def test_the_cli_turns_nvlink_on_and_off_and_sets_a_gpus_links(gpuhost_factory):
    host = gpuhost_factory(gpus=2)
    assert host.state["nvlink_links"] == 0
    done = gpusim("nvlink", "--root", host.root, "--links", "18")
    assert (done.returncode, done.stdout.strip()) == (0, '{"links": 18}'), done.stderr
    fault = ["fault", "--root", host.root, "slow", "--gpu", "1"]
    assert gpusim(*fault + ["--nvlink-down", "3,5", "--nvlink-errors", "4", "--p2p", "120.5"]).returncode == 0
    gpu = host.state["gpus"][1]
    assert (gpu["nvlink_down"], gpu["nvlink_errors"], gpu["p2p_gbps"]) == ([3, 5], 4, 120.5)
    assert "nvlink 1 40 4 120.5\n" in open(os.path.join(host.root, "var/lib/gpusim/state.nvml")).read()
    assert gpusim(*fault + ["--clear"]).returncode == 0
    gpu = host.state["gpus"][1]
    assert (gpu["nvlink_down"], gpu["nvlink_errors"], gpu["p2p_gbps"]) == ([], 0, None)
    assert gpusim("fault", "--root", host.root, "remap", "--gpu", "0", "--histogram", "3000,60,10,2,0").returncode == 0
    assert host.state["faults"]["remap"]["0"]["histogram"] == [3000, 60, 10, 2, 0]
    assert "remap_histogram 0 3000 60 10 2 0\n" in open(os.path.join(host.root, "var/lib/gpusim/state.nvml")).read()
    assert gpusim("nvlink", "--root", host.root).returncode == 0
    assert host.state["nvlink_links"] == 0


@pytest.mark.parametrize("args, code, said", [
    (["nvlink", "--links", "19"], 2,
     "gpusim nvlink: error: argument --links: expected 0 to 18 NVLinks per GPU, got '19'"),
    (["nvlink", "--links", "-1"], 2, "argument --links: expected 0 to 18 NVLinks per GPU, got '-1'"),
    (["fault", "slow", "--gpu", "1", "--nvlink-down", "3x"], 2,
     "gpusim fault slow: error: argument --nvlink-down: expected NVLink numbers from 0 to 17, e.g. 0,3; got '3x'"),
    (["fault", "slow", "--gpu", "1", "--nvlink-down", "18"], 2, "argument --nvlink-down: expected NVLink numbers"),
    (["fault", "slow", "--gpu", "1", "--nvlink-errors", "many"], 2,
     "argument --nvlink-errors: expected a count of 0 or more, got 'many'"),
    (["fault", "slow", "--gpu", "1", "--p2p", "0"], 2, "argument --p2p: expected a positive number of GB/s, got '0'"),
    (["fault", "remap", "--gpu", "1", "--histogram", "1,2,3"], 2,
     "gpusim fault remap: error: argument --histogram: expected five counts of banks, MAX,HIGH,PARTIAL,LOW,NONE"),
    (["fault", "slow", "--gpu", "1", "--nvlink-down", "12"], 1,
     "gpusim: nvlink_down: GPU 1 has links 0 to 11 (gpusim nvlink --links N), not link 12"),
])
def test_the_cli_refuses_bad_input(gpuhost_factory, args, code, said):
    host = gpuhost_factory(gpus=2)
    host.nvlink(12)
    command = args[:1] + ["--root", host.root] + args[1:]
    done = gpusim(*command)
    assert (done.returncode, said in done.stderr) == (code, True), done.stderr
    assert host.state["gpus"][1]["nvlink_down"] == []


def test_the_api_refuses_links_on_a_host_without_nvlink(gpuhost_factory):
    host = gpuhost_factory(gpus=2)
    with pytest.raises(ValueError, match="GPU 0 has no NVLink"):
        host.slow(0, nvlink_down=[0])
    with pytest.raises(ValueError, match="links is a number from 0 to 18"):
        host.nvlink(19)
    with pytest.raises(ValueError, match="histogram: expected five counts"):
        host.fault("remap", gpu=0, histogram=(1, -2, 0, 0, 0))
