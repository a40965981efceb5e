"""Holder processes: real processes, real files, and what nvidia-smi makes of them."""

import json
import os
import signal
import subprocess
import sys
import time

from gpusim.state import DEFAULTS, is_alive, proc_stat, proc_starttime

IDLE_MIB = DEFAULTS["idle_used_mib"]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def poll(pred, timeout=10.0, interval=0.02):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("condition not met within %ss" % timeout)
        time.sleep(interval)


def used(host, *ids):
    """MiB allocated per GPU: nvidia-smi's memory.used less the idle reading (1 MiB by default)."""
    args = ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    if ids:
        args += ["-i", ",".join(str(i) for i in ids)]
    r = host.smi(*args)
    return {int(a): int(b) - IDLE_MIB for a, b in (line.split(", ") for line in r.stdout.splitlines())}


def utilization(host):
    r = host.smi("--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")
    return [int(x) for x in r.stdout.split()]


def fd_targets(pid):
    d = "/proc/%d/fd" % pid
    out = set()
    for fd in os.listdir(d):
        try:
            out.add(os.readlink(os.path.join(d, fd)))
        except OSError:
            pass
    return out


def fuser(host):
    # fuser prints the pids on stdout and the rest on stderr: merge them, as a terminal does.
    r = subprocess.run("fuser -v %s 2>&1" % host.dev_glob, shell=True, capture_output=True, text=True, check=False)
    return "\n".join(line for line in r.stdout.splitlines() if "Cannot stat" not in line)


def test_hold_then_kill_releases(gpuhost):
    h = gpuhost.hold(gpus=[0, 1], mib=1000, util=40)
    assert is_alive(h["pid"]) and is_alive(h["monitor_pid"])
    assert used(gpuhost) == {0: 1000, 1: 1000, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0}
    assert utilization(gpuhost)[:3] == [40, 40, 0]
    devs = fd_targets(h["pid"])
    for p in (gpuhost.dev_path(0), gpuhost.dev_path(1), os.path.join(gpuhost.root, "dev", "nvidiactl"),
              os.path.join(gpuhost.root, "dev", "nvidia-uvm")):
        assert p in devs
    assert gpuhost.dev_path(2) not in devs
    assert not any(t.startswith(os.path.join(gpuhost.root, "dev")) for t in fd_targets(h["monitor_pid"]))
    r = gpuhost.smi("--query-compute-apps=pid,used_memory,gpu_bus_id", "--format=csv,noheader,nounits")
    assert r.stdout.splitlines() == ["%d, 1000, 00000000:18:00.0" % h["pid"],
                                     "%d, 1000, 00000000:2A:00.0" % h["pid"]]
    os.kill(h["pid"], signal.SIGTERM)
    poll(lambda: used(gpuhost, 0, 1) == {0: 0, 1: 0})
    assert utilization(gpuhost)[:2] == [0, 0]
    rec = [r for r in gpuhost.ps() if r["pid"] == h["pid"]][0]
    assert rec["alive"] is False and rec["died_at"] is not None
    poll(lambda: not is_alive(h["monitor_pid"]))   # nothing to re-spawn: the monitor exits


def test_release_delay(gpuhost_factory):
    host = gpuhost_factory(release_delay=0.6)
    h = host.hold(gpus=[2], mib=700)
    os.kill(h["pid"], signal.SIGKILL)
    poll(lambda: not is_alive(h["pid"]))
    t0 = time.monotonic()
    assert used(host, 2) == {2: 700}
    r = host.smi("--query-compute-apps=pid", "--format=csv,noheader")
    assert r.stdout == ""              # no process, memory still there
    poll(lambda: used(host, 2) == {2: 0}, timeout=5)
    assert time.monotonic() - t0 > 0.3


