"""gpusim's kernel modules: ROOT/sys/module, and the simulated modprobe and rmmod over it.

No kernel module can be loaded in a container, so a reload of the driver is simulated on
ROOT/sys/module. rmmod refuses as the kernel does: a module that others hold (its holders/), that
is in use (refcnt above 0), or nvidia while a process holds a /dev/nvidia* node or a GPU is in
persistence mode ("rmmod: ERROR: Module nvidia is in use"). Unloading nvidia unbinds the GPUs
(their PCI driver link, /proc/driver/nvidia/gpus) and nvidia-smi says the driver is not loaded;
modprobe loads a module after the module it depends on, and loading nvidia brings the GPUs back
as a fresh driver does: the same minor numbers, persistence mode off, their memory freed.
"""

import json
import os
import shutil
import sys

from gpusim.state import Paths, holders_of, load_state, write_json

DRIVER = "nvidia"
KERNEL_RELEASE = "6.8.0-gpusim"


def sys_module(paths):
    return os.path.join(paths.root, "sys", "module")


def dependencies_file(paths):
    """{module: the module it depends on}: what modprobe knows (modules.dep of the simulated host)."""
    return os.path.join(paths.lib, "modules.json")


def read_dependencies(paths):
    try:
        with open(dependencies_file(paths)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def record_dependency(paths, name, holds):
    deps = read_dependencies(paths)
    deps[name] = holds
    os.makedirs(paths.lib, exist_ok=True)
    write_json(dependencies_file(paths), deps)


def is_loaded(paths, name):
    return os.path.isdir(os.path.join(sys_module(paths), name))


def insert(paths, name, holds, refcnt=0):
    """NAME/refcnt and NAME/holders/, and HOLDS/holders/NAME (a link to it), as sysfs shows them."""
    base = sys_module(paths)
    os.makedirs(os.path.join(base, name, "holders"), exist_ok=True)
    with open(os.path.join(base, name, "refcnt"), "w") as f:
        f.write("%d\n" % refcnt)
    if holds:
        link = os.path.join(base, holds, "holders", name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "..", name), link)


def _in_use(paths, name):
    """Why the kernel would refuse to remove NAME (loaded), or None."""
    base = sys_module(paths)
    holders = sorted(os.listdir(os.path.join(base, name, "holders")))
    if holders:
        return "rmmod: ERROR: Module %s is in use by: %s" % (name, " ".join(holders))
    state = load_state(paths)
    if _refcnt(base, name) > 0 or name in (state.get("faults") or {}).get("modules_in_use", ()):
        return "rmmod: ERROR: Module %s is in use" % name
    if name == DRIVER and (_nodes_held(paths, state) or any(g.get("persistence_mode") == "Enabled"
                                                            for g in state["gpus"])):
        return "rmmod: ERROR: Module %s is in use" % name
    return None


def _refcnt(base, name):
    try:
        with open(os.path.join(base, name, "refcnt")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _nodes_held(paths, state):
    nodes = set([paths.ctl_dev] + [paths.gpu_dev(g.get("minor", g["index"])) for g in state["gpus"]])
    return holders_of(nodes, exclude=(os.getpid(),))


def rmmod(paths, name):
    """(exit code, message) of rmmod NAME."""
    if not is_loaded(paths, name):
        return 1, "rmmod: ERROR: Module %s is not currently loaded" % name
    refusal = _in_use(paths, name)
    if refusal:
        return 1, refusal
    base = sys_module(paths)
    for other in os.listdir(base):
        link = os.path.join(base, other, "holders", name)
        if os.path.lexists(link):
            os.unlink(link)
    shutil.rmtree(os.path.join(base, name))
    if name == DRIVER:
        _driver_unloaded(paths)
    return 0, ""


def modprobe(paths, name):
    """(exit code, message) of modprobe NAME: the module it depends on first, as modprobe does."""
    deps = read_dependencies(paths)
    if name not in deps:
        return 1, "modprobe: FATAL: Module %s not found in directory /lib/modules/%s" % (name, KERNEL_RELEASE)
    if is_loaded(paths, name):
        return 0, ""
    holds = deps[name]
    if holds and not is_loaded(paths, holds):
        rc, said = modprobe(paths, holds)
        if rc != 0:
            return rc, said
    insert(paths, name, holds)
    if name == DRIVER:
        _driver_loaded(paths)
    return 0, ""


def _driver_unloaded(paths):
    """The GPUs unbound: no driver link on the PCI bus, no /proc/driver/nvidia/gpus; nvidia-smi and
    NVML find no driver."""
    state = load_state(paths)
    state.setdefault("faults", {})["driver_not_loaded"] = True
    write_json(paths.state, state)
    for g in state["gpus"]:
        link = os.path.join(paths.pci_devices, _bus(g["pci_bus_id"]), "driver")
        if os.path.lexists(link):
            os.unlink(link)
    shutil.rmtree(paths.driver_gpus, ignore_errors=True)


def _driver_loaded(paths):
    """The GPUs as a freshly loaded driver has them: bound, with their minor numbers, persistence
    mode off, nothing left in their memory."""
    from gpusim import messages as M
    from gpusim.smi import apply_reset

    state = load_state(paths)
    state.setdefault("faults", {})["driver_not_loaded"] = False
    for g in state["gpus"]:
        bus = _bus(g["pci_bus_id"])
        link = os.path.join(paths.pci_devices, bus, "driver")
        if os.path.isdir(os.path.dirname(link)) and not os.path.lexists(link):
            os.symlink("../../drivers/nvidia", link)
        info = os.path.join(paths.driver_gpus, bus)
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "information"), "w") as f:
            f.write(M.GPU_INFORMATION.format(model=g["name"], uuid=g["uuid"], bus=bus, minor=g.get("minor", g["index"])))
        g["persistence_mode"] = "Disabled"
    apply_reset(paths, state, state["gpus"])


def _bus(pci_bus_id):
    return pci_bus_id[4:].lower()


def main(root, program, argv=None):
    """rmmod NAME... or modprobe NAME, as the simulated host's programs."""
    argv = sys.argv[1:] if argv is None else argv
    names = [arg for arg in argv if not arg.startswith("-")]
    if not names:
        sys.stderr.write("%s: ERROR: missing module name.\n" % program)
        sys.exit(1)
    paths = Paths(root)
    for name in names if program == "rmmod" else names[:1]:
        rc, said = (rmmod if program == "rmmod" else modprobe)(paths, name)
        if rc != 0:
            sys.stderr.write(said + "\n")
            sys.exit(rc)
    sys.exit(0)
