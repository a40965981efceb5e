# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    # The release's options, shared by nvidia_device_release and nvidia_device_reset (which runs
    # the release before its reset); the return values named are nvidia_device_release's.
    DOCUMENTATION = r'''
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
        two); memory still held then is orphaned (RV(gpuops.nvidia.nvidia_device_release#module:orphaned_gpus)), and the task fails at once
        unless they are to be reset (M(gpuops.nvidia.nvidia_device_reset)).
      - The GPUs' health (the driver's verdicts, its recovery action, remapped rows, ECC, the
        fields the driver knows) is read once, at the start and again after a GPU reset; the
        reads while waiting read only the memory, the utilisation and the processes.
      - With V(false) the module returns right after signalling; RV(gpuops.nvidia.nvidia_device_release#module:released) then tells
        whether the GPUs happened to be clean already and RV(gpuops.nvidia.nvidia_device_release#module:orphaned_gpus) stays empty.
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
        Xid errors read at the end, in RV(gpuops.nvidia.nvidia_device_release#module:facts_after), in the shape of the facts of
        M(gpuops.nvidia.nvidia_gpu_facts), so that the outcome can be judged without another
        task. The C(gpuops.nvidia.gpu_reset) role asks for it when it judges the GPUs with a
        clean query of the user's own.
      - Costs one more scan of C(/proc) and a read of the kernel log, within O(timeout). Left out,
        with a warning, when the last read of the GPUs failed. Memory, utilisation and processes
        are those of the last read; the other values those of the first (or of the read after a
        GPU reset).
    type: bool
    default: false
  hold_after_cures:
    description:
      - A GPU that needs a reset, whose fault comes back after this many cures tried (GPU
        resets that worked, reboots the Slurm hook asked for) within O(hold_window_days), as its
        history on the host says (C(/var/lib/gpuops), under O(host_root) on a simulated host), is
        not reset again - it is not released, RV(gpuops.nvidia.nvidia_device_release#module:held) and the message name the GPU, the fault
        and the cures tried, for a person. A GPU held once stays held until its history is cleared.
      - Between 1 and 100.
    type: int
    default: 2
  hold_window_days:
    description:
      - The window, in days, in which O(hold_after_cures) cures and the resets of O(reset_budget) are
        counted. More than 0, at most 365.
    type: float
    default: 7.0
  reset_budget:
    description:
      - The GPU resets a GPU may be given within O(hold_window_days), those that worked and those
        that failed, as its history on the host says. A GPU that needs a reset once its budget is
        spent is not reset again - it is not released, and RV(gpuops.nvidia.nvidia_device_release#module:held)
        and the message name the GPU, the fault, the resets and the budget, for a person. Its
        history records it held (outcome V(held)), and it stays held until its history is cleared.
      - Between 1 and 100.
    type: int
    default: 3
  kernel_log:
    description:
      - Where to read the kernel's Xid messages from for the GPUs' health (RV(gpuops.nvidia.nvidia_device_release#module:released),
        RV(gpuops.nvidia.nvidia_device_release#module:gpu_states[].recovery_action)) and the reasons to reset, instead of C(journalctl -k)
        (journald's kernel transport), then C(dmesg --facility=kern). It names C(/dev/kmsg) (its records
        of the kernel's facility), or a root-owned file of its records, as in
        M(gpuops.nvidia.nvidia_gpu_facts) (O(gpuops.nvidia.nvidia_gpu_facts#module:kernel_log)).
      - A syslog file such as C(/var/log/kern.log) is refused with a warning, and no health is read
        from it, as any local user can C(logger -t kernel -p kern.err) a line there that reads exactly
        as the kernel's.
    type: path
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
        no list read before it); it is reported in RV(gpuops.nvidia.nvidia_device_release#module:other_jobs). Whose a process is, is read again
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
            is not signalled (reported in RV(gpuops.nvidia.nvidia_device_release#module:other_jobs) as V(jobs_unknown)).
        type: str
  probe:
    description:
      - Prove the GPUs this release left clean by allocation, in the same module call, as
        M(gpuops.nvidia.nvidia_gpu_probe) does (the action P(gpuops.nvidia.gpu_reset#module) asks
        for it, so that its usual path stays one module call). Only after a release that ends
        released, and never in check mode; not the GPUs of O(job.shared_gpus), which other jobs
        may be using.
      - The result is RV(gpuops.nvidia.nvidia_device_release#module:probe). A probe that fails does not fail the release (the GPUs were
        released); RV(gpuops.nvidia.nvidia_device_release#module:probe.failure) says why.
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
        description: What a host without the CUDA driver library gets, V(skip) (noted in RV(gpuops.nvidia.nvidia_device_release#module:probe)) or V(fail).
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
'''