def test_zombie_counts_as_dead(gpuhost):
    h = gpuhost.hold(gpus=[0], mib=300)
    os.kill(h["monitor_pid"], signal.SIGSTOP)   # the monitor cannot reap: the holder stays a zombie
    try:
        # Stopped, not only sent the signal: a monitor not yet scheduled would find the zombie in
        # its waitpid and reap it before it stops.
        poll(lambda: proc_stat(h["monitor_pid"])[0] == "T")
        os.kill(h["pid"], signal.SIGKILL)
        poll(lambda: proc_stat(h["pid"])[0] == "Z")
        assert used(gpuhost, 0) == {0: 0}
        rec = [r for r in gpuhost.ps() if r["pid"] == h["pid"]][0]
        assert rec["died_at"] is not None          # set by nvidia-smi, which saw it first
    finally:
        os.kill(h["monitor_pid"], signal.SIGCONT)


def test_ignore_term(gpuhost):
    h = gpuhost.hold(gpus=[0], mib=10, ignore_term=True, children=1)
    os.kill(h["pid"], signal.SIGTERM)
    os.kill(h["children"][0], signal.SIGTERM)
    time.sleep(0.3)
    assert is_alive(h["pid"]) and is_alive(h["children"][0])
    assert used(gpuhost, 0) == {0: 10}
    os.kill(h["pid"], signal.SIGKILL)
    os.kill(h["children"][0], signal.SIGKILL)
    poll(lambda: not is_alive(h["pid"]) and not is_alive(h["children"][0]))
    poll(lambda: used(gpuhost, 0) == {0: 0})


def test_children_hold_files(gpuhost):
    h = gpuhost.hold(gpus=[4], mib=2000, children=3)
    assert len(h["children"]) == 3
    for c in h["children"]:
        assert gpuhost.dev_path(4) in fd_targets(c)
        assert proc_stat(c)[1] == h["monitor_pid"]        # same session as the monitor
    out = fuser(gpuhost)
    for pid in [h["pid"]] + h["children"]:
        assert " %d " % pid in out
    r = gpuhost.smi("--query-compute-apps=pid", "--format=csv,noheader")
    assert r.stdout.split() == [str(h["pid"])]              # children allocate nothing
    # Parent killed with SIGKILL: the workers live on, holding the files (memory is freed).
    os.kill(h["pid"], signal.SIGKILL)
    poll(lambda: used(gpuhost, 4) == {4: 0})
    assert all(is_alive(c) for c in h["children"])
    for c in h["children"]:
        os.kill(c, signal.SIGTERM)
    poll(lambda: not any(is_alive(c) for c in h["children"]))


def test_respawn(gpuhost):
    h = gpuhost.hold(gpus=[5], mib=900, respawn=1, respawn_delay=0.1)
    os.kill(h["pid"], signal.SIGKILL)

    def new_holder():
        live = [r for r in gpuhost.ps() if r["alive"]]
        return live and live[0]["pid"] != h["pid"] and live[0]

    rec = poll(new_holder)
    assert rec["monitor_pid"] == h["monitor_pid"]
    assert gpuhost.dev_path(5) in fd_targets(rec["pid"])
    assert used(gpuhost, 5) == {5: 900}
    old = [r for r in gpuhost.ps() if r["pid"] == h["pid"]][0]
    assert old["died_at"] is not None
    os.kill(rec["pid"], signal.SIGKILL)              # respawn budget spent: stays dead
    poll(lambda: not is_alive(h["monitor_pid"]))
    assert not [r for r in gpuhost.ps() if r["alive"]]
    assert used(gpuhost, 5) == {5: 0}


def test_name_shows_in_comm_cmdline_and_fuser(gpuhost):
    h = gpuhost.hold(gpus="all", mib=0, name="nvidia-persistenced")
    with open("/proc/%d/comm" % h["pid"]) as f:
        assert f.read().strip() == "nvidia-persiste"
    with open("/proc/%d/cmdline" % h["pid"], "rb") as f:
        assert f.read().split(b"\0")[0] == b"nvidia-persistenced"
    assert "nvidia-persiste" in fuser(gpuhost)
    r = gpuhost.smi("--query-compute-apps=pid", "--format=csv,noheader")
    assert r.stdout == ""                          # holds files, not a compute app
    r = subprocess.run(["ps", "-o", "comm=", "-p", str(h["pid"])], capture_output=True, text=True, check=False)
    assert r.stdout.strip() == "nvidia-persiste"


