"""Command line: python3 -m gpusim <command> --root ROOT ...  (see README.md)."""

import argparse
import json
import math
import os
import sys

from gpusim.state import DEFAULTS, NVLINK_MAX_LINKS, PCIE_LANE_GBPS, PCIE_WIDTHS, REMAP_HISTOGRAM_BUCKETS


def _parser():
    p = argparse.ArgumentParser(prog="gpusim", description="Simulated NVIDIA GPU host")
    sub = p.add_subparsers(dest="cmd", required=True)

    def cmd(name, **kw):
        c = sub.add_parser(name, **kw)
        c.add_argument("--root", required=True, help='host root ("/" for the real paths)')
        return c

    c = cmd("init", help="create device files, state and the fake nvidia-smi")
    c.add_argument("--gpus", type=int, default=DEFAULTS["gpus"])
    c.add_argument("--name", default=DEFAULTS["name"])
    c.add_argument("--memory-total-mib", type=int, default=DEFAULTS["memory_total_mib"])
    c.add_argument("--driver-version", default=DEFAULTS["driver_version"])
    c.add_argument("--cuda-version", default=DEFAULTS["cuda_version"])
    c.add_argument("--release-delay", type=float, default=DEFAULTS["release_delay"], metavar="SECONDS")
    c.add_argument("--persistence-mode", choices=("on", "off"), default=DEFAULTS["persistence_mode"])
    c.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    c.add_argument("--idle-used-mib", type=int, default=DEFAULTS["idle_used_mib"],
                   help="memory.used of an idle GPU (real H100/H200: 1)")
    c.add_argument("--reserved-mib", type=int, default=DEFAULTS["reserved_mib"],
                   help="memory the driver reserves per GPU (memory.reserved; inside NVML v1 used)")
    c.add_argument("--minors", default=None, metavar="M0,M1,...",
                   help="the driver's minor number of each GPU it attaches, in index order (default: the index)")
    c.add_argument("--fallen", default="", metavar="P0,P1,...",
                   help="bus positions (0-based) of GPUs that fell off the bus at boot")

    c = cmd("hold", help="start a detached process holding GPUs")
    c.add_argument("--gpus", required=True, help="0,1 or all (allocation)")
    c.add_argument("--open", dest="open_gpus", default=None,
                   help="GPUs whose device files are opened (default: --gpus); 0,1 or all")
    c.add_argument("--mib", type=int, required=True)
    c.add_argument("--util", type=int, default=0)
    c.add_argument("--name", default=None)
    c.add_argument("--daemon", action="store_true",
                   help="run from a root-owned executable named --name, as a real daemon does")
    c.add_argument("--ignore-term", action="store_true")
    c.add_argument("--children", type=int, default=0)
    c.add_argument("--respawn", type=int, default=0, help="times to re-spawn (-1 = forever)")
    c.add_argument("--respawn-delay", type=float, default=0.0)
    c.add_argument("--map", action="store_true")
    c.add_argument("--leak", action="store_true")
    c.add_argument("--cgroup", default=None, metavar="CONTROLLER:PATH",
                   help="run in this real cgroup (root), e.g. freezer:/slurm/uid_0/job_5/step_0")

    c.add_argument("--mig", default=None, metavar="GI[:CI]",
                   help="run on this MIG instance of the one GPU of --gpus (opens its caps nodes too)")

    c = cmd("mig", help="MIG on a GPU: its mode and its MIG devices (GPU and compute instances)")
    c.add_argument("--gpu", type=int, required=True)
    c.add_argument("--profiles", default="", metavar="P0,P1,...", help="GPU instance profiles, e.g. 1g.18gb,3g.71gb")
    c.add_argument("--mode", choices=("enabled", "disabled"), default="enabled")
    c.add_argument("--pending", choices=("enabled", "disabled"), default=None,
                   help="the mode after the next reset (default: --mode)")
    c.add_argument("--cis-per-gi", type=int, default=1, help="compute instances in each GPU instance")

    c = cmd("fault", help="inject a fault")
    fs = c.add_subparsers(dest="kind", required=True)
    f = fs.add_parser("lost")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--message", choices=("unknown", "lost"), default="unknown")
    f.add_argument("--in-place", action="store_true",
                   help="old variant: the error line in the GPU's place, the other GPUs listed")
    f = fs.add_parser("hang")
    f.add_argument("--seconds", type=float, required=True)
    f = fs.add_parser("hang-d", help="nvidia-smi hangs as in D state in the driver (ROOT/proc/PID says so; 0 clears)")
    f.add_argument("--seconds", type=float, required=True)
    f = fs.add_parser("mig-create", help="nvidia-smi mig refuses to create a GPU instance on the GPU, in these words")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", metavar="WORDS|off", help='e.g. "Insufficient Resources"')
    f = fs.add_parser("reset-slow", help="nvidia-smi -r takes this long before it resets, deaf to SIGTERM (0 clears)")
    f.add_argument("--seconds", type=float, required=True)
    f = fs.add_parser("host-engine-hang", help="the next N DCGM host engines started (holders named nv-hostengine) "
                      "never answer dcgmi (0 clears)")
    f.add_argument("--next", type=int, default=1)
    f = fs.add_parser("na")
    f.add_argument("--field", required=True)
    f.add_argument("--gpu", type=int, default=None)
    f.add_argument("--value", default="[N/A]")
    f = fs.add_parser("stuck")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--mib", type=int, required=True)
    for k in ("driver-not-loaded", "no-devices", "mismatch"):
        f = fs.add_parser(k)
        f.add_argument("value", choices=("on", "off"))
    fs.add_parser("clear")
    f = fs.add_parser("module-in-use", help="rmmod refuses the module as in use, whatever its refcnt says")
    f.add_argument("value", help="a module name, or off to clear them all")
    f = fs.add_parser("remap", help="row-remapper state of a GPU")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--pending", choices=("on", "off"))
    f.add_argument("--failure", choices=("on", "off"))
    f.add_argument("--correctable", type=int)
    f.add_argument("--uncorrectable", type=int)
    f.add_argument("--histogram", type=_histogram, default=None, metavar="MAX,HIGH,PARTIAL,LOW,NONE",
                   help="banks with all, many, some, few and no spare rows left (default 3072,0,0,0,0)")
    f = fs.add_parser("retired", help="retired pages pending (GPUs before Ampere)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", choices=("on", "off"))
    f = fs.add_parser("reset-required", help="the driver says the GPU needs a reset ([GPU requires reset])")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", choices=("on", "off"), nargs="?", default="on")
    f = fs.add_parser("reset-refused", help="nvidia-smi refuses to reset the GPU: in use by a client no /proc scan sees")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", choices=("on", "off"), nargs="?", default="on")
    f = fs.add_parser("reset-flr-refused", help="nvidia-smi -r answers as when the platform refuses the FLR "
                      "(AWS bare metal, EKS)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", choices=("on", "off", "Unknown Error", "Not Supported", "Insufficient Permissions"),
                   nargs="?", default="on")
    f = fs.add_parser("recovery", help="the driver's GPU Recovery Action (drivers from 565)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", choices=("none", "reset", "reboot", "drain-p2p", "drain-and-reset"))
    f = fs.add_parser("fabric", help="an NVSwitch fabric: on|off, or with --gpu stuck or a registration status")
    f.add_argument("--gpu", type=int, default=None)
    f.add_argument("--seconds", type=float, default=None, help="how long a reset GPU takes to register again")
    f.add_argument("value", help="on, off; with --gpu: stuck, or a status such as 'Insufficient Resources'")
    f = fs.add_parser("xid", help="log an Xid error for a GPU in the kernel log")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--code", type=int, required=True)
    f.add_argument("--text", default=None)
    f.add_argument("--gpu-instance", type=int, default=None, help="MIG GPU instance the driver names")
    f.add_argument("--count", type=int, default=1, help="write the line this many times (an Xid storm)")
    f = fs.add_parser("driver-hung", help="log the driver's assertions of a full-chip reset that hung")
    f.add_argument("--count", type=int, default=1, help="write them this many times (a storm)")
    f = fs.add_parser("fallen", help="log that a GPU has fallen off the bus, without an Xid")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--form", choices=("probe", "line"), default="probe")
    f = fs.add_parser("cuda-init", help="the CUresult cuInit of the fake libcuda returns")
    f.add_argument("--code", default="CUDA_ERROR_UNKNOWN", help="cuda.h name or number; 0 clears")
    f = fs.add_parser("cuda-hang", help="cuInit (with --gpu: that GPU's context creation) of the fake libcuda sleeps first")
    f.add_argument("--seconds", type=float, required=True)
    f.add_argument("--gpu", type=int, default=None)
    f = fs.add_parser("cuda-crash", help="the fake libcuda's context creation on a GPU kills its process with a signal")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--signal", default="SEGV", help="name or number; 0 clears")
    f = fs.add_parser("cuda-jit", help="the CUresult loading a PTX module on a GPU returns (fake libcuda)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--code", default="CUDA_ERROR_INVALID_PTX", help="cuda.h name or number; 0 clears")
    f = fs.add_parser("cuda-launch", help="the CUresult a kernel launch on a GPU meets (fake libcuda)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--code", default="CUDA_ERROR_LAUNCH_FAILED", help="cuda.h name or number; 0 clears")
    f = fs.add_parser("cuda-idle", help="kernel launches on a GPU return success and run nothing (fake libcuda)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", nargs="?", default="on", choices=("on", "off"))
    f = fs.add_parser("cuda-flip", help="a bit of the memory the probe's kernels write on a GPU reads back flipped")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--offset", type=int, required=True, help="byte, counted over what the fill kernels wrote; -1 clears")
    f.add_argument("--bit", type=int, default=0)
    f = fs.add_parser("cuda", help="the CUresult the fake libcuda gives on a GPU")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--code", required=True, help="cuda.h name or number; 0 clears")
    f = fs.add_parser("slow", help="a GPU's PCIe link and bandwidths, as the fake libcuda times copies and kernels "
                      "and NVML and nvidia-smi report the link (only what is given changes)")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("--link", type=_link, default=None, metavar="GEN,WIDTH",
                   help="the link under load, e.g. 3,8 (idle: gen 1 at that width); default the max, 5,16")
    f.add_argument("--h2d", type=_gbps, default=None, metavar="GBPS", help="host-to-device copy bandwidth (default 55)")
    f.add_argument("--d2h", type=_gbps, default=None, metavar="GBPS", help="device-to-host copy bandwidth (default 55)")
    f.add_argument("--hbm", type=_gbps, default=None, metavar="GBPS", help="memory bandwidth (default 4000)")
    f.add_argument("--replays", type=_count, default=None, metavar="N", help="PCIe replays each copy adds")
    f.add_argument("--copy-hang", type=_seconds, default=None, metavar="S", help="seconds each copy sleeps first")
    f.add_argument("--retrains", action="store_true", default=None,
                   help="the next GPU reset trains the degraded link back up to its maximum (a marginal link)")
    f.add_argument("--nvlink-down", type=_link_numbers, default=None, metavar="L[,L...]",
                   help="these NVLinks of the GPU are down (see gpusim nvlink)")
    f.add_argument("--nvlink-errors", type=_count, default=None, metavar="K",
                   help="flit CRC errors each peer copy over NVLink involving the GPU adds to its link 0")
    f.add_argument("--p2p", type=_gbps, default=None, metavar="GBPS", help="a cap on the GPU's peer copies")
    f.add_argument("--clear", action="store_true",
                   help="back to the defaults (replay and NVLink error counters 0), then what is given")
    f = fs.add_parser("compute-mode", help="a GPU's compute mode")
    f.add_argument("--gpu", type=int, required=True)
    f.add_argument("value", choices=("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"))

    c = cmd("nvlink", help="NVLinks per GPU: an HGX board, every pair of GPUs connected through the NVSwitches")
    c.add_argument("--links", type=_links, default=0, metavar="N",
                   help="NVLinks per GPU, 0 to %d (an H200's: 18); 0, the default at init, turns NVLink off"
                        % NVLINK_MAX_LINKS)

    c = cmd("scenario", help="start a ready-made situation")
    c.add_argument("name", choices=("hung-job",))
    c.add_argument("--release-delay", type=float, default=0.0)

    cmd("cuda", help="build and install the simulated libcuda.so.1 (needs gcc)")
    c = cmd("nvml", help="build and install the simulated libnvidia-ml.so.1 (needs gcc)")
    c.add_argument("--flavor", choices=("current", "old", "oldest"), default="current",
                   help="old: no memory _v2, no processes _v3; oldest: no processes _v2 either")
    c = cmd("module", help="load a kernel module in ROOT/sys/module (the driver's own are loaded at init)")
    c.add_argument("name")
    c.add_argument("--holds", default="nvidia", help="the module it depends on (default nvidia)")
    c.add_argument("--refcnt", type=int, default=0)
    c.add_argument("--blocks-reset", action="store_true",
                   help="nvidia-smi refuses a GPU reset while it is loaded, as with an idle nvidia_drm")
    c = cmd("kmsg", help="write a line to the kernel log as root's `echo LINE > /dev/kmsg` does (user facility)")
    c.add_argument("line", help='the line; a "<N>" prefix sets the level (and a facility other than the kernel\'s)')
    cmd("ps", help="allocation records, with alive")
    cmd("stop", help="SIGKILL everything this root started; wait until gone")
    c = cmd("smi", help="run the fake nvidia-smi in-process (arguments after --)")
    c.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _link(text):
    """--link GEN,WIDTH: a PCIe generation (1-5) and width; the GPU's max ones are checked later."""
    parts = text.split(",")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError("expected GEN,WIDTH, e.g. 3,8; got %r" % text)
    gen, width = (int(part) for part in parts)
    if gen not in PCIE_LANE_GBPS:
        raise argparse.ArgumentTypeError("PCIe generation %d: expected 1 to %d" % (gen, max(PCIE_LANE_GBPS)))
    if width not in PCIE_WIDTHS:
        raise argparse.ArgumentTypeError("width %d: expected one of %s" % (width, ", ".join(map(str, PCIE_WIDTHS))))
    return gen, width


