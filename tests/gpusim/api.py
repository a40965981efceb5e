"""Python API over a simulated host; the CLI (python3 -m gpusim) is a thin layer on it."""

import os
import shlex
import shutil
import signal
import subprocess
import sys

from gpusim import hold as _hold
from gpusim import kmsg as _kmsg
from gpusim import messages
from gpusim import modules as _modules
from gpusim import mig as _mig
from gpusim.state import (DEFAULTS, DEV_FILE_SIZE, GPU_PCI_CLASS, GPU_PCI_DEVICE, NVLINK_MAX_LINKS, OTHER_PCI_DEVICES,
                          PCIE_LANE_GBPS, PCIE_WIDTHS, RECOVERY_ACTIONS, REMAP_HISTOGRAM_BUCKETS, Paths, build_state,
                          cuda_code, empty_faults, healthy_link, is_alive, link_of, load_records, load_state, minor_of,
                          nvlink_links, write_json)

# (module, the module it holds) as a data-center driver loads them.
DEFAULT_MODULES = (("nvidia", None), ("nvidia_uvm", "nvidia"), ("nvidia_modeset", "nvidia"))

SMI_SCRIPT = """\
#!{python} -S
import sys
sys.path.insert(0, {parent!r})
from gpusim.smi import main
main({root!r})
"""

# gpusim's dcgmi (gpusim.dcgmi), beside nvidia-smi: DCGM's client, against a holder named nv-hostengine.
DCGMI_SCRIPT = """\
#!{python} -S
import sys
sys.path.insert(0, {parent!r})
from gpusim.dcgmi import main
sys.exit(main({root!r}))
"""

# gpusim's nvidia-bug-report.sh: --output-file NAME writes NAME.gz (the simulated host's state as
# the report), after the fault "bug-report-hang" seconds (-1: it fails, exit 1).
BUG_REPORT_SCRIPT = """\
#!{python} -S
import gzip, json, sys, time
args = sys.argv[1:]
name = args[args.index("--output-file") + 1] if "--output-file" in args else "nvidia-bug-report.log"
with open({state!r}) as f:
    state = json.load(f)
hang = float(state.get("faults", {{}}).get("bug_report_hang_s") or 0)
if hang < 0:
    sys.stderr.write("nvidia-bug-report.sh: simulated failure\\n")
    sys.exit(1)
time.sleep(hang)
with gzip.open(name + ".gz", "wt") as f:
    json.dump(state, f)
print("Running nvidia-bug-report.sh... complete. The output file is " + name + ".gz")
"""

# gpusim's modprobe and rmmod (gpusim.modules), over ROOT/sys/module.
MODULE_SCRIPT = """\
#!{python} -S
import sys
sys.path.insert(0, {parent!r})
from gpusim.modules import main
main({root!r}, {program!r})
"""

# Logs its arguments (each followed by a unit separator, one line per call), then runs nvidia-smi.
COUNTING_SMI = """\
#!/bin/sh
{{ printf '%s\\037' "$@"; printf '\\n'; }} >> {log}
exec {smi} "$@"
"""

FAULT_KINDS = ("lost", "hang", "hang-d", "na", "stuck", "driver-not-loaded", "no-devices", "mismatch", "clear",
               "remap", "retired", "xid", "fallen", "reset-required", "reset-refused", "reset-flr-refused",
               "recovery", "fabric", "module-in-use",
               "bug-report-hang", "cuda-init", "cuda-hang", "cuda-crash", "cuda", "compute-mode",
               "cuda-jit", "cuda-launch", "cuda-idle", "cuda-flip", "reset-slow", "host-engine-hang",
               "driver-hung", "mig-create")

COMPUTE_MODE_NAMES = ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")

HUNG_JOB_RANK_MIB = 76113


def _sysfs_bus(pci_bus_id):
    """00000000:18:00.0 -> 0000:18:00.0, the kernel's spelling (sysfs, /proc/driver/nvidia)."""
    return pci_bus_id[4:].lower()


def _per_gpu(faults, name, gpu, value):
    """A per-GPU fault of the fake libcuda; a false value clears it."""
    table = faults.setdefault(name, {})
    table[str(int(gpu))] = value
    faults[name] = {k: v for k, v in table.items() if v}


def signal_number(value):
    """A signal by name (SEGV, SIGSEGV) or number; 0, off or False clear."""
    if value in (None, True):
        return int(signal.SIGSEGV)
    if value in (False, 0, "0", "off"):
        return 0
    text = str(value).upper()
    if text.isdigit():
        return int(text)
    return int(getattr(signal, text if text.startswith("SIG") else "SIG" + text))


def _onoff(value):
    if isinstance(value, str):
        if value.lower() in ("on", "1", "true", "yes"):
            return True
        if value.lower() in ("off", "0", "false", "no"):
            return False
        raise ValueError("expected on|off, got %r" % value)
    return bool(value)


