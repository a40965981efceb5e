"""Workload processes: the launcher, the monitor (a slurmstepd stand-in) and the holder.

    launcher (gpusim hold)  --Popen, new session-->  monitor  --fork+exec-->  holder  --fork-->  children

The monitor holds no device file. It reaps the holder, writes died_at into its record,
re-spawns it when asked, and is a child subreaper so orphaned children are reaped too.
Every pid is written to ROOT/var/lib/gpusim/tracked/ (with its start time) so that
`stop` can kill them all, and never a recycled pid.
"""

import json
import os
import signal
import sys
import time

from gpusim.state import (DEV_FILE_SIZE, Paths, is_alive, proc_stat, proc_starttime, read_json, read_json_dir,
                          write_json)

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36

HOLDER_SCRIPT = """\
import sys
sys.path.insert(0, {parent!r})
from gpusim.hold import holder_main
holder_main()
"""


def write_holder_script(path):
    with open(path, "w") as f:
        f.write(HOLDER_SCRIPT.format(parent=PKG_PARENT))


def _prctl(option, arg):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if isinstance(arg, bytes):
        arg = ctypes.c_char_p(arg)
    libc.prctl(option, arg, 0, 0, 0)


def _map_shared(fd):
    # Python's mmap module keeps a dup of the fd; libc mmap leaves only the mapping.
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    addr = libc.mmap(None, DEV_FILE_SIZE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return addr


def set_comm(name):
    # The kernel truncates comm to 15 bytes; a name that is not UTF-8 keeps its bytes.
    _prctl(PR_SET_NAME, name.encode("utf-8", "surrogateescape")[:15])


# ---------------------------------------------------------------- pid registry

def track(paths, pid, role):
    start = proc_starttime(pid)
    if start is None:
        return
    os.makedirs(paths.tracked, exist_ok=True)
    write_json(os.path.join(paths.tracked, "%d.json" % pid),
               {"pid": pid, "starttime": start, "role": role})


def tracked(paths):
    return read_json_dir(paths.tracked)


def stop_all(paths, timeout=15.0):
    """SIGKILL every monitor, holder and child started under this root; wait until gone."""
    me = os.getpid()
    entries = tracked(paths)
    sessions = {e["pid"]: e["starttime"] for e in entries if e["role"] == "monitor"}
    deadline = time.monotonic() + timeout
    while True:
        victims = []
        for e in tracked(paths):
            if e["pid"] != me and is_alive(e["pid"], e["starttime"]):
                victims.append((0 if e["role"] == "monitor" else 1, e["pid"]))
        if sessions:
            # Anything left in a monitor's session (e.g. a holder forked a moment ago).
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == me:
                    continue
                st = proc_stat(int(name))
                if (st and st[0] not in ("Z", "X") and st[1] in sessions
                        and st[2] >= sessions[st[1]]):
                    victims.append((0 if int(name) in sessions else 1, int(name)))
        if not victims:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("gpusim stop: still alive after %ss: %s"
                               % (timeout, sorted(p for _unused, p in victims)))
        for _unused, pid in sorted(set(victims)):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    for e in tracked(paths):
        if not is_alive(e["pid"], e["starttime"]):
            try:
                os.unlink(os.path.join(paths.tracked, "%d.json" % e["pid"]))
            except OSError:
                pass
    from gpusim.cgroups import remove_all

    remove_all(paths)


# ---------------------------------------------------------------- launcher

def _gpu_list(spec, all_gpus):
    if spec in ("all", None):
        return list(all_gpus)
    if isinstance(spec, int):
        spec = [spec]
    if isinstance(spec, str):
        spec = [x for x in spec.split(",") if x.strip() != ""]
    out = [int(g) for g in spec]
    for g in out:
        if g not in all_gpus:
            raise ValueError("gpusim hold: no GPU %d on this host" % g)
    return out


def start_hold(paths, gpus, mib, util=0, name=None, ignore_term=False, children=0,
               respawn=0, respawn_delay=0.0, map=False, leak=False, open_gpus=None,
               argv=None, cwd=None, timeout=20.0, exe=None, cgroup=None, mig=None):
    """Start a detached monitor + holder; return ({"pid", "monitor_pid", "children"}, Popen)."""
    import select
    import subprocess

    from gpusim.state import load_state

    state = load_state(paths)
    all_gpus = [g["index"] for g in state["gpus"]]
    gpus = _gpu_list(gpus, all_gpus)
    open_gpus = gpus if open_gpus is None else _gpu_list(open_gpus, all_gpus)
    cfg = {
        "root": paths.root, "gpus": gpus, "open": sorted(set(open_gpus) | set(gpus)), "mib": int(mib), "util": int(util),
        # GPU index -> the minor number of its device node.
        "minors": dict((str(g["index"]), g.get("minor", g["index"])) for g in state["gpus"]),
        "name": name, "ignore_term": bool(ignore_term), "children": int(children),
        "respawn": int(respawn), "respawn_delay": float(respawn_delay),
        "map": bool(map), "leak": bool(leak),
        "argv": argv or [name or "python3", os.path.join(paths.lib, "holder.py")],
        "cwd": cwd or "/",
        "exe": exe or sys.executable,
        "cgroup": cgroup,
    }
    if mig is not None:
        cfg.update(_mig_holding(paths, state, gpus, mig))
    env = dict(os.environ)
    env["GPUSIM_MONITOR"] = json.dumps(cfg)
    env["PYTHONPATH"] = PKG_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = open(os.path.join(paths.lib, "gpusim.log"), "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpusim", "_monitor"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=log, start_new_session=True, close_fds=True,
            cwd="/", env=env)
    finally:
        log.close()
    track(paths, proc.pid, "monitor")
    line = b""
    end = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        left = end - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            break
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        line += chunk
    proc.stdout.close()
    try:
        info = json.loads(line.decode())
    except ValueError:
        info = {"error": "holder did not start (see %s/gpusim.log)" % paths.lib}
    if "error" in info:
        stop_all(paths)
        proc.wait()
        raise RuntimeError("gpusim hold: " + info["error"])
    return info, proc


def _mig_holding(paths, state, gpus, mig):
    """The record's MIG instance ([GI, CI]) and the caps nodes its holder opens."""
    from gpusim import mig as _mig

    gi, ci = (tuple(mig) + (None,))[:2] if isinstance(mig, (list, tuple)) else (int(mig), None)
    if len(gpus) != 1:
        raise ValueError("a holder on a MIG instance holds one GPU, not %s" % gpus)
    gpu = state["gpus"][gpus[0]]
    dev = _mig.find(gpu, int(gi), None if ci is None else int(ci))
    return {"mig": [dev["gi"], dev["ci"]], "caps": _mig.caps_nodes(paths, gpu, dev)}


def install_daemon(paths, name):
    """An executable named name under ROOT/usr/sbin: a copy of this Python interpreter (which
    finds its libraries through PYTHONHOME, as every holder does), mode 0755."""
    if not name or "/" in name:
        raise ValueError("gpusim hold: a daemon needs a plain --name, got %r" % (name,))
    sbin = os.path.join(paths.root, "usr", "sbin")
    exe = os.path.join(sbin, name)
    if not os.path.isfile(exe):
        import shutil

        os.makedirs(sbin, exist_ok=True)
        tmp = "%s.tmp.%d" % (exe, os.getpid())
        shutil.copyfile(os.path.realpath(sys.executable), tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, exe)
    return exe


# ---------------------------------------------------------------- monitor

def _spawn_holder(paths, cfg):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.set_inheritable(w, True)
            hcfg = dict(cfg, ready_fd=w, monitor_pid=os.getppid())
            env = dict(os.environ)
            env.pop("GPUSIM_MONITOR", None)
            env["GPUSIM_HOLDER"] = json.dumps(hcfg)
            # argv[0] is the fake process name, so Python cannot find its prefix from it.
            env["PYTHONHOME"] = "%s:%s" % (sys.base_prefix, sys.base_exec_prefix)
            os.chdir(cfg["cwd"])
            os.execve(cfg["exe"], cfg["argv"], env)
        finally:
            os._exit(127)
    os.close(w)
    track(paths, pid, "holder")
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    try:
        return json.loads(data.decode())
    except ValueError:
        return {"error": "holder %d exited before it was ready" % pid, "pid": pid}


def _enter_cgroup(paths, spec):
    """None once the monitor (and so its holder) is in the cgroup spec, or the error."""
    if not spec:
        return None
    from gpusim.cgroups import enter

    try:
        enter(paths, spec)
    except (OSError, RuntimeError) as exc:
        return {"error": "cannot enter cgroup %s: %s" % (spec, exc)}
    return None


def monitor_main():
    cfg = json.loads(os.environ["GPUSIM_MONITOR"])
    paths = Paths(cfg["root"])
    set_comm("gpusim-monitor")
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    track(paths, os.getpid(), "monitor")
    respawn = cfg["respawn"]
    info = _enter_cgroup(paths, cfg["cgroup"]) or _spawn_holder(paths, cfg)
    out = dict(info, monitor_pid=os.getpid())
    os.write(1, (json.dumps(out) + "\n").encode())
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    if "error" in info:
        os._exit(1)
    holder = info["pid"]
    stopping = []

    def stop(_signum, _frame):
        # As a supervisor does: pass SIGTERM on, re-spawn no more, and exit only once every child
        # is reaped, so that a service manager sees its main process go last (systemd on cgroup v1
        # in a container learns that a unit's cgroup is empty only from its main process's exit).
        stopping.append(True)
        try:
            os.kill(holder, signal.SIGTERM)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    while True:
        try:
            pid, _unused = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid != holder:
            continue
        rec = read_json(paths.proc_record(pid))
        if rec is not None and rec.get("died_at") is None:
            rec["died_at"] = time.time()
            write_json(paths.proc_record(pid), rec)
        if respawn == 0 or stopping:
            continue
        if respawn > 0:
            respawn -= 1
        time.sleep(cfg["respawn_delay"])
        info = _spawn_holder(paths, cfg)
        if "error" in info:
            respawn = 0
            continue
        holder = info["pid"]
    os._exit(0)


# ---------------------------------------------------------------- holder

def _sleep_forever():
    while True:
        signal.pause()


PERSISTENCED = "nvidia-persistenced"


def _persistence_sync(paths, gpu_fds):
    """nvidia-persistenced stand-in: `nvidia-smi -pm 0|1` asks the daemon (here by SIGUSR1)
    to let go of, or take back, the device of each GPU whose persistence mode changed."""
    from gpusim.state import load_state

    for g in load_state(paths)["gpus"]:
        i = g["index"]
        if i not in gpu_fds:
            continue
        if g["persistence_mode"] == "Disabled" and gpu_fds[i] is not None:
            os.close(gpu_fds[i])
            gpu_fds[i] = None
        elif g["persistence_mode"] == "Enabled" and gpu_fds[i] is None:
            gpu_fds[i] = os.open(paths.gpu_dev(g.get("minor", i)), os.O_RDWR)


def holder_main():
    cfg = json.loads(os.environ.pop("GPUSIM_HOLDER"))
    os.environ.pop("PYTHONHOME", None)
    paths = Paths(cfg["root"])
    me = os.getpid()
    track(paths, me, "holder")
    ready_fd = cfg["ready_fd"]
    if cfg["ignore_term"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_comm(cfg["name"] or os.path.basename(cfg["argv"][0]))
    keep = []
    gpu_fds = {}
    files = [(None, paths.ctl_dev), (None, paths.uvm_dev)] + [(i, paths.gpu_dev(cfg["minors"][str(i)])) for i in cfg["open"]]
    files += [(None, caps) for caps in cfg.get("caps", ())]
    for i, p in files:
        fd = os.open(p, os.O_RDWR)
        if cfg["map"]:
            keep.append(_map_shared(fd))
            os.close(fd)
        else:
            keep.append(fd)
            if i is not None:
                gpu_fds[i] = fd
    persistenced = PERSISTENCED in (cfg["name"], os.path.basename(cfg["argv"][0])) and not cfg["map"]
    if persistenced:
        signal.signal(signal.SIGUSR1, lambda *_: _persistence_sync(paths, gpu_fds))
    kids = []
    for _unused in range(cfg["children"]):
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_fd)
                _sleep_forever()
            finally:
                os._exit(0)
        track(paths, pid, "child")
        kids.append(pid)
    from gpusim.state import proc_cmdline_argv0, proc_comm

    record = {
        "pid": me,
        "starttime": proc_starttime(me),
        "comm": proc_comm(me),
        "process_name": proc_cmdline_argv0(me),
        "gpus": cfg["gpus"],
        "gpus_open": cfg["open"],
        "mib": cfg["mib"],
        "util": cfg["util"],
        "leak": cfg["leak"],
        "map": cfg["map"],
        "persistenced": persistenced,
        "children": kids,
        "monitor_pid": cfg["monitor_pid"],
        "created": time.time(),
        "died_at": None,
    }
    if cfg.get("mig"):
        record["mig"] = cfg["mig"]
    write_json(paths.proc_record(me), record)
    os.write(ready_fd, (json.dumps({"pid": me, "children": kids}) + "\n").encode())
    os.close(ready_fd)
    _sleep_forever()