def _number(text, kind, accept):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or math.isnan(value) or not accept(value):
        raise argparse.ArgumentTypeError("expected %s, got %r" % (kind, text))
    return value


def _gbps(text):
    return _number(text, "a positive number of GB/s", lambda value: 0 < value < float("inf"))


def _seconds(text):
    return _number(text, "0 or more seconds", lambda value: 0 <= value < float("inf"))


def _count(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError("expected a count of 0 or more, got %r" % text)
    return int(text)


def _links(text):
    """--links N: NVLinks per GPU, as many as nvml.h's NVML_NVLINK_MAX_LINKS at most."""
    if not text.isdigit() or int(text) > NVLINK_MAX_LINKS:
        raise argparse.ArgumentTypeError("expected 0 to %d NVLinks per GPU, got %r" % (NVLINK_MAX_LINKS, text))
    return int(text)


def _link_numbers(text):
    """--nvlink-down L[,L...]: NVLink numbers (the GPU's count is checked later)."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) < NVLINK_MAX_LINKS for part in parts):
        raise argparse.ArgumentTypeError("expected NVLink numbers from 0 to %d, e.g. 0,3; got %r" % (
            NVLINK_MAX_LINKS - 1, text))
    return [int(part) for part in parts]


def _histogram(text):
    """--histogram MAX,HIGH,PARTIAL,LOW,NONE: five counts of memory banks."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != len(REMAP_HISTOGRAM_BUCKETS) or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError("expected five counts of banks, %s, e.g. 3070,2,0,0,0; got %r" % (
            ",".join(bucket.upper() for bucket in REMAP_HISTOGRAM_BUCKETS), text))
    return [int(part) for part in parts]


