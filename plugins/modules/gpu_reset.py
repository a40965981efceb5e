#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: gpu_reset
short_description: Put the NVIDIA GPUs of a host back into a clean state, and judge it
version_added: 0.1.0
description:
  - The whole per-host sequence of the role P(gpuops.nvidia.gpu_reset#role) in one task, run by
    an action plugin on the controller; the modules it calls run on the host.
  - "It checks its options first (their types, and the limits the release applies on the host):
    a wrong value fails the host before anything is read, with one short line per value."
  - With a clean query of your own (O(clean_query)), it reads the GPUs with
    M(gpuops.nvidia.nvidia_gpu_facts) and stops there when the query holds.
  - Otherwise it releases the GPUs with M(gpuops.nvidia.nvidia_device_release), which reads them
    first itself and signals nothing on a clean host; on the usual path that one module call is
    all. With O(allow_gpu_reset), the release names the GPUs that need a reset, and only then
    M(gpuops.nvidia.nvidia_device_reset) resets them, reading them again first.
  - A reset (O(allow_gpu_reset)) is said in the report's C(escalation) - which GPUs, why each,
    nvidia-smi's words, the NVLink fabric after it, and what is still wrong (C(problems)).
  - It reads the GPUs again only when the release did not leave them clean (once), or when your
    clean query does not hold yet on what the release read last (at most four reads, a second
    apart).
  - It judges the host (V(clean), V(released), V(would_release) in check mode, V(failed)) and
    returns the report at the top level of its result, the reason naming each GPU that is not
    clean and why.
  - With O(probe), the GPUs judged clean are then proven by allocation with
    M(gpuops.nvidia.nvidia_gpu_probe); a GPU whose probe fails makes the host failed.
  - It warns about variables named C(gpu_reset_*) that are no setting of the role (a typo such
    as C(gpu_reset_timout) would otherwise be ignored), naming the nearest setting. Each warning
    it passes on starts with the host's name.
author:
  - gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpuops.nvidia.gpu.memory_threshold
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: The release runs in check mode; the report says what would be signalled.
  diff_mode:
    support: full
    details: The release's holders before and after.
  platform:
    platforms: posix
options:
  devices:
    description:
      - Device node globs; a process that has one of the matching files open or mapped holds
        the GPUs (O(gpuops.nvidia.nvidia_device_release#module:devices)).
    type: list
    elements: str
    default: ['/dev/nvidia*']
  gpus:
    description:
      - Put only these GPUs back (indexes as nvidia-smi numbers them), for example the GPUs of
        one Slurm job on a shared node. Not set, every GPU of the host.
      - Slurm's C(SLURM_JOB_GPUS) are not indexes but places in the node's C(gres.conf); the
        collection's Slurm hook maps each through its C(File=) device node's minor number to the
        GPU of that minor, and passes these indexes (for a MIG GRES, its instances).
      - A MIG instance is named V(N:G) (GPU N, its GPU instance G), V(N:G:C) (and compute
        instance C) or by its MIG UUID; only its own processes are stopped (those holding its
        caps node, never a sibling instance's) and it is judged by its own memory, never reset
        (see O(gpuops.nvidia.nvidia_device_release#module:gpus)). A whole GPU with MIG on means
        every instance of it.
    type: list
    elements: raw
  backend:
    description:
      - How the GPUs are read (O(gpuops.nvidia.nvidia_gpu_facts#module:backend)).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi_path:
    description:
      - The nvidia-smi executable, a command name looked up on E(PATH) or a path.
    type: str
    default: nvidia-smi
  host_root:
    description:
      - Where the host's C(/dev), C(/sys) and C(/proc/driver) are found
        (O(gpuops.nvidia.nvidia_gpu_facts#module:host_root)).
    type: path
    default: /
  expected_gpus:
    description:
      - The number of GPUs the host should have; fewer readable fails the host before anything
        is signalled. Not set, nothing is checked.
    type: int
  signals:
    description:
      - Signals sent in turn to each holder (O(gpuops.nvidia.nvidia_device_release#module:signals)).
    type: list
    elements: str
    default: [TERM, KILL]
  grace_period:
    description:
      - Seconds to wait after each signal for the holders to exit.
    type: float
    default: 5
  timeout:
    description:
      - Seconds the release may take in all, its GPU reset included.
    type: float
    default: 60
  extra_protect:
    description:
      - More program names or shell globs never to signal, added to NVIDIA's daemons
        (O(gpuops.nvidia.nvidia_device_release#module:extra_protect)).
    type: list
    elements: str
    default: []
  lock_file:
    description:
      - The lock that releases on one host take turns on (the release module's default when not set).
    type: path
  clean_query:
    description:
      - A JMESPath expression over the facts of M(gpuops.nvidia.nvidia_gpu_facts), narrowed to
        O(gpus), that gives true when the host is clean.
      - Not set, clean means every GPU in scope readable and at or below O(memory_threshold_mib)
        and no unprotected holder (the release's own test).
    type: str
  allow_gpu_reset:
    description:
      - Reset the GPUs that need a reset (C(nvidia-smi --gpu-reset)) - memory held with no
        process left, the driver's word, pending remapped rows, an Xid whose catalogue action is
        a GPU reset - and wait for their NVLink fabric after it
        (O(gpuops.nvidia.nvidia_device_release#module:reset_orphaned), then
        M(gpuops.nvidia.nvidia_device_reset)).
    type: bool
    default: false
  reload_modules:
    description:
      - With O(allow_gpu_reset), when the platform refuses a GPU's reset (FLR blocked, as in a
        VM), reload the NVIDIA driver's kernel modules instead of asking for a reboot - only when
        every GPU of the host is idle and no process holds a device node; a module that will not
        unload stops it, and what was unloaded is loaded back. The report's C(escalation.module_reload)
        says what was done
        (O(gpuops.nvidia.nvidia_device_reset#module:reset_reload_modules)).
    type: bool
    default: false
  hold_after_cures:
    description:
      - A GPU whose fault comes back after this many cures tried (GPU resets that worked, reboots
        the Slurm hook asked for) within O(hold_window_days), as its history on the host says, is
        not reset or rebooted again - the host fails, naming the GPU, the fault and the cures
        tried, and the Slurm hook drains the node for a person (C(gpu_reset(hold)) reason, never
        resumed by the health check). Once held, a GPU stays held until its history is cleared
        (R(the Slurm guide, ansible_collections.gpuops.nvidia.docsite.guide_slurm)). Between 1 and 100
        (O(gpuops.nvidia.nvidia_device_release#module:hold_after_cures)).
    type: int
    default: 2
  hold_window_days:
    description:
      - The window, in days, in which O(hold_after_cures) cures are counted. More than 0, at most 365.
    type: float
    default: 7.0
  stop_units:
    description:
      - The systemd services whose processes may be stopped for that reset when they hold the
        GPUs, as shell globs, started again after it; C(nvidia-cuda-mps-control) lets the MPS
        control daemon outside any service quit. V([]) allows none, and the reset is then not
        attempted while they hold the GPUs
        (O(gpuops.nvidia.nvidia_device_reset#module:reset_stop_units)).
    type: list
    elements: str
    default: [nvidia-dcgm.service, nvidia-dcgm-exporter.service, dcgm-exporter.service, nvsm*.service, nvidia-cuda-mps-control]
  kernel_log:
    description:
      - Where to read the kernel's Xid messages from for the GPUs' health (a GPU whose health
        calls for a reset, a reboot or a person is not clean) and the reasons to reset, instead of
        C(journalctl -k) (journald's kernel transport) or C(dmesg --facility=kern). It names
        C(/dev/kmsg), or a root-owned file of its records
        (O(gpuops.nvidia.nvidia_device_release#module:kernel_log)).
        A syslog file such as C(/var/log/kern.log) is refused, as any local user can write a line
        there that reads exactly as the kernel's.
    type: path
  bug_report_dir:
    description:
      - Where C(nvidia-bug-report.sh) writes its report when a GPU reset fails; not set, none is
        made (O(gpuops.nvidia.nvidia_device_reset#module:bug_report_dir)).
    type: path
  bug_report_timeout:
    description:
      - Seconds C(nvidia-bug-report.sh) may run, after the release's O(timeout).
    type: float
    default: 120
  assert_clean:
    description:
      - Fail the host when it is not clean, with a message that names each dirty GPU and why.
      - V(false) returns the report with C(outcome=failed) and leaves the judgment to the caller.
      - The host is drained, and its metrics and report written, before it fails.
      - Wrong settings fail the task either way, with the report (C(outcome=failed)) and a
        message naming each wrong setting, since nothing was read and there is nothing to judge.
    type: bool
    default: true
  probe:
    description:
      - Prove the GPUs judged clean by allocation. The release does it for the GPUs it released, in
        its own module call (O(gpuops.nvidia.nvidia_device_release#module:probe)); only GPUs judged
        clean by another read (a clean query of your own) are proven with
        M(gpuops.nvidia.nvidia_gpu_probe), one more module call.
    type: bool
    default: true
  probe_mib:
    description:
      - MiB the probe allocates on each GPU.
    type: int
    default: 1024
  probe_level:
    description:
      - What the probe writes and checks on each GPU
        (O(gpuops.nvidia.nvidia_gpu_probe#module:probe_level)) - V(allocation), O(probe_mib) MiB,
        or V(memory), all the GPU's free memory (at memory bandwidth; a job starting at the same
        moment finds almost none free).
    type: str
    choices: [allocation, memory]
    default: allocation
  probe_missing_library:
    description:
      - What a probe does on a host without C(libcuda.so.1)
        (O(gpuops.nvidia.nvidia_gpu_probe#module:missing_library)).
    type: str
    choices: [skip, fail]
    default: skip
  probe_cuda_library:
    description:
      - The CUDA driver library the probe loads.
    type: str
    default: libcuda.so.1
  job:
    description:
      - The Slurm job the run is for, as O(gpuops.nvidia.nvidia_device_release#module:job) takes it
        (V(id), V(uid), V(shared_gpus), V(live_jobs), V(scontrol)); the Slurm hooks set it.
      - Another live job's processes are never signalled; on a shared GPU only the job's own are,
        the GPU is judged for the job alone while another job uses it, and it is not probed.
    type: dict
  on_failure:
    description:
      - What to do with a host that cannot be made clean. V(fail) fails the host; V(drain) runs
        O(drain_command) on the host first, then fails it. A host whose settings are wrong is not
        drained (nothing was read there).
    type: str
    choices: [fail, drain]
    default: fail
  drain_command:
    description:
      - The command run on a host that cannot be made clean when O(on_failure=drain), as a list of
        arguments, each quoted for the shell, over the task's connection and with its become
        (as M(ansible.builtin.raw) runs a command, with no Python needed on the host).
      - Given as the variable C(gpu_reset_drain_command), it is templated when it runs, with the
        report as C(gpu_reset_result) (C(gpu_reset_result.reason) says why the host is not clean).
      - The default drains the Slurm node named after C(inventory_hostname_short), with the reason
        made by the filter P(gpuops.nvidia.gpu_reset_drain_reason#filter) (control characters
        escaped, cut at 200 characters).
    type: list
    elements: str
    default:
      - scontrol
      - update
      - nodename={{ inventory_hostname_short }}
      - state=drain
      - "reason={{ gpu_reset_result.reason | default(none) | gpuops.nvidia.gpu_reset_drain_reason }}"
  drain_timeout:
    description:
      - Seconds the drain command may run; one still running then is stopped (coreutils
        C(timeout) on the host), and the reason says that the drain failed.
    type: int
    default: 60
  max_drained:
    description:
      - The fleet brake, a number of nodes or a percentage of the cluster's (V(10%), rounded up, at
        least 1). Before a host is drained, the nodes C(sinfo) on the host shows drained or down
        with a C(gpu_reset) reason are counted; past the cap, a host that is not clean but where a
        job can run (no GPU lost, no memory held) is not drained, and the report (RV(brake)) and
        the reason say so; it still fails. A host where no job can run is drained all the same,
        the brake overridden. When C(sinfo) cannot answer, the host is drained as without a
        brake, and RV(brake) says why.
      - The hosts of one run count and drain one at a time, so that a fault they all share
        drains no more of them than the cap. The Slurm hooks apply the same brake
        (C(GPU_RESET_MAX_DRAINED)).
    type: str
    default: 10%
  report_dir:
    description:
      - A directory on the controller for one JSON report per host, C(<inventory_hostname>.json),
        created when missing; the host name escaped as the filter
        P(gpuops.nvidia.gpu_reset_report_path#filter) escapes it. Also in check mode. A report that
        cannot be written fails the host, saying why.
    type: path
  textfile_dir:
    description:
      - The node_exporter textfile collector directory on the host, for C(gpu_reset.prom) (the
        gauges are listed in R(the monitoring guide, ansible_collections.gpuops.nvidia.docsite.guide_monitoring)).
        Not in check mode. Metrics that cannot be
        written fail the host, saying why.
    type: path
notes:
  - The options not given as arguments are taken from the variables of the same names with the
    prefix C(gpu_reset_) where they are set (the role's defaults among them), so the role's one task
    is this action with no arguments. In the role, messages name the variables.
seealso:
  - module: gpuops.nvidia.nvidia_device_release
  - module: gpuops.nvidia.nvidia_gpu_facts
'''

EXAMPLES = r'''
- name: Free the GPUs of a hung job and fail the host when they stay held
  gpuops.nvidia.gpu_reset:
    timeout: 120
  become: true

- name: Put back only the GPUs of one job, resetting those left with orphaned memory
  gpuops.nvidia.gpu_reset:
    gpus: [0, 1]
    allow_gpu_reset: true
    assert_clean: false
  become: true
  register: reset

- name: Say what was done
  ansible.builtin.debug:
    msg: "{{ reset.outcome }}: {{ reset.reason or 'GPUs free' }}"
'''

RETURN = r'''
host:
  description: The host's inventory name.
  returned: always
  type: str
outcome:
  description: V(clean) (nothing to do), V(released), V(would_release) (check mode) or V(failed).
  returned: always
  type: str
reason:
  description: Why the host is not clean (each dirty GPU and each stray holder), or what check
    mode would do; null otherwise.
  returned: always
  type: str
check_mode:
  description: Whether the run was in check mode.
  returned: always
  type: bool
misconfigured:
  description: Whether the host failed on its settings, before anything was read (RV(reason) names them).
  returned: always
  type: bool
gpus_before:
  description: Memory used per GPU in scope before the release (index, memory_used_mib; a MIG instance
    in O(gpus) is an entry of its own, its mig_instance its GPU and compute instance and MIG UUID).
  returned: always
  type: list
  elements: dict
gpus_after:
  description: Memory used per GPU in scope at the end (index, memory_used_mib; mig_instance, as in
    RV(gpus_before)).
  returned: always
  type: list
  elements: dict
gpus_free:
  description: GPUs in scope at or below the memory threshold at the end.
  returned: always
  type: int
gpus_held:
  description: GPUs in scope above the memory threshold at the end.
  returned: always
  type: int
signalled:
  description: The processes the release signalled (as M(gpuops.nvidia.nvidia_device_release) returns them).
  returned: always
  type: list
  elements: dict
survivors:
  description: The holders left at the end, each with why.
  returned: always
  type: list
  elements: dict
other_jobs:
  description: With O(job), the holders left alone as other jobs' (as M(gpuops.nvidia.nvidia_device_release)
    returns them).
  returned: always
  type: list
  elements: dict
foreign_holders:
  description: Root or system processes holding a GPU in scope that belong to no job (as
    M(gpuops.nvidia.nvidia_device_release) returns them); never signalled, and the host is not clean
    while one holds a GPU.
  returned: always
  type: list
  elements: dict
unreadable:
  description: The processes whose descriptors could not all be read (as
    M(gpuops.nvidia.nvidia_device_release) returns them); a GPU one of them may hold is not called
    clean, and is not probed.
  returned: always
  type: list
  elements: dict
orphaned_gpus:
  description: Indexes of the GPUs found holding memory with no process left.
  returned: always
  type: list
  elements: int
escalation:
  description: The GPU reset, when O(allow_gpu_reset) and one was tried (gpus, persistence_mode_off,
    reset_ok, output, persistence_mode_restored), or could not be tried because a process that
    O(stop_units) does not allow to be stopped holds the GPU (reset_ok false, output naming it);
    with O(reload_modules), module_reload says what a reload of the driver's kernel modules did
    after a reset the platform refused, or why it was not done; on a GPU with MIG, mig says what the
    reset changed (the MIG mode applied, the instances gone); null otherwise.
  returned: always
  type: dict
gpus:
  description: Per GPU at the end, for metrics (index, pci_bus_id, state, recovery_action,
    orphaned_mib, seconds_until_free).
  returned: always
  type: list
  elements: dict
release_s:
  description: Seconds the release took (null when it did not run).
  returned: always
  type: float
started:
  description: When the run started (seconds since the epoch).
  returned: always
  type: float
duration_s:
  description: Seconds the whole run took.
  returned: always
  type: float
drained:
  description: Whether the host was drained (O(on_failure=drain) on a host that is not clean).
  returned: always
  type: bool
brake:
  description:
    - What the fleet brake (O(max_drained)) did before a drain - C(held) (the host left in
      service), C(rule) (C(count), when one held or was overridden), C(overridden) (drained
      since no job can run there), C(drained_nodes), C(nodes), C(cap); or C(why) the drained
      nodes could not be counted.
  returned: when a host that is not clean was to be drained (not in check mode)
  type: dict
would_drain:
  description: In check mode, true when the host would have been drained (O(on_failure=drain)).
  returned: in check mode, on a host that would be drained
  type: bool
probe:
  description: With O(probe), what the probe found (probed, library_missing, gpus, duration_ms).
  returned: when the GPUs were probed
  type: dict
'''
