"""gpusim's dcgmi against a host engine (a holder named nv-hostengine), and a slow nvidia-smi -r."""

import os
import subprocess
import time

import pytest


def dcgmi(host, timeout=10):
    return subprocess.run([os.path.join(host.root, "bin", "dcgmi"), "discovery", "-l"], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_without_a_host_engine_dcgmi_cannot_connect(gpuhost):
    r = dcgmi(gpuhost)
    assert r.returncode != 0
    assert r.stdout.splitlines() == ["Error: unable to establish a connection to the specified host: localhost",
                                     "Error: Unable to connect to host engine. Host engine connection "
                                     "invalid/disconnected."]


def test_a_live_host_engine_lists_the_gpus(gpuhost_factory):
    host = gpuhost_factory(gpus=2)
    host.hold(gpus="all", mib=0, name="nv-hostengine")
    r = dcgmi(host)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "2 GPUs found." and lines[2].startswith("| GPU ID | Device Information")
    assert len(set(len(line) for line in lines[1:])) == 1  # a table of equal rows
    assert "| 1      | Name: NVIDIA H200" in r.stdout and "PCI Bus ID: 00000000:" in r.stdout


def test_a_host_engine_started_after_the_fault_never_answers_and_the_next_one_does(gpuhost):
    before = gpuhost.hold(gpus="all", mib=0, name="nv-hostengine")
    gpuhost.fault("host-engine-hang", value=1)
    assert dcgmi(gpuhost).returncode == 0  # started before the fault: it answers
    os.kill(before["pid"], 9)
    gpuhost.hold(gpus="all", mib=0, name="nv-hostengine")
    with pytest.raises(subprocess.TimeoutExpired):
        dcgmi(gpuhost, timeout=3)
    gpuhost.stop()
    gpuhost.hold(gpus="all", mib=0, name="nv-hostengine")  # a restart
    assert dcgmi(gpuhost).returncode == 0


def test_reset_slow_delays_the_reset_and_then_resets(gpuhost_factory):
    gpuhost = gpuhost_factory(persistence_mode="off")
    gpuhost.fault("stuck", gpu=1, mib=1024)
    gpuhost.fault("reset-slow", seconds=2)
    started = time.monotonic()
    r = gpuhost.smi("-r", "-i", "1")
    assert r.returncode == 0 and time.monotonic() - started >= 2
    assert gpuhost.memory_used()[1] == 1
