"""MIG on a simulated host: GPU instances and compute instances per GPU, their caps device nodes and
the driver's /proc/driver/nvidia/capabilities tree, and the memory each instance holds.

A GPU's MIG state lives in state.json under the GPU's "mig" key (absent: MIG disabled, as on a host
that never enabled it); a holder on an instance has "mig": [GI, CI] in its record. Evidence for the
formats: samples/mig/. Kept import-light: the fake nvidia-smi imports this module.
"""

import os

# H200 (141 GB) GPU instance profiles: name -> (profile id, slices, memory MiB). The names and ids
# are NVIDIA's (nvidia-smi mig -lgip on an H200 prints 1g.18gb as 19, 3g.71gb as 9, ...); the memory
# of each is a guess of the right size, no real H200 sample gives it in MiB.
PROFILES = {
    "1g.18gb": (19, 1, 16384),
    "1g.35gb": (15, 1, 32768),
    "2g.35gb": (14, 2, 32768),
    "3g.71gb": (9, 3, 69632),
    "4g.71gb": (5, 4, 69632),
    "7g.141gb": (0, 7, 139264),
}
# The first GPU instance id a driver gives each size (A100 and H100 hosts: 7g 0, 4g 1, 3g 1-2,
# 2g 3-5, 1g 7-14; samples/mig/mig_lgi.txt shows 1g at 9 and 10, 2g at 3, 3g at 2).
FIRST_GI_ID = {7: 0, 4: 1, 3: 1, 2: 3, 1: 7}
MAX_MIG_DEVICES = 7
# /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, then per GPU 15 GPU instances of
# 9 minors each (the GI's access, then compute instances 0-7).
CAPS_CONFIG_MINOR = 1
CAPS_MONITOR_MINOR = 2
CAPS_PER_GI = 9
CAPS_GIS_PER_GPU = 15
ACCESS_TEXT = "DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def gi_minor(gpu_minor, gi):
    return 3 + gpu_minor * CAPS_GIS_PER_GPU * CAPS_PER_GI + gi * CAPS_PER_GI


def ci_minor(gpu_minor, gi, ci):
    return gi_minor(gpu_minor, gi) + 1 + ci


def mig_of(gpu):
    """The GPU's MIG state: {"current", "pending", "instances"}; MIG disabled when it has none."""
    return gpu.get("mig") or {"current": "Disabled", "pending": "Disabled", "instances": []}


def enabled(gpu):
    return mig_of(gpu)["current"] == "Enabled"


def instances(gpu):
    """The GPU's MIG devices (one per compute instance), in MIG device index order."""
    return mig_of(gpu)["instances"] if enabled(gpu) else []


