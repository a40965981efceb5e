"""gpusim's kernel modules: ROOT/sys/module, and its rmmod and modprobe refusing as the kernel does."""

import os
import subprocess

from gpusim import messages as M


def run(host, *argv):
    proc = subprocess.run(list(argv), env=host.env(), capture_output=True, text=True, timeout=30, check=False)
    return proc.returncode, proc.stderr.strip()


def modules(host):
    return sorted(os.listdir(os.path.join(host.root, "sys", "module")))


def test_rmmod_refuses_a_module_others_hold_or_that_is_in_use(gpuhost):
    assert run(gpuhost, "rmmod", "nvidia") == (1, "rmmod: ERROR: Module nvidia is in use by: nvidia_modeset nvidia_uvm")
    gpuhost.load_module("nvidia_drm", holds="nvidia_modeset", refcnt=1)
    assert run(gpuhost, "rmmod", "nvidia_drm") == (1, "rmmod: ERROR: Module nvidia_drm is in use")
    gpuhost.fault("module-in-use", value="nvidia_uvm")
    assert run(gpuhost, "rmmod", "nvidia_uvm") == (1, "rmmod: ERROR: Module nvidia_uvm is in use")
    gpuhost.fault("module-in-use", value="off")
    assert run(gpuhost, "rmmod", "nvidia_uvm") == (0, "")
    assert run(gpuhost, "rmmod", "nvidia_uvm") == (1, "rmmod: ERROR: Module nvidia_uvm is not currently loaded")


def test_nvidia_is_in_use_while_a_node_is_held_or_a_gpu_is_persistent(gpuhost, spawn):
    for name in ("nvidia_uvm", "nvidia_modeset"):
        assert run(gpuhost, "rmmod", name) == (0, "")
    assert run(gpuhost, "rmmod", "nvidia") == (1, "rmmod: ERROR: Module nvidia is in use")  # persistence mode on
    assert gpuhost.smi("-pm", "0").returncode == 0
    holder = spawn([gpuhost.paths.ctl_dev])
    assert run(gpuhost, "rmmod", "nvidia") == (1, "rmmod: ERROR: Module nvidia is in use")
    holder.kill()
    holder.wait()
    assert run(gpuhost, "rmmod", "nvidia") == (0, "") and modules(gpuhost) == []


def test_unloading_nvidia_unbinds_the_gpus_and_loading_it_brings_them_back_fresh(gpuhost):
    gpuhost.fault("stuck", gpu=2, mib=4096)
    assert gpuhost.smi("-pm", "0").returncode == 0
    for name in ("nvidia_uvm", "nvidia_modeset", "nvidia"):
        assert run(gpuhost, "rmmod", name) == (0, "")
    r = gpuhost.smi("-L")
    assert r.returncode == M.EXIT_DRIVER_NOT_LOADED
    assert not os.path.exists(gpuhost.paths.driver_gpus)
    assert not os.path.lexists(os.path.join(gpuhost.paths.pci_devices, "0000:18:00.0", "driver"))
    gpuhost.smi("-pm", "1")
    assert run(gpuhost, "modprobe", "nvidia_uvm") == (0, "")  # nvidia first, as modprobe does
    assert modules(gpuhost) == ["nvidia", "nvidia_uvm"]
    assert os.listdir(os.path.join(gpuhost.root, "sys", "module", "nvidia", "holders")) == ["nvidia_uvm"]
    assert len(os.listdir(gpuhost.paths.driver_gpus)) == 8
    assert os.path.lexists(os.path.join(gpuhost.paths.pci_devices, "0000:18:00.0", "driver"))
    assert set(g["persistence_mode"] for g in gpuhost.state["gpus"]) == {"Disabled"}
    assert gpuhost.memory_used()[2] == 1


def test_modprobe_of_a_module_it_does_not_know(gpuhost):
    assert run(gpuhost, "modprobe", "nvidia_fs") == (1, "modprobe: FATAL: Module nvidia_fs not found in directory "
                                                        "/lib/modules/6.8.0-gpusim")


def test_a_reloaded_module_leaves_its_nodes_to_nvidia_modprobe(gpuhost):
    uvm = os.path.join(gpuhost.root, "dev", "nvidia-uvm")
    assert os.path.exists(uvm)
    assert run(gpuhost, "rmmod", "nvidia_uvm") == (0, "") and not os.path.exists(uvm)
    assert run(gpuhost, "nvidia-modprobe", "-u", "-c", "0") == (1, "nvidia-modprobe: nvidia_uvm is not loaded")
    assert run(gpuhost, "modprobe", "nvidia_uvm") == (0, "") and not os.path.exists(uvm)  # modprobe makes no node
    assert run(gpuhost, "nvidia-modprobe", "-u", "-c", "0") == (0, "") and os.path.exists(uvm)
    assert os.path.exists(os.path.join(gpuhost.root, "dev", "nvidia-uvm-tools"))
