"""On-disk state of a simulated host, and the /proc helpers shared by everything else.

Kept import-light: the fake nvidia-smi imports this module on every call.
"""

import json
import os
import time

HGX_BUS_IDS = (
    "00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
    "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0",
)

DEFAULTS = {
    "gpus": 8,
    "name": "NVIDIA H200",
    "memory_total_mib": 143771,
    "driver_version": "550.127.05",
    "cuda_version": "12.4",
    "release_delay": 0.0,
    "persistence_mode": "on",
    "seed": 0,
    # What an idle GPU reads as used through nvidia-smi and NVML v2: idle H100 and H200 read
    # 1 MiB (real-samples Q08_idle_memory_tables.txt; some read 0 MiB).
    "idle_used_mib": 1,
    # Memory the driver and firmware reserve, outside nvidia-smi's memory.used but inside NVML
    # v1 `used`: an idle A10 reads 516 MiB through v1 (Q09_nvml_v1_used_idle.txt, 541917184 B),
    # so 515 reserved + the 1 MiB idle reading. The H200's own figure is not in the samples: a
    # guess of the right size.
    "reserved_mib": 515,
    "minors": None,
    "fallen": (),
}

# PCI identity of the simulated GPUs (H200 SXM: 10de:2335, a 3D controller) and of two PCI
# devices that are not GPUs, so that readers of the bus have something to leave out: the
# host bridge, and an NVSwitch (NVIDIA's vendor id, class 0x0680 "other bridge").
GPU_PCI_DEVICE = "0x2335"
GPU_PCI_CLASS = "0x030200"
OTHER_PCI_DEVICES = (
    ("0000:00:00.0", "0x8086", "0x09a2", "0x060000"),
    ("0000:05:00.0", "0x10de", "0x22a3", "0x068000"),
)

DEV_FILE_SIZE = 4096

# ---------------------------------------------------------------- PCIe link and bandwidth
#
# A lane's capacity in GB/s (1e9 bytes) by PCIe generation, after the line encoding (8b/10b up to
# gen 2, 128b/130b from gen 3): the figures of the PCI-SIG's per-generation tables.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
# What copies reach of a link's capacity: the rest goes to packet headers and flow control.
PCIE_EFFICIENCY = 0.85
# A link counts as loaded for this long after a copy ends; then the GPU drops it to gen 1 to save
# power (the width stays), as real GPUs do while idle.
LINK_LOADED_AFTER_S = 0.5
# Per GPU: the link the GPU and its slot allow, copy bandwidths of an H200 on PCIe Gen5 x16, its HBM,
# replays each copy adds (`fault slow --replays`) and seconds each copy sleeps first (`--copy-hang`).
# loaded_gen and loaded_width (the link under load) default to the max ones.
LINK_DEFAULTS = {"max_gen": 5, "max_width": 16, "h2d_gbps": 55.0, "d2h_gbps": 55.0, "hbm_gbps": 4000.0,
                 "replays": 0, "copy_hang_s": 0.0}
# The settings `fault slow` changes, and `fault slow --clear` and `fault clear` put back.
SLOW_KEYS = ("loaded_gen", "loaded_width", "h2d_gbps", "d2h_gbps", "hbm_gbps", "replays", "copy_hang_s")
# Host CPUs of each NUMA node (`nvidia-smi topo -m`'s CPU Affinity): a two-socket HGX host's, 56
# cores and their hyperthreads per socket, as a DGX H100 prints them (0-55,112-167 on node 0).
NUMA_CPUS = ("0-55,112-167", "56-111,168-223")

# ---------------------------------------------------------------- NVLink and peer copies
#
# `gpusim nvlink --links N` makes the host an HGX board: every GPU has N NVLinks to the NVSwitches, so
# every pair of GPUs is connected (an H100 or H200 has 18, NVLink 4; 0, the default, is a host without
# NVLink). nvml.h's NVML_NVLINK_MAX_LINKS is 18: no GPU has more.
NVLINK_MAX_LINKS = 18
NVLINK_HGX_LINKS = 18
# What `nvidia-smi nvlink -s` prints for an active NVLink 4 link, as an H100 HGX prints it
# (stas00/ml-engineering, NVIDIA/k8s-test-infra#371 for GB200's 53.125).
NVLINK_LINK_SPEED = "26.562 GB/s"
# What a peer copy between two GPUs over NVLink reaches with all their links up: about 370 GB/s of the
# 450 GB/s each way of an H100's or H200's 18 NVLink 4 links, as nvbandwidth and p2pBandwidthLatencyTest
# measure it on HGX H100 boards. Fewer links active on the slower GPU scale it down.
NVLINK_PEER_GBPS = 370.0
# nvmlNvLinkErrorCounter_t, as nvml.h numbers it, and the words `nvidia-smi nvlink -e` prints for the
# first three (the flit CRC counter is its "CRC Errors"; stas00/ml-engineering's H100 capture).
NVLINK_ERROR_COUNTERS = ("DL_REPLAY", "DL_RECOVERY", "DL_CRC_FLIT", "DL_CRC_DATA", "DL_ECC_DATA")
NVLINK_SMI_ERRORS = (("Replay Errors", "DL_REPLAY"), ("Recovery Errors", "DL_RECOVERY"), ("CRC Errors", "DL_CRC_FLIT"))
# Per GPU, what `fault slow` sets of its NVLinks: the links down, the flit CRC errors each peer copy over
# NVLink adds to its link 0, and its own cap on peer copies (None: none).
NVLINK_DEFAULTS = {"nvlink_down": [], "nvlink_errors": 0, "p2p_gbps": None}

