"""MIG on the simulated host: instances, caps nodes and the driver's capabilities tree, jobs on an
instance, and nvidia-smi's MIG output in the real formats (samples/mig)."""

import os
import re

import pytest

from gpusim import mig as _mig

# The shapes of samples/mig/list_gpus_L.txt and capabilities_access.txt.
MIG_LINE_RE = re.compile(r"  MIG \d+g\.\d+gb {4,5}Device {1,2}\d: \(UUID: MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
                         r"[0-9a-f]{4}-[0-9a-f]{12}\)")
ACCESS_RE = re.compile(r"DeviceFileMinor: (\d+)\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def read(path):
    with open(path) as f:
        return f.read()


def test_mig_is_off_by_default_and_leaves_no_caps(gpuhost):
    r = gpuhost.smi("--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert r.stdout.splitlines() == ["%d, Disabled, Disabled" % i for i in range(8)]
    assert not os.path.exists(os.path.join(gpuhost.root, "dev", "nvidia-caps"))
    assert "MIG devices:" not in gpuhost.smi().stdout


def test_instances_list_as_real_drivers_list_them(gpuhost):
    gpuhost.mig(2, ["1g.18gb"] * 3 + ["3g.71gb"])
    lines = gpuhost.smi("-L").stdout.splitlines()
    assert lines[2].startswith("GPU 2: ") and lines[7].startswith("GPU 3: ")
    assert all(MIG_LINE_RE.fullmatch(line) for line in lines[3:7]), lines[3:7]
    assert [line.split()[1] for line in lines[3:7]] == ["3g.71gb", "1g.18gb", "1g.18gb", "1g.18gb"]
    assert [(d["gi"], d["ci"]) for d in gpuhost.state["gpus"][2]["mig"]["instances"]] == [(1, 0), (7, 0), (8, 0), (9, 0)]
    r = gpuhost.smi("--query-gpu=index,mig.mode.current,utilization.gpu", "--format=csv,noheader,nounits")
    assert r.stdout.splitlines()[2] == "2, Enabled, [N/A]" and r.stdout.splitlines()[1] == "1, Disabled, 0"


def test_caps_nodes_and_access_files_follow_the_minor_number(gpuhost_factory):
    host = gpuhost_factory(gpus=2, minors=[1, 0])
    host.mig(0, ["2g.35gb"], cis_per_gi=2)
    caps = os.path.join(host.root, "proc", "driver", "nvidia", "capabilities")
    gi = os.path.join(caps, "gpu1", "mig", "gi3")
    minors = [int(ACCESS_RE.fullmatch(read(os.path.join(gi, name))).group(1)) for name in ("access", "ci0/access", "ci1/access")]
    assert minors == [_mig.gi_minor(1, 3), _mig.gi_minor(1, 3) + 1, _mig.gi_minor(1, 3) + 2]
    assert ACCESS_RE.fullmatch(read(os.path.join(caps, "mig", "monitor"))).group(1) == "2"
    nodes = sorted(os.listdir(os.path.join(host.root, "dev", "nvidia-caps")))
    assert nodes == sorted("nvidia-cap%d" % m for m in [1, 2] + minors)
    host.mig(0, mode="disabled")
    assert not os.path.exists(os.path.join(caps, "gpu1")) and len(os.listdir(os.path.join(host.root, "dev", "nvidia-caps"))) == 2


def test_a_job_on_an_instance_holds_its_caps_and_its_memory(gpuhost):
    gpuhost.mig(1, ["1g.18gb", "1g.18gb"])
    job = gpuhost.hold(gpus="1", mib=2048, mig=(8, 0), name="tenant")
    dev = _mig.find(gpuhost.state["gpus"][1], 8, 0)
    fds = os.path.join("/proc", str(job["pid"]), "fd")
    held = set(os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds))
    assert set(_mig.caps_nodes(gpuhost.paths, gpuhost.state["gpus"][1], dev)) <= held
    assert gpuhost.dev_path(1) in held
    out = gpuhost.smi().stdout
    assert re.search(r"\|  1    8   0   1  \| +2048MiB / 16384MiB \|", out)
    assert re.search(r"\|  1    7   0   0  \| +0MiB / 16384MiB \|", out)
    assert re.search(r"\| +1 +8 +0 +%d +C +tenant +2048MiB \|" % job["pid"], out)
    used = gpuhost.smi("--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "1").stdout.strip()
    assert used == "2049"


def test_pending_mode_waits_for_a_reset(gpuhost):
    gpuhost.mig(4, mode="disabled", pending="enabled")
    r = gpuhost.smi("--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader", "-i", "4")
    assert r.stdout.strip() == "Disabled, Enabled"


def test_mig_makes_instances_as_the_guide_prints_and_refuses_in_nvidias_words(gpuhost):
    gpuhost.mig(2, [])
    made = gpuhost.smi("mig", "-i", "2", "-cgi", "3g.71gb,19", "-C")
    assert made.returncode == 0, made.stdout
    assert made.stdout.splitlines() == [
        "Successfully created GPU instance ID  1 on GPU  2 using profile MIG 3g.71gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  2 GPU instance ID  1 using profile MIG 3g.71gb (ID  2)",
        "Successfully created GPU instance ID  7 on GPU  2 using profile MIG 1g.18gb (ID 19)",
        "Successfully created compute instance ID  0 on GPU  2 GPU instance ID  7 using profile MIG 1g.18gb (ID  0)"]
    full = gpuhost.smi("mig", "-i", "2", "-cgi", "4g.71gb")
    assert full.returncode == 255
    assert full.stdout.strip() == "Unable to create a GPU instance on GPU  2 using profile 4g.71gb: Insufficient Resources"
    assert gpuhost.smi("mig", "-i", "2", "-cci").returncode == 2  # -cci needs -gi
    assert gpuhost.smi("mig", "-i", "3", "-cgi", "19").stdout.strip().endswith(": Not Supported")  # MIG off
    with pytest.raises(ValueError, match="mig-create takes a GPU and the words of the refusal"):
        gpuhost.fault("mig-create", gpu=2, value="")
    gpuhost.fault("mig-create", gpu=2, value="Insufficient Resources")
    assert gpuhost.smi("mig", "-i", "2", "-cgi", "19").stdout.strip().endswith("profile 19: Insufficient Resources")
    gpuhost.fault("mig-create", gpu=2, value="off")
    gpuhost.mig(2, [])
    assert gpuhost.smi("mig", "-i", "2", "-cgi", "19", "-C").returncode == 0
