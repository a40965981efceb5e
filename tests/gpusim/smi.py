"""The fake nvidia-smi. Prints what the real one prints, from the simulated host's state.

Called in polling loops: stdlib only, no argparse, nothing heavy at import.
"""

import os
import sys
import time

from gpusim import messages as M
from gpusim import mig as _mig
from gpusim.state import (NUMA_CPUS, NVLINK_LINK_SPEED, NVLINK_SMI_ERRORS, RECOVERY_ACTION_FROM, RECOVERY_ACTIONS,
                          REMAP_HISTOGRAM_BUCKETS, RESET_REQUIRED_FIELDS, Paths, driver_major, fabric_value, gpu_free,
                          gpu_reserved, gpu_usage, holders_of, link_now, link_of, load_records, load_state, minor_of,
                          numa_node, nvlink_crc_errors, nvlink_links, nvlinks_active, recovery_action, remap_histogram,
                          topology, write_json)

# canonical field -> (header unit or None, aliases)
GPU_FIELDS = {
    "timestamp": None, "driver_version": None, "count": None, "name": None,
    "serial": None, "uuid": None, "pci.bus_id": None, "pci.domain": None, "pci.bus": None,
    "pci.device": None, "pci.device_id": None, "index": None, "minor_number": None,
    "persistence_mode": None, "compute_mode": None, "pstate": None,
    "memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB",
    "memory.reserved": "MiB", "utilization.gpu": "%", "utilization.memory": "%",
    "temperature.gpu": None, "power.draw": "W", "power.limit": "W",
    "remapped_rows.correctable": None, "remapped_rows.uncorrectable": None,
    "remapped_rows.pending": None, "remapped_rows.failure": None, "retired_pages.pending": None,
    "gpu_recovery_action": None, "fabric.state": None, "fabric.status": None,
    "mig.mode.current": None, "mig.mode.pending": None,
    "pcie.link.gen.current": None, "pcie.link.gen.max": None, "pcie.link.gen.gpumax": None,
    "pcie.link.width.current": None, "pcie.link.width.max": None,
}
GPU_ALIASES = {
    "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "persistence-mode": "persistence_mode", "compute-mode": "compute_mode",
}
APP_FIELDS = {
    "timestamp": None, "gpu_name": None, "gpu_bus_id": None, "gpu_serial": None,
    "gpu_uuid": None, "pid": None, "process_name": None, "used_gpu_memory": "MiB",
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}
REMAP_FIELDS = {
    "timestamp": None, "gpu_bus_id": None, "gpu_uuid": None, "gpu_name": None,
    "remapped_rows.correctable": None, "remapped_rows.uncorrectable": None,
    "remapped_rows.pending": None, "remapped_rows.failure": None,
}
REMAP_ALIASES = {"pci.bus_id": "gpu_bus_id", "uuid": "gpu_uuid", "name": "gpu_name"}
# The 535 and 550 drivers list remapped_rows.* only under --query-remapped-rows (man pages and
# strings of the real binaries); 590.48.01 accepts them in --query-gpu too. Between: a guess.
REMAPPED_ROWS_IN_QUERY_GPU_FROM = 590
# `-q -d TYPE[,TYPE]`: the display types nvidia-smi(1) lists; the fake prints the sections it has of
# them (MEMORY, UTILIZATION, COMPUTE, ROW_REMAPPER) and nothing for the others.
DISPLAY_TYPES = ("MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS", "PERFORMANCE",
                 "SUPPORTED_CLOCKS", "PAGE_RETIREMENT", "ACCOUNTING", "ENCODER_STATS", "SUPPORTED_GPU_TARGET_TEMP",
                 "VOLTAGE", "FBC_STATS", "ROW_REMAPPER", "RESET_STATUS", "GSP_FIRMWARE_VERSION")
# `nvidia-smi nvlink` options the fake answers: the links' state and their error counters.
NVLINK_OPTIONS = {"-s": "status", "--status": "status", "-e": "errors", "--errorcounters": "errors"}


class Usage(Exception):
    def __init__(self, text, code=M.EXIT_INVALID_ARGUMENT):
        Exception.__init__(self, text)
        self.text = text
        self.code = code


def short_bus(bus_id):
    # The device-handle error prints the 4-digit-domain form: 0000:5D:00.0
    return bus_id[4:] if len(bus_id) == 16 else bus_id


def parse_args(argv):
    opts = {"query_gpu": None, "query_apps": None, "query_remap": None, "format": None, "ids": None,
            "pm": None, "reset": False, "list": False, "query": False, "help": False, "topo": False,
            "display": None, "nvlink": None, "mig": None}
    if argv[:1] == ["topo"]:
        # `nvidia-smi topo -m`: the topology matrix; nothing else of topo's is simulated.
        if argv[1:] not in (["-m"], ["--matrix"]):
            raise Usage(M.INVALID_ARGS)
        opts["topo"] = True
        return opts
    if argv[:1] == ["nvlink"]:
        return parse_nvlink_args(argv[1:], opts)
    if argv[:1] == ["mig"]:
        return parse_mig_args(argv[1:], opts)
    i = 0

    def value(i, flag):
        if "=" in argv[i]:
            return argv[i].split("=", 1)[1], i
        if i + 1 >= len(argv):
            raise Usage(M.INVALID_ARGS)
        return argv[i + 1], i + 1

    while i < len(argv):
        a = argv[i]
        key = a.split("=", 1)[0]
        if key in ("--query-gpu",):
            opts["query_gpu"], i = value(i, a)
        elif key in ("--query-compute-apps",):
            opts["query_apps"], i = value(i, a)
        elif key in ("--query-remapped-rows",):
            opts["query_remap"], i = value(i, a)
        elif key in ("--format",):
            opts["format"], i = value(i, a)
        elif key in ("-i", "--id"):
            opts["ids"], i = value(i, a)
        elif key in ("-pm", "--persistence-mode"):
            opts["pm"], i = value(i, a)
        elif key in ("-r", "--gpu-reset"):
            opts["reset"] = True
        elif key in ("-L", "--list-gpus"):
            opts["list"] = True
        elif key in ("-q", "--query"):
            opts["query"] = True
        elif key in ("-d", "--display"):
            display, i = value(i, a)
            opts["display"] = [part.strip().upper() for part in display.split(",")]
            if not all(part in DISPLAY_TYPES for part in opts["display"]):
                raise Usage(M.INVALID_ARGS)
        elif key in ("-h", "--help"):
            opts["help"] = True
        else:
            raise Usage(M.INVALID_ARGS)
        i += 1
    if opts["display"] is not None and not opts["query"]:
        raise Usage(M.INVALID_ARGS)
    return opts


