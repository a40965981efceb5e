"""The fake nvidia-smi: formats, messages, exit codes, faults."""

import os
import sys
import re
import signal
import stat
import subprocess
import time

import pytest

from gpusim import kmsg
from gpusim import messages as M
from gpusim.state import HGX_BUS_IDS

GPUSIM_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FIELDS = ("index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,"
          "temperature.gpu,persistence_mode,compute_mode,driver_version,count")


def csv(host, *args):
    r = host.smi(*args)
    return r.returncode, r.stdout.splitlines()


def test_init_layout(gpuhost):
    root = gpuhost.root
    for n in ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % i for i in range(8)]:
        p = os.path.join(root, "dev", n)
        assert os.path.isfile(p) and os.path.getsize(p) == 4096
    assert gpuhost.dev_glob == os.path.join(root, "dev", "nvidia*")
    assert gpuhost.dev_path(3) == os.path.join(root, "dev", "nvidia3")
    assert gpuhost.smi_path == os.path.join(root, "bin", "nvidia-smi")
    assert os.access(gpuhost.smi_path, os.X_OK)
    assert gpuhost.env()["PATH"].split(os.pathsep)[0] == os.path.join(root, "bin")
    r = subprocess.run(["nvidia-smi", "-L"], env=gpuhost.env(), capture_output=True, text=True, check=False)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 8
    assert re.fullmatch(r"GPU 0: NVIDIA H200 \(UUID: GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
                        r"[0-9a-f]{4}-[0-9a-f]{12}\)", lines[0])
    state = gpuhost.state
    assert [g["pci_bus_id"] for g in state["gpus"]] == list(HGX_BUS_IDS)


def test_driver_version_file_names_the_loaded_module(gpuhost_factory):
    host = gpuhost_factory(driver_version="570.86.15")
    with open(os.path.join(host.root, "proc", "driver", "nvidia", "version")) as f:
        first = f.readline()
    assert first.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  ")


