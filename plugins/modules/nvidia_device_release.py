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
  gpus:
    description:
      - Release only these GPUs (indexes as nvidia-smi numbers them). The holders of their
        C(nvidiaN) device nodes among the nodes matching O(devices) are stopped, found on the
        host by device identity; a holder that the driver places only on other GPUs (NVML and
        CUDA open every GPU's node on hosts without device cgroups) is left to their release.
      - What the driver reports is a hint, never proof that a pid may be signalled. A reported
        pid whose descriptors hold no node of these GPUs is not signalled (one whose descriptors
        cannot be read is, once two reads report it and it started before the first).
      - A GPU's node is the one of its minor number, which the driver gives in
        C(/proc/driver/nvidia/gpus) and which need not equal its index.
      - Processes that hold only shared nodes (C(nvidiactl), C(nvidia-uvm)) are then left
        alone, since every CUDA process on the host holds those.
      - By default every holder of every matching node is stopped and every GPU is checked.
        An empty list is an error, not "no GPU".
      - A MIG instance is named V(N:G) (GPU N, its GPU instance G, with each of its compute
        instances), V(N:G:C) (compute instance C of it) or by its MIG UUID (C(MIG-...)). Its
        holders are the processes that hold the caps node of its compute instance
        (C(/dev/nvidia-caps/nvidia-capM), M from the driver's C(/proc/driver/nvidia/capabilities)),
        found by device identity whatever O(devices) says, or that the driver places on it; a
        process that holds only the parent's C(nvidiaN) (as every MIG process does) or a sibling
        instance's node is not one. The instance is judged by its own memory and processes, and
        never reset (a reset of its GPU would end the other instances).
      - A whole GPU with MIG on means every instance of it. An instance the host does not have
        is an error, before any signal.
    type: list
    elements: raw
  signals:
    description:
      - The signals sent in turn to each holder, waiting up to O(grace_period) after each one
        for the process to exit. Names with or without C(SIG), or numbers.
      - Only signals that end a process are accepted. C(STOP), C(TSTP), C(TTIN), C(TTOU),
        C(CONT), C(CHLD), C(URG) and C(WINCH) are refused, since they would leave the job, and its GPU
        memory, frozen or untouched.
      - The ladder must fit in O(timeout), so O(grace_period) times the number of signals less
        one must be less than O(timeout).
    type: list
    elements: str
    default: [TERM, KILL]
  grace_period:
    description:
      - Seconds to wait after each signal for the holders to exit before the next signal.
      - Near the end of O(timeout) the waits are shortened so that every holder still gets the
        rest of its ladder in time.
    type: float
    default: 5
  wait:
    description:
      - Wait until no unprotected holder is left and every GPU in scope reports memory used at
        or below O(memory_threshold_mib), and fail when that does not happen within O(timeout).
      - Memory that no process holds is waited for 5 seconds, counted from the first read that
        finds it so (a driver frees a process's memory as the process exits, within a second or
        two); memory still held then is orphaned (RV(orphaned_gpus)), and the task fails at once
        unless O(reset_orphaned) resets those GPUs.
      - The GPUs' health (the driver's verdicts, its recovery action, remapped rows, ECC, the
        fields the driver knows) is read once, at the start and again after a GPU reset; the
        reads while waiting read only the memory, the utilisation and the processes.
      - With V(false) the module returns right after signalling; RV(released) then tells
        whether the GPUs happened to be clean already and RV(orphaned_gpus) stays empty.
    type: bool
    default: true
  timeout:
    description:
      - Seconds, counted from the start of the task and including the wait for O(lock_file),
        until the GPUs must be clean. It bounds the whole release, grace periods, newcomers and
        every read of the GPUs included (an C(nvidia-smi) that hangs is stopped in time).
        Signalling stops one second before it, so that a last read of the GPUs can report the state
        at the end.
      - No call to C(nvidia-smi), NVML or another program is started with less than half a second
        left for it (a real C(nvidia-smi) call takes 50 to 150 ms); when the time left is shorter,
        the step is not made and the message says where the time went, phase by phase.
      - A finite number of seconds, at least 2 (the GPUs are read at the start and at the end) and at
        most 2147483 (what C(poll) accepts).
    type: float
    default: 60
  settle_time:
    description:
      - Seconds, counted from the moment the last holder exited, to watch that no holder comes
        back before the GPUs count as released. A holder that comes back is stopped or reported
        as V(respawned).
      - The default covers a supervisor that restarts the job at once (systemd restarts a unit
        after C(RestartSec=100ms) by default). The window overlaps the driver's own release of
        the memory, so it costs nothing when the driver is slower. V(0) turns it off.
    type: float
    default: 1.0
  lock_file:
    description:
      - The file locked (C(flock)) while a release runs, so that two releases on one host do
        not interleave.
      - Defaults to C(/run/gpuops/nvidia-release.lock) for root, in a directory created with
        mode 0700 that must be root's own and writable by no one else (a world-writable place
        such as C(/run/lock) would let any user hold the lock or plant a link there). Without
        root, the default is in a private C(gpuops) directory under C($XDG_RUNTIME_DIR), or
        C(gpuops-UID) in the temporary directory, checked the same way.
      - The lock file is created with mode 0600. It is refused, with a message naming it, when
        it is a symbolic link, not a regular file (FIFO, device, directory), owned by another
        user or hard-linked. An existing file with other content is locked but never changed;
        the holder's PID is written only into an empty file or one holding a PID.
      - A lock file of your own must be in a directory that only root (or the user running the
        release) can write, below directories no other user can replace. One in C(/tmp),
        C(/run/lock) or any directory others can write, sticky or not, is refused before
        any GPU is read or any process signalled (anyone could create the name first and hold it).
      - When the lock is not free by O(timeout), the message names the process that holds it,
        as the kernel reports it (C(/proc/locks)).
    type: path
  facts_after:
    description:
      - Return the GPUs as the release read them last, with their holders and the kernel log's
        Xid errors read at the end, in RV(facts_after), in the shape of the facts of
        M(gpuops.nvidia.nvidia_gpu_facts), so that the outcome can be judged without another
        task. The C(gpuops.nvidia.gpu_reset) role asks for it when it judges the GPUs with a
        clean query of the user's own.
      - Costs one more scan of C(/proc) and a read of the kernel log, within O(timeout). Left out,
        with a warning, when the last read of the GPUs failed. Memory, utilisation and processes
        are those of the last read; the other values those of the first (or of the read after a
        GPU reset).
    type: bool
    default: false
  reset_orphaned:
    description:
      - When the release ends with GPUs in scope that need a GPU reset and no unprotected
        holder left, reset them. A GPU needs one when it is left with orphaned memory
        (RV(orphaned_gpus), memory used, no process), or when its health calls for a reset and
        nothing worse - the driver says so (C([GPU requires reset]), NVML's RESET_REQUIRED, a
        recovery action of reset), remapped rows or retired pages are pending, or the kernel
        log has an Xid since the GPU's last cure whose action in NVIDIA's Xid catalogue is a
        GPU reset (for example 95, 119, 120, or 154 naming a reset), read as
        M(gpuops.nvidia.nvidia_gpu_facts) reads it (O(kernel_log)). A GPU whose health calls
        for a reboot or for a person (Xid 79, 48) is not reset. RV(escalation.reasons) says why
        each GPU was reset.
      - For each such GPU, persistence mode is switched off when it is on (C(nvidia-smi -i N -pm 0);
        it counts as a client of the device, and C(nvidia-persistenced) lets the GPU go), then
        C(nvidia-smi --gpu-reset -i N) runs, and persistence mode is switched back on whatever
        the reset did. On NVSwitch systems the reset GPUs must register with the NVLink fabric
        again, so the module waits, within O(timeout), until each reports the fabric state
        C(Completed) with status C(Success) (RV(escalation.fabric)); a GPU whose fabric does
        not come back is not released. The GPUs are then read again, so RV(gpus_after),
        RV(orphaned_gpus) and RV(released) tell the state after the reset; RV(escalation)
        tells what was done. A successful reset cures the GPU, so older Xid errors no longer count.
      - When nvidia-smi refuses the reset and names other GPUs with it (NVLink peers that the
        driver requires to be reset in the same command), the reset is tried once more with
        them, provided they are GPUs in scope that need a reset themselves. A refusal
        is reported in nvidia-smi's own words and fails the task.
      - A refusal that says the platform does not allow the reset (C(Unknown Error),
        C(Not Supported) or C(Insufficient Permissions) for the GPU, as on AWS bare metal and EKS,
        where the hypervisor blocks the function-level reset) names the GPU in
        RV(escalation.flr_refused), its recovery action in RV(gpu_states) becomes V(reboot), and the
        failure says C(reset_refused) - a driver reload or a reboot is needed. With
        O(reset_reload_modules), the driver's kernel modules are reloaded instead.
      - The reset always runs through nvidia-smi (O(nvidia_smi_path)), whatever O(backend)
        reads the GPUs, and needs root. It fits in O(timeout); waiting for the driver to free
        memory that no process holds (see O(wait)) ends, at the latest, a third of O(timeout) (at
        least one second) before the signalling would, to leave that time to the reset; the read
        after it keeps its own. Restoring persistence mode is allowed a few seconds more.
      - Not attempted while a process other than a protected one still holds the devices
        (a warning says so), nor with O(wait=false). In check mode, RV(escalation) says which
        GPUs would be reset, and why, and nothing is done.
      - Protected processes that hold a GPU to be reset (DCGM's host engine, dcgm-exporter, NVSM)
        are stopped for it through their systemd units, as O(reset_stop_units) allows.
    type: bool
    default: false
  reset_reload_modules:
    description:
      - With O(reset_orphaned), when the platform refuses a GPU's reset (RV(escalation.flr_refused)),
        reload the NVIDIA driver's kernel modules instead of leaving the GPU to a reboot - only when
        every GPU of the host is idle (no process on any, none lost), no module that depends on
        C(nvidia) is in use (C(/sys/module/NAME/refcnt)), and, once the services of
        O(reset_stop_units) are stopped, no process holds a C(/dev/nvidia*) node (C(nvidia-persistenced)
        included, so stop it first).
      - Persistence mode is switched off where it is on, the modules that hold C(nvidia)
        (C(nvidia_drm), C(nvidia_modeset), C(nvidia_uvm), C(nvidia_peermem), ...) are unloaded with
        C(rmmod) in dependency order, then C(nvidia); all are loaded back with C(modprobe) in
        reverse order, persistence mode is restored, the stopped services are started again, and
        every GPU is checked back - bound to C(nvidia) on the PCI bus with the same minor number, and,
        on NVSwitch systems, registered with the fabric again. C(modprobe) and C(rmmod) are those
        beside O(nvidia_smi_path) when it is a path and they are there, else those on C(PATH).
      - A module that will not unload stops the reload, and what was unloaded is loaded back. Loading
        back is given a few seconds even past O(timeout). RV(escalation.module_reload) says what was
        done, or why not; when the reload did not happen or failed, the GPU's recovery action stays
        V(reboot). In check mode, RV(escalation.module_reload) says what would be reloaded.
    type: bool
    default: false
  hold_after_cures:
    description:
      - With O(reset_orphaned), a GPU whose fault comes back after this many cures tried (GPU
        resets that worked, reboots the Slurm hook asked for) within O(hold_window_days), as its
        history on the host says (C(/var/lib/gpuops), under O(host_root) on a simulated host), is
        not reset again - it is not released, RV(held) and the message name the GPU, the fault
        and the cures tried, for a person. A GPU held once stays held until its history is cleared.
      - Between 1 and 100.
    type: int
    default: 2
  hold_window_days:
    description:
      - The window, in days, in which O(hold_after_cures) cures are counted. More than 0, at most 365.
    type: float
    default: 7.0
  kernel_log:
    description:
      - Where to read the kernel's Xid messages from for the GPUs' health (RV(released),
        RV(gpu_states[].recovery_action)) and the reasons to reset, instead of C(journalctl -k)
        (journald's kernel transport), then C(dmesg --facility=kern). It names C(/dev/kmsg) (its records
        of the kernel's facility), or a root-owned file of its records, as in
        M(gpuops.nvidia.nvidia_gpu_facts) (O(gpuops.nvidia.nvidia_gpu_facts#module:kernel_log)).
      - A syslog file such as C(/var/log/kern.log) is refused with a warning, and no health is read
        from it, as any local user can C(logger -t kernel -p kern.err) a line there that reads exactly
        as the kernel's.
    type: path
  bug_report_dir:
    description:
      - When a GPU reset that was tried fails (nvidia-smi refused or failed it, or the fabric did not come back), run NVIDIA's
        C(nvidia-bug-report.sh) (the one beside O(nvidia_smi_path) when that is a path, else the
        one on C(PATH)), which NVIDIA support asks for, writing its report into this directory;
        its path is RV(escalation.bug_report.path).
      - The directory is created with mode 0700 when missing; an existing one must belong to
        the user the module runs as, with mode 0700, and not be a symbolic link (the report holds
        the host's kernel log and process list). It is opened without following a link, checked on
        the open directory, and C(nvidia-bug-report.sh) runs in that open directory (its working
        directory), so a swap for a link after the check does not redirect the report. No
        directory above it may be writable by another user (a sticky one, such as C(/tmp),
        excepted) either. Not set, no report is made.
    type: path
  bug_report_timeout:
    description:
      - Seconds C(nvidia-bug-report.sh) may run; after that it is stopped with everything it started.
        This comes on top of O(timeout), and only after a failed reset with O(bug_report_dir).
    type: float
    default: 120
  reset_stop_units:
    description:
      - The systemd services that may be stopped for a O(reset_orphaned) reset, as shell globs
        matched against unit names. The driver refuses a reset while any process has the GPU's
        device node open, and protected processes are never signalled; so before the reset, each
        protected process that holds a GPU to be reset is placed in its unit by its cgroup
        (C(/system.slice/nvidia-dcgm.service) is C(nvidia-dcgm.service)), the units this list
        allows are stopped (C(systemctl stop)), and after the reset, whatever it did, exactly
        those are started again and checked with C(systemctl is-active).
      - The entry C(nvidia-cuda-mps-control) allows the MPS control daemon, when it runs outside
        any service, to be asked to quit (C(echo quit | nvidia-cuda-mps-control), in its own
        C(CUDA_MPS_PIPE_DIRECTORY)); it is not started again. That program (the daemon's own
        file, else the one on C(PATH)) is opened without following a link, checked on the open
        file (a regular file of root's that no other user can write) and run from it.
      - A protected holder that no entry allows (its unit is not listed, it runs in no service,
        or the release itself runs in its unit) leaves the reset unattempted, and the message
        names it (pid, name, unit). So does a host where systemd does not run or C(systemctl) is
        missing. V([]) allows nothing to be stopped.
      - Every C(systemctl) call fits in O(timeout). Starting the units again (one C(systemctl start),
        given 15 s, and one C(systemctl is-active), 5 s) is kept in reserve, so the stops and the
        reset end 20 s before the end of O(timeout); a reset that cannot leave that reserve is not
        started, and the message says so. Should the reset run late, starting the units again is
        still given its seconds, past O(timeout). A SIGTERM ends the release through the restore.
      - "The default: C(nvidia-dcgm.service) (nv-hostengine), C(nvidia-dcgm-exporter.service)
        and C(dcgm-exporter.service), C(nvsm*.service) and C(nvidia-cuda-mps-control). NVIDIA's
        Kubernetes device plugin runs in a pod, not in a unit of its own: it is named, never stopped."
    type: list
    elements: str
    default: [nvidia-dcgm.service, nvidia-dcgm-exporter.service, dcgm-exporter.service, nvsm*.service, nvidia-cuda-mps-control]
  job:
    description:
      - The Slurm job this release runs for (the Slurm hooks fill it from C(SLURM_JOB_ID),
        C(SLURM_JOB_UID), C(gres.conf) and C(scontrol listpids)). Not set, the release acts as if
        no other job ran on the host.
      - A process's job is read on the host, never from what the process says, from its cgroup
        (C(/slurm/uid_U/job_N/...) on cgroup v1, C(/system.slice/slurmstepd.scope/job_N/...) on v2),
        else the pids O(job.live_jobs) lists for a job, with what they forked.
      - A process of another job is never signalled, whatever it holds, listed in O(job.live_jobs)
        or not (a job that ended is ended by slurmstepd; one Slurm started during this job's Epilog is on
        no list read before it); it is reported in RV(other_jobs). Whose a process is, is read again
        right before each round of signals (its cgroup; slurmd's list, with O(job.scontrol)).
        On a GPU of O(job.shared_gpus) only the job's own processes are signalled
        (in its cgroup, or, when O(job.live_jobs) is given, in no live job and of O(job.uid)); such a GPU is judged for the job
        alone while another job's process is on it (none of the job's processes left, whatever
        memory the others use), it is never reset then, and C(nvidia-cuda-mps-server) or
        C(nvidia-cuda-mps-control) on it is left running while another job's process uses it.
    type: dict
    suboptions:
      id:
        description: The job's id (C(SLURM_JOB_ID)), digits.
        type: str
        required: true
      uid:
        description:
          - The job's user (C(SLURM_JOB_UID)). On a shared GPU a process in no live job is the
            job's only when it runs as this user; not set, no such process is.
        type: int
      shared_gpus:
        description:
          - The GPUs in scope (nvidia-smi indexes) that Slurm may give to several jobs at once
            (C(gres/shard), C(gres/mps)).
        type: list
        elements: int
        default: []
      live_jobs:
        description:
          - The other jobs still on the node, each with the pids slurmd lists for it
            (C(scontrol listpids)); a mapping of job id to a list of pids, as read when the
            release began (O(job.scontrol) reads it again before each round of signals).
          - Not set, which jobs are still on the node is not known, and a process in no job's cgroup is
            then never taken for the job's own on a shared GPU.
        type: dict
      scontrol:
        description:
          - The C(scontrol) program. When set, C(scontrol listpids) is read again right before each
            round of signals, and a process that no cgroup places in a job counts as the job's only
            when that latest list still says so (nodes that track jobs without cgroups).
          - When the list cannot be read then, a process in no job's cgroup that is not of O(job.uid)
            is not signalled (reported in RV(other_jobs) as V(jobs_unknown)).
        type: str
  probe:
    description:
      - Prove the GPUs this release left clean by allocation, in the same module call, as
        M(gpuops.nvidia.nvidia_gpu_probe) does (the action P(gpuops.nvidia.gpu_reset#module) asks
        for it, so that its usual path stays one module call). Only after a release that ends
        released, and never in check mode; not the GPUs of O(job.shared_gpus), which other jobs
        may be using.
      - The result is RV(probe). A probe that fails does not fail the release (the GPUs were
        released); RV(probe.failure) says why.
    type: dict
    suboptions:
      mib:
        description: MiB allocated on each GPU (M(gpuops.nvidia.nvidia_gpu_probe)'s C(probe_mib)).
        type: int
        default: 1024
      level:
        description:
          - What the probe writes and checks on each GPU (M(gpuops.nvidia.nvidia_gpu_probe)'s
            C(probe_level)), V(allocation) (O(probe.mib) MiB) or V(memory) (all free memory).
        type: str
        choices: [allocation, memory]
        default: allocation
      missing_library:
        description: What a host without the CUDA driver library gets, V(skip) (noted in RV(probe)) or V(fail).
        type: str
        choices: [fail, skip]
        default: skip
      cuda_library:
        description: The CUDA driver library the probe loads.
        type: str
        default: libcuda.so.1
      timeout:
        description: Seconds the probe may take, after the release's O(timeout).
        type: float
        default: 30
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

- name: Free the GPUs, and reset those left with orphaned memory
  gpuops.nvidia.nvidia_device_release:
    reset_orphaned: true
    timeout: 90
  become: true
  register: release
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
    - What O(reset_orphaned) did. Null when no reset was attempted (the option is off, no GPU
      needed a reset, or a holder remained).
  returned: always
  type: dict
  contains:
    attempted:
      description: V(true) when nvidia-smi was asked to reset; V(false) in check mode, where
        nothing is done.
      type: bool
    gpus:
      description: Indexes of the GPUs the reset was (or, in check mode, would be) tried on,
        the NVLink peers reset with them included.
      type: list
      elements: int
    ok:
      description: Whether every reset succeeded and persistence mode was restored wherever it
        was switched off; null in check mode.
      type: bool
    message:
      description: What happened to each GPU, with nvidia-smi's own words (its refusal, for a
        GPU that another client still uses), and, when a reset failed, the kernel modules that
        hold C(nvidia) (RV(escalation.module_holders)).
      type: str
    persistence_mode_off:
      description: Indexes of the GPUs whose persistence mode was switched off for the reset
        (those where it was on); empty in check mode.
      type: list
      elements: int
    flr_refused:
      description: Indexes of the GPUs whose reset the platform refused (nvidia-smi said
        C(Unknown Error), C(Not Supported) or C(Insufficient Permissions) for them); a driver
        reload or a reboot is their cure, and their recovery action is V(reboot).
      type: list
      elements: int
    persistence_mode_restored:
      description: Whether persistence mode was switched back on on every GPU of
        RV(escalation.persistence_mode_off), whatever the reset did; null when it was switched
        off on none.
      type: bool
    quiesced:
      description: The protected processes that held the GPUs to be reset and what was done about
        them (O(reset_stop_units)); in check mode, what would be done.
      type: dict
      contains:
        held_by:
          description: Each protected process holding a GPU to be reset, with C(pid), C(comm),
            C(unit) (its systemd unit, null for none), C(gpus) and C(action) (V(stop), V(quit)
            for the MPS control daemon, or null when nothing may be done about it).
          type: list
          elements: dict
        to_stop:
          description: The units to stop for the reset.
          type: list
          elements: str
        mps_to_quit:
          description: Whether the MPS control daemon is to be asked to quit.
          type: bool
        refusal:
          description: Why the reset is not attempted (a holder nothing may be done about, no
            systemd); null when nothing stands in its way.
          type: str
        stopped:
          description: The units a stop was asked of (all of them are started again).
          type: list
          elements: str
        started:
          description: The units started again and active after the reset.
          type: list
          elements: str
        active_after:
          description: The state C(systemctl is-active) gives each stopped unit after the reset
            (V(active) when it came back).
          type: dict
        host_engines:
          description:
            - DCGM's host engine in each unit started again that runs it (C(nvidia-dcgm.service),
              C(dcgm.service), or a unit nv-hostengine was found in), once the unit is active -
              whether C(dcgmi discovery -l) answers within a few seconds; one that does not is
              restarted once (C(systemctl restart)) and asked again.
            - Empty when no such unit was stopped.
          type: list
          elements: dict
          contains:
            unit:
              description: The unit.
              type: str
            answers:
              description: Whether the host engine answered (at last); null when it was not asked
                (C(dcgmi) is not on E(PATH)).
              type: bool
            restarted:
              description: Whether the unit was restarted because its host engine did not answer.
              type: bool
            said:
              description: What C(dcgmi) (or C(systemctl restart)) said last when it did not answer,
                or why it was not asked; null when it answered.
              type: str
        mps_quit:
          description: Whether the MPS control daemon quit for the reset (it is not started again).
          type: bool
        problems:
          description: What went wrong stopping or starting them (also in the warnings).
          type: list
          elements: str
    reasons:
      description: Why each GPU of RV(escalation.gpus) was (or would be) reset - C(orphaned
        memory), the driver's words, C(remapped rows pending), C(retired pages pending),
        C(Xid 95 since the last cure) and the like.
      type: list
      elements: dict
      contains:
        index:
          description: The GPU's index.
          type: int
        reasons:
          description: Each reason, in words.
          type: list
          elements: str
    fabric:
      description: After a successful reset, each reset GPU's NVLink fabric registration as
        nvidia-smi reports it (C(fabric.state), C(fabric.status)).
      returned: when the reset succeeded
      type: list
      elements: dict
      contains:
        index:
          description: The GPU's index.
          type: int
        state:
          description: C(Completed), C(In Progress), C(Not Started), C([N/A]) on a GPU without
            an NVSwitch fabric; null when it could not be read.
          type: str
        status:
          description: C(Success), or the error of a registration that completed.
          type: str
        ok:
          description: Whether the GPU is ready for NVLink (registered with success), or has
            no fabric to register with.
          type: bool
        note:
          description: Why, when it is not plainly registered.
          type: str
          returned: when it is not C(Completed) with C(Success)
    problems:
      description: What is still wrong after the reset that the GPUs' readings do not show, one
        text per GPU - a fabric that did not come back, a failed reset of a GPU whose health (not
        its memory) called for it. Each also fails the release.
      returned: when a reset was attempted
      type: list
      elements: str
    module_holders:
      description:
        - The kernel modules that hold the driver's module C(nvidia), as C(/sys/module) (under
          O(host_root)) shows them - directly, or through another (C(nvidia_drm) through
          C(nvidia_modeset)). Some keep the driver from resetting a GPU although no process holds
          it (an idle C(nvidia_drm) makes C(nvidia-smi --gpu-reset) answer "In use by another
          client"); unloading one that nothing uses, when a person decides to, can let the reset
          through.
      returned: when a reset was attempted and failed
      type: list
      elements: dict
      contains:
        name:
          description: The module's name.
          type: str
        refcnt:
          description: Its use count (C(/sys/module/NAME/refcnt)); null when unreadable.
          type: int
        via:
          description: The module it holds C(nvidia) through; null when it holds C(nvidia) itself.
          type: str
    module_reload:
      description:
        - The reload of the driver's kernel modules after a reset the platform refused
          (O(reset_reload_modules)); the keys of RV(escalation) (its C(gpus) are every GPU of the
          host, C(flr_refused) those it was for, C(quiesced) the services stopped around it), and
          those below. C(attempted) false and C(message) say why it was not started (a GPU in use,
          a module in use, a process holding a device node, too little time). Once it worked,
          RV(escalation.ok) is true and RV(escalation.flr_refused) is empty.
      returned: when O(reset_reload_modules) and the platform refused a reset (in check mode, when a reset would be tried)
      type: dict
      contains:
        modules:
          description: The modules to unload, in order (the driver C(nvidia) last).
          type: list
          elements: str
        unloaded:
          description: Those unloaded with C(rmmod).
          type: list
          elements: str
        loaded:
          description: Those loaded back with C(modprobe), in order.
          type: list
          elements: str
        stopped_by:
          description: Why the reload stopped after it started (C(rmmod)'s refusal of a module in use,
            in its words); null when it did not stop.
          type: str
      sample:
        attempted: true
        ok: true
        gpus: [0, 1, 2, 3, 4, 5, 6, 7]
        flr_refused: [3]
        message: kernel modules nvidia_modeset, nvidia_uvm, nvidia unloaded and loaded again
        modules: [nvidia_modeset, nvidia_uvm, nvidia]
        unloaded: [nvidia_modeset, nvidia_uvm, nvidia]
        loaded: [nvidia, nvidia_uvm, nvidia_modeset]
        stopped_by: null
        persistence_mode_off: [0, 1, 2, 3, 4, 5, 6, 7]
        persistence_mode_restored: true
    mig:
      description:
        - What the reset did to the MIG of each reset GPU that had MIG enabled or a MIG mode change
          pending, read before and after it as the driver reports it (nothing is recreated). A reset
          applies a pending MIG mode, and GPU and compute instances do not survive it.
        - The reasons of RV(escalation.reasons) include a MIG mode change that waited for a reset, and a
          GPU with a MIG instance in use (a process on it, or its memory over O(memory_threshold_mib))
          is never reset.
      returned: when a reset was attempted on a GPU with MIG
      type: list
      elements: dict
      contains:
        index:
          description: The GPU's index.
          type: int
        uuid:
          description: The GPU's UUID.
          type: str
        before:
          description: C(mode_current), C(mode_pending) and C(instances) (each with C(gpu_instance_id),
            C(compute_instance_id), C(profile) and C(uuid), the MIG UUID) before the reset.
          type: dict
        after:
          description: The same after the reset; null when it could not be read.
          type: dict
        changes:
          description: What changed, in words (V(MIG mode disabled -> enabled), the instances gone by
            GPU instance, compute instance and MIG UUID); V(MIG unchanged) for nothing.
          type: list
          elements: str
      sample:
        - index: 3
          uuid: GPU-5e8d3f4a-1c2b-4d6e-8f90-a1b2c3d4e5f6
          before: {mode_current: enabled, mode_pending: disabled, instances: [{gpu_instance_id: 7, compute_instance_id: 0,
                   profile: 1g.18gb, uuid: MIG-240979d4-a82c-490c-8f64-7d2f8afa38ea}]}
          after: {mode_current: disabled, mode_pending: disabled, instances: []}
          changes: ['MIG mode enabled -> disabled', 'MIG instances gone: GI 7 CI 0 (MIG-240979d4-a82c-490c-8f64-7d2f8afa38ea)']
    bug_report:
      description: The C(nvidia-bug-report.sh) run after a failed reset (see O(bug_report_dir)).
      returned: when the reset failed and O(bug_report_dir) is set
      type: dict
      contains:
        path:
          description: The report's file; null when none was written.
          type: str
        ok:
          description: Whether it ran to the end and wrote its report.
          type: bool
        message:
          description: What happened, in words.
          type: str
  sample:
    attempted: true
    gpus: [3]
    ok: true
    message: 'GPU 3 reset: GPU 00000000:5D:00.0 was successfully reset. All done.'
    reasons: [{index: 3, reasons: [orphaned memory]}]
    fabric: [{index: 3, state: Completed, status: Success, ok: true}]
    persistence_mode_off: [3]
    persistence_mode_restored: true
    quiesced:
      held_by:
        - {pid: 2210, comm: nv-hostengine, unit: nvidia-dcgm.service, gpus: [3], action: stop}
      to_stop: [nvidia-dcgm.service]
      mps_to_quit: false
      refusal: null
      stopped: [nvidia-dcgm.service]
      started: [nvidia-dcgm.service]
      active_after: {nvidia-dcgm.service: active}
      host_engines: [{unit: nvidia-dcgm.service, answers: true, restarted: false, said: null}]
      mps_quit: false
      problems: []
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
        - V(reboot) for a GPU whose reset the platform refused (RV(escalation.flr_refused)).
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
      therefore not reset. The message starts with their reasons.
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
      fault back after its cures, C(probe) with C(result) pass or fail), C(index), C(reason),
      and C(count) when the same event repeated; C(counts) the events of each kind in the last
      C(1d), C(7d) and C(30d).
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

from ansible_collections.gpuops.nvidia.plugins.module_utils._module import run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release import (
    ReleaseOptions,
    release,
    release_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Terminated, sigterm_raises


def main():
    module = AnsibleModule(argument_spec=release_argument_spec(), supports_check_mode=True)
    # A SIGTERM (the Slurm hook stopping it at its deadline) ends the release through its finally
    # blocks: the units stopped for a reset are started again, the lock is let go.
    try:
        with sigterm_raises():
            result, warnings = run_with_reader(
                module, lambda reader, options: release(reader, options, check_mode=module.check_mode),
                ReleaseOptions.from_params)
    except Terminated:
        module.fail_json(msg='the release was stopped by SIGTERM before its end; the units it had stopped for a GPU reset, '
                             'if any, were asked to start again before it exited')
    for warning in warnings + result.warnings:
        module.warn(warning)
    values = result.dump(diff=module._diff)
    if result.failure:
        module.fail_json(msg=result.failure, **values)
    module.exit_json(**values)


if __name__ == '__main__':
    main()