def parse_nvlink_args(argv, opts):
    """`nvidia-smi nvlink -s|-e [-i ID]`: which of the two, and the GPUs (as for the other commands)."""
    i = 0
    while i < len(argv):
        key = argv[i].split("=", 1)[0]
        if key in NVLINK_OPTIONS and opts["nvlink"] in (None, NVLINK_OPTIONS[key]):
            opts["nvlink"] = NVLINK_OPTIONS[key]
        elif key in ("-i", "--id") and "=" in argv[i]:
            opts["ids"] = argv[i].split("=", 1)[1]
        elif key in ("-i", "--id") and i + 1 < len(argv):
            i += 1
            opts["ids"] = argv[i]
        else:
            raise Usage(M.INVALID_ARGS)
        i += 1
    if opts["nvlink"] is None:
        raise Usage(M.INVALID_ARGS)
    return opts


def parse_mig_args(argv, opts):
    """`nvidia-smi mig [-i ID] -cgi P[,P...] [-C]` and `nvidia-smi mig [-i ID] -gi GI -cci [P[,P...]]`: the
    two ways to create MIG instances (GPU instance profiles by name or id; compute instance profiles
    by id, none: the GPU instance's default one); nothing else of mig's is simulated."""
    mig = {"cgi": None, "default_ci": False, "gi": None, "cci": None}
    i = 0
    while i < len(argv):
        key = argv[i]
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        if key in ("-cgi", "--create-gpu-instance") and has_value:
            i += 1
            mig["cgi"] = [part.strip() for part in argv[i].split(",") if part.strip()]
        elif key in ("-C", "--default-compute-instance"):
            mig["default_ci"] = True
        elif key in ("-gi", "--gpu-instance-id") and has_value and argv[i + 1].isdigit():
            i += 1
            mig["gi"] = int(argv[i])
        elif key in ("-cci", "--create-compute-instance"):
            mig["cci"] = []
            if has_value:
                i += 1
                mig["cci"] = [part.strip() for part in argv[i].split(",") if part.strip()]
                if not all(part.isdigit() for part in mig["cci"]):
                    raise Usage(M.INVALID_ARGS)
        elif key in ("-i", "--id") and has_value:
            i += 1
            opts["ids"] = argv[i]
        else:
            raise Usage(M.INVALID_ARGS)
        i += 1
    if (mig["cgi"] is None) == (mig["cci"] is None) or (mig["cci"] is not None and mig["gi"] is None):
        raise Usage(M.INVALID_ARGS)
    opts["mig"] = mig
    return opts


def resolve_fields(spec, fields, aliases, refused=()):
    out = []
    for raw in spec.split(","):
        f = raw.strip()
        if not f:
            continue
        canon = aliases.get(f, f)
        if canon not in fields or canon in refused:
            raise Usage(M.INVALID_FIELD.format(field=f))
        out.append(canon)
    return out


def select_gpus(state, ids):
    gpus = state["gpus"]
    if ids is None:
        return gpus
    chosen = []
    for tok in ids.split(","):
        tok = tok.strip()
        match = [g for g in gpus if tok == str(g["index"]) or tok == g["uuid"]
                 or tok.upper() in (g["pci_bus_id"], short_bus(g["pci_bus_id"]))]
        if not match:
            raise Usage(M.NO_DEVICES + "\n", M.EXIT_NOT_FOUND)
        for g in match:
            if g not in chosen:
                chosen.append(g)
    return chosen