def test_comma_in_process_name(gpuhost):
    h = gpuhost.hold(gpus=[0], mib=64, name="a,b")
    r = gpuhost.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
                    "--format=csv,noheader")
    line = r.stdout.splitlines()[0]
    assert line.startswith("%d, a,b, 64 MiB, GPU-" % h["pid"])
    assert len(line.split(",")) == 6               # naive CSV splitting breaks


def test_map_only_in_maps(gpuhost):
    h = gpuhost.hold(gpus=[6], mib=100, map=True)
    assert not any(t.startswith(os.path.join(gpuhost.root, "dev")) for t in fd_targets(h["pid"]))
    with open("/proc/%d/maps" % h["pid"]) as f:
        maps = f.read()
    assert gpuhost.dev_path(6) in maps and os.path.join(gpuhost.root, "dev", "nvidiactl") in maps
    assert " %d " % h["pid"] in fuser(gpuhost)
    r = gpuhost.smi("-r", "-i", "6")
    assert r.returncode == 255


def test_leak_stays_until_reset(gpuhost):
    h = gpuhost.hold(gpus=[1], mib=5000, leak=True)
    os.kill(h["pid"], signal.SIGKILL)
    poll(lambda: not is_alive(h["pid"]))
    time.sleep(0.1)
    assert used(gpuhost, 1) == {1: 5000}
    assert gpuhost.smi("--query-compute-apps=pid", "--format=csv,noheader").stdout == ""
    # Persistence mode counts as a client of the device: reset refused until it is off.
    r = gpuhost.smi("--gpu-reset", "-i", "1")
    assert r.returncode == 255 and "GPU 00000000:2A:00.0: In use by another client" in r.stdout
    assert gpuhost.smi("-pm", "0", "-i", "1").returncode == 0
    r = gpuhost.smi("--gpu-reset", "-i", "1")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["GPU 00000000:2A:00.0 was successfully reset.", "All done."]
    assert used(gpuhost, 1) == {1: 0}


def test_stuck_memory_and_reset(gpuhost_factory):
    host = gpuhost_factory(persistence_mode="off")
    host.fault("stuck", gpu=2, mib=1234)
    assert used(host, 2) == {2: 1234}
    assert host.smi("-r").returncode == 2          # -r needs -i
    r = host.smi("-r", "-i", "2")
    assert r.returncode == 0 and used(host, 2) == {2: 0}


def test_reset_refused_while_held(gpuhost_factory):
    host = gpuhost_factory(persistence_mode="off")
    h = host.hold(gpus=[3], mib=0)                 # files only, no allocation
    r = host.smi("-r", "-i", "3")
    assert r.returncode == 255
    assert r.stdout.splitlines()[:3] == ["The following GPUs could not be reset:",
                                         "  GPU 00000000:5D:00.0: In use by another client", ""]
    assert r.stdout.splitlines()[3].startswith("1 device is currently being used by one or more "
                                               "other processes (e.g., Fabric Manager, CUDA application")
    assert host.smi("-r", "-i", "4").returncode == 0
    os.kill(h["pid"], signal.SIGKILL)
    poll(lambda: host.smi("-r", "-i", "3").returncode == 0)


def test_stop_leaves_nothing(gpuhost):
    h1 = gpuhost.hold(gpus=[0], mib=10, children=2, ignore_term=True, respawn=-1, respawn_delay=0)
    h2 = gpuhost.hold(gpus=[1], mib=10, map=True)
    pids = [h1["pid"], h1["monitor_pid"], h2["pid"], h2["monitor_pid"]] + h1["children"]
    starts = {p: proc_starttime(p) for p in pids}
    os.kill(h1["pid"], signal.SIGKILL)             # the monitor is re-spawning as we stop
    gpuhost.stop()
    for p in pids:
        assert not is_alive(p, starts[p])
    sessions = {h1["monitor_pid"], h2["monitor_pid"]}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            assert not (st and st[1] in sessions and st[0] != "Z"), name
    assert not [r for r in gpuhost.ps() if r["alive"]]
    assert "F...." not in fuser(gpuhost)
    gpuhost.stop()                                  # idempotent