def make_instances(gpu, profiles, cis_per_gi=1, seed=0):
    """MIG devices for the profile names given, with GPU instance ids as a driver assigns them."""
    import random  # here: the fake nvidia-smi imports this module on every call

    rng = random.Random("%s/%d/%s" % (gpu["uuid"], seed, ",".join(profiles)))
    taken, out = set(), []
    for name in profiles:
        if name not in PROFILES:
            raise ValueError("unknown MIG profile %r (known: %s)" % (name, ", ".join(sorted(PROFILES))))
        profile_id, slices, mib = PROFILES[name]
        gi = FIRST_GI_ID[slices]
        while gi in taken:
            gi += 1
        taken.add(gi)
        if slices % cis_per_gi:
            raise ValueError("%s has %d compute slices: not %d compute instances of one size" % (name, slices, cis_per_gi))
        for ci in range(cis_per_gi):
            # A compute instance smaller than its GPU instance is named for its slices: 1c.3g.71gb.
            out.append({"gi": gi, "ci": ci, "profile": ci_profile_name(name, slices // cis_per_gi), "gi_profile": name,
                        "ci_slices": slices // cis_per_gi, "profile_id": profile_id, "memory_total_mib": mib,
                        "uuid": "MIG-%08x-%04x-%04x-%04x-%012x" % tuple(rng.getrandbits(b) for b in (32, 16, 16, 16, 48))})
    if len(out) > MAX_MIG_DEVICES:
        raise ValueError("a GPU has at most %d MIG devices, not %d" % (MAX_MIG_DEVICES, len(out)))
    out.sort(key=lambda dev: (dev["gi"], dev["ci"]))
    return out


# nvidia-smi mig -cci takes compute instance profiles by id: NVML's
# NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE constants (1 slice 0, 2 slices 1, 3 slices 2, 4 slices 3,
# 7 slices 4, 8 slices 5, 6 slices 6).
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
COMPUTE_SLICES = 7


class CreateError(Exception):
    """What nvidia-smi mig says when it cannot create an instance (the NVML error's words)."""


def gi_profile(key):
    """The GPU instance profile name of a -cgi argument: a profile name or its id."""
    for name, (profile_id, dummy, dummy2) in PROFILES.items():
        if key in (name, str(profile_id)):
            return name
    raise CreateError("Invalid Argument")


def ci_profile_name(gi_name, slices):
    """A compute instance's profile name, as nvidia-smi -L prints it: the GPU instance's profile
    for one that takes the whole GPU instance, else "<slices>c.<GPU instance profile>"."""
    return gi_name if slices == PROFILES[gi_name][1] else "%dc.%s" % (slices, gi_name)


def _new_uuid():
    import random  # here: the fake nvidia-smi imports this module on every call

    rng = random.Random()
    return "MIG-%08x-%04x-%04x-%04x-%012x" % tuple(rng.getrandbits(b) for b in (32, 16, 16, 16, 48))


def gi_slices_of(dev):
    return PROFILES[dev.get("gi_profile", dev["profile"])][1]


def create_gpu_instance(gpu, key, refused=None):
    """Create a GPU instance of profile key (name or id) on a MIG-enabled GPU: (GI id, profile
    name). Its compute instances come with create_compute_instance. The GPU instance is kept in
    the GPU's "mig" "empty_gis" until it has a compute instance (nvidia-smi -L lists only
    compute instances). refused: the words of a refusal (the fault mig-create)."""
    if not enabled(gpu):
        raise CreateError("Not Supported")
    name = gi_profile(key)
    if refused:
        raise CreateError(refused)
    mig = gpu["mig"]
    gis = dict((dev["gi"], gi_slices_of(dev)) for dev in mig["instances"])
    gis.update((int(gi), PROFILES[profile][1]) for gi, profile in mig.get("empty_gis", {}).items())
    profile_id, slices, dummy = PROFILES[name]
    if sum(gis.values()) + slices > COMPUTE_SLICES:
        raise CreateError("Insufficient Resources")
    gi = FIRST_GI_ID[slices]
    while gi in gis:
        gi += 1
    mig.setdefault("empty_gis", {})[str(gi)] = name
    return gi, name


def create_compute_instance(gpu, gi, ci_profile_id=None):
    """Create a compute instance in GPU instance gi: of compute-slice profile ci_profile_id, or
    the whole GPU instance (None, as -C does). Returns the MIG device made."""
    mig = gpu["mig"]
    empty = mig.get("empty_gis", {})
    devs = [dev for dev in mig["instances"] if dev["gi"] == gi]
    name = empty.get(str(gi)) or (devs[0].get("gi_profile", devs[0]["profile"]) if devs else None)
    if name is None:
        raise CreateError("Not Found")
    profile_id, gi_slices, mib = PROFILES[name]
    slices = gi_slices if ci_profile_id is None else CI_PROFILE_SLICES.get(ci_profile_id)
    used = sum(ci_slices_of(dev) for dev in devs)
    if slices is None or slices > gi_slices:
        raise CreateError("Invalid Argument")
    if used + slices > gi_slices:
        raise CreateError("Insufficient Resources")
    ci = 0
    while any(dev["ci"] == ci for dev in devs):
        ci += 1
    dev = {"gi": gi, "ci": ci, "profile": ci_profile_name(name, slices), "gi_profile": name, "ci_slices": slices,
           "profile_id": profile_id, "memory_total_mib": mib, "uuid": _new_uuid()}
    empty.pop(str(gi), None)
    mig["instances"].append(dev)
    mig["instances"].sort(key=lambda d: (d["gi"], d["ci"]))
    return dev


def ci_slices_of(dev):
    """The compute slices a MIG device takes (the whole GPU instance unless made smaller)."""
    return dev.get("ci_slices", gi_slices_of(dev))


def ci_profile_id(dev):
    """The compute instance profile id of a MIG device (CI_PROFILE_SLICES)."""
    slices = ci_slices_of(dev)
    return [profile_id for profile_id, n in CI_PROFILE_SLICES.items() if n == slices][0]


def find(gpu, gi, ci=None):
    """The MIG device of GPU instance gi (compute instance ci, or its first); ValueError if none."""
    for dev in instances(gpu):
        if dev["gi"] == gi and (ci is None or dev["ci"] == ci):
            return dev
    raise ValueError("GPU %d has no MIG instance GI %s%s" % (gpu["index"], gi, "" if ci is None else " CI %s" % ci))


def reset(gpu):
    """What a GPU reset does to a GPU's MIG state: the pending mode becomes the mode, and no GPU or
    compute instance is left. NVIDIA's MIG user guide (Deployment Considerations,
    https://docs.nvidia.com/datacenter/tesla/mig-user-guide/deployment-considerations.html): "Setting
    MIG mode on the A100/A30 requires a GPU reset"; the GPU and compute instances are not persistent
    across a reset or a reboot and have to be created again (what nvidia-mig-parted's service does at
    boot)."""
    if "mig" not in gpu:
        return
    gpu["mig"] = {"current": gpu["mig"]["pending"], "pending": gpu["mig"]["pending"], "instances": []}


def caps_nodes(paths, gpu, dev):
    """The caps device nodes of a MIG device: its GPU instance's, then its compute instance's."""
    minor = gpu.get("minor", gpu["index"])
    return [os.path.join(paths.dev, "nvidia-caps", "nvidia-cap%d" % m)
            for m in (gi_minor(minor, dev["gi"]), ci_minor(minor, dev["gi"], dev["ci"]))]


def write_caps(paths, state):
    """ROOT/dev/nvidia-caps/nvidia-cap<M> and, but with ROOT /, the driver's
    ROOT/proc/driver/nvidia/capabilities tree, for every MIG device of the host."""
    caps_dir = os.path.join(paths.dev, "nvidia-caps")
    proc = os.path.join(paths.root, "proc", "driver", "nvidia", "capabilities")
    import shutil  # here: the fake nvidia-smi imports this module on every call

    shutil.rmtree(caps_dir, ignore_errors=True)
    if paths.root != "/":
        shutil.rmtree(proc, ignore_errors=True)
    os.makedirs(caps_dir, exist_ok=True)
    access = {"mig/config": CAPS_CONFIG_MINOR, "mig/monitor": CAPS_MONITOR_MINOR}
    for gpu in state["gpus"]:
        minor = gpu.get("minor", gpu["index"])
        for dev in instances(gpu):
            base = "gpu%d/mig/gi%d" % (minor, dev["gi"])
            access[base + "/access"] = gi_minor(minor, dev["gi"])
            access["%s/ci%d/access" % (base, dev["ci"])] = ci_minor(minor, dev["gi"], dev["ci"])
    for rel, number in sorted(access.items()):
        _write(os.path.join(caps_dir, "nvidia-cap%d" % number), b"\0" * 4096)
        if paths.root != "/":
            _write(os.path.join(proc, rel), (ACCESS_TEXT % number).encode())


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def instance_used(records, gpu, dev):
    """MiB held on a MIG device's GPU instance by the live records (shared by its compute instances)."""
    return sum(int(rec.get("mib", 0)) for rec in records
               if rec.get("alive", True) and gpu["index"] in rec.get("gpus", ()) and (rec.get("mig") or [None])[0] == dev["gi"])


def on_instance(rec, gpu, dev):
    """Whether a live record's process runs on this MIG device."""
    mig = rec.get("mig")
    return bool(mig) and gpu["index"] in rec.get("gpus", ()) and mig[0] == dev["gi"] and mig[1] == dev["ci"]


def flat_lines(state):
    """The MIG lines of state.nvml for the fake libnvidia-ml (see state._flat_state)."""
    lines = []
    for gpu in state.get("gpus", []):
        mig = mig_of(gpu)
        lines.append("mig %d %d %d" % (gpu["index"], mig["current"] == "Enabled", mig["pending"] == "Enabled"))
        for dev in instances(gpu):
            lines.append("migdev %d %d %d %d %s %s" % (
                gpu["index"], dev["gi"], dev["ci"], dev["memory_total_mib"], dev["uuid"], dev["profile"]))
    return lines