class Smi:
    def __init__(self, root, out):
        self.paths = Paths(root)
        self.out = out
        self.state = load_state(self.paths)
        self.faults = self.state.get("faults", {})
        self.rc = M.EXIT_OK

    def w(self, line):
        self.out.write(line + "\n")

    # -- faults --------------------------------------------------------------------------
    def lost_kind(self, gpu):
        return self.faults.get("lost", {}).get(str(gpu["index"]))

    def lost_line(self, gpu, template=None):
        kind = self.lost_kind(gpu)
        bus = short_bus(gpu["pci_bus_id"])
        if kind == "lost":
            self.rc = M.EXIT_GPU_LOST
            return M.HANDLE_GPU_LOST.format(bus=bus)
        if self.rc != M.EXIT_GPU_LOST:
            self.rc = M.EXIT_OTHER
        return (template or M.HANDLE_UNKNOWN_ERROR).format(bus=bus)

    def only_lost(self, gpus):
        """Print the error line of each lost GPU among gpus and return True when real drivers
        print nothing else (the default, as public reports show it; fault "lost" --in-place
        keeps the old variant: the error line in the lost GPU's place, the others listed)."""
        lost = [g for g in gpus if self.lost_kind(g)]
        if not lost or self.faults.get("lost_style") == "in-place":
            return False
        for g in lost:
            self.w(self.lost_line(g))
        return True

    def na_value(self, field, index):
        if field in RESET_REQUIRED_FIELDS and self.faults.get("reset_required", {}).get(str(index)):
            return "[GPU requires reset]"
        for na in self.faults.get("na", ()):
            names = (na["field"], GPU_ALIASES.get(na["field"]), APP_ALIASES.get(na["field"]))
            if field in names and (na.get("gpu") is None or na["gpu"] == index):
                return na["value"]
        return None

    # -- values --------------------------------------------------------------------------
    def usage(self):
        if not hasattr(self, "_usage"):
            self._usage = gpu_usage(self.paths, self.state)
        return self._usage

    def gpu_value(self, field, g, units, now):
        na = self.na_value(field, g["index"])
        if na is not None:
            return na
        mig = self.mig_value(field, g)
        if mig is not None:
            return mig
        used, util, _unused = self.usage()
        idx = g["index"]

        def unit(v, u):
            return "%s %s" % (v, u) if units else str(v)

        if field == "timestamp":
            return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + ".%03d" % (now % 1 * 1000)
        if field == "driver_version":
            return self.state["driver_version"]
        if field == "count":
            return str(len(self.state["gpus"]))
        if field == "name":
            return g["name"]
        if field == "serial":
            return g.get("serial", "[N/A]")
        if field == "uuid":
            return g["uuid"]
        if field == "pci.bus_id":
            return g["pci_bus_id"]
        if field == "pci.domain":
            return "0x" + g["pci_bus_id"][:4]
        if field == "pci.bus":
            return "0x" + g["pci_bus_id"][9:11]
        if field == "pci.device":
            return "0x" + g["pci_bus_id"][12:14]
        if field == "pci.device_id":
            return "0x233510DE"
        if field == "index":
            return str(idx)
        if field == "minor_number":
            return str(g.get("minor", idx))
        if field == "persistence_mode":
            return g["persistence_mode"]
        if field == "compute_mode":
            return g["compute_mode"]
        if field == "pstate":
            return "P0"
        if field == "memory.total":
            return unit(g["memory_total_mib"], "MiB")
        if field == "memory.used":
            return unit(used[idx], "MiB")
        if field == "memory.free":
            return unit(gpu_free(g, used[idx]), "MiB")
        if field == "memory.reserved":
            return unit(gpu_reserved(g), "MiB")
        if field == "utilization.gpu":
            return unit(util[idx], "%")
        if field == "utilization.memory":
            return unit(min(100, util[idx] // 2), "%")
        if field == "temperature.gpu":
            return str(g["temperature"] + util[idx] // 5)
        if field == "power.draw":
            return unit("%.2f" % (72.5 + 6.2 * util[idx]), "W")
        if field == "power.limit":
            return unit("700.00", "W")
        if field.startswith("remapped_rows."):
            remap = self.faults.get("remap", {}).get(str(idx)) or {}
            key = field.split(".", 1)[1]
            if key in ("pending", "failure"):
                return "Yes" if remap.get(key) else "No"
            return str(int(remap.get(key, 0)))
        if field == "gpu_recovery_action":
            return RECOVERY_ACTIONS[recovery_action(self.state, idx)][1]
        if field in ("fabric.state", "fabric.status"):
            return fabric_value(self.faults, g, field, time.time())
        if field.startswith("pcie.link."):
            return str(self.link_value(field, g, now))
        if field == "retired_pages.pending":
            # Ampere and newer remap rows instead of retiring pages.
            pending = self.faults.get("retired_pending", {}).get(str(idx))
            return "[N/A]" if pending is None else ("Yes" if pending else "No")
        return "[N/A]"

    def link_value(self, field, g, now):
        """A pcie.link.* field: the max ones are what the GPU and its slot allow; the current
        generation is the loaded one while the fake libcuda's copies keep the link loaded, 1 while it
        idles (the width stays)."""
        link = link_of(g)
        gen, width = link_now(self.paths, g, now)
        return {"pcie.link.gen.current": gen, "pcie.link.gen.max": link["max_gen"],
                "pcie.link.gen.gpumax": link["max_gen"], "pcie.link.width.current": width,
                "pcie.link.width.max": link["max_width"]}[field]

    @staticmethod
    def mig_value(field, g):
        """MIG's fields, and the values a GPU with MIG enabled does not give for the whole GPU
        (utilisation: N/A in samples/mig/summary_mig_510.txt); None for the others."""
        if field in ("mig.mode.current", "mig.mode.pending"):
            return _mig.mig_of(g)[field.rsplit(".", 1)[1]]
        if field in ("utilization.gpu", "utilization.memory") and _mig.enabled(g):
            return "[N/A]"
        return None

    def readable(self, gpus):
        """The GPUs that answer, in order. A lost GPU's error line is printed in its place, and
        only that when no GPU answers, as nvidia-smi does."""
        if self.only_lost(gpus):
            return
        for g in gpus:
            if self.lost_kind(g):
                self.w(self.lost_line(g))
            else:
                yield g

    # -- commands ------------------------------------------------------------------------
    def query_gpu(self, fields, gpus, header, units):
        if header:
            self.w(", ".join(f + (" [%s]" % GPU_FIELDS[f] if GPU_FIELDS[f] else "") for f in fields))
        now = time.time()
        for g in self.readable(gpus):
            self.w(", ".join(self.gpu_value(f, g, units, now) for f in fields))

    def query_remap(self, fields, gpus, header, units):
        if header:
            self.w(", ".join(fields))
        now = time.time()
        for g in self.readable(gpus):
            remap = self.faults.get("remap", {}).get(str(g["index"])) or {}
            vals = []
            for f in fields:
                if f.startswith("remapped_rows.") and self.na_value(f, g["index"]):
                    vals.append(self.na_value(f, g["index"]))
                elif f.startswith("remapped_rows."):
                    # 0/1 here, as Azure/azhpc-diagnostics asserts on real VMs (^[01], ...).
                    vals.append(str(int(remap.get(f.split(".", 1)[1], 0))))
                elif f == "gpu_bus_id":
                    vals.append(g["pci_bus_id"])
                elif f == "gpu_uuid":
                    vals.append(g["uuid"])
                elif f == "gpu_name":
                    vals.append(g["name"])
                else:
                    vals.append(self.gpu_value("timestamp", g, units, now))
            self.w(", ".join(vals))

    def query_apps(self, fields, gpus, header, units):
        if header:
            self.w(", ".join(f + (" [%s]" % APP_FIELDS[f] if APP_FIELDS[f] else "") for f in fields))
        _unused, _unused2, live = self.usage()
        now = time.time()
        for g in self.readable(gpus):
            for rec in live:
                if g["index"] not in rec["gpus"] or int(rec.get("mib", 0)) <= 0:
                    continue
                vals = []
                for f in fields:
                    na = self.na_value(f, g["index"])
                    if na is not None:
                        vals.append(na)
                    elif f == "pid":
                        vals.append(str(rec["pid"]))
                    elif f == "process_name":
                        vals.append(rec.get("process_name") or rec.get("comm") or "")
                    elif f == "used_gpu_memory":
                        vals.append("%d MiB" % rec["mib"] if units else str(rec["mib"]))
                    elif f == "gpu_uuid":
                        vals.append(g["uuid"])
                    elif f == "gpu_bus_id":
                        vals.append(g["pci_bus_id"])
                    elif f == "gpu_name":
                        vals.append(g["name"])
                    elif f == "gpu_serial":
                        vals.append(g.get("serial", "[N/A]"))
                    elif f == "timestamp":
                        vals.append(self.gpu_value("timestamp", g, units, now))
                self.w(", ".join(vals))

    def topology_matrix(self, gpus):
        """`nvidia-smi topo -m`: how each pair of GPUs connects, and each GPU's CPUs and NUMA node,
        then the legend, tab-separated as the real one prints it (M.TOPO_*)."""
        if self.only_lost(gpus):
            return
        count = len(self.state["gpus"])
        # On an HGX board each pair of GPUs shares the links both have up, through the NVSwitches (NV18 on an
        # H100 or H200 board); a GPU with none left talks to the others over PCIe (a guess: no capture).
        active = {g["index"]: len(nvlinks_active(self.state, g)) for g in gpus}
        self.w("\t" + "\t".join("GPU%d" % g["index"] for g in gpus) + "\t" + M.TOPO_AFFINITY_HEADER)
        for g in gpus:
            node = numa_node(g["index"], count)
            cells = [" X " if h is g else
                     topology(g["index"], h["index"], count, min(active[g["index"]], active[h["index"]]))
                     for h in gpus]
            self.w("GPU%d\t%s\t%s\t%d\t\tN/A" % (g["index"], "\t".join(cells), NUMA_CPUS[node], node))
        self.w("")
        for line in M.TOPO_LEGEND:
            self.w(line)

    def nvlink(self, gpus, what):
        """`nvidia-smi nvlink -s` (what "status") or `-e` ("errors"), as an HGX H100 prints them
        (stas00/ml-engineering; NVIDIA/k8s-test-infra#371, NVIDIA/srt-slurm#307): per GPU a line `GPU 0:
        NAME (UUID: ...)`, then one line per link, `\t Link 0: 26.562 GB/s` or `\t Link 3: <inactive>`,
        or its three counters, `\t Link 0: Replay Errors: 0`, Recovery, CRC (the flit CRC counter), a
        blank line between links. A GPU without NVLink prints nothing, as the real tool does."""
        links = nvlink_links(self.state)
        for g in self.readable(gpus):
            if not links:
                continue
            self.w("GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]))
            up = set(nvlinks_active(self.state, g))
            for link in range(links):
                if what == "status":
                    self.w("\t Link %d: %s" % (link, NVLINK_LINK_SPEED if link in up else "<inactive>"))
                    continue
                if link:
                    self.w("")
                counts = {"DL_CRC_FLIT": nvlink_crc_errors(self.paths, g["index"]) if link == 0 else 0}
                for words, counter in NVLINK_SMI_ERRORS:
                    self.w("\t Link %d: %s: %d" % (link, words, counts.get(counter, 0)))

    def list_gpus(self, gpus):
        # -L spells it "for gpu" (smi_errors/E09); whether it goes on with the other GPUs is not
        # in the public reports: like the queries, it prints only the error lines.
        if self.faults.get("lost_style") != "in-place" and any(self.lost_kind(g) for g in gpus):
            for g in gpus:
                if self.lost_kind(g):
                    self.w(self.lost_line(g, M.HANDLE_UNKNOWN_ERROR_L))
            return
        for g in gpus:
            if self.lost_kind(g):
                self.w(self.lost_line(g, M.HANDLE_UNKNOWN_ERROR_L))
                continue
            self.w("GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]))
            for number, dev in enumerate(_mig.instances(g)):
                self.w("  %-16sDevice %2d: (UUID: %s)" % ("MIG " + dev["profile"], number, dev["uuid"]))

    def persistence(self, value, gpus):
        v = value.strip().upper()
        if v in ("1", "ENABLED"):
            want = "Enabled"
        elif v in ("0", "DISABLED"):
            want = "Disabled"
        else:
            raise Usage(M.INVALID_ARGS)
        changed = False
        for g in gpus:
            if self.lost_kind(g):
                self.w(self.lost_line(g))
                continue
            if g["persistence_mode"] == want:
                self.w(M.PM_ALREADY.format(mode=want, bus=g["pci_bus_id"]))
            else:
                g["persistence_mode"] = want
                changed = True
                self.w((M.PM_ENABLED if want == "Enabled" else M.PM_DISABLED).format(bus=g["pci_bus_id"]))
        if changed:
            write_json(self.paths.state, self.state)
            self.notify_persistenced()
        self.w(M.ALL_DONE)

    def notify_persistenced(self):
        """Tell running nvidia-persistenced holders, and wait until they have acted (the real
        tool talks to the daemon over RPC, synchronously)."""
        import signal

        _unused, _unused2, live = self.usage()
        want = {g["index"]: g["persistence_mode"] == "Enabled" for g in self.state["gpus"]}
        for rec in live:
            if not rec.get("persistenced"):
                continue
            try:
                os.kill(rec["pid"], signal.SIGUSR1)
            except OSError:
                continue
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                nodes = _held_gpu_devs(rec["pid"], self.paths)
                held = set(i for i in want if minor_of(self.state, i) in nodes)
                if all((i in held) == want[i] for i in rec["gpus_open"] if i in want):
                    break
                time.sleep(0.005)

    def gpu_reset(self, gpus):
        _unused, _unused2, live = self.usage()
        busy, refused, ok = [], [], []
        for g in gpus:
            if self.lost_kind(g):
                self.w(self.lost_line(g))
                continue
            idx = g["index"]
            dev = self.paths.gpu_dev(g.get("minor", idx))
            in_use = (g["persistence_mode"] == "Enabled"
                      or self.faults.get("reset_refused", {}).get(str(idx))
                      or any(os.path.isdir(os.path.join(self.paths.root, "sys", "module", name))
                             for name in self.faults.get("reset_blocking_modules", ()))
                      or any(idx in rec["gpus"] and int(rec.get("mib", 0)) > 0 for rec in live)
                      or holders_of({dev}, exclude=(os.getpid(),)))
            flr = self.faults.get("reset_flr_refused", {}).get(str(idx))
            (busy if in_use else refused if flr else ok).append(g)
        if busy or refused:
            self.w(M.RESET_FAILED_HEADER)
            for g in busy:
                self.w(M.RESET_FAILED_GPU.format(bus=g["pci_bus_id"]))
            for g in refused:
                words = self.faults["reset_flr_refused"][str(g["index"])]
                self.w(M.RESET_REFUSED_GPU.format(bus=g["pci_bus_id"], words=words))
            if busy:
                self.w("")
                n = len(busy)
                self.w(M.RESET_FAILED_FOOTER.format(n=n, s="" if n == 1 else "s",
                                                    verb="is" if n == 1 else "are"))
            self.rc = M.EXIT_OTHER
            return
        apply_reset(self.paths, self.state, ok)
        for g in ok:
            self.w(M.RESET_OK.format(bus=g["pci_bus_id"]))
        self.w(M.ALL_DONE)

    def mig_create(self, gpus, request):
        """`nvidia-smi mig -cgi ... [-C]` or `-gi GI -cci ...` on each GPU of gpus, in the words of
        NVIDIA's MIG user guide (samples/mig/create_instances.txt); the state and the caps nodes
        written after."""
        refusals = self.faults.get("mig_create_refused", {})
        for g in gpus:
            idx = g["index"]
            for key in request["cgi"] or ():
                try:
                    gi, name = _mig.create_gpu_instance(g, key, refusals.get(str(idx)))
                    self.w(M.MIG_GI_CREATED.format(gi=gi, gpu=idx, profile=name, id=_mig.PROFILES[name][0]))
                    if request["default_ci"]:
                        dev = _mig.create_compute_instance(g, gi)
                        self.w(M.MIG_DEFAULT_CI_CREATED.format(ci=dev["ci"], gpu=idx, gi=gi, profile=dev["profile"],
                                                               id=_mig.ci_profile_id(dev)))
                except _mig.CreateError as e:
                    self.w(M.MIG_GI_FAILED.format(gpu=idx, profile=key, words=e))
                    self.rc = M.EXIT_OTHER
            for key in request["cci"] if request["cci"] is not None else ():
                try:
                    dev = _mig.create_compute_instance(g, request["gi"], int(key))
                    self.w(M.MIG_CI_CREATED.format(gpu=idx, gi=request["gi"], profile=dev["profile"], id=int(key)))
                except _mig.CreateError as e:
                    self.w(M.MIG_CI_FAILED.format(gpu=idx, gi=request["gi"], profile=key, words=e))
                    self.rc = M.EXIT_OTHER
            if request["cci"] == []:
                try:
                    dev = _mig.create_compute_instance(g, request["gi"])
                    self.w(M.MIG_CI_CREATED.format(gpu=idx, gi=request["gi"], profile=dev["profile"],
                                                   id=_mig.ci_profile_id(dev)))
                except _mig.CreateError as e:
                    self.w(M.MIG_CI_FAILED.format(gpu=idx, gi=request["gi"], profile="default", words=e))
                    self.rc = M.EXIT_OTHER
        write_json(self.paths.state, self.state)
        _mig.write_caps(self.paths, self.state)

    def summary(self, gpus):
        if self.only_lost(gpus):
            return
        used, util, live = self.usage()
        w = self.w
        rule = "+" + "-" * 89 + "+"
        cells = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"

        def row(a, b, c):
            w("|%s|%s|%s|" % (a.ljust(41)[:41], b.ljust(24)[:24], c.ljust(22)[:22]))

        w(time.strftime("%a %b %e %H:%M:%S %Y"))
        w(rule)
        w("|%s|" % (" NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s"
                    % (self.state["driver_version"], self.state["driver_version"],
                       self.state["cuda_version"])).ljust(89))
        w("|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "|")
        row(" GPU  Name                 Persistence-M ", " Bus-Id          Disp.A ", " Volatile Uncorr. ECC ")
        row(" Fan  Temp   Perf          Pwr:Usage/Cap ", "           Memory-Usage ", " GPU-Util  Compute M. ")
        row("", "", "               MIG M. ")
        w("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|")
        for g in gpus:
            if self.lost_kind(g):
                w(self.lost_line(g))
                continue
            i = g["index"]
            pm = "On" if g["persistence_mode"] == "Enabled" else "Off"
            row((" %3d  %s" % (i, g["name"][:28])).ljust(36) + pm.ljust(5),
                ("%s Off " % g["pci_bus_id"]).rjust(24), "0 ".rjust(22))
            power = "%4dW /  700W " % int(72.5 + 6.2 * util[i])
            row((" N/A   %2dC    P0" % g["temperature"]).ljust(41 - len(power)) + power,
                ("%dMiB / %dMiB " % (used[i], g["memory_total_mib"])).rjust(24),
                ("%s      Default " % ("N/A" if _mig.enabled(g) else "%d%%" % util[i])).rjust(22))
            row("", "", (_mig.mig_of(g)["current"] + " ").rjust(22))
            w(cells)
        w("")
        self.mig_table([g for g in gpus if not self.lost_kind(g)], live)
        w(rule)
        w("|%s|" % " Processes:".ljust(89))
        w("|%s|" % "  GPU   GI   CI        PID   Type   Process name                              GPU Memory ".ljust(89))
        w("|%s|" % "        ID   ID                                                               Usage      ".ljust(89))
        w("|" + "=" * 89 + "|")
        rows = [(g["index"], rec) for g in gpus if not self.lost_kind(g)
                for rec in live if g["index"] in rec["gpus"] and int(rec.get("mib", 0)) > 0]
        if not rows:
            w("|%s|" % "  No running processes found".ljust(89))
        for i, rec in rows:
            name = rec.get("process_name") or rec.get("comm") or ""
            if len(name) > 38:
                name = "..." + name[-35:]
            line = "  %4d   N/A  N/A  %9d      C   %-38s" % (i, rec["pid"], name)
            if rec.get("mig"):
                line = "  %4d %4d %4d  %9d      C   %-38s" % (i, rec["mig"][0], rec["mig"][1], rec["pid"], name)
            w("|%s|" % (line + ("%dMiB " % rec["mib"]).rjust(89 - len(line))))
        w(rule)

    def mig_table(self, gpus, live):
        """The "MIG devices:" table of plain nvidia-smi, when a GPU has MIG devices (the 535 and
        later layout, 89 wide; samples/mig/summary_mig_510.txt has the older one's columns)."""
        rows = [(g, number, dev) for g in gpus for number, dev in enumerate(_mig.instances(g))]
        if not rows:
            return
        w = self.w
        cells = "+" + "-" * 18 + "+" + "-" * 32 + "+" + "-" * 11 + "+" + "-" * 23 + "+"
        w("+" + "-" * 89 + "+")
        w("|%s|" % " MIG devices:".ljust(89))
        w(cells)
        w("| GPU  GI  CI  MIG |                   Memory-Usage |        Vol|      Shared           |")
        w("|      ID  ID  Dev |                     BAR1-Usage | SM     Unc| CE ENC DEC OFA JPG    |")
        w("|                  |                                |        ECC|                       |")
        w("|" + "=" * 18 + "+" + "=" * 32 + "+" + "=" * 11 + "+" + "=" * 23 + "|")
        for g, number, dev in rows:
            used = _mig.instance_used(live, g, dev)
            slices = _mig.gi_slices_of(dev)
            w("| %2d %4d %3d %3d  |%s| %2d      0 | %2d   0    %d    0    %d |" % (
                g["index"], dev["gi"], dev["ci"], number,
                ("%dMiB / %dMiB " % (used, dev["memory_total_mib"])).rjust(32), 16 * slices, slices, slices, slices))
            w("|                  |%s|           |                       |" % "0MiB / 16383MiB ".rjust(32))
            w(cells)
        w("")

    def detail(self, gpus, display=None):
        """`nvidia-smi -q`, short: the header, then per GPU its identity, memory, compute mode, utilisation
        and row remapper; with display (`-d ROW_REMAPPER,MEMORY`), the sections of those types alone, as
        the real one prints them."""
        if self.only_lost(gpus):
            return
        used, util, _unused = self.usage()
        w = self.w
        w("")
        w("==============NVSMI LOG==============")
        w("")
        w("%-42s: %s" % ("Timestamp", time.strftime("%a %b %e %H:%M:%S %Y")))
        w("%-42s: %s" % ("Driver Version", self.state["driver_version"]))
        w("%-42s: %s" % ("CUDA Version", self.state["cuda_version"]))
        w("")
        w("%-42s: %d" % ("Attached GPUs", len(self.state["gpus"])))
        shown = set(display or DISPLAY_TYPES)
        for g in gpus:
            if self.lost_kind(g):
                w(self.lost_line(g))
                continue
            i = g["index"]
            w("GPU %s" % g["pci_bus_id"])
            if display is None:
                for k, v in (("Product Name", g["name"]), ("Persistence Mode", g["persistence_mode"]),
                             ("GPU UUID", g["uuid"]), ("Minor Number", g.get("minor", i))):
                    w("    %-38s: %s" % (k, v))
            if "MEMORY" in shown:
                w("    FB Memory Usage")
                for k, v in (("Total", g["memory_total_mib"]), ("Reserved", gpu_reserved(g)), ("Used", used[i]),
                             ("Free", gpu_free(g, used[i]))):
                    w("        %-34s: %d MiB" % (k, v))
            if "COMPUTE" in shown:
                w("    Compute Mode                          : %s" % g["compute_mode"])
            action = recovery_action(self.state, i)
            if action is not None and display is None:
                w("    %-38s: %s" % ("GPU Recovery Action", RECOVERY_ACTIONS[action][1]))
            if "UTILIZATION" in shown:
                w("    Utilization")
                w("        %-34s: %d %%" % ("Gpu", util[i]))
            if "ROW_REMAPPER" in shown:
                self.remapped_rows(g)
            w("")

    def remapped_rows(self, g):
        """-q's "Remapped Rows" block, as real H100 and H200 print it (PrincetonUniversity's
        gpu_programming_intro, thamada/gls gls/H200_smi.py): the counts, pending and failure, and the
        bank remap availability histogram, in banks."""
        remap = self.faults.get("remap", {}).get(str(g["index"])) or {}
        w = self.w
        w("    Remapped Rows")
        for words, key in (("Correctable Error", "correctable"), ("Uncorrectable Error", "uncorrectable"),
                           ("Pending", "pending"), ("Remapping Failure Occurred", "failure")):
            value = self.na_value("remapped_rows." + key, g["index"])
            if value is None and key in ("pending", "failure"):
                value = "Yes" if remap.get(key) else "No"
            w("        %-34s: %s" % (words, int(remap.get(key, 0)) if value is None else value))
        w("        Bank Remap Availability Histogram")
        for bucket, banks in zip(REMAP_HISTOGRAM_BUCKETS, remap_histogram(self.faults, g["index"])):
            w("            %-30s: %d bank(s)" % (bucket.capitalize(), banks))


def apply_reset(paths, state, gpus):
    """What a GPU reset (or a reload of the driver) does to the GPUs of state: frees their memory,
    carries out what the driver asked for, applies pending remappings; writes the state."""
    faults = state.get("faults") or {}
    reset = {g["index"] for g in gpus}
    for g in gpus:
        g["stuck_mib"] = 0
        # A reset retrains the PCIe link: a marginal one (fault slow --retrains) comes back at its maximum.
        if g.pop("link_retrains", False):
            g["loaded_gen"], g["loaded_width"] = g["max_gen"], g["max_width"]
        # On an NVSwitch system a reset GPU registers with the fabric manager again.
        if faults.get("fabric"):
            g["fabric_ready_at"] = time.time() + float(faults["fabric"].get("delay_s", 0))
        # A reset carries out what the driver asked for: the GPU answers again.
        faults.get("reset_required", {}).pop(str(g["index"]), None)
        if faults.get("recovery", {}).get(str(g["index"])) in ("reset", "drain-and-reset"):
            faults["recovery"].pop(str(g["index"]))
        # A reset applies the pending row remappings.
        remap = faults.get("remap", {}).get(str(g["index"]))
        if remap:
            remap["pending"] = False
        # And the pending page retirements (GPUs before Ampere).
        if faults.get("retired_pending", {}).get(str(g["index"])):
            faults["retired_pending"][str(g["index"])] = False
        _mig.reset(g)
    write_json(paths.state, state)
    if any("mig" in g for g in gpus):
        _mig.write_caps(paths, state)
    for rec in load_records(paths):
        hit = reset.intersection(rec["gpus"]) - set(rec.get("reset_gpus", ()))
        if hit and rec.get("died_at") is not None:
            rec["reset_gpus"] = sorted(set(rec.get("reset_gpus", ())) | hit)
            rec.pop("alive", None)
            write_json(paths.proc_record(rec["pid"]), rec)


def _held_gpu_devs(pid, paths):
    out = set()
    d = "/proc/%d/fd" % pid
    try:
        for fd in os.listdir(d):
            try:
                t = os.readlink(os.path.join(d, fd))
            except OSError:
                continue
            base = os.path.basename(t)
            if os.path.dirname(t) == paths.dev and base[6:].isdigit() and base.startswith("nvidia"):
                out.add(int(base[6:]))
    except OSError:
        pass
    return out


# The kernel stack of a task hung in NVIDIA's driver, as a hung-task report prints it (an NVML
# client blocked in nvidia_uvm: NVIDIA/k8s-device-plugin#77), in /proc/PID/stack's form.
HUNG_STACK = ("[<0>] __mutex_lock_slowpath+0xb4/0x130\n[<0>] mutex_lock+0x1f/0x2f\n"
              "[<0>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]\n[<0>] SyS_ioctl+0x79/0x90\n")


def hang_in_driver(paths, seconds):
    """The fault hang-d: nvidia-smi hangs as one stuck in the driver. A real D state needs a
    kernel that blocks the task (no test can make one: SIGKILL ends any process of ours), so
    what a reader of /proc sees of it is written under ROOT/proc/PID (stat with state D, wchan,
    stack) for a runner pointed there (Runner.proc); the process itself sleeps, and dies when killed."""
    where = os.path.join(paths.root, "proc", str(os.getpid()))
    os.makedirs(where, exist_ok=True)
    with open("/proc/self/stat") as handle:
        head, tail = handle.read().rsplit(")", 1)
    fields = tail.split()
    fields[0] = "D"
    for name, text in (("stat", "%s) %s\n" % (head, " ".join(fields))), ("wchan", "mutex_lock"), ("stack", HUNG_STACK)):
        with open(os.path.join(where, name), "w") as handle:
            handle.write(text)
    hang(seconds)


def hang(seconds):
    import signal

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(left)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def run(root, argv, out):
    """Run one nvidia-smi invocation; return its exit code."""
    try:
        opts = parse_args(argv)
    except Usage as e:
        out.write(e.text)
        return e.code
    if opts["help"]:
        out.write("NVIDIA System Management Interface -- v(gpusim)\n\n"
                  "Supported: -L, -q, -i ID, --query-gpu=..., --query-compute-apps=..., "
                  "--format=csv[,noheader][,nounits], -q -d TYPE, -pm 0|1, -r/--gpu-reset, topo -m, "
                  "nvlink -s|-e, mig -cgi P[,P] [-C], mig -gi GI -cci [P[,P]]\n")
        return M.EXIT_OK
    try:
        smi = Smi(root, out)
    except FileNotFoundError:
        out.write(M.DRIVER_NOT_LOADED)
        return M.EXIT_DRIVER_NOT_LOADED
    try:
        refused = ()
        if driver_major(smi.state) < REMAPPED_ROWS_IN_QUERY_GPU_FROM:
            refused = tuple(f for f in GPU_FIELDS if f.startswith("remapped_rows."))
        if driver_major(smi.state) < RECOVERY_ACTION_FROM:
            refused += ("gpu_recovery_action",)
        q_gpu = resolve_fields(opts["query_gpu"], GPU_FIELDS, GPU_ALIASES, refused) if opts["query_gpu"] else None
        q_app = resolve_fields(opts["query_apps"], APP_FIELDS, APP_ALIASES) if opts["query_apps"] else None
        q_remap = (resolve_fields(opts["query_remap"], REMAP_FIELDS, REMAP_ALIASES)
                   if opts["query_remap"] else None)
        fmt = None
        if q_gpu is not None or q_app is not None or q_remap is not None:
            if not opts["format"]:
                raise Usage(M.FORMAT_REQUIRED)
            fmt = [x.strip() for x in opts["format"].split(",")]
            if "csv" not in fmt or any(x not in ("csv", "noheader", "nounits") for x in fmt):
                raise Usage(M.INVALID_ARGS)
        if opts["reset"] and opts["ids"] is None:
            raise Usage(M.RESET_NEEDS_ID)
    except Usage as e:
        out.write(e.text)
        return e.code

    f = smi.faults
    if f.get("hang_d_s"):
        hang_in_driver(smi.paths, float(f["hang_d_s"]))
    if f.get("hang_s"):
        hang(float(f["hang_s"]))
    if f.get("driver_not_loaded"):
        out.write(M.DRIVER_NOT_LOADED)
        return M.EXIT_DRIVER_NOT_LOADED
    if f.get("mismatch"):
        out.write(M.VERSION_MISMATCH + "\n")
        out.write(M.NVML_LIBRARY_VERSION.format(version=f.get("mismatch_library_version") or
                                                ".".join(smi.state["driver_version"].split(".")[:2])) + "\n")
        return M.EXIT_VERSION_MISMATCH
    if f.get("no_devices") or not smi.state["gpus"]:
        out.write(M.NO_DEVICES + "\n")
        return M.EXIT_NOT_FOUND
    try:
        gpus = select_gpus(smi.state, opts["ids"])
    except Usage as e:
        out.write(e.text)
        return e.code

    if q_gpu is not None or q_app is not None or q_remap is not None:
        header = "noheader" not in fmt
        units = "nounits" not in fmt
        if q_gpu is not None:
            smi.query_gpu(q_gpu, gpus, header, units)
        if q_app is not None:
            smi.query_apps(q_app, gpus, header, units)
        if q_remap is not None:
            smi.query_remap(q_remap, gpus, header, units)
    elif opts["pm"] is not None:
        try:
            smi.persistence(opts["pm"], gpus)
        except Usage as e:
            out.write(e.text)
            return e.code
    elif opts["reset"]:
        if f.get("reset_slow_s"):
            hang(float(f["reset_slow_s"]))
        smi.gpu_reset(gpus)
    elif opts["list"]:
        smi.list_gpus(gpus)
    elif opts["topo"]:
        smi.topology_matrix(gpus)
    elif opts["nvlink"]:
        smi.nvlink(gpus, opts["nvlink"])
    elif opts["mig"]:
        smi.mig_create(gpus, opts["mig"])
    elif opts["query"]:
        smi.detail(gpus, opts["display"])
    else:
        smi.summary(gpus)
    return smi.rc


def main(root, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # The real tool prints a process name that is not UTF-8 as the bytes it read.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="surrogateescape")
    try:
        rc = run(root, argv, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        rc = M.EXIT_OTHER
    sys.exit(rc)
