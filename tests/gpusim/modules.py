"""gpusim's kernel modules: ROOT/sys/module, and the simulated modprobe and rmmod over it.

No kernel module can be loaded in a container, so a reload of the driver is simulated on
ROOT/sys/module. rmmod refuses as the kernel does: a module that others hold (its holders/), that
is in use (refcnt above 0), or nvidia while a process holds a /dev/nvidia* node or a GPU is in
persistence mode ("rmmod: ERROR: Module nvidia is in use"). Unloading nvidia unbinds the GPUs
(their PCI driver link, /proc/driver/nvidia/gpus) and nvidia-smi says the driver is not loaded;
modprobe loads a module after the module it depends on, and loading nvidia brings the GPUs back
as a fresh driver does: the same minor numbers, persistence mode off, their memory freed.

The device nodes a module's driver numbers anew when it is loaded again (its character device
major is given afresh) are gone with it here, as stale as gone: /dev/nvidia-uvm and
nvidia-uvm-tools with nvidia_uvm, /dev/nvidia-modeset with nvidia_modeset, the MIG capability
nodes /dev/nvidia-caps/* with nvidia. modprobe makes none of them again; nvidia-modprobe does, as
the driver's own tool: -u -c 0 (the UVM nodes), -m (modeset), -f PATH (the capability node of the
procfs file PATH, its DeviceFileMinor).
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
    for node in _nodes_of(paths, name):
        os.unlink(node)
    if name == DRIVER:
        _driver_unloaded(paths)
    return 0, ""


def _nodes_of(paths, name):
    """The device nodes that go with module NAME (see above), those there."""
    if name == "nvidia_uvm":
        found = [os.path.join(paths.dev, node) for node in ("nvidia-uvm", "nvidia-uvm-tools")]
    elif name == "nvidia_modeset":
        found = [os.path.join(paths.dev, "nvidia-modeset")]
    elif name == DRIVER:
        caps = os.path.join(paths.dev, "nvidia-caps")
        found = [os.path.join(caps, node) for node in (os.listdir(caps) if os.path.isdir(caps) else [])]
    else:
        found = []
    return [node for node in found if os.path.lexists(node)]


def nvidia_modprobe(paths, argv):
    """(exit code, message) of nvidia-modprobe ARGV: -u -c 0 (the UVM nodes, nvidia_uvm loaded), -m
    (the modeset node, nvidia_modeset loaded), -f PATH (the capability node of the procfs file PATH
    under the host's root, nvidia loaded)."""
    made = []
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag == "-u":
            if not is_loaded(paths, "nvidia_uvm"):
                return 1, "nvidia-modprobe: nvidia_uvm is not loaded"
            made += [os.path.join(paths.dev, "nvidia-uvm"), os.path.join(paths.dev, "nvidia-uvm-tools")]
        elif flag == "-c":
            args.pop(0) if args else None
        elif flag == "-m":
            if not is_loaded(paths, "nvidia_modeset"):
                return 1, "nvidia-modprobe: nvidia_modeset is not loaded"
            made.append(os.path.join(paths.dev, "nvidia-modeset"))
        elif flag == "-f" and args:
            proc_file = os.path.join(paths.root, args.pop(0).lstrip("/"))
            try:
                with open(proc_file) as f:
                    minor = int(f.read().split("DeviceFileMinor:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                return 1, "nvidia-modprobe: cannot read the capability file %s" % proc_file
            made.append(os.path.join(paths.dev, "nvidia-caps", "nvidia-cap%d" % minor))
        else:
            return 1, "nvidia-modprobe: unknown option %s" % flag
    for node in made:
        os.makedirs(os.path.dirname(node), exist_ok=True)
        if not os.path.exists(node):
            with open(node, "wb") as f:
                f.write(b"\0" * 4096)
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
    """rmmod NAME..., modprobe NAME or nvidia-modprobe OPTIONS, as the simulated host's programs."""
    argv = sys.argv[1:] if argv is None else argv
    if program == "nvidia-modprobe":
        rc, said = nvidia_modprobe(Paths(root), argv)
        if rc != 0:
            sys.stderr.write(said + "\n")
        sys.exit(rc)
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