class Host:
    """A simulated NVIDIA host rooted at `root` ("/" installs at the real paths)."""

    def __init__(self, root):
        self.paths = Paths(root)
        self._monitors = []   # Popen objects of monitors we launched, reaped by stop()

    # -- properties ----------------------------------------------------------------------
    @property
    def root(self):
        return self.paths.root

    @property
    def smi_path(self):
        return self.paths.smi

    @property
    def dev_glob(self):
        return os.path.join(self.paths.dev, "nvidia*")

    def dev_path(self, index):
        """The device node of GPU `index`: /dev/nvidiaN with N its minor number."""
        return self.paths.gpu_dev(minor_of(load_state(self.paths), index))

    @property
    def kernel_log(self):
        """The kernel log, a file of /dev/kmsg records (gpusim.kmsg): what the modules' kernel_log
        names for this host."""
        return self.paths.kmsg

    @property
    def state_dir(self):
        """The collection's state directory of this host: ROOT/run/gpuops, the modules' default
        with host_root ROOT. A run that finds the host by devices and nvidia_smi_path alone (no
        host_root) is given it as state_dir: otherwise it uses the machine's own /run/gpuops,
        shared by every simulated host (and their GPUs share UUIDs)."""
        return self.paths.state_dir

    def env(self, base=None, nvml=False, cuda=False):
        """Environment for a process on this host: the fake nvidia-smi first on PATH and, with
        nvml=True or cuda=True, the directory of the simulated libnvidia-ml.so.1 and libcuda.so.1
        first on LD_LIBRARY_PATH (see install_nvml, install_cuda)."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.paths.bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        if nvml or cuda:
            old = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = self.paths.nvml_dir + (os.pathsep + old if old else "")
        return env

    def install_cuda(self, cache_dir=None):
        """Build (once, with gcc) and install the simulated libcuda.so.1 beside libnvidia-ml.so.1;
        returns its path. env(cuda=True) puts it first on LD_LIBRARY_PATH."""
        return self._install_library("cuda", cache_dir)

    def _install_library(self, library, cache_dir=None, flavor="current"):
        from gpusim.nvml_build import LIBRARIES, build

        lib = build(cache_dir, flavor=flavor, library=library)
        os.makedirs(self.paths.nvml_dir, exist_ok=True)
        dest = os.path.join(self.paths.nvml_dir, LIBRARIES[library]["soname"])
        tmp = dest + ".tmp.%d" % os.getpid()
        shutil.copyfile(lib, tmp)
        os.replace(tmp, dest)
        return dest

    def install_nvml(self, cache_dir=None, flavor="current"):
        """Build (once, with gcc) and install the simulated libnvidia-ml.so.1; returns its path.

        flavor: "current" (every entry point), "old" (no nvmlDeviceGetMemoryInfo_v2 and no
        nvmlDeviceGetComputeRunningProcesses_v3) or "oldest" (no _v2 process call either);
        see nvml_build.FLAVORS."""
        return self._install_library("nvml", cache_dir, flavor)

    @property
    def state(self):
        return load_state(self.paths)

    # -- setup ---------------------------------------------------------------------------
    def init(self, gpus=DEFAULTS["gpus"], name=DEFAULTS["name"],
             memory_total_mib=DEFAULTS["memory_total_mib"],
             driver_version=DEFAULTS["driver_version"], cuda_version=DEFAULTS["cuda_version"],
             release_delay=DEFAULTS["release_delay"], persistence_mode=DEFAULTS["persistence_mode"],
             seed=DEFAULTS["seed"], idle_used_mib=DEFAULTS["idle_used_mib"],
             reserved_mib=DEFAULTS["reserved_mib"], minors=DEFAULTS["minors"], fallen=DEFAULTS["fallen"]):
        """gpus: GPUs on the PCI bus; fallen: bus positions of those that fell off the bus at
        boot (not attached, absent from nvidia-smi); minors: minor number per index."""
        p = self.paths
        if isinstance(persistence_mode, bool):
            persistence_mode = "on" if persistence_mode else "off"
        state = build_state(gpus=gpus, name=name, memory_total_mib=memory_total_mib,
                            driver_version=driver_version, cuda_version=cuda_version,
                            release_delay=release_delay, persistence_mode=persistence_mode,
                            seed=seed, idle_used_mib=idle_used_mib, reserved_mib=reserved_mib,
                            minors=minors, fallen=fallen)
        # A fresh boot: every PCIe link idle, every replay counter at 0.
        shutil.rmtree(p.link, ignore_errors=True)
        for d in (p.dev, p.bin, p.lib, p.procs, p.tracked, p.link):
            os.makedirs(d, exist_ok=True)
        if p.root != "/":
            # Where a host keeps /run/gpuops (the collection's state directory, state_dir) on its
            # tmpfs; the collection makes the directory itself, mode 0700.
            os.makedirs(os.path.dirname(p.state_dir), exist_ok=True)
        nodes = ["nvidia%d" % g["minor"] for g in state["gpus"]]
        for n in ["nvidiactl", "nvidia-uvm"] + nodes:
            path = os.path.join(p.dev, n)
            if not os.path.isfile(path) or os.path.getsize(path) != DEV_FILE_SIZE:
                with open(path, "wb") as f:
                    f.write(b"\0" * DEV_FILE_SIZE)
        # Device nodes of a previous init must not linger (MIG's too: MIG starts disabled).
        shutil.rmtree(os.path.join(p.dev, "nvidia-caps"), ignore_errors=True)
        for n in os.listdir(p.dev):
            if n.startswith("nvidia") and n[6:].isdigit() and n not in nodes:
                os.unlink(os.path.join(p.dev, n))
        _hold.write_holder_script(os.path.join(p.lib, "holder.py"))
        # A fresh boot: an empty kernel log, but for the probe of the GPUs that fell off the bus.
        _kmsg.create(p.kmsg)
        for g in state["fallen"]:
            _kmsg.append(p.kmsg, self._fallen_records(g["pci_bus_id"]))
        if p.root != "/":
            self._write_host_tree(state)
        tmp = p.smi + ".tmp"
        with open(tmp, "w") as f:
            f.write(SMI_SCRIPT.format(python=sys.executable, parent=_hold.PKG_PARENT, root=p.root))
        os.chmod(tmp, 0o755)
        os.replace(tmp, p.smi)
        dcgmi = os.path.join(p.bin, "dcgmi")
        with open(dcgmi + ".tmp", "w") as f:
            f.write(DCGMI_SCRIPT.format(python=sys.executable, parent=_hold.PKG_PARENT, root=p.root))
        os.chmod(dcgmi + ".tmp", 0o755)
        os.replace(dcgmi + ".tmp", dcgmi)
        if p.root != "/":
            self._install_module_programs()
        report = os.path.join(p.bin, "nvidia-bug-report.sh")
        with open(report + ".tmp", "w") as f:
            f.write(BUG_REPORT_SCRIPT.format(python=sys.executable, state=p.state))
        os.chmod(report + ".tmp", 0o755)
        os.replace(report + ".tmp", report)
        write_json(p.state, state)
        return self

    def _install_module_programs(self):
        """modprobe, rmmod and nvidia-modprobe beside nvidia-smi (only under a ROOT of its own: the
        real ones are never replaced)."""
        for program in ("modprobe", "rmmod", "nvidia-modprobe"):
            path = os.path.join(self.paths.bin, program)
            with open(path + ".tmp", "w") as f:
                f.write(MODULE_SCRIPT.format(python=sys.executable, parent=_hold.PKG_PARENT, root=self.paths.root,
                                             program=program))
            os.chmod(path + ".tmp", 0o755)
            os.replace(path + ".tmp", path)

    def _write_host_tree(self, state):
        """ROOT/sys/bus/pci/devices/<bus id>/{vendor,device,class} for every GPU on the bus and two
        devices that are not GPUs, and ROOT/proc/driver/nvidia/gpus/<bus id>/information for each
        GPU the driver attached (not the fallen ones)."""
        p = self.paths
        shutil.rmtree(os.path.join(p.root, "sys"), ignore_errors=True)
        shutil.rmtree(os.path.join(p.root, "proc"), ignore_errors=True)
        devices = [(_sysfs_bus(g["pci_bus_id"]), "0x10de", GPU_PCI_DEVICE, GPU_PCI_CLASS)
                   for g in state["gpus"] + state["fallen"]]
        bound = set(_sysfs_bus(g["pci_bus_id"]) for g in state["gpus"])
        os.makedirs(os.path.join(p.root, "sys", "bus", "pci", "drivers", "nvidia"))
        for bus, vendor, device, klass in devices + list(OTHER_PCI_DEVICES):
            d = os.path.join(p.pci_devices, bus)
            os.makedirs(d)
            for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
                with open(os.path.join(d, name), "w") as f:
                    f.write(value + "\n")
            if bus in bound:
                # The driver core binds a device only once its probe has succeeded.
                os.symlink("../../drivers/nvidia", os.path.join(d, "driver"))
        from gpusim import messages as M

        for g in state["gpus"]:
            bus = _sysfs_bus(g["pci_bus_id"])
            d = os.path.join(p.driver_gpus, bus)
            os.makedirs(d)
            with open(os.path.join(d, "information"), "w") as f:
                f.write(M.GPU_INFORMATION.format(model=g["name"], uuid=g["uuid"], bus=bus, minor=g["minor"]))
        with open(os.path.join(os.path.dirname(p.driver_gpus), "version"), "w") as f:
            f.write(M.DRIVER_VERSION_FILE.format(version=state["driver_version"]))
        # The driver's kernel modules as a data-center node loads them: nvidia, held by
        # nvidia_uvm and nvidia_modeset.
        for name, holds in DEFAULT_MODULES:
            self.load_module(name, holds)

    def load_module(self, name, holds="nvidia", refcnt=0, blocks_reset=False):
        """A kernel module in ROOT/sys/module: NAME/refcnt, and, when it holds another module
        (depends on it), HOLDS/holders/NAME, a link to it, as sysfs shows them. blocks_reset: the
        simulated nvidia-smi refuses a GPU reset while it is loaded ("In use by another client"),
        as an idle nvidia_drm makes the real one do. The simulated modprobe knows it from then on
        (it loads it back after HOLDS, see gpusim.modules)."""
        _modules.insert(self.paths, name, holds, refcnt)
        _modules.record_dependency(self.paths, name, holds)
        if blocks_reset:
            state = load_state(self.paths)
            blocking = state.setdefault("faults", {}).setdefault("reset_blocking_modules", [])
            if name not in blocking:
                blocking.append(name)
            write_json(self.paths.state, state)

    @staticmethod
    def _fallen_records(pci_bus_id):
        import time

        from gpusim import messages as M

        when = _kmsg.usec(time.time())
        bus, pci_id = _sysfs_bus(pci_bus_id), "10de:" + GPU_PCI_DEVICE[2:]
        found = []
        for text in M.FALLEN_OFF_BUS_AT_BOOT:
            if text.startswith("NVRM: "):
                found.append(_kmsg.kernel(text.format(bus=bus, pci_id=pci_id), when))
            else:
                found.append(_kmsg.kernel(text.format(bus=bus), when, _kmsg.LEVEL_WARNING,
                                          [line.format(bus=bus) for line in M.PROBE_FAILED_DICT]))
        return found

    # -- workloads -----------------------------------------------------------------------
    def hold(self, gpus="all", mib=0, util=0, name=None, ignore_term=False, children=0,
             respawn=0, respawn_delay=0.0, map=False, leak=False, open_gpus=None,
             argv=None, cwd=None, daemon=False, cgroup=None, mig=None):
        """Start a detached holder; returns {"pid", "monitor_pid", "children"}.

        daemon=True runs it from an executable file named `name` (sbin/<name>, owned by the
        caller, mode 0755), as a real daemon runs from its own program: the release protects a
        process by its executable, not by the name it gives itself. cgroup: the real cgroup the
        holder runs in (CONTROLLER:PATH, see gpusim.cgroups.job_cgroup), made and removed by gpusim.
        mig: (GI, CI) or GI, the MIG instance of the one GPU of gpus that the holder runs on: it opens
        the instance's caps nodes too, and its memory counts on the instance."""
        info, proc = _hold.start_hold(
            self.paths, gpus, mib, util=util, name=name, ignore_term=ignore_term,
            children=children, respawn=respawn, respawn_delay=respawn_delay, map=map,
            leak=leak, open_gpus=open_gpus, argv=argv, cwd=cwd,
            exe=_hold.install_daemon(self.paths, name) if daemon else None, cgroup=cgroup, mig=mig)
        self._monitors.append(proc)
        return info

    def mig(self, gpu, profiles=(), mode="enabled", pending=None, cis_per_gi=1):
        """MIG on GPU gpu: mode enabled with the MIG devices of profiles (replacing any), or
        disabled; pending: the mode after the next reset (default: mode). Rewrites the caps nodes."""
        state = load_state(self.paths)
        g = state["gpus"][int(gpu)]
        current = "Enabled" if mode == "enabled" else "Disabled"
        devices = _mig.make_instances(g, list(profiles), cis_per_gi) if current == "Enabled" else []
        g["mig"] = {"current": current, "pending": "Enabled" if (pending or mode) == "enabled" else "Disabled",
                    "instances": devices}
        _mig.write_caps(self.paths, state)
        write_json(self.paths.state, state)
        return g["mig"]

    def scenario(self, name="hung-job", release_delay=0.0):
        if name != "hung-job":
            raise ValueError("unknown scenario %r (known: hung-job)" % name)
        self.stop()
        shutil.rmtree(self.paths.procs, ignore_errors=True)
        self.init(gpus=8, release_delay=release_delay)
        persistenced = self.hold(gpus="all", mib=0, name="nvidia-persistenced", daemon=True,
                                 argv=["nvidia-persistenced", os.path.join(self.paths.lib, "holder.py"),
                                       "--user", "nvidia-persistenced", "--persistence-mode"])
        job = os.path.join(self.paths.lib, "job")
        os.makedirs(job, exist_ok=True)
        _hold.write_holder_script(os.path.join(job, "train.py"))
        ranks = []
        for r in range(8):
            info = self.hold(gpus=[r], open_gpus="all", mib=HUNG_JOB_RANK_MIB, util=0,
                             name="python3", cwd=job,
                             argv=["python3", "train.py", "--local-rank", str(r)])
            ranks.append(dict(info, rank=r, gpu=r))
        return {"scenario": name, "persistenced": persistenced, "ranks": ranks}

    def ps(self):
        out = []
        for rec in load_records(self.paths):
            rec["alive"] = is_alive(rec["pid"], rec.get("starttime"))
            out.append(rec)
        return out

    def stop(self, timeout=15.0):
        """SIGKILL every process this root started and wait until all are gone."""
        try:
            _hold.stop_all(self.paths, timeout=timeout)
        finally:
            for proc in self._monitors:
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
            self._monitors = []

    # -- faults --------------------------------------------------------------------------
    def fault(self, kind, value=True, gpu=None, message="unknown", seconds=None,
              field=None, mib=None, pending=None, failure=None, correctable=None,
              uncorrectable=None, code=None, text=None, when=None, in_place=False,
              gpu_instance=None, form="probe", count=1, offset=None, bit=0, histogram=None):
        """Inject a fault. kind: lost (gpu, message; in_place=True: the old variant, where the
        error line stands in the GPU's place and the others are listed, for every lost GPU),
        hang (seconds), hang-d (seconds: nvidia-smi hangs as one in D state in the driver does, as
        far as ROOT/proc/PID shows it: see smi.hang_in_driver; 0 clears), na (field, gpu, value),
        stuck (gpu, mib), driver-not-loaded|no-devices|mismatch (value on/off), clear,
        remap (gpu, pending, failure, correctable, uncorrectable: row-remapper state; histogram: the
        banks with max, high, partial, low and none of their spare rows left, five counts),
        retired (gpu, value: retired pages pending, on GPUs that retire pages),
        xid (gpu, code, text, when, gpu_instance, count: an Xid line in the kernel log, count
        times (a storm: count 1000000 writes a million lines, one second apart, ending at when); with
        gpu_instance, the MIG form "Xid (PCI:0000:01:00 GPU-I:05): ..."),
        fallen (gpu, when, form: the driver's "fallen off the bus" message without an Xid;
        form "probe" is its three-line form, "line" its one-line form),
        reset-required (gpu, value on/off: the driver says the GPU needs a reset; cleared by
        nvidia-smi -r), reset-refused (gpu, value on/off: nvidia-smi -r refuses the GPU as in use by
        another client, one this host's /proc does not show: another PID namespace), reset-flr-refused
        (gpu, value on/off or nvidia-smi's words: nvidia-smi -r answers as when the platform refuses
        the function-level reset, "Unknown Error" by default, "Not Supported", "Insufficient
        Permissions"; a GPU in use is refused as in use first), recovery (gpu, value: the driver's GPU Recovery Action, none | reset |
        reboot | drain-p2p | drain-and-reset, on drivers from 565),
        cuda-init (code: the CUresult cuInit returns, by cuda.h name or number; 0 clears),
        cuda-hang (seconds cuInit sleeps first; with gpu, seconds that GPU's context creation sleeps
        first; 0 clears), cuda-crash (gpu, value: the signal, by name or number, that kills the
        process creating a context on that GPU; default SEGV; 0 clears),
        cuda (gpu, code: the CUresult the fake libcuda gives on that GPU: CUDA_ERROR_ECC_UNCORRECTABLE
        when the probe reads back, any other when it creates its context; 0 clears),
        compute-mode (gpu, value: Default, Exclusive_Process, Prohibited; a context on an
        Exclusive_Process GPU that another live process holds is CUDA_ERROR_DEVICE_UNAVAILABLE),
        cuda-jit (gpu, code: the CUresult loading a PTX module on that GPU returns; 0 clears),
        cuda-launch (gpu, code: the CUresult a kernel launch there meets: 1, 400, 701 from
        cuLaunchKernel, any other from the next cuCtxSynchronize, and every call after it; 0 clears),
        cuda-idle (gpu, value on/off: launches there return success and run nothing),
        cuda-flip (gpu, offset: a byte of the memory the probe's fill kernel writes on that GPU,
        counted over its fills in order, whose bit `bit` reads back flipped; each call adds one, up
        to 8; offset None or negative clears them),
        fabric (an NVSwitch system: value on/off, seconds a reset GPU takes to register with the
        fabric manager again (default 1); with gpu, value stuck: that GPU never registers again
        after a reset; or value a status, e.g. "Insufficient Resources", its registration's),
        bug-report-hang (seconds gpusim's nvidia-bug-report.sh takes; -1: it fails),
        reset-slow (seconds nvidia-smi -r takes before it resets, deaf to SIGTERM; 0 clears),
        driver-hung (count, when: the driver's assertions of a full-chip reset that hung, from
        NVIDIA/open-gpu-kernel-modules#1045, count times over in the kernel log),
        host-engine-hang (value N: the next N DCGM host engines started, holders named nv-hostengine,
        never answer gpusim's dcgmi, which waits; one started after them answers; 0 clears),
        mig-create (gpu, value: the words nvidia-smi mig says when it refuses to create a GPU
        instance there, e.g. "Insufficient Resources"; off clears),
        module-in-use (value: a module name, or off to clear them all: rmmod refuses it as in use
        whatever its refcnt says, as when a user takes it between a read and the rmmod).
        A GPU's PCIe link and bandwidths have a method of their own, slow; clear clears them too."""
        kind = kind.replace("_", "-")
        if kind not in FAULT_KINDS:
            raise ValueError("unknown fault %r (known: %s)" % (kind, ", ".join(FAULT_KINDS)))
        state = load_state(self.paths)
        faults = state.setdefault("faults", empty_faults())
        indexes = [g["index"] for g in state["gpus"]]
        if gpu is not None and int(gpu) not in indexes:
            raise ValueError("no GPU %s on this host" % gpu)
        if kind == "lost":
            if message not in ("unknown", "lost"):
                raise ValueError("message must be unknown or lost")
            faults["lost"][str(int(gpu))] = message
            if in_place:
                faults["lost_style"] = "in-place"
        elif kind == "hang":
            faults["hang_s"] = float(seconds if seconds is not None else value)
        elif kind == "hang-d":
            faults["hang_d_s"] = float(seconds if seconds is not None else value)
        elif kind == "reset-slow":
            faults["reset_slow_s"] = float(seconds if seconds is not None else value)
        elif kind == "host-engine-hang":
            from gpusim.dcgmi import host_engines

            faults["host_engine_hang"] = {"next": int(value), "hung": [], "known": host_engines(self.paths)}
        elif kind == "na":
            v = "[N/A]" if value is True else value
            faults["na"] = [n for n in faults["na"]
                            if not (n["field"] == field and n.get("gpu") == gpu)]
            faults["na"].append({"field": field, "gpu": None if gpu is None else int(gpu), "value": v})
        elif kind == "stuck":
            state["gpus"][indexes.index(int(gpu))]["stuck_mib"] = int(mib)
        elif kind == "clear":
            state["faults"] = empty_faults()
            for g in state["gpus"]:
                self._heal_link(g)
        elif kind == "remap":
            remap = faults.setdefault("remap", {}).setdefault(str(int(gpu)), {
                "correctable": 0, "uncorrectable": 0, "pending": False, "failure": False})
            for key, v in (("pending", pending), ("failure", failure)):
                if v is not None:
                    remap[key] = _onoff(v)
            for key, v in (("correctable", correctable), ("uncorrectable", uncorrectable)):
                if v is not None:
                    remap[key] = int(v)
            if histogram is not None:
                remap["histogram"] = _histogram(histogram)
        elif kind == "retired":
            faults.setdefault("retired_pending", {})[str(int(gpu))] = _onoff(value)
        elif kind == "reset-required":
            if _onoff(value):
                faults.setdefault("reset_required", {})[str(int(gpu))] = True
            else:
                faults.setdefault("reset_required", {}).pop(str(int(gpu)), None)
        elif kind == "mig-create":
            if gpu is None or not isinstance(value, str) or not value.strip():
                raise ValueError("mig-create takes a GPU and the words of the refusal, or off")
            if value == "off":
                faults.setdefault("mig_create_refused", {}).pop(str(int(gpu)), None)
            else:
                faults.setdefault("mig_create_refused", {})[str(int(gpu))] = value
        elif kind == "reset-refused":
            if _onoff(value):
                faults.setdefault("reset_refused", {})[str(int(gpu))] = True
            else:
                faults.setdefault("reset_refused", {}).pop(str(int(gpu)), None)
        elif kind == "reset-flr-refused":
            # value: on (nvidia-smi says "Unknown Error"), off, or the words it says for the GPU.
            words = value if value in messages.FLR_REFUSED_WORDS else messages.FLR_REFUSED_WORDS[0]
            if value not in messages.FLR_REFUSED_WORDS and not _onoff(value):
                faults.setdefault("reset_flr_refused", {}).pop(str(int(gpu)), None)
            else:
                faults.setdefault("reset_flr_refused", {})[str(int(gpu))] = words
        elif kind == "recovery":
            if value not in RECOVERY_ACTIONS:
                raise ValueError("recovery action must be one of %s" % ", ".join(RECOVERY_ACTIONS))
            faults.setdefault("recovery", {})[str(int(gpu))] = value
        elif kind == "xid":
            self._log_xid(state, int(gpu), int(code), text, when, gpu_instance, int(count))
            return
        elif kind == "cuda-init":
            faults["cuda_init"] = cuda_code(code if code is not None else "CUDA_ERROR_UNKNOWN")
        elif kind == "cuda-hang" and gpu is not None:
            _per_gpu(faults, "cuda_gpu_hang", gpu, float(seconds if seconds is not None else value))
        elif kind == "cuda-hang":
            faults["cuda_hang_s"] = float(seconds if seconds is not None else value)
        elif kind == "cuda-crash":
            _per_gpu(faults, "cuda_gpu_crash", gpu, signal_number(value))
        elif kind == "cuda":
            faults.setdefault("cuda_gpu", {})[str(int(gpu))] = cuda_code(code)
            faults["cuda_gpu"] = {k: v for k, v in faults["cuda_gpu"].items() if v}
        elif kind in ("cuda-jit", "cuda-launch", "cuda-idle"):
            kernel = faults.setdefault("cuda_gpu_kernel", {}).setdefault(str(int(gpu)), {})
            kernel[kind[5:]] = _onoff(value) if kind == "cuda-idle" else cuda_code(code)
            faults["cuda_gpu_kernel"] = {k: v for k, v in faults["cuda_gpu_kernel"].items() if any(v.values())}
        elif kind == "cuda-flip":
            flips = faults.setdefault("cuda_gpu_flip", {})
            if offset is None or int(offset) < 0:
                flips.pop(str(int(gpu)), None)
            elif len(flips.get(str(int(gpu)), [])) >= 8:
                raise ValueError("at most 8 flipped bits per GPU")
            else:
                flips.setdefault(str(int(gpu)), []).append([int(offset), int(bit) % 8])
        elif kind == "compute-mode":
            if value not in COMPUTE_MODE_NAMES:
                raise ValueError("compute mode must be one of %s" % ", ".join(COMPUTE_MODE_NAMES))
            state["gpus"][indexes.index(int(gpu))]["compute_mode"] = value
        elif kind == "fallen":
            self._log_fallen(state, int(gpu), when, form)
            return
        elif kind == "driver-hung":
            self._log_lines(messages.DRIVER_HUNG_LINES, when, int(count))
            return
        elif kind == "fabric":
            _fabric_fault(faults, value, gpu, seconds)
        elif kind == "module-in-use":
            faults["modules_in_use"] = [] if value in (False, "off") else sorted(
                set(faults.get("modules_in_use", [])) | set([value]))
        elif kind == "bug-report-hang":
            faults["bug_report_hang_s"] = float(seconds if seconds is not None else value)
        else:
            faults[kind.replace("-", "_")] = _onoff(value)
        write_json(self.paths.state, state)

    def nvlink(self, links):
        """NVLinks per GPU (`gpusim nvlink --links N`): with N > 0 the host is an HGX board, every GPU
        linked by N NVLinks to the NVSwitches, so every pair of GPUs is connected (an H100's or H200's
        18: nvidia-smi topo -m says NV18); 0, as init leaves it, a host without NVLink. Returns N."""
        try:
            links = int(links)
        except (TypeError, ValueError):
            raise ValueError("nvlink: links is a number from 0 to %d, got %r" % (NVLINK_MAX_LINKS, links))
        if not 0 <= links <= NVLINK_MAX_LINKS:
            raise ValueError("nvlink: links is a number from 0 to %d (NVML_NVLINK_MAX_LINKS), got %d" % (
                NVLINK_MAX_LINKS, links))
        state = load_state(self.paths)
        state["nvlink_links"] = links
        write_json(self.paths.state, state)
        return links

    def slow(self, gpu, link=None, h2d=None, d2h=None, hbm=None, replays=None, copy_hang=None, clear=False,
             nvlink_down=None, nvlink_errors=None, p2p=None, retrains=None):
        """GPU gpu's PCIe link and bandwidths (`gpusim fault slow`): link (GEN, WIDTH), the link it
        runs under load (gen 1 at that width while idle); h2d, d2h: copy bandwidths in GB/s (a copy
        reaches the lower of these and 0.85 x what the loaded link carries); hbm: memory bandwidth in
        GB/s (the probe's kernels); replays: PCIe replays each copy adds to the GPU's counter;
        copy_hang: seconds each copy on the GPU sleeps first; retrains: whether the next GPU reset trains
        the degraded link back up to its maximum (a marginal link, not a broken slot). Its NVLinks (see nvlink): nvlink_down, the
        links that are down (numbers, or "L,L"; [] brings them all up); nvlink_errors, the flit CRC
        errors each peer copy over NVLink that involves the GPU adds to its link 0; p2p, a cap in GB/s on
        its peer copies. Only what is given changes; clear=True puts the GPU back to the defaults (and
        its replay and NVLink error counters to 0) first. Returns the GPU's link (state.link_of)."""
        state = load_state(self.paths)
        found = [g for g in state["gpus"] if g["index"] == int(gpu)]
        if not found:
            raise ValueError("no GPU %s on this host" % gpu)
        g = found[0]
        settings = {}
        if nvlink_down is not None:
            settings["nvlink_down"] = _nvlinks_down(nvlink_down, nvlink_links(state), g["index"])
        if nvlink_errors is not None:
            if int(nvlink_errors) < 0:
                raise ValueError("nvlink_errors: a count of 0 or more, got %r" % nvlink_errors)
            settings["nvlink_errors"] = int(nvlink_errors)
        if p2p is not None:
            if float(p2p) <= 0:
                raise ValueError("p2p: a bandwidth is a positive number of GB/s, got %r" % (p2p,))
            settings["p2p_gbps"] = float(p2p)
        if link is not None:
            settings["loaded_gen"], settings["loaded_width"] = _link(link, link_of(g))
        if retrains is not None:
            # Whether a GPU reset trains the degraded link back up to its maximum (a marginal
            # link, not a broken slot), as a reset retrains a real GPU's link.
            settings["link_retrains"] = bool(retrains)
        for key, value in (("h2d_gbps", h2d), ("d2h_gbps", d2h), ("hbm_gbps", hbm)):
            if value is not None:
                if float(value) <= 0:
                    raise ValueError("%s: a bandwidth is a positive number of GB/s, got %r" % (key, value))
                settings[key] = float(value)
        if replays is not None:
            if int(replays) < 0:
                raise ValueError("replays: a count of 0 or more, got %r" % replays)
            settings["replays"] = int(replays)
        if copy_hang is not None:
            if float(copy_hang) < 0:
                raise ValueError("copy_hang: 0 or more seconds, got %r" % copy_hang)
            settings["copy_hang_s"] = float(copy_hang)
        if not settings and not clear:
            raise ValueError("slow: give link, h2d, d2h, hbm, replays or copy_hang, or clear (or of the NVLinks "
                             "nvlink_down, nvlink_errors, p2p)")
        if clear:
            self._heal_link(g)
        g.update(settings)
        write_json(self.paths.state, state)
        return link_of(g)

    def _heal_link(self, gpu):
        """A GPU back to the link and bandwidths of healthy_link, its replay and NVLink error counters at 0."""
        gpu.update(healthy_link(gpu))
        gpu.pop("link_retrains", None)
        for counter in (self.paths.replay_file(gpu["index"]), self.paths.nvlink_crc_file(gpu["index"])):
            try:
                os.unlink(counter)
            except FileNotFoundError:
                pass

    def _log_xid(self, state, gpu, code, text, when, gpu_instance=None, count=1):
        import time

        from gpusim import messages as M

        bus = [g for g in state["gpus"] if g["index"] == gpu][0]["pci_bus_id"]
        # The driver prints the 4-digit domain and no function: PCI:0000:18:00
        where = bus[4:-2].lower()
        if gpu_instance is not None:
            where += " GPU-I:%02d" % int(gpu_instance)
        text = M.XID_MESSAGE.format(bus=where, code=code, text=text if text is not None else M.XID_TEXTS.get(code, M.XID_TEXT_OTHER))
        end = _kmsg.usec(time.time() if when is None else when)
        # A storm: the same record, a second apart (none before the boot).
        _kmsg.append(self.paths.kmsg, [_kmsg.kernel(text, max(0, end - n * 1000000)) for n in range(count - 1, -1, -1)])

    def _log_fallen(self, state, gpu, when, form):
        from gpusim import messages as M

        if form not in ("probe", "line"):
            raise ValueError("form must be probe or line")
        bus = [g for g in state["gpus"] if g["index"] == gpu][0]["pci_bus_id"][4:].lower()
        lines = M.FALLEN_PROBE if form == "probe" else M.FALLEN_LINE
        self._log_lines([line.format(bus=bus) for line in lines], when)

    def _log_lines(self, lines, when, count=1):
        """The kernel's records of lines in the kernel log, count times over, at when."""
        import time

        time_us = _kmsg.usec(time.time() if when is None else when)
        _kmsg.append(self.paths.kmsg, [_kmsg.kernel(line, time_us) for dummy in range(count) for line in lines])

    def write_kmsg(self, line, when=None):
        """What root's `echo LINE > /dev/kmsg` does: a record of the user facility (a "<N>" prefix
        sets the level, and a facility other than the kernel's); never the kernel's own."""
        import time

        _kmsg.append(self.paths.kmsg, [_kmsg.from_user(line, _kmsg.usec(time.time() if when is None else when))])

    # -- conveniences for tests ----------------------------------------------------------
    def smi(self, *args, timeout=30):
        return subprocess.run([self.smi_path] + list(args), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def counting_smi(self, log):
        """The path of a wrapper around this host's nvidia-smi that appends each call's arguments
        to the file log (one line per call, see smi_calls) before it runs nvidia-smi."""
        wrapper = os.path.join(self.paths.bin, "nvidia-smi-counted")
        with open(wrapper + ".tmp", "w") as f:
            f.write(COUNTING_SMI.format(log=shlex.quote(log), smi=shlex.quote(self.smi_path)))
        os.chmod(wrapper + ".tmp", 0o755)
        os.replace(wrapper + ".tmp", wrapper)
        return wrapper

    @staticmethod
    def smi_calls(log):
        """The calls a counting_smi wrapper logged: a list of argument lists, in order."""
        try:
            with open(log) as f:
                return [line.rstrip("\n").split("\x1f")[:-1] for line in f]
        except FileNotFoundError:
            return []

    def memory_used(self):
        """{index: MiB} as the fake nvidia-smi reports it right now."""
        from gpusim.state import gpu_usage

        used, _unused, _unused2 = gpu_usage(self.paths, load_state(self.paths))
        return used


def _link(link, current):
    """(GEN, WIDTH) of a link under load, from a pair or "GEN,WIDTH": a PCIe generation and width no
    more than the GPU's max ones (current: its link_of)."""
    try:
        gen, width = (int(part) for part in (link.split(",") if isinstance(link, str) else link))
    except (TypeError, ValueError):
        raise ValueError("link: expected GEN,WIDTH, e.g. 3,8; got %r" % (link,))
    if gen not in PCIE_LANE_GBPS or gen > current["max_gen"]:
        raise ValueError("link: PCIe generation %d: this GPU's link runs at gen 1 to %d" % (gen, current["max_gen"]))
    if width not in PCIE_WIDTHS or width > current["max_width"]:
        raise ValueError("link: width x%d: a PCIe link is x%s wide, this GPU's x%d at most" % (
            width, ", x".join(str(w) for w in PCIE_WIDTHS), current["max_width"]))
    return gen, width


def _nvlinks_down(links, count, gpu):
    """The sorted, distinct NVLinks of links (numbers, or "L,L"), each one of the count a GPU has."""
    try:
        found = sorted(set(int(part) for part in (links.split(",") if isinstance(links, str) else links)
                           if str(part).strip()))
    except (TypeError, ValueError):
        raise ValueError("nvlink_down: expected link numbers, e.g. 0,3; got %r" % (links,))
    beyond = [link for link in found if not 0 <= link < count]
    if beyond:
        raise ValueError("nvlink_down: GPU %d has %s (gpusim nvlink --links N), not link %s" % (
            gpu, "no NVLink" if count == 0 else "links 0 to %d" % (count - 1), beyond[0]))
    return found


def _histogram(histogram):
    """Five counts of banks, max to none, from a sequence or "MAX,HIGH,PARTIAL,LOW,NONE"."""
    try:
        counts = [int(part) for part in (histogram.split(",") if isinstance(histogram, str) else histogram)]
    except (TypeError, ValueError):
        counts = []
    if len(counts) != len(REMAP_HISTOGRAM_BUCKETS) or any(count < 0 for count in counts):
        raise ValueError("histogram: expected five counts of 0 or more, %s; got %r" % (
            ",".join(bucket.upper() for bucket in REMAP_HISTOGRAM_BUCKETS), histogram))
    return counts


def _fabric_fault(faults, value, gpu, seconds):
    """The fault "fabric" (see Host.fault)."""
    if gpu is None:
        faults["fabric"] = {"delay_s": 1.0 if seconds is None else float(seconds)} if _onoff(value) else {}
        return
    fabric = faults.setdefault("fabric", {"delay_s": 1.0})
    if value == "stuck":
        fabric["stuck"] = sorted(set(fabric.get("stuck", [])) | set([str(int(gpu))]))
    else:
        fabric.setdefault("status", {})[str(int(gpu))] = str(value)
