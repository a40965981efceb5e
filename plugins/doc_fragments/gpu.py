# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    # How GPU state is read.
    DOCUMENTATION = r'''
options:
  backend:
    description:
      - How GPU state is read.
      - V(nvidia-smi) runs C(nvidia-smi --query-gpu) and C(--query-compute-apps) with CSV output.
      - V(nvml) uses the NVML library (C(libnvidia-ml.so.1), from the driver) through the
        C(nvidia-ml-py) Python bindings, in the module's own process (no process is started),
        and the facts are the same as with V(nvidia-smi).
      - V(auto) uses NVML when C(nvidia-ml-py) is installed and NVML initialises, and
        V(nvidia-smi) otherwise.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi_path:
    description:
      - The nvidia-smi executable, as a command name looked up on E(PATH) or as a path.
    type: str
    default: nvidia-smi
  host_root:
    description:
      - Where the host's C(/dev), C(/sys) and C(/proc/driver) are found. Meant for testing (a
        simulated host under a directory) and for containers where the host's directories are
        mounted under a prefix (for example C(/host)).
      - The PCI bus (C(/sys/bus/pci/devices)) and the driver's C(/proc/driver/nvidia/gpus) are
        read under it to tell each GPU's minor number (the N of C(/dev/nvidiaN)) and the GPUs
        the host has but the driver or O(backend) does not list.
      - Device node globs (the C(devices) option, in the modules that have it) are resolved under it.
        Processes are always looked up in the real C(/proc).
      - Without C(/sys) or C(/proc/driver) under it, minor numbers are unknown, C(/dev/nvidiaN) is
        taken to be the GPU of index N (with a warning where that matters) and no GPU is found
        missing, as before these were read.
    type: path
    default: /
  expected_gpus:
    description:
      - The number of GPUs this host should have. The task fails, before anything else is done,
        when fewer can be read, and the message names the GPUs seen and the lost ones with why.
      - Lost GPUs (unreadable, or on the PCI bus but not listed by the driver) do not count.
      - Not set, nothing is checked.
    type: int
  state_dir:
    description:
      - The directory where the collection keeps what it remembers on the host between runs
        (where the kernel log was last read, with the summary of what it said, and each GPU's
        last cure, by GPU UUID and boot id).
      - It must be a directory only this user can write, as the release lock's, below directories
        that belong to root or this user and that no other user can write (a sticky directory such
        as C(/tmp) excepted); a symbolic link on the way is followed only when root or this user
        owns it. It is created 0700 when missing (its parent must exist); one that is a symbolic
        link, another user's or writable by group or others, or below a directory another user
        could replace it in, is not used, with a warning, and then nothing is remembered (the
        kernel log is read from its start each time, within its bounds, and health counts every
        message of this boot).
      - The directory is opened from C(/) one component at a time, by descriptor, for each read
        and write, and its files are read and replaced through that descriptor; a directory
        swapped for a symbolic link after the check is never written through.
      - Not set, it is C(/run/gpuops) under O(host_root) (for a user other than root, a directory
        of its own, as for the release lock).
      - Each GPU's history (resets, reboots asked for, cures, probe results), which must survive a
        reboot, is kept in C(/var/lib/gpuops) under O(host_root) when this is not set, and in its
        C(history) subdirectory when it is.
    type: path
requirements:
  - nvidia-smi (from the NVIDIA driver) for O(backend=nvidia-smi)
  - nvidia-ml-py (the C(pynvml) module) and the driver's C(libnvidia-ml.so.1) for O(backend=nvml)
notes:
  - Every nvidia-smi call runs under a deadline. nvidia-smi can hang inside the driver on a
    sick GPU; a call that misses its deadline is killed and reported as an error, never waited
    out.
  - NVML calls can hang inside the driver the same way. They run in a worker thread; a read
    that misses its deadline is reported as an error and the thread is abandoned.
'''

    # When a GPU with no process counts as free. The default is DEFAULT_MEMORY_THRESHOLD_MIB
    # (module_utils/_common.py), where the real readings behind it are named.
    MEMORY_THRESHOLD = r'''
options:
  memory_threshold_mib:
    description:
      - Memory used, in MiB, at or below which a GPU that no process uses counts as free
        rather than holding orphaned memory.
      - Memory used is the memory allocated on the GPU, as C(nvidia-smi) shows it (NVML v2
        C(used)), without the memory the driver reserves (reported apart as
        C(memory_reserved_mib)).
      - Real idle GPUs do not read 0. Idle H100 and H200 GPUs read 0 or 1 MiB and other idle
        GPUs up to about 8 MiB, while a process that still holds a CUDA context holds a few
        hundred MiB. The default of 32 lies between the two.
      - On an older driver, whose NVML has no v2 memory call, memory used includes the
        reserved memory and idle GPUs may read hundreds of MiB; the module then warns, and
        this threshold must be raised above the idle reading.
    type: int
    default: 32
'''

    # Which device nodes count and which processes are never signalled.
    HOLDERS = r'''
options:
  devices:
    description:
      - Device node globs. A process that has one of the matching files open or mapped (by any
        of its threads) holds the GPUs, as C(fuser -v) would list it.
      - Every match must be an NVIDIA device node, named like one (C(nvidiaN), C(nvidiactl),
        C(nvidia-uvm), C(nvidia-uvm-tools), C(nvidia-modeset), C(nvidia-nvlink),
        C(nvidia-nvswitchN), C(nvidia-caps/nvidia-capN), ...) and, for a character device, with
        a major number that an NVIDIA driver registered in C(/proc/devices). Anything else, such
        as C(/dev/null) or C(/dev/*), is refused, naming the path, before anything is read or
        signalled. A regular file of such a name passes (a simulated host).
      - Directories that match (such as C(/dev/nvidia-caps)) are skipped.
      - A glob that matches nothing fails M(gpuops.nvidia.nvidia_device_release); for
        M(gpuops.nvidia.nvidia_gpu_facts) it is a warning (a host may have no GPU yet).
    type: list
    elements: str
    default: ['/dev/nvidia*']
  protect:
    description:
      - Programs whose processes are reported but never signalled, as exact names or shell globs
        (C(nv-*)), not regular expressions.
      - A process is protected only when its executable (C(/proc/PID/exe)) has such a name, is
        owned by root and writable by neither group nor others, and the process runs as root
        or a system account (below C(UID_MIN) of C(/etc/login.defs)). A process that only
        calls itself by such a name (its C(comm) or C(argv[0])) is a normal holder, reported
        with C(impersonates) and a warning.
      - The default is NVIDIA's own daemons (persistence, fabric manager, DCGM, power, IMEX,
        NVSM, the Kubernetes device plugin and GPU feature discovery, the MPS control daemon)
        and the display servers; stopping some of these can leave GPUs unusable until a reboot.
      - Use O(extra_protect) to add names without repeating the defaults.
    type: list
    elements: str
    default: [nvidia-persistenced, nvidia-fabricmanager, nv-fabricmanager, nv-hostengine,
              dcgm-exporter, nvidia-powerd, nvidia-imex, nvsm_core, nvidia-device-plugin,
              gpu-feature-discovery, nvidia-cuda-mps-control, Xorg, Xwayland, gnome-shell]
  extra_protect:
    description:
      - More program names or shell globs to protect, added to O(protect), with the same checks.
        An entry that looks like a regular expression (C(python.*)) gives a warning, since it would
        match only a program named exactly that.
    type: list
    elements: str
    default: []
notes:
  - Holders are found by reading C(/proc). Without root, other users' processes cannot be
    inspected; the module warns how many were skipped. Run it with privilege escalation (C(become)).
  - The module's own process and its ancestors are always protected.
'''