# ---------------------------------------------------------------- the row remapper's histogram
#
# nvmlRowRemapperHistogramValues_t and `nvidia-smi -q`'s "Bank Remap Availability Histogram": how many
# memory banks have all (max), many (high), some (partial), few (low) or no (none) spare rows left. A
# healthy H200 reads 3072 banks at max (thamada/gls gls/H200_smi.py, a real H200's `nvidia-smi -a` on
# 550.90.12; an H100 NVL, six HBM stacks too, reads 3072, an H100 80GB with five reads 2560).
REMAP_HISTOGRAM_BUCKETS = ("max", "high", "partial", "low", "none")
REMAP_HISTOGRAM_DEFAULT = (3072, 0, 0, 0, 0)


class Paths:
    """Where a simulated host lives under ROOT."""

    def __init__(self, root):
        self.root = os.path.realpath(root or "/")
        self.dev = os.path.join(self.root, "dev")
        self.lib = os.path.join(self.root, "var", "lib", "gpusim")
        self.state = os.path.join(self.lib, "state.json")
        self.procs = os.path.join(self.lib, "procs")
        self.tracked = os.path.join(self.lib, "tracked")
        # Per GPU, written by the fake libcuda: <index> holds the time (realtime seconds) until which
        # its PCIe link is loaded, <index>.replays its PCIe replay counter, <index>.nvlink_crc_flit the
        # flit CRC errors of its NVLink 0.
        self.link = os.path.join(self.lib, "link")
        if self.root == "/":
            # The driver packages install nvidia-smi there; so does gpusim in a container.
            self.bin = "/usr/bin"
        else:
            self.bin = os.path.join(self.root, "bin")
        self.smi = os.path.join(self.bin, "nvidia-smi")
        # The simulated libnvidia-ml.so.1 (`gpusim nvml`); with ROOT "/" it stays out of the
        # real library directories, so only a process given LD_LIBRARY_PATH loads it.
        self.nvml_dir = os.path.join(self.lib, "lib") if self.root == "/" else os.path.join(self.root, "lib")
        # The simulated kernel log (`gpusim fault xid`, `gpusim kmsg`): a file of /dev/kmsg records
        # (gpusim.kmsg) at ROOT/dev/kmsg; with ROOT "/" beside the state (the real /dev/kmsg is the kernel's).
        self.kmsg = os.path.join(self.lib if self.root == "/" else self.dev, "kmsg")
        self.kernel_log = self.kmsg
        # The PCI bus and the driver's per-GPU entries. With ROOT "/" these are the kernel's own
        # /sys and /proc, which gpusim does not write.
        self.pci_devices = os.path.join(self.root, "sys", "bus", "pci", "devices")
        self.driver_gpus = os.path.join(self.root, "proc", "driver", "nvidia", "gpus")
        # The collection's state directory on this host (its default under host_root ROOT): the
        # kernel log's last read and the GPUs' cures. With ROOT "/" it is the machine's own.
        self.state_dir = os.path.join(self.root, "run", "gpuops")

    def gpu_dev(self, minor):
        """The device node of minor number `minor` (see minor_of for a GPU's)."""
        return os.path.join(self.dev, "nvidia%d" % minor)

    @property
    def ctl_dev(self):
        return os.path.join(self.dev, "nvidiactl")

    @property
    def uvm_dev(self):
        return os.path.join(self.dev, "nvidia-uvm")

    def proc_record(self, pid):
        return os.path.join(self.procs, "%d.json" % pid)

    def link_file(self, index):
        return os.path.join(self.link, "%d" % index)

    def replay_file(self, index):
        return os.path.join(self.link, "%d.replays" % index)

    def nvlink_crc_file(self, index):
        return os.path.join(self.link, "%d.nvlink_crc_flit" % index)


