#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: nvidia_device_release
short_description: Stop the processes holding NVIDIA GPUs and wait until their memory is free
version_added: 0.1.0
description:
  - Finds every process that holds a GPU device node (as C(fuser -v /dev/nvidia*) lists them),
    leaves NVIDIA's own daemons alone, and stops the others with a ladder of signals
    (C(SIGTERM), then C(SIGKILL) after a grace period).
  - A process is signalled only while it is still the process that was found (pidfd, or its
    start time re-read from C(/proc) right before the signal), so a recycled PID is never hit.
  - Only NVIDIA device nodes are looked at (see O(devices)), and NVIDIA's daemons are
    recognised by the program they run, not by the name they give themselves (see O(protect)).
  - A process that starts holding the devices while the ladder runs joins it. A child of a
    holder, or a process of the same session, cgroup or user that appeared after the holder was
    first signalled (a job forking on SIGTERM), takes the holder's place on the ladder; when the
    last signal is C(KILL), the whole set is stopped with C(SIGSTOP) first and then killed, so
    that no fork outruns it. Other newcomers go through the whole ladder.
  - A process that started only after its predecessor exited, with the same user, name and
    command line (restarted by a supervisor), is stopped once more at most and then reported
    in RV(survivors) with reason V(respawned) and its supervisor.
  - Then waits, polling without fixed sleeps, until no unprotected holder is left and every
    GPU in scope reports memory used at or below O(memory_threshold_mib), and for
    O(settle_time) after the last holder exited that none comes back.
  - Memory that stays in use with no process left is reported in RV(orphaned_gpus); only a
    GPU reset frees it.
  - Every signal sent is written to the system log with the PID, user and command.
  - Two releases on one host run one after the other (a lock on O(lock_file)).
author:
  - gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.actiongroups
  - gpuops.nvidia.gpu
  - gpuops.nvidia.gpu.memory_threshold
  - gpuops.nvidia.gpu.holders
  - gpuops.nvidia.release
attributes:
  action_group:
    membership: [gpuops.nvidia.nvidia]
  check_mode:
    support: full
    details: Reports in RV(signalled) the processes that would be signalled, and signals nothing.
  diff_mode:
    support: full
    details: The holders before and after, one line per process.
  platform:
    platforms: posix