def test_counting_smi_logs_each_call_and_answers_as_nvidia_smi(gpuhost, tmp_path):
    log = str(tmp_path / "calls.log")
    wrapper = gpuhost.counting_smi(log)
    first = subprocess.run([wrapper, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                           text=True, check=False)
    subprocess.run([wrapper, "-L"], capture_output=True, check=False)
    assert first.returncode == 0 and first.stdout == gpuhost.smi("--query-gpu=index,name", "--format=csv,noheader").stdout
    assert gpuhost.smi_calls(log) == [["--query-gpu=index,name", "--format=csv,noheader"], ["-L"]]


def test_uuids_deterministic_from_seed(gpuhost_factory):
    a = gpuhost_factory("a", seed=7).state["gpus"]
    b = gpuhost_factory("b", seed=7).state["gpus"]
    c = gpuhost_factory("c", seed=8).state["gpus"]
    assert [g["uuid"] for g in a] == [g["uuid"] for g in b]
    assert [g["uuid"] for g in a] != [g["uuid"] for g in c]
    assert len({g["uuid"] for g in a}) == 8
    big = gpuhost_factory("big", gpus=16).state["gpus"]
    assert len({g["pci_bus_id"] for g in big}) == 16


def test_query_gpu_csv_formats(gpuhost):
    rc, lines = csv(gpuhost, "--query-gpu=" + FIELDS, "--format=csv")
    assert rc == 0
    assert lines[0] == ("index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], "
                        "memory.free [MiB], utilization.gpu [%], temperature.gpu, persistence_mode, "
                        "compute_mode, driver_version, count")
    row = lines[1].split(", ")
    assert row[0] == "0" and row[2] == "NVIDIA H200" and row[3] == "00000000:18:00.0"
    # Idle: 1 MiB used (real-samples Q08), free = total - reserved - used.
    assert row[4:8] == ["143771 MiB", "1 MiB", "143255 MiB", "0 %"]
    assert row[9:] == ["Enabled", "Default", "550.127.05", "8"]
    assert len(lines) == 9

    rc, lines = csv(gpuhost, "--query-gpu=index,memory.used", "--format=csv,nounits")
    assert lines[0] == "index, memory.used [MiB]" and lines[1] == "0, 1"
    rc, lines = csv(gpuhost, "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert lines[0] == "0, 1 MiB"
    rc, lines = csv(gpuhost, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "0,3")
    assert lines == ["0, 1", "3, 1"]
    rc, lines = csv(gpuhost, "--query-gpu=gpu_name,gpu_bus_id", "--format=csv", "--id=1")
    assert lines == ["name, pci.bus_id", "NVIDIA H200, 00000000:2A:00.0"]


def test_idle_reading_and_reserved_memory(gpuhost_factory):
    host = gpuhost_factory("a")
    host.hold(gpus=[1], mib=300)
    rc, lines = csv(host, "--query-gpu=memory.total,memory.reserved,memory.used,memory.free",
                    "--format=csv,noheader,nounits")
    assert lines[0] == "143771, 515, 1, 143255" and lines[1] == "143771, 515, 301, 142955"
    host = gpuhost_factory("b", idle_used_mib=0, reserved_mib=328, memory_total_mib=81559)
    rc, lines = csv(host, "--query-gpu=memory.reserved,memory.used,memory.free", "--format=csv,noheader", "-i", "0")
    assert lines == ["328 MiB, 0 MiB, 81231 MiB"]
    assert "0MiB / 81559MiB" in host.smi().stdout
    assert "Reserved                          : 328 MiB" in host.smi("-q", "-i", "0").stdout


def test_process_name_that_is_not_utf8_is_printed_as_its_bytes(gpuhost):
    info = gpuhost.hold(gpus=[0], mib=64, name="\udcffjob")
    out = subprocess.run([gpuhost.smi_path, "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                         capture_output=True, check=True).stdout
    assert out == b"%d, \xffjob\n" % info["pid"]


def test_invalid_field_and_id(gpuhost):
    r = gpuhost.smi("--query-gpu=index,xyz", "--format=csv")
    assert r.returncode == 2 and r.stdout == 'Field "xyz" is not a valid field to query.\n'
    r = gpuhost.smi("--query-compute-apps=pid,bogus", "--format=csv")
    assert r.returncode == 2 and 'Field "bogus"' in r.stdout
    r = gpuhost.smi("--query-gpu=index", "--format=csv", "-i", "9")
    assert r.returncode == 6 and r.stdout.strip() == "No devices were found"


def test_compute_apps_empty(gpuhost):
    assert gpuhost.smi("--query-compute-apps=pid,process_name,used_memory",
                       "--format=csv,noheader").stdout == ""
    assert gpuhost.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
                       "--format=csv").stdout.splitlines() == [
        "pid, process_name, used_gpu_memory [MiB], gpu_uuid, gpu_bus_id"]


def test_persistence_mode_messages(gpuhost):
    r = gpuhost.smi("-pm", "1", "-i", "0")
    assert r.stdout.splitlines() == ["Persistence mode is already Enabled for GPU 00000000:18:00.0.",
                                     "All done."]
    r = gpuhost.smi("-pm", "0", "-i", "0,1")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["Disabled persistence mode for GPU 00000000:18:00.0.",
                                     "Disabled persistence mode for GPU 00000000:2A:00.0.",
                                     "All done."]
    _unused, lines = csv(gpuhost, "--query-gpu=persistence_mode", "--format=csv,noheader", "-i", "0,2")
    assert lines == ["Disabled", "Enabled"]
    r = gpuhost.smi("-pm", "1", "-i", "1")
    assert r.stdout.splitlines()[0] == "Enabled persistence mode for GPU 00000000:2A:00.0."


def test_summary_table(gpuhost):
    gpuhost.hold(gpus=[1], mib=5000, util=12, name="python3")
    r = gpuhost.smi()
    assert r.returncode == 0
    assert "NVIDIA-SMI 550.127.05" in r.stdout and "CUDA Version: 12.4" in r.stdout
    assert "5001MiB / 143771MiB" in r.stdout
    assert re.search(r"\|\s+1\s+N/A\s+N/A\s+\d+\s+C\s+python3\s+5000MiB \|", r.stdout)
    assert gpuhost.smi("-q").returncode == 0


# ---------------------------------------------------------------- faults

def test_fault_lost_gpu_prints_only_its_error_line(gpuhost):
    # As public reports show it (smi_errors/E05-E08; E06 is the whole output of a 4-GPU host).
    gpuhost.fault("lost", gpu=3)
    rc, lines = csv(gpuhost, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert rc == M.EXIT_OTHER == 255
    assert lines == ["Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"]
    rc, lines = csv(gpuhost, "--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert lines == ["Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"]
    rc, lines = csv(gpuhost, "-L")
    assert lines == ["Unable to determine the device handle for gpu 0000:5D:00.0: Unknown Error"]
    gpuhost.fault("lost", gpu=3, message="lost")
    rc, lines = csv(gpuhost, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert rc == 15
    assert lines == ["Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost.  "
                     "Reboot the system to recover this GPU"]
    # The healthy GPUs answer to -i; the lost one answers with its error line.
    rc, lines = csv(gpuhost, "--query-gpu=index", "--format=csv,noheader", "-i", "4")
    assert rc == 0 and lines == ["4"]
    rc, lines = csv(gpuhost, "--query-gpu=index", "--format=csv,noheader", "-i", "3")
    assert rc == 15 and lines[0].startswith("Unable to determine the device handle for GPU0000:5D:00.0")
    rc, lines = csv(gpuhost, "--query-gpu=index", "--format=csv,noheader", "-i", "8")
    assert rc == 6 and lines == ["No devices were found"]
    gpuhost.fault("clear")
    assert csv(gpuhost, "--query-gpu=index", "--format=csv,noheader")[0] == 0


def test_fault_lost_gpu_in_place_variant(gpuhost):
    gpuhost.fault("lost", gpu=3, in_place=True)
    rc, lines = csv(gpuhost, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert rc == 255
    assert lines[3] == "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"
    assert lines[2] == "2, 1" and lines[4] == "4, 1" and len(lines) == 8


@pytest.mark.parametrize("driver, accepted", [("535.261.03", False), ("550.163.01", False), ("590.48.01", True)])
def test_remapped_rows_in_query_gpu_by_driver_version(gpuhost_factory, driver, accepted):
    host = gpuhost_factory(gpus=2, driver_version=driver)
    host.fault("remap", gpu=1, pending=True)
    r = host.smi("--query-gpu=index,remapped_rows.pending", "--format=csv,noheader")
    if accepted:
        assert (r.returncode, r.stdout.splitlines()) == (0, ["0, No", "1, Yes"])
    else:
        assert r.returncode == 2
        assert r.stdout == 'Field "remapped_rows.pending" is not a valid field to query.\n'
    r = host.smi("--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure",
                 "--format=csv,noheader")
    assert (r.returncode, r.stdout.splitlines()) == (0, ["00000000:18:00.0, 0, 0", "00000000:2A:00.0, 1, 0"])


def test_kernel_log_mig_xid_and_fallen_off_the_bus(gpuhost):
    gpuhost.fault("xid", gpu=0, code=94, gpu_instance=5)
    gpuhost.fault("fallen", gpu=1)
    gpuhost.fault("fallen", gpu=2, form="line")
    records = kmsg.records(gpuhost.kernel_log)
    assert [(facility, seq) for facility, level, seq, dummy, dummy in records] == [(0, n) for n in range(5)]
    assert [message for dummy, dummy, dummy, dummy, message in records] == [
        "NVRM: Xid (PCI:0000:18:00 GPU-I:05): 94, pid=4242, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
        "NVRM: The NVIDIA GPU 0000:2a:00.0",
        "NVRM: (PCI ID: 10de:2335) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: GPU 0000:3a:00.0: GPU has fallen off the bus.",
    ]


@pytest.mark.parametrize("value", M.NA_VALUES)
def test_fault_na(gpuhost, value):
    gpuhost.fault("na", field="memory.used", gpu=2, value=value)
    _unused, lines = csv(gpuhost, "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits")
    assert lines[2] == "2, %s, 143771" % value
    assert lines[1] == "1, 1, 143771"
    gpuhost.fault("na", field="utilization.gpu")   # every GPU, default [N/A]
    _unused, lines = csv(gpuhost, "--query-gpu=utilization.gpu", "--format=csv,noheader")
    assert set(lines) == {"[N/A]"}


def test_fault_driver_not_loaded_no_devices_mismatch(gpuhost):
    gpuhost.fault("driver-not-loaded", "on")
    r = gpuhost.smi("--query-gpu=index", "--format=csv")
    assert r.returncode == 9
    assert r.stdout == ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                        "driver. Make sure that the latest NVIDIA driver is installed and running.\n")
    gpuhost.fault("driver-not-loaded", "off")
    gpuhost.fault("no-devices", "on")
    r = gpuhost.smi("-L")
    assert (r.returncode, r.stdout) == (6, "No devices were found\n")
    gpuhost.fault("no-devices", False)
    gpuhost.fault("mismatch", "on")
    r = gpuhost.smi()
    assert r.returncode == 18
    assert r.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                     "NVML library version: 550.127"]
    gpuhost.fault("clear")
    assert gpuhost.smi("-L").returncode == 0


def ignores(pid, *signals):
    """Whether process pid ignores every one of signals (SigIgn in its /proc status)."""
    try:
        with open("/proc/%d/status" % pid) as handle:
            mask = int(next(line for line in handle if line.startswith("SigIgn:")).split()[1], 16)
    except (OSError, StopIteration):
        return False
    return all(mask & (1 << (number - 1)) for number in signals)


def test_fault_hang_ignores_term(gpuhost):
    gpuhost.fault("hang", seconds=0.8)
    t0 = time.monotonic()
    p = subprocess.Popen([gpuhost.smi_path, "--query-gpu=index", "--format=csv,noheader"],
                         stdout=subprocess.PIPE, text=True)
    # Signalled once it hangs, however long its start takes on a busy machine (before, TERM ends it).
    until = time.monotonic() + 30
    while not ignores(p.pid, signal.SIGTERM, signal.SIGINT) and time.monotonic() < until:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    p.send_signal(signal.SIGINT)
    out, _unused = p.communicate(timeout=10)
    assert p.returncode == 0 and out.splitlines()[0] == "0"
    assert time.monotonic() - t0 >= 0.75
    p = subprocess.Popen([gpuhost.smi_path, "-L"], stdout=subprocess.DEVNULL)
    time.sleep(0.2)
    p.kill()
    assert p.wait(timeout=5) == -signal.SIGKILL
    # Cleared, a hang far longer than any load could explain is gone.
    gpuhost.fault("hang", seconds=60)
    gpuhost.fault("hang", seconds=0)
    t0 = time.monotonic()
    assert gpuhost.smi("-L").returncode == 0
    assert time.monotonic() - t0 < 30


def test_na_on_compute_apps_field(gpuhost):
    h = gpuhost.hold(gpus=[0], mib=50)
    gpuhost.fault("na", field="used_memory")
    r = gpuhost.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert r.stdout.splitlines() == ["%d, [N/A]" % h["pid"]]


def test_root_slash_uses_real_paths():
    from gpusim.state import Paths

    p = Paths("/")
    assert (p.smi, p.gpu_dev(0), p.ctl_dev, p.state) == (
        "/usr/bin/nvidia-smi", "/dev/nvidia0", "/dev/nvidiactl", "/var/lib/gpusim/state.json")


def test_cli_smi_and_missing_host(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    r = subprocess.run([sys.executable, "-m", "gpusim", "smi", "--root", str(tmp_path), "--", "-L"],
                       capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 9                        # nothing initialised: no driver


def test_minors_and_a_gpu_that_fell_off_the_bus(gpuhost_factory):
    host = gpuhost_factory(gpus=4, fallen=[1], minors=[2, 0, 1])
    root = host.root
    out = host.smi("--query-gpu=index,pci.bus_id,minor_number", "--format=csv,noheader").stdout.splitlines()
    assert out == ["0, 00000000:18:00.0, 2", "1, 00000000:3A:00.0, 0", "2, 00000000:5D:00.0, 1"]
    assert sorted(n for n in os.listdir(os.path.join(root, "dev")) if n[6:].isdigit()) == ["nvidia0", "nvidia1", "nvidia2"]
    assert host.dev_path(0) == os.path.join(root, "dev", "nvidia2")
    pci = os.path.join(root, "sys", "bus", "pci", "devices")
    gpus = [n for n in sorted(os.listdir(pci)) if open(os.path.join(pci, n, "class")).read() == "0x030200\n"]
    assert gpus == ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
    assert open(os.path.join(pci, "0000:2a:00.0", "vendor")).read() == "0x10de\n"
    driver = os.path.join(root, "proc", "driver", "nvidia", "gpus")
    assert sorted(os.listdir(driver)) == ["0000:18:00.0", "0000:3a:00.0", "0000:5d:00.0"]
    info = open(os.path.join(driver, "0000:3a:00.0", "information")).read()
    assert "Bus Location: \t 0000:3a:00.0\nDevice Minor: \t 0\n" in info
    log = open(host.kernel_log).read()
    assert ";NVRM: The NVIDIA GPU 0000:2a:00.0\n" in log and "probe of 0000:2a:00.0 failed with error -1\n" in log
    assert " SUBSYSTEM=pci\n DEVICE=+pci:0000:2a:00.0\n" in log and "Xid" not in log
    assert set(facility for facility, dummy, dummy, dummy, dummy in kmsg.records(host.kernel_log)) == {0}
    rec = host.hold(gpus=[0], mib=64)
    assert host.dev_path(0) in {os.readlink("/proc/%d/fd/%s" % (rec["pid"], fd)) for fd in os.listdir("/proc/%d/fd" % rec["pid"])}
    with pytest.raises(ValueError, match="minors"):
        host.init(gpus=2, minors=[0, 0])


def test_fault_reset_required_prints_the_drivers_words_until_a_reset(gpuhost):
    gpuhost.fault("reset-required", gpu=2)
    out = gpuhost.smi("-i", "2", "--query-gpu=index,temperature.gpu,utilization.gpu,memory.used",
                      "--format=csv,noheader")
    # As the real H100 row (real-samples smi_query_gpu/Q11): index and memory still read.
    assert out.returncode == 0 and out.stdout == "2, [GPU requires reset], [GPU requires reset], 1 MiB\n"
    gpuhost.smi("-pm", "0", "-i", "2")
    assert gpuhost.smi("-r", "-i", "2").returncode == 0
    out = gpuhost.smi("-i", "2", "--query-gpu=temperature.gpu", "--format=csv,noheader")
    assert "requires reset" not in out.stdout


def test_recovery_action_on_drivers_from_565(gpuhost_factory):
    old = gpuhost_factory(name="old", gpus=2)
    out = old.smi("--query-gpu=index,gpu_recovery_action", "--format=csv,noheader")
    assert out.returncode == 2 and out.stdout.startswith('Field "gpu_recovery_action" is not a valid field')
    new = gpuhost_factory(name="new", gpus=3, driver_version="570.172.08")
    new.fault("recovery", gpu=1, value="reboot")
    new.fault("reset-required", gpu=2)
    out = new.smi("--query-gpu=index,gpu_recovery_action", "--format=csv,noheader")
    assert out.stdout == "0, None\n1, Node Reboot\n2, Reset\n"
    assert "    GPU Recovery Action                   : Node Reboot" in new.smi("-q", "-i", "1").stdout


def test_an_xid_storm_on_request(gpuhost):
    gpuhost.fault("xid", gpu=0, code=95, count=2000)
    records = kmsg.records(gpuhost.kernel_log)
    assert len(records) == 2000 and all(message.startswith("NVRM: Xid (PCI:0000:18:00): 95, ") for *dummy, message in records)
    # A second apart, ending now, none before this boot.
    times = [time_us for dummy, dummy, dummy, time_us, dummy in records]
    assert times == sorted(times) and times[-1] - times[-2] == 1000000 and times[0] >= 0
    assert abs(kmsg.boot_time() + times[-1] / 1e6 - time.time()) < 60


def test_the_kernel_log_is_a_ring_of_kmsg_records_with_the_kernels_facility(gpuhost):
    gpuhost.fault("xid", gpu=1, code=79, when=time.time() - 5)
    gpuhost.fault("driver-hung")
    assert os.path.realpath(gpuhost.kernel_log) == os.path.join(gpuhost.root, "dev", "kmsg")
    assert stat.S_IMODE(os.stat(gpuhost.kernel_log).st_mode) == 0o644
    # Root's `echo > /dev/kmsg`: the user facility, whatever facility its prefix names, unless another.
    gpuhost.write_kmsg("<3>NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    gpuhost.write_kmsg("plain\\text\twith a tab")
    gpuhost.write_kmsg("<30>daemon line")
    records = kmsg.records(gpuhost.kernel_log)
    assert [(facility, level, seq) for facility, level, seq, dummy, dummy in records] == [
        (0, 3, 0), (0, 3, 1), (0, 3, 2), (0, 3, 3), (0, 3, 4), (1, 3, 5), (1, 4, 6), (3, 6, 7)]
    assert records[6][4] == "plain\\x5ctext\\x09with a tab"
    with open(gpuhost.kernel_log) as handle:
        assert handle.read().splitlines()[5] == "11,5,%d,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus." % records[5][3]
    # A fresh boot: an empty ring, a file of its own.
    inode = os.stat(gpuhost.kernel_log).st_ino
    gpuhost.init()
    assert kmsg.records(gpuhost.kernel_log) == [] and os.stat(gpuhost.kernel_log).st_ino != inode


def test_the_cli_writes_a_kmsg_line_as_root_would(gpuhost):
    r = subprocess.run([sys.executable, "-m", "gpusim", "kmsg", "--root", gpuhost.root, "<3>NVRM: Xid (PCI:0000:18:00): 13, x"],
                       capture_output=True, text=True, check=False, env=dict(os.environ, PYTHONPATH=GPUSIM_PARENT))
    assert r.returncode == 0, r.stderr
    assert [(facility, level, message) for facility, level, dummy, dummy, message in kmsg.records(gpuhost.kernel_log)] == [
        (1, 3, "NVRM: Xid (PCI:0000:18:00): 13, x")]