def write_json(path, data):
    """Atomic write: readers see the old or the new file, never half of one.

    The host state and the allocation records also get a flat twin (see flat_text) for the
    simulated libnvidia-ml.so.1, written the same way, so the C library needs no JSON parser.
    """
    flat = flat_text(path, data)
    if flat is not None:
        _write_atomic(os.path.splitext(path)[0] + ".nvml", flat)
    _write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def _write_atomic(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    # surrogateescape: a process name that is not UTF-8 is written back as its own bytes.
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    os.replace(tmp, path)


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


# ---------------------------------------------------------------- /proc helpers

def proc_stat(pid):
    """(state, session, starttime) from /proc/PID/stat, or None if there is no such pid."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return rest[0], int(rest[3]), int(rest[19])


def proc_starttime(pid):
    st = proc_stat(pid)
    return None if st is None else st[2]


def is_alive(pid, starttime=None):
    """True if pid runs (not a zombie) and, when given, still has that start time."""
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X", "x"):
        return False
    return starttime is None or st[2] == starttime


def proc_cmdline_argv0(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data:
        return None
    # surrogateescape keeps the bytes of a name that is not UTF-8 (they are printed as read).
    return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def proc_comm(pid):
    try:
        with open("/proc/%d/comm" % pid, encoding="utf-8", errors="surrogateescape") as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def holders_of(paths_set, exclude=()):
    """pids that have any of paths_set open (fd) or mapped, like fuser."""
    found = set()
    for pid in pids():
        if pid in exclude:
            continue
        fd_dir = "/proc/%d/fd" % pid
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(os.path.join(fd_dir, fd)) in paths_set:
                        found.add(pid)
                        break
                except OSError:
                    pass
        except OSError:
            continue
        if pid in found:
            continue
        try:
            with open("/proc/%d/maps" % pid) as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].rstrip("\n") in paths_set:
                        found.add(pid)
                        break
        except OSError:
            pass
    return found


# ---------------------------------------------------------------- host state

def make_uuid(rng):
    h = "%032x" % rng.getrandbits(128)
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def bus_id(index):
    if index < len(HGX_BUS_IDS):
        return HGX_BUS_IDS[index]
    # Beyond one HGX board: a second board's worth of plausible, distinct buses.
    return "00000000:%02X:00.0" % ((0x0E + 0x11 * (index - len(HGX_BUS_IDS))) % 0x100)


def minor_of(state, index):
    """The driver's minor number of GPU `index` (its /dev/nvidiaN)."""
    for g in state["gpus"]:
        if g["index"] == index:
            return g.get("minor", index)
    raise ValueError("no GPU %s on this host" % index)


def _minors(minors, count):
    if minors is None:
        return list(range(count))
    minors = [int(m) for m in minors]
    if len(minors) != count or len(set(minors)) != count or any(m < 0 or m > 254 for m in minors):
        raise ValueError("minors: give %d distinct minor numbers from 0 to 254, one per GPU the driver "
                         "attaches, in index order; got %s" % (count, minors))
    return minors


def build_state(gpus=8, name="NVIDIA H200", memory_total_mib=143771,
                driver_version="550.127.05", cuda_version="12.4", release_delay=0.0,
                persistence_mode="on", seed=0, idle_used_mib=1, reserved_mib=515, minors=None, fallen=()):
    """gpus: GPUs on the PCI bus. fallen: positions (0-based, in bus order) of those that fell off
    the bus at boot: the driver never attached them, so nvidia-smi numbers the others 0..N-1 in
    bus order. minors: the driver's minor number of each attached GPU, in index order."""
    import random

    rng = random.Random(seed)
    pm = "Enabled" if persistence_mode in ("on", "1", "Enabled", True) else "Disabled"
    fallen = sorted(set(int(p) for p in fallen or ()))
    if any(p < 0 or p >= int(gpus) for p in fallen):
        raise ValueError("fallen: positions are 0 to %d, got %s" % (int(gpus) - 1, fallen))
    slots = [p for p in range(int(gpus)) if p not in fallen]
    minors = _minors(minors, len(slots))
    gpu_list = []
    for i, slot in enumerate(slots):
        gpu_list.append({
            "index": i,
            "minor": minors[i],
            "uuid": make_uuid(rng),
            "serial": "%013d" % rng.randrange(10 ** 12, 10 ** 13),
            "name": name,
            "pci_bus_id": bus_id(slot),
            "memory_total_mib": int(memory_total_mib),
            "persistence_mode": pm,
            "compute_mode": "Default",
            "temperature": 28 + rng.randrange(0, 9),
            "stuck_mib": 0,
            "idle_used_mib": int(idle_used_mib),
            "reserved_mib": int(reserved_mib),
        })
        gpu_list[-1].update(healthy_link(gpu_list[-1]))
    return {
        "gpus": gpu_list,
        "driver_version": driver_version,
        "cuda_version": cuda_version,
        "release_delay_s": float(release_delay),
        "faults": empty_faults(),
        # NVLinks per GPU (`gpusim nvlink`): 0, a host whose GPUs talk over PCIe alone.
        "nvlink_links": 0,
        # On the PCI bus, never attached by the driver.
        "fallen": [{"pci_bus_id": bus_id(p), "name": name} for p in fallen],
    }


def healthy_link(gpu):
    """The settings of `fault slow` as a GPU has them without it: its link loaded at the max gen and
    width, the default bandwidths, no replays, no hang, every NVLink up without errors, no peer cap."""
    healthy = {key: LINK_DEFAULTS[key] for key in SLOW_KEYS if key in LINK_DEFAULTS}
    healthy.update((key, list(value) if isinstance(value, list) else value) for key, value in NVLINK_DEFAULTS.items())
    healthy["max_gen"] = int(gpu.get("max_gen", LINK_DEFAULTS["max_gen"]))
    healthy["max_width"] = int(gpu.get("max_width", LINK_DEFAULTS["max_width"]))
    healthy["loaded_gen"] = healthy["max_gen"]
    healthy["loaded_width"] = healthy["max_width"]
    return healthy


def link_of(gpu):
    """A GPU's PCIe link and bandwidths (LINK_DEFAULTS, with loaded_gen and loaded_width) and what
    `fault slow` set of its NVLinks (NVLINK_DEFAULTS), the defaults filled in for a state written before
    gpusim had them."""
    link = healthy_link(gpu)
    link.update((key, gpu[key]) for key in SLOW_KEYS + tuple(NVLINK_DEFAULTS) if key in gpu)
    return link


def copy_gbps(gpu, direction):
    """The bandwidth (GB/s) a copy reaches, direction "h2d" or "d2h": the configured one, capped by
    what the link loaded at its gen and width carries."""
    link = link_of(gpu)
    capacity = PCIE_EFFICIENCY * PCIE_LANE_GBPS[link["loaded_gen"]] * link["loaded_width"]
    return min(float(link[direction + "_gbps"]), capacity)


def link_loaded_until(paths, index):
    """The time until which the fake libcuda's copies keep GPU index's link loaded (0: never copied)."""
    try:
        with open(paths.link_file(index)) as f:
            return float(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0.0


def link_now(paths, gpu, now=None):
    """(gen, width) of a GPU's link now: the loaded ones while a copy is in flight and for
    LINK_LOADED_AFTER_S after it (the fake libcuda writes until when), gen 1 at that width otherwise."""
    link = link_of(gpu)
    now = time.time() if now is None else now
    loaded = now < link_loaded_until(paths, gpu["index"])
    return (link["loaded_gen"] if loaded else 1), link["loaded_width"]


def nvlink_links(state):
    """NVLinks per GPU on this host (`gpusim nvlink`); 0 without NVLink."""
    return int(state.get("nvlink_links") or 0)


def nvlinks_active(state, gpu):
    """The links of a GPU that are up: all of the host's but those `fault slow --nvlink-down` took down."""
    down = set(link_of(gpu)["nvlink_down"])
    return [link for link in range(nvlink_links(state)) if link not in down]


def nvlink_crc_errors(paths, index):
    """The flit CRC errors (NVML_NVLINK_ERROR_DL_CRC_FLIT) of GPU index's NVLink 0, as the fake libcuda's
    peer copies over NVLink added them."""
    try:
        with open(paths.nvlink_crc_file(index)) as f:
            return int(float(f.read().strip() or 0))
    except (OSError, ValueError):
        return 0


def same_switch(a, b):
    """Whether GPUs a and b (indexes) sit under one PCIe switch: GPUs 2k and 2k+1 do."""
    return a != b and a // 2 == b // 2


def peer_path(state, src, dst):
    """How a direct peer copy from GPU src to GPU dst (entries of state["gpus"]) travels: "nvlink" when
    the host has NVLink and both GPUs have a link up, "pcie" between two GPUs under one PCIe switch (P2P
    over PCIe works there), None otherwise (the GPUs cannot access each other's memory). The fake
    libcuda's cuDeviceCanAccessPeer says 1 for the first two."""
    if src["index"] == dst["index"]:
        return None
    if nvlinks_active(state, src) and nvlinks_active(state, dst):
        return "nvlink"
    return "pcie" if same_switch(src["index"], dst["index"]) else None


def peer_gbps(state, src, dst):
    """The GB/s a direct peer copy from GPU src to GPU dst reaches (as the fake libcuda times it): over
    NVLink NVLINK_PEER_GBPS x the share of the slower GPU's links that are up; over PCIe what the link
    model of each gives a copy out of src (d2h) and into dst (h2d), the lower; then capped by each GPU's
    `fault slow --p2p`. None when the two cannot access each other (see peer_path)."""
    path = peer_path(state, src, dst)
    if path is None:
        return None
    if path == "nvlink":
        share = min(len(nvlinks_active(state, g)) for g in (src, dst)) / float(nvlink_links(state))
        gbps = NVLINK_PEER_GBPS * share
    else:
        gbps = min(copy_gbps(src, "d2h"), copy_gbps(dst, "h2d"))
    caps = [link_of(g)["p2p_gbps"] for g in (src, dst) if link_of(g)["p2p_gbps"]]
    return min([gbps] + [float(cap) for cap in caps])


def staged_gbps(src, dst):
    """The GB/s a peer copy between GPUs without peer access reaches: staged through host memory, out of
    src and into dst over their PCIe links (the lower of the two)."""
    return min(copy_gbps(src, "d2h"), copy_gbps(dst, "h2d"))


def remap_histogram(faults, index):
    """GPU index's row-remapper histogram (max, high, partial, low, none), `fault remap --histogram`'s or
    a healthy H200's."""
    histogram = ((faults.get("remap") or {}).get(str(index)) or {}).get("histogram")
    return tuple(int(v) for v in histogram) if histogram else REMAP_HISTOGRAM_DEFAULT


def numa_node(index, count):
    """The NUMA node of GPU index of count: the switches (pairs) of the lower half on node 0, the
    others on node 1 (a switch never spans two nodes)."""
    return 0 if 2 * (index - index % 2) < count else 1


def topology(a, b, count, nvlinks=0):
    """How `nvidia-smi topo -m` names the path between GPUs a and b of count: NV<nvlinks> when they
    share a bonded set of that many NVLinks (through the NVSwitches of an HGX board); otherwise GPUs 2k
    and 2k+1 share a PCIe switch (PIX), the others meet in their NUMA node's host bridges (NODE) or
    across the sockets' interconnect (SYS)."""
    if a == b:
        return "X"
    if nvlinks > 0:
        return "NV%d" % nvlinks
    if a // 2 == b // 2:
        return "PIX"
    return "NODE" if numa_node(a, count) == numa_node(b, count) else "SYS"


def empty_faults():
    return {
        "lost": {},            # str(index) -> "unknown" | "lost"
        "hang_s": 0.0,
        "na": [],              # {"field": ..., "gpu": int|None, "value": ...}
        "driver_not_loaded": False,
        "no_devices": False,
        "mismatch": False,
        "remap": {},           # str(index) -> {"correctable", "uncorrectable", "pending", "failure"}
        "retired_pending": {},  # str(index) -> bool; absent: not supported (Ampere and newer)
        "reset_required": {},  # str(index) -> True: the driver says the GPU needs a reset
        "reset_refused": {},   # str(index) -> True: a client /proc does not show holds it; no reset
        "recovery": {},        # str(index) -> the driver's GPU Recovery Action (RECOVERY_ACTIONS)
        # The fake libcuda (libcuda/cuda.c): what cuInit returns (0: success), how long it
        # hangs first, and the CUresult each GPU's probe meets (str(index) -> code).
        "cuda_init": 0,
        "cuda_hang_s": 0.0,
        "cuda_gpu": {},
    }


def load_state(paths):
    st = read_json(paths.state)
    if st is None:
        raise FileNotFoundError("gpusim: no host at %s (run gpusim init)" % paths.root)
    return st


# ---------------------------------------------------------------- allocations

def read_json_dir(directory):
    """Every readable JSON record in directory (a missing directory has none)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    records = (read_json(os.path.join(directory, name)) for name in names if name.endswith(".json"))
    return [record for record in records if record]


def load_records(paths):
    out = read_json_dir(paths.procs)
    out.sort(key=lambda r: (r.get("created", 0), r["pid"]))
    return out


def record_alive(rec):
    return is_alive(rec["pid"], rec.get("starttime"))


def mark_dead(paths, rec, now=None):
    """Set died_at on a record of a dead holder if nobody has yet; returns the record."""
    if rec.get("died_at") is None:
        fresh = read_json(paths.proc_record(rec["pid"]), rec)
        if fresh.get("starttime") == rec.get("starttime") and fresh.get("died_at") is None:
            fresh["died_at"] = time.time() if now is None else now
            write_json(paths.proc_record(rec["pid"]), fresh)
            rec = fresh
        elif fresh.get("died_at") is not None:
            rec = fresh
    return rec


def gpu_usage(paths, state, records=None, now=None):
    """{index: (used_mib, util_pct)} plus the list of live compute records.

    Used = the idle reading + live allocations + dead ones still inside the driver's release
    delay + leaked allocations of dead holders (until reset) + stuck memory; what the driver
    reserves is not in it (see gpu_reserved).
    """
    now = time.time() if now is None else now
    if records is None:
        records = load_records(paths)
    delay = float(state.get("release_delay_s", 0.0))
    used = {g["index"]: int(g.get("stuck_mib", 0)) + int(g.get("idle_used_mib", 0)) for g in state["gpus"]}
    util = {g["index"]: 0 for g in state["gpus"]}
    live = []
    for rec in records:
        mib = int(rec.get("mib", 0))
        alive = record_alive(rec)
        rec["alive"] = alive
        freed = _freed(rec)
        if alive:
            # A process of the fake libcuda that freed its allocation on a GPU no longer holds it.
            rec["gpus"] = [i for i in rec["gpus"] if i not in freed]
            if rec["gpus"]:
                live.append(rec)
            for i in rec["gpus"]:
                if i in used:
                    used[i] += mib
                    util[i] = max(util[i], int(rec.get("util", 0)))
        else:
            rec.update(mark_dead(paths, rec, now))
        cleared = set(rec.get("reset_gpus", ()))
        for i in rec["gpus"] if not alive else freed:
            released_at = freed.get(i, rec.get("died_at"))
            if i in used and i not in cleared and (rec.get("leak") or now < released_at + delay):
                used[i] += mib
    return used, util, live


def _freed(rec):
    """{GPU index: time} of the allocations a live process freed (records of the fake libcuda)."""
    return {int(i): float(at) for i, at in (rec.get("freed") or {}).items()}


def gpu_reserved(gpu):
    """MiB the driver reserves on a GPU: nvidia-smi's memory.reserved, NVML v2 `reserved`."""
    return int(gpu.get("reserved_mib", 0))


def gpu_free(gpu, used):
    """nvidia-smi's memory.free (and NVML's `free`, v1 and v2): total less reserved and used."""
    return max(0, int(gpu["memory_total_mib"]) - gpu_reserved(gpu) - used)


# ---------------------------------------------------------------- flat twins for the C library
#
# The JSON files stay the one source of truth; every write of state.json or of a record in
# procs/ also writes NAME.nvml, a line-oriented projection of the same data that
# libnvml/nvml.c reads. Liveness, release delay and leaks are still decided at read time.

COMPUTE_MODES = {"Default": 0, "Exclusive_Thread": 1, "Prohibited": 2, "Exclusive_Process": 3}

# An injected N/A value -> the NVML return code a real driver gives for it.
NA_CODES = {"[N/A]": 3, "[Not Supported]": 3, "[Insufficient Permissions]": 4,
            "[GPU is lost]": 15, "[GPU requires reset]": 16, "[Unknown Error]": 999}
NA_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
              "persistence-mode": "persistence_mode", "compute-mode": "compute_mode",
              "used_memory": "used_gpu_memory"}
LOST_CODES = {"lost": 15, "unknown": 999}

# The driver's GPU Recovery Action: nvmlGpuRecoveryAction_t and how nvidia-smi prints it ("None"
# and "Reset" as NVIDIA/DCGM#263 shows them; the others NVIDIA's names, a guess at the spelling).
RECOVERY_ACTIONS = {"none": (0, "None"), "reset": (1, "Reset"), "reboot": (2, "Node Reboot"),
                    "drain-p2p": (3, "Drain P2P"), "drain-and-reset": (4, "Drain and Reset")}
# Drivers that have the field (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, nvidia-smi gpu_recovery_action):
# 565 and later, NVIDIA's NVML change log ("Changes between v560 and v565").
RECOVERY_ACTION_FROM = 565
# What a GPU that needs a reset answers for the values only the GPU itself can give: nvidia-smi's
# [GPU requires reset] (real-samples smi_query_gpu/Q11: temperature and utilisation; memory.used
# still read, 0 MiB) and NVML_ERROR_RESET_REQUIRED (16).
RESET_REQUIRED_FIELDS = ("temperature.gpu", "utilization.gpu", "utilization.memory", "power.draw", "pstate",
                         "retired_pages.pending", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                         "remapped_rows.pending", "remapped_rows.failure")


def fabric_value(faults, gpu, field, now):
    """fabric.state or fabric.status of gpu. Without the fault "fabric" the host has no NVSwitch
    fabric ([N/A]); with it, a GPU is registered (Completed, Success or the fault's status) except
    for the delay after a reset (In Progress), and for ever after one when the fault says stuck."""
    fabric = faults.get("fabric")
    if not fabric:
        return "[N/A]"
    key = str(gpu["index"])
    ready_at = gpu.get("fabric_ready_at")
    pending = ready_at is not None and (key in fabric.get("stuck", ()) or now < ready_at)
    if field == "fabric.state":
        return "In Progress" if pending else "Completed"
    return "N/A" if pending else fabric.get("status", {}).get(key, "Success")


def driver_major(state):
    try:
        return int(str(state.get("driver_version", "0")).split(".", maxsplit=1)[0])
    except ValueError:
        return 0


def recovery_action(state, index):
    """The driver's recovery action for GPU index: a RECOVERY_ACTIONS key, or None on a driver
    without the field. A GPU that needs a reset says reset unless told otherwise."""
    if driver_major(state) < RECOVERY_ACTION_FROM:
        return None
    faults = state.get("faults") or {}
    action = (faults.get("recovery") or {}).get(str(index))
    if action is None and (faults.get("reset_required") or {}).get(str(index)):
        action = "reset"
    return action or "none"


# CUresult numbers of the CUDA driver API (cuda.h of CUDA 12.4, enum cudaError_enum), for the
# faults of the fake libcuda; libcuda/cuda.c carries the same table with cuGetErrorString's texts.
CUDA_ERRORS = {
    "CUDA_SUCCESS": 0,
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_NOT_INITIALIZED": 3,
    "CUDA_ERROR_DEVICE_UNAVAILABLE": 46,
    "CUDA_ERROR_NO_DEVICE": 100,
    "CUDA_ERROR_INVALID_DEVICE": 101,
    "CUDA_ERROR_NO_BINARY_FOR_GPU": 209,
    "CUDA_ERROR_ECC_UNCORRECTABLE": 214,
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": 217,
    "CUDA_ERROR_INVALID_PTX": 218,
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": 222,
    "CUDA_ERROR_OPERATING_SYSTEM": 304,
    "CUDA_ERROR_INVALID_HANDLE": 400,
    "CUDA_ERROR_NOT_FOUND": 500,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED": 704,
    "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED": 705,
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": 701,
    "CUDA_ERROR_LAUNCH_TIMEOUT": 702,
    "CUDA_ERROR_LAUNCH_FAILED": 719,
    "CUDA_ERROR_NOT_SUPPORTED": 801,
    "CUDA_ERROR_SYSTEM_NOT_READY": 802,
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": 803,
    "CUDA_ERROR_UNKNOWN": 999,
}


def cuda_code(code):
    """A CUresult from its cuda.h name (CUDA_ERROR_ECC_UNCORRECTABLE, or ECC_UNCORRECTABLE) or number."""
    if isinstance(code, int) or str(code).isdigit():
        return int(code)
    name = str(code).upper().replace("-", "_")
    name = name if name.startswith("CUDA_") else "CUDA_ERROR_" + name
    if name not in CUDA_ERRORS:
        raise ValueError("unknown CUDA error %r (known: %s)" % (code, ", ".join(sorted(CUDA_ERRORS))))
    return CUDA_ERRORS[name]


def flat_text(path, data):
    """The .nvml twin of a state or record file, or None for any other file."""
    parent = os.path.basename(os.path.dirname(path))
    name = os.path.basename(path)
    if name == "state.json" and parent == "gpusim":
        return _flat_state(data)
    if parent == "procs" and name.endswith(".json") and "pid" in data:
        return _flat_record(data)
    return None


def _one_line(text):
    return " ".join(str(text).split())


def _flat_state(state):
    faults = state.get("faults") or {}
    lines = [
        "driver %s" % _one_line(state.get("driver_version") or "-"),
        "release_delay %r" % float(state.get("release_delay_s", 0.0)),
        "hang %r" % float(faults.get("hang_s") or 0.0),
        "driver_not_loaded %d" % bool(faults.get("driver_not_loaded")),
        "no_devices %d" % bool(faults.get("no_devices")),
        "mismatch %d" % bool(faults.get("mismatch")),
        "cuda_init %d" % int(faults.get("cuda_init") or 0),
        "cuda_hang %r" % float(faults.get("cuda_hang_s") or 0.0),
        "nvlink_links %d" % nvlink_links(state),
    ]
    for g in state.get("gpus", []):
        key = str(g["index"])
        remap = (faults.get("remap") or {}).get(key) or {}
        retired = (faults.get("retired_pending") or {}).get(key)
        lines.append("gpu %d %d %d %d %d %d %d %d %d %d %d %d %s %s %s" % (
            g["index"], g["memory_total_mib"], g["persistence_mode"] == "Enabled",
            COMPUTE_MODES.get(g["compute_mode"], 0), g["temperature"], int(g.get("stuck_mib", 0)),
            LOST_CODES.get((faults.get("lost") or {}).get(key), 0),
            int(remap.get("correctable", 0)), int(remap.get("uncorrectable", 0)),
            bool(remap.get("pending")), bool(remap.get("failure")),
            -1 if retired is None else int(bool(retired)),
            g["pci_bus_id"], g["uuid"], _one_line(g["name"])))
    for g in state.get("gpus", []):
        lines.append("mem %d %d %d" % (g["index"], int(g.get("idle_used_mib", 0)), gpu_reserved(g)))
        lines.append("minor %d %d" % (g["index"], g.get("minor", g["index"])))
        link = link_of(g)
        lines.append("link %d %d %d %d %d %r %r %r %d %r" % (
            g["index"], link["max_gen"], link["max_width"], link["loaded_gen"], link["loaded_width"],
            float(link["h2d_gbps"]), float(link["d2h_gbps"]), float(link["hbm_gbps"]), int(link["replays"]),
            float(link["copy_hang_s"])))
        # The links down as a bit mask (bit L: link L), the errors each peer copy adds, the peer cap (0: none).
        lines.append("nvlink %d %d %d %r" % (
            g["index"], sum(1 << int(link_no) for link_no in set(link["nvlink_down"])), int(link["nvlink_errors"]),
            float(link["p2p_gbps"] or 0.0)))
        lines.append("remap_histogram %d %s" % (g["index"], " ".join(
            str(v) for v in remap_histogram(faults, g["index"]))))
    # After the gpu lines: the C library applies each to a GPU it has read.
    for key, code in sorted((faults.get("cuda_gpu") or {}).items()):
        lines.append("cuda_gpu %d %d" % (int(key), int(code)))
    for key, seconds in sorted((faults.get("cuda_gpu_hang") or {}).items()):
        lines.append("cuda_gpu_hang %d %r" % (int(key), float(seconds)))
    for key, number in sorted((faults.get("cuda_gpu_crash") or {}).items()):
        lines.append("cuda_gpu_crash %d %d" % (int(key), int(number)))
    for key, kernel in sorted((faults.get("cuda_gpu_kernel") or {}).items()):
        lines.append("cuda_gpu_kernel %d %d %d %d" % (int(key), int(kernel.get("jit") or 0), int(kernel.get("launch") or 0),
                                                      int(bool(kernel.get("idle")))))
    for key, flips in sorted((faults.get("cuda_gpu_flip") or {}).items()):
        for offset, bit in flips:
            lines.append("cuda_gpu_flip %d %d %d" % (int(key), int(offset), int(bit)))
    for na in faults.get("na", []):
        field = NA_ALIASES.get(na["field"], na["field"])
        gpu = -1 if na.get("gpu") is None else int(na["gpu"])
        lines.append("na %s %d %d" % (field, gpu, NA_CODES.get(na.get("value"), 3)))
    for key in sorted(faults.get("reset_required") or {}):
        lines.extend("na %s %d 16" % (field, int(key)) for field in RESET_REQUIRED_FIELDS)
    for g in state.get("gpus", []):
        action = recovery_action(state, g["index"])
        lines.append("recovery %d %d" % (g["index"], -1 if action is None else RECOVERY_ACTIONS[action][0]))
    from gpusim.mig import flat_lines

    lines.extend(flat_lines(state))
    return "\n".join(lines) + "\n"


def _flat_record(rec):
    died = rec.get("died_at")
    return "\n".join([
        "pid %d" % rec["pid"],
        "starttime %d" % (-1 if rec.get("starttime") is None else rec["starttime"]),
        "created %r" % float(rec.get("created", 0)),
        "mib %d" % int(rec.get("mib", 0)),
        "util %d" % int(rec.get("util", 0)),
        "leak %d" % bool(rec.get("leak")),
        "died_at %r" % (-1.0 if died is None else float(died)),
        "gpus %s" % " ".join(str(i) for i in rec.get("gpus", ())),
        "reset %s" % " ".join(str(i) for i in rec.get("reset_gpus", ())),
        "freed %s" % " ".join("%d %r" % (int(i), float(at)) for i, at in sorted((rec.get("freed") or {}).items())),
        "name %s" % _one_line(rec.get("process_name") or rec.get("comm") or ""),
        "mig %s" % " ".join(str(i) for i in rec.get("mig") or ()),
    ]) + "\n"