def _ints(text):
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError("expected a comma-separated list of numbers, got %r" % text)


def main(argv=None):
    args = _parser().parse_args(argv)
    from gpusim.api import Host

    host = Host(args.root)
    try:
        if args.cmd == "init":
            host.init(gpus=args.gpus, name=args.name, memory_total_mib=args.memory_total_mib,
                      driver_version=args.driver_version, cuda_version=args.cuda_version,
                      release_delay=args.release_delay, persistence_mode=args.persistence_mode,
                      seed=args.seed, idle_used_mib=args.idle_used_mib, reserved_mib=args.reserved_mib,
                      minors=_ints(args.minors) if args.minors else None, fallen=_ints(args.fallen))
            print(json.dumps({"root": host.root, "smi": host.smi_path, "gpus": args.gpus}))
        elif args.cmd == "hold":
            info = host.hold(gpus=args.gpus, mib=args.mib, util=args.util, name=args.name,
                             ignore_term=args.ignore_term, children=args.children,
                             respawn=args.respawn, respawn_delay=args.respawn_delay,
                             map=args.map, leak=args.leak, open_gpus=args.open_gpus,
                             daemon=args.daemon, cgroup=args.cgroup,
                             mig=_ints(args.mig.replace(":", ",")) if args.mig else None)
            print(json.dumps(info))
        elif args.cmd == "mig":
            print(json.dumps(host.mig(args.gpu, [p for p in args.profiles.split(",") if p], args.mode, args.pending,
                                      args.cis_per_gi)))
        elif args.cmd == "fault":
            k = args.kind
            if k == "lost":
                host.fault(k, gpu=args.gpu, message=args.message, in_place=args.in_place)
            elif k in ("hang", "hang-d", "reset-slow"):
                host.fault(k, seconds=args.seconds)
            elif k == "host-engine-hang":
                host.fault(k, value=args.next)
            elif k == "na":
                host.fault(k, field=args.field, gpu=args.gpu, value=args.value)
            elif k == "stuck":
                host.fault(k, gpu=args.gpu, mib=args.mib)
            elif k == "clear":
                host.fault(k)
            elif k == "remap":
                host.fault(k, gpu=args.gpu, pending=args.pending, failure=args.failure,
                           correctable=args.correctable, uncorrectable=args.uncorrectable, histogram=args.histogram)
            elif k in ("retired", "reset-required", "reset-refused", "reset-flr-refused", "recovery", "mig-create"):
                host.fault(k, gpu=args.gpu, value=args.value)
            elif k == "xid":
                host.fault(k, gpu=args.gpu, code=args.code, text=args.text, gpu_instance=args.gpu_instance,
                           count=args.count)
            elif k == "fallen":
                host.fault(k, gpu=args.gpu, form=args.form)
            elif k == "driver-hung":
                host.fault(k, count=args.count)
            elif k == "fabric":
                host.fault(k, gpu=args.gpu, value=args.value, seconds=args.seconds)
            elif k == "cuda-init":
                host.fault(k, code=args.code)
            elif k == "cuda-hang":
                host.fault(k, gpu=args.gpu, seconds=args.seconds)
            elif k == "cuda-crash":
                host.fault(k, gpu=args.gpu, value=args.signal)
            elif k == "cuda":
                host.fault(k, gpu=args.gpu, code=args.code)
            elif k in ("cuda-jit", "cuda-launch"):
                host.fault(k, gpu=args.gpu, code=args.code)
            elif k == "cuda-idle":
                host.fault(k, gpu=args.gpu, value=args.value)
            elif k == "cuda-flip":
                host.fault(k, gpu=args.gpu, offset=args.offset, bit=args.bit)
            elif k == "compute-mode":
                host.fault(k, gpu=args.gpu, value=args.value)
            elif k == "slow":
                host.slow(args.gpu, link=args.link, h2d=args.h2d, d2h=args.d2h, hbm=args.hbm, replays=args.replays,
                          copy_hang=args.copy_hang, clear=args.clear, retrains=args.retrains, nvlink_down=args.nvlink_down,
                          nvlink_errors=args.nvlink_errors, p2p=args.p2p)
            else:
                host.fault(k, value=args.value)
        elif args.cmd == "nvlink":
            print(json.dumps({"links": host.nvlink(args.links)}))
        elif args.cmd == "scenario":
            print(json.dumps(host.scenario(args.name, release_delay=args.release_delay)))
        elif args.cmd == "cuda":
            lib = host.install_cuda()
            print(json.dumps({"lib": lib, "LD_LIBRARY_PATH": os.path.dirname(lib)}))
        elif args.cmd == "nvml":
            lib = host.install_nvml(flavor=args.flavor)
            print(json.dumps({"lib": lib, "LD_LIBRARY_PATH": os.path.dirname(lib)}))
        elif args.cmd == "module":
            host.load_module(args.name, args.holds, args.refcnt, args.blocks_reset)
        elif args.cmd == "ps":
            print(json.dumps(host.ps(), indent=1))
        elif args.cmd == "kmsg":
            host.write_kmsg(args.line)
        elif args.cmd == "stop":
            host.stop()
        elif args.cmd == "smi":
            from gpusim.smi import main as smi_main

            rest = args.args[1:] if args.args[:1] == ["--"] else args.args
            smi_main(host.root, rest)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print("gpusim: %s" % e, file=sys.stderr)
        return 1
    return 0