def test_cli_hold_returns_under_capture_output(gpuhost):
    env = dict(os.environ, PYTHONPATH=TESTS_DIR)
    r = subprocess.run([sys.executable, "-m", "gpusim", "hold", "--root", gpuhost.root,
                        "--gpus", "0,2", "--mib", "123", "--children", "1"],
                       capture_output=True, text=True, timeout=20, env=env, check=False)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert set(info) >= {"pid", "monitor_pid", "children"} and len(info["children"]) == 1
    assert used(gpuhost, 0, 2) == {0: 123, 2: 123}
    r = subprocess.run([sys.executable, "-m", "gpusim", "ps", "--root", gpuhost.root],
                       capture_output=True, text=True, timeout=20, env=env, check=False)
    assert [x["pid"] for x in json.loads(r.stdout) if x["alive"]] == [info["pid"]]
    r = subprocess.run([sys.executable, "-m", "gpusim", "stop", "--root", gpuhost.root],
                       capture_output=True, text=True, timeout=30, env=env, check=False)
    assert r.returncode == 0
    assert not is_alive(info["pid"]) and not is_alive(info["monitor_pid"])


def test_scenario_hung_job(gpuhost):
    s = gpuhost.scenario("hung-job")
    assert len(s["ranks"]) == 8
    pers = s["persistenced"]["pid"]
    with open("/proc/%d/comm" % pers) as f:
        assert f.read().strip() == "nvidia-persiste"
    assert used(gpuhost) == {i: 76113 for i in range(8)}
    assert utilization(gpuhost) == [0] * 8
    all_devs = {gpuhost.dev_path(i) for i in range(8)}
    for rank in s["ranks"]:
        pid = rank["pid"]
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            assert f.read().split(b"\0")[:4] == [b"python3", b"train.py", b"--local-rank",
                                                 str(rank["rank"]).encode()]
        with open("/proc/%d/comm" % pid) as f:
            assert f.read().strip() == "python3"
        assert all_devs <= fd_targets(pid)
    assert all_devs <= fd_targets(pers)
    r = gpuhost.smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    lines = r.stdout.splitlines()
    assert len(lines) == 8 and all(", python3, 76113 MiB" in line for line in lines)
    for rank in s["ranks"]:                        # deadlocked ranks still die on SIGTERM
        os.kill(rank["pid"], signal.SIGTERM)
    poll(lambda: used(gpuhost) == {i: 0 for i in range(8)})
    assert is_alive(pers)


def test_persistenced_lets_go_on_pm_off(gpuhost):
    """With nvidia-persistenced running, -pm 0 makes the daemon close that GPU's device,
    after which --gpu-reset can succeed; -pm 1 makes it take the device back."""
    s = gpuhost.scenario("hung-job")
    pers = s["persistenced"]["pid"]
    rank3 = s["ranks"][3]["pid"]
    os.kill(rank3, signal.SIGKILL)
    poll(lambda: used(gpuhost, 3) == {3: 0})
    # Other ranks still have /dev/nvidia3 open (CUDA opens every device).
    assert gpuhost.smi("-pm", "0", "-i", "3").returncode == 0
    assert gpuhost.dev_path(3) not in fd_targets(pers)
    assert gpuhost.dev_path(2) in fd_targets(pers)
    assert gpuhost.smi("-r", "-i", "3").returncode == 255
    for rank in s["ranks"]:
        if rank["pid"] != rank3:
            os.kill(rank["pid"], signal.SIGKILL)
    poll(lambda: gpuhost.smi("-r", "-i", "3").returncode == 0)
    assert gpuhost.smi("-pm", "1", "-i", "3").returncode == 0
    assert gpuhost.dev_path(3) in fd_targets(pers)