options:
  reset_orphaned:
    description:
      - Name in RV(reset_due) the GPUs in scope that the release leaves needing a GPU reset, with
        no unprotected holder left, and why each; such a GPU is not released.
        M(gpuops.nvidia.nvidia_device_reset) resets them (the role P(gpuops.nvidia.gpu_reset#role)
        calls it when C(gpu_reset_allow_gpu_reset) is on). The reset's own code is not shipped to
        the host by this module, so a host with nothing to reset runs the release alone.
      - A GPU needs one when it is left with orphaned memory (RV(orphaned_gpus), memory used, no
        process), when its MIG mode change waits for one, or when its health calls for a reset and
        nothing worse - the driver says so (C([GPU requires reset]), NVML's RESET_REQUIRED, a
        recovery action of reset), remapped rows or retired pages are pending, or the kernel
        log has an Xid since the GPU's last cure whose action in NVIDIA's Xid catalogue is a
        GPU reset (for example 95, 119, 120, or 154 naming a reset), read as
        M(gpuops.nvidia.nvidia_gpu_facts) reads it (O(kernel_log)). A GPU whose health calls
        for a reboot or for a person (Xid 79, 48) is not named, nor one the kernel log says the
        driver hung on, nor one held for a person (RV(held)). A GPU a MIG instance in use keeps
        is not named either; the task fails, naming the instance.
      - Waiting for the driver to free memory that no process holds (see O(wait)) ends, at the
        latest, a third of O(timeout) (at least one second) before the signalling would.
      - In check mode, RV(reset_due) names the GPUs that would need a reset.
    type: bool
    default: false
notes:
  - A pattern in O(devices) that matches no NVIDIA device node, a typo or a host without the
    driver, fails the task before anything is signalled; the module never calls GPUs released
    without reading them.
  - What waiting cannot fix fails at once, before any signal, instead of waiting out
    O(timeout) - nvidia-smi missing or not executable, the driver not loaded, the NVML library
    missing or of another version.
  - When the GPUs are not clean by O(timeout) the task fails with a message that names each
    dirty GPU and why, and still returns every value below.
  - A lost GPU (one the driver cannot read) never becomes clean; once no unprotected holder is
    left and only lost GPUs stand in the way, the module fails at once rather than waiting
    out O(timeout).
seealso:
  - module: gpuops.nvidia.nvidia_gpu_facts
  - module: gpuops.nvidia.nvidia_device_reset
'''

EXAMPLES = r'''
- name: Free every GPU of a hung job, keeping NVIDIA's daemons
  gpuops.nvidia.nvidia_device_release:
  become: true

- name: Free GPUs 2 and 3 only, faster ladder, tolerate a little memory left
  gpuops.nvidia.nvidia_device_release:
    gpus: [2, 3]
    grace_period: 2
    timeout: 30
    memory_threshold_mib: 64
  become: true

- name: Also protect a monitoring agent, and show who would be stopped
  gpuops.nvidia.nvidia_device_release:
    extra_protect: [my-gpu-exporter]
  check_mode: true
  register: would_release

- name: Send SIGINT first so that the job can checkpoint
  gpuops.nvidia.nvidia_device_release:
    signals: [INT, TERM, KILL]
    grace_period: 10
  become: true
  register: release

- name: Report orphaned memory
  ansible.builtin.debug:
    msg: "GPUs {{ release.orphaned_gpus }} need a reset"
  when: release.orphaned_gpus | length > 0

- name: Free the GPUs, and name those that need a reset
  gpuops.nvidia.nvidia_device_release:
    reset_orphaned: true
    timeout: 90
  become: true
  register: release
  failed_when: release.failed and not release.reset_due

- name: Reset them
  gpuops.nvidia.nvidia_device_reset:
    reset_due: "{{ release.reset_due }}"
  become: true
  when: release.reset_due | length > 0
'''

RETURN = r'''
released:
  description: True when at the end no unprotected holder is left, every GPU in scope
    reports memory used at or below O(memory_threshold_mib) with no process in the driver's
    list, and the GPUs stayed so for O(settle_time) after the last holder exited (false, with
    C(not_settled) in the message, when that window did not fit before O(timeout)). A GPU whose
    health (RV(gpu_states[].recovery_action)) calls for a reboot or a person, or for a reset that
    O(reset_orphaned) does not carry out, is not released, and the message says why (for example
    C(GPU 1 needs a reboot (Xid 79 since the last cure))); nothing is probed then.
  returned: always
  type: bool
  sample: true
signalled:
  description: The processes signalled (in check mode, those that would be), in the order
    they were found.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    user:
      description: The user the process ran as.
      type: str
    comm:
      description: The process name as the kernel keeps it (at most 15 characters).
      type: str
    name:
      description: The process name to show in messages. It is C(comm), unless C(comm) is 15
        characters long (the kernel cuts a name there, so C(nvidia-persistenced) reads
        C(nvidia-persiste)); then it is the basename of the executable, or else of C(argv[0]), that
        starts with C(comm), and C(comm) when neither does. The process chose it, as it chose
        C(comm).
      type: str
    cmdline:
      description: The command line, arguments separated by spaces.
      type: str
    devices:
      description: The matching device nodes it held.
      type: list
      elements: str
    signals_sent:
      description:
        - The signals of O(signals) sent to it, by name without C(SIG), in order. Empty in
          check mode.
        - The C(SIGSTOP) that freezes the set just before a final C(KILL) is written to the
          system log but not listed.
      type: list
      elements: str
    exited:
      description: Whether the process had exited by the end of the run.
      type: bool
    impersonates:
      description: The protected name (from O(protect)) this process goes by although it is not
        that daemon, its executable or user failing the checks described under O(protect).
        Only present for such a process.
      type: str
      returned: when the process calls itself by a protected name
      sample: nvidia-persistenced
  sample:
    - pid: 4242
      user: alice
      comm: python3
      name: python3
      cmdline: python3 train.py --local-rank 0
      devices: [/dev/nvidia-uvm, /dev/nvidia0, /dev/nvidiactl]
      signals_sent: [TERM]
      exited: true
protected:
  description: Holders left alone because their identity matches O(protect) or O(extra_protect)
    (verified as described there), or because they are the module's own process or its
    ancestors.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    user:
      description: The user the process runs as.
      type: str
    comm:
      description: The process name as the kernel keeps it.
      type: str
    name:
      description: The process name to show in messages, as RV(signalled[].name) says.
      type: str
    cmdline:
      description: The command line.
      type: str
    devices:
      description: The matching device nodes it holds.
      type: list
      elements: str
  sample:
    - pid: 1201
      user: root
      comm: nvidia-persiste
      name: nvidia-persistenced
      cmdline: /usr/bin/nvidia-persistenced --user nvidia-persistenced
      devices: [/dev/nvidia-uvm, /dev/nvidia0, /dev/nvidiactl]
foreign_holders:
  description: Holders left alone because they are root or system processes that the driver
    places on no GPU and that share no session, cgroup or ancestry with a job (a daemon that
    was handed a device descriptor, a root monitoring agent). They are never signalled, and a GPU
    in scope that one holds is not released (RV(released) false), and the failure names it, its user,
    its unit, the nodes it holds and when it lets go. The release waits for it until its timeout. Each
    entry has the fields of an entry of RV(protected), and RV(foreign_holders[].reason) and
    RV(foreign_holders[].unit). They are not listed in RV(protected).
  returned: always
  type: list
  elements: dict
  contains:
    reason:
      description: Always V(foreign_holder).
      type: str
    unit:
      description: The systemd unit its cgroup places it in, or null.
      type: str
  sample:
    - pid: 845
      user: root
      comm: dbus-daemon
      name: dbus-daemon
      cmdline: /usr/bin/dbus-daemon --system
      devices: [/dev/nvidia0]
      reason: foreign_holder
      unit: dbus.service
other_jobs:
  description:
    - With O(job), the holders the release left alone for that job, never signalled. Each entry
      has the fields of an entry of RV(protected), and RV(other_jobs[].job_id),
      RV(other_jobs[].why), RV(other_jobs[].gpus).
  returned: always
  type: list
  elements: dict
  contains:
    job_id:
      description: The Slurm job the process belongs to, by its cgroup or slurmd's pids; null for none.
      type: str
    why:
      description:
        - V(another_job), a process of another job (its cgroup's, or slurmd's latest list's);
          V(not_this_job), on a shared GPU, a process of no live job and not of O(job.uid);
          V(mps_in_use), an MPS daemon on a GPU that another job's process uses; V(jobs_unknown), a
          process in no job's cgroup, not of O(job.uid), when slurmd's list could not be read again
          before the signals (O(job.scontrol)).
      type: str
    gpus:
      description: The GPUs in scope it holds or the driver places it on.
      type: list
      elements: int
  sample:
    - pid: 5120
      user: alice
      comm: python3
      name: python3
      cmdline: python3 train.py
      devices: [/dev/nvidia0, /dev/nvidiactl]
      job_id: "4711"
      why: another_job
      gpus: [0]
survivors:
  description: Unprotected holders still there at the end.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    user:
      description: The user the process runs as.
      type: str
    comm:
      description: The process name as the kernel keeps it.
      type: str
    name:
      description: The process name to show in messages, as RV(signalled[].name) says.
      type: str
    cmdline:
      description: The command line.
      type: str
    devices:
      description: The matching device nodes it holds.
      type: list
      elements: str
    signals_sent:
      description: The signals sent to it.
      type: list
      elements: str
    gpus:
      description: Indexes of the GPUs in scope it holds (its C(nvidiaN) node, or the driver
        reports it on the GPU).
      type: list
      elements: int
    reason:
      description:
        - V(uninterruptible) the process is in uninterruptible sleep (state D), usually inside
          the driver; it dies only when the driver lets go.
        - V(zombie) the process has exited but was not reaped.
        - V(respawned) a new process took the place of one that was stopped (same user, name and
          command line, started after it exited) after it had already come back once, or it
          appeared too late to be signalled; RV(survivors[].supervisor) says who started it.
        - V(ignored_signals) the process received every signal of O(signals) and still runs.
        - V(not_permitted) the kernel refused the signals (another user's process, without
          root); RV(survivors[].uid) is its user id.
      type: str
      sample: ignored_signals
    supervisor:
      description: Who started a V(respawned) process - its parent (C(pid), C(name)) and the
        systemd C(unit) or C(container) id of its cgroup (null when none).
      type: dict
      returned: when the reason is V(respawned)
      sample: {pid: 1, name: systemd, unit: train.service, container: null}
    uid:
      description: The user id of a V(not_permitted) process.
      type: int
      returned: when the reason is V(not_permitted)
orphaned_gpus:
  description: Indexes of GPUs in scope whose memory stayed in use with no process left,
    longer than a driver takes to free a dead process's memory (see O(wait)). Only a GPU reset
    frees it. Empty when O(wait=false).
  returned: always
  type: list
  elements: int
  sample: [3]
escalation:
  description:
    - Always null here; the reset of M(gpuops.nvidia.nvidia_device_reset) says what it did in its
      own RV(gpuops.nvidia.nvidia_device_reset#module:escalation).
  returned: always
  type: dict
reset_due:
  description:
    - With O(reset_orphaned), the GPUs that need a reset, and why each, in the form
      M(gpuops.nvidia.nvidia_device_reset) takes as its
      O(gpuops.nvidia.nvidia_device_reset#module:reset_due). Empty when none does.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index.
      type: int
    reasons:
      description: Why it needs one (C(orphaned memory), an Xid, the driver's word, a MIG mode change).
      type: list
      elements: str
  sample: [{index: 3, reasons: [orphaned memory]}]
gpus_before:
  description: Memory used per GPU in scope before anything was signalled (empty when the
    GPUs could not be read).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index.
      type: int
    memory_used_mib:
      description: Memory used in MiB, or null when not reported.
      type: int
    mig_instance:
      description: For a MIG instance in O(gpus), its GPU instance, compute instance and MIG
        UUID (C(gpu_instance_id), C(compute_instance_id), C(uuid)); its C(index) is its GPU's.
      type: dict
      returned: for a MIG instance
  sample:
    - index: 0
      memory_used_mib: 76113
gpus_after:
  description: Memory used per GPU in scope at the end (empty when the GPUs could not be read).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index.
      type: int
    memory_used_mib:
      description: Memory used in MiB, or null when not reported.
      type: int
    mig_instance:
      description: For a MIG instance in O(gpus), its GPU instance, compute instance and MIG
        UUID (C(gpu_instance_id), C(compute_instance_id), C(uuid)); its C(index) is its GPU's.
      type: dict
      returned: for a MIG instance
  sample:
    - index: 0
      memory_used_mib: 1
gpu_states:
  description:
    - Each GPU in scope as the release left it (as it is, in check mode); empty when the GPUs
      could not be read. The role's per-GPU metrics are made from it.
    - The driver's verdicts in it (V(reset_required), V(lost), its recovery action) are those of
      the release's first read, or of the read after a GPU reset, unless a later read found a
      new one or a GPU it could not read.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index; null for a GPU on the PCI bus that the reader does not list.
      type: int
    pci_bus_id:
      description: The GPU's PCI bus id.
      type: str
    state:
      description:
        - As RV(gpuops.nvidia.nvidia_gpu_facts#module:ansible_facts.nvidia_gpus[].state).
      type: str
      choices: [free, busy, idle_holding, orphaned_memory, reset_required, lost]
    driver_recovery_action:
      description:
        - The driver's GPU Recovery Action, as
          RV(gpuops.nvidia.nvidia_gpu_facts#module:ansible_facts.nvidia_gpus[].health.driver_recovery_action).
      type: str
    recovery_action:
      description:
        - What the GPU's health calls for since its last cure (the driver's word, the memory
          repair state, the kernel log read as O(kernel_log) says), decided as
          RV(gpuops.nvidia.nvidia_gpu_facts#module:ansible_facts.nvidia_gpus[].health.recovery_action)
          is. Null for a GPU with no index.
        - V(reboot) for a GPU whose reset the platform refused (RV(gpuops.nvidia.nvidia_device_reset#module:escalation.flr_refused)).
      type: str
      choices: [none, restart_app, reset_gpu, reboot, inspect]
    memory_used_mib:
      description: Memory used in MiB, or null when not reported.
      type: int
    mig_instance:
      description: For a MIG instance in O(gpus), its GPU instance, compute instance and MIG
        UUID (C(gpu_instance_id), C(compute_instance_id), C(uuid)); its C(index) is its GPU's.
      type: dict
      returned: for a MIG instance
  sample:
    - index: 0
      pci_bus_id: "00000000:18:00.0"
      state: free
      driver_recovery_action: none
      recovery_action: none
      memory_used_mib: 1
facts_after:
  description:
    - The GPUs and their holders at the end, read after everything else (in check mode, as
      they are), with the keys and values that M(gpuops.nvidia.nvidia_gpu_facts) returns in
      its C(ansible_facts). Not set as host facts.
    - Unlike RV(gpus_after), it covers every GPU and every holder of the nodes matching
      O(devices), whatever O(gpus) says.
  returned: when O(facts_after=true) and the GPUs could be read at the end
  type: dict
  contains:
    nvidia_gpus:
      description: Every GPU, as RV(gpuops.nvidia.nvidia_gpu_facts#module:ansible_facts.nvidia_gpus).
      type: list
      elements: dict
    nvidia_gpu_count:
      description: The number of GPUs.
      type: int
    nvidia_driver_version:
      description: The driver version.
      type: str
    nvidia_gpu_backend:
      description: The backend that read the GPUs, V(nvml) or V(nvidia-smi).
      type: str
    nvidia_device_holders:
      description: Every process holding a matching node, as
        RV(gpuops.nvidia.nvidia_gpu_facts#module:ansible_facts.nvidia_device_holders).
      type: list
      elements: dict
  sample:
    nvidia_gpu_count: 8
    nvidia_driver_version: 550.54.15
    nvidia_gpu_backend: nvml
    nvidia_gpus: []
    nvidia_device_holders: []
held:
  description:
    - The GPUs held for a person - their fault came back after O(hold_after_cures) cures within
      O(hold_window_days), or they were held before and their history was not cleared - and
      therefore not reset; with M(gpuops.nvidia.nvidia_device_reset), also a GPU whose MIG instances
      its reset ended and that were not made again. The message starts with their reasons.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index.
      type: int
    uuid:
      description: The GPU's UUID.
      type: str
    reason:
      description: The GPU, the fault and the cures tried, with their times in UTC.
      type: str
history:
  description:
    - The history of each GPU in scope that has one, by GPU UUID (C(/var/lib/gpuops), kept
      across reboots), as it was before the probe of this call.
    - C(events) the newest 10 events, each with C(time) (epoch seconds), C(kind) (C(reset),
      C(reset_failed), C(reboot_asked), C(cure) with C(how) reset or probe, C(cure_failed) the
      GPU held for a person, C(not_attempted) a reset due but not tried, C(probe) with C(result)
      pass or fail), C(index), C(reason), and C(count) when the same event repeated; C(counts)
      the events of each kind in the last C(1d), C(7d) and C(30d).
    - An attempt's event also has its C(outcome) - C(cured) (with C(proof), what read it clean),
      C(cure_failed), C(not_attempted) (with C(why)), C(escalated) (with C(to), what comes next -
      C(module_reload) or C(reboot)) or C(held) - and, for a reset, C(duration_s).
  returned: when the GPUs were read
  type: dict
elapsed_s:
  description: Seconds the release took, lock wait included.
  returned: always
  type: float
  sample: 1.52
unreadable:
  description: The processes whose descriptors or mappings the last scan of C(/proc) could read only in
    part, so that what they hold beyond that is unknown to it. A process has 1024 of its
    descriptors read (the usual soft limit of open files), and a scan reads 65536 more in all for
    the processes that have more; 4 MiB of a process's mappings are read, and no process is read
    past the deadline, so no process can stall the release. Such a process of the job (with
    O(job), in its cgroup, or of O(job.uid) in no live job) is taken for a holder of every GPU in
    scope and released. Any other of a regular user, unless another job's, may hold a GPU in scope;
    it is never signalled, and the GPUs are not called released (RV(released) false, the failure
    names it). One of a system account is named here alone.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    user:
      description: The user the process runs as (its uid when it has no name).
      type: str
    comm:
      description: The process name (C(/proc/PID/comm)).
      type: str
    why:
      description: V(too_many_descriptors), V(too_many_mappings), or V(deadline) (the timeout came first).
      type: str
  sample:
    - pid: 5120
      user: nobody
      comm: python3
      why: too_many_descriptors
probe:
  description: What the probe asked for with O(probe) found; as M(gpuops.nvidia.nvidia_gpu_probe) returns it,
    with RV(probe.failure).
  returned: when O(probe) was given and the GPUs were released (not in check mode)
  type: dict
  contains:
    probed:
      description: Whether the CUDA library was found and the GPUs probed.
      type: bool
    library_missing:
      description: The CUDA driver library was missing and O(probe.missing_library=skip).
      type: bool
    gpus:
      description: One result per GPU probed (see M(gpuops.nvidia.nvidia_gpu_probe)'s C(gpus)).
      type: list
      elements: dict
    duration_ms:
      description: How long the probe took.
      type: float
    verified:
      description: The last pass of the probe on each GPU of the host, by UUID (see M(gpuops.nvidia.nvidia_gpu_probe)'s C(verified)).
      type: dict
    failure:
      description: Why the probe failed (each GPU that failed, the CUDA error), or null.
      type: str
  sample:
    probed: true
    library_missing: false
    gpus:
      - {index: 0, pci_bus_id: "00000000:18:00.0", ok: true, ms: 41.2, mib: 1024, released: true,
         call: null, error_code: null, error_name: null, error_string: null}
    duration_ms: 212.5
    failure: null
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils._module import exit_with_release, run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions, release, release_argument_spec


def main():
    module = AnsibleModule(argument_spec=release_argument_spec(), supports_check_mode=True)
    exit_with_release(module, lambda: run_with_reader(
        module, lambda reader, options: release(reader, options, check_mode=module.check_mode), ReleaseOptions.from_params),
        'release')


if __name__ == '__main__':
    main()
