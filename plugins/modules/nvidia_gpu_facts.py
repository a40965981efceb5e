#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: nvidia_gpu_facts
short_description: Gather NVIDIA GPU state and the processes holding the GPUs
version_added: 0.1.0
description:
  - Reads every NVIDIA GPU on the host (memory, utilisation, temperature, persistence and
    compute mode, compute processes) and classifies it as free, busy, holding memory while
    idle (the signature of a hung distributed job), holding orphaned memory, needing a reset
    (the driver says so), or lost.
  - Only C([N/A]) and C([Not Supported]) mean that a value does not apply; every other bracketed
    value of nvidia-smi (C([GPU requires reset]), C([GPU is lost]), C([Unknown Error]),
    C([Insufficient Permissions]), ...) and every other NVML error is the driver's verdict on that
    GPU, which is then never free.
  - The kernel log is read on from where the last read on the host ended (kept in O(state_dir))
    and summarised per GPU and message, so an Xid storm costs a count.
  - Lists every process that holds a GPU device node, as C(fuser -v /dev/nvidia*) would, and
    marks NVIDIA's own daemons as protected.
  - Reports each GPU's health, Xid errors from the kernel log and the memory repair state
    (row remapping, page retirement), and the recovery action they call for.
  - With MIG enabled on a GPU, names each MIG device by GPU, GPU and compute instance and MIG UUID,
    with its memory, processes and device nodes (RV(ansible_facts.nvidia_gpus[].mig)).
  - Changes nothing on the host.
author:
  - gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.actiongroups
  - ansible.builtin.action_common_attributes.facts
  - gpuops.nvidia.gpu
  - gpuops.nvidia.gpu.memory_threshold
  - gpuops.nvidia.gpu.holders
attributes:
  action_group:
    membership: [gpuops.nvidia.nvidia]
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
options:
  timeout:
    description:
      - Seconds each read of the GPUs may take before it is abandoned and the module fails.
    type: float
    default: 10
  kernel_log:
    description:
      - "Where to read the kernel's C(NVRM:) messages (Xid errors, GPUs fallen off the bus) from
        instead of the default: C(/dev/kmsg), or a regular file of its records (C(PRIO,SEQ,USEC,FLAGS;MESSAGE),
        one a line, as a simulated host writes them) owned by root (or the user the module runs
        as) and writable by no group or other user."
      - When not set, the module runs C(journalctl -k) (journald's kernel transport, this boot only;
        later runs go on from the cursor kept in O(state_dir)), and C(dmesg --facility=kern) when
        that gives nothing. Reading either may need privilege escalation; when no kernel log can
        be read, RV(ansible_facts.nvidia_gpus[].health.xid_events) is null and the module warns.
      - Only what the kernel wrote counts. In C(/dev/kmsg) that is the records of facility 0;
        what userspace (root) writes there is filed as the user facility and is not counted. Its
        records are read on from the sequence number of the last read, a file of records from its
        offset (a rotated or truncated file from its start).
      - A syslog file such as C(/var/log/kern.log) is refused with a warning (and
        RV(ansible_facts.nvidia_gpus[].health.xid_events) is null), as any local user can
        C(logger -t kernel -p kern.err) a line that the syslog daemon writes exactly as the kernel's.
      - A read takes at most 64 MiB of new records, in 16 MiB chunks, the position saved after
        each; more new text than that is skipped from the oldest, with a warning and
        RV(ansible_facts.nvidia_kernel_log.skipped_bytes).
    type: path
seealso:
  - module: gpuops.nvidia.nvidia_device_release
'''

EXAMPLES = r'''
- name: Read the GPUs and who holds them
  gpuops.nvidia.nvidia_gpu_facts:
  become: true

- name: Show GPUs holding memory while idle (hung job)
  ansible.builtin.debug:
    msg: "GPU {{ item.index }} holds {{ item.memory_used_mib }} MiB at 0 %"
  loop: "{{ ansible_facts.nvidia_gpus | selectattr('state', 'equalto', 'idle_holding') }}"

- name: Use a driver installed outside PATH, and only count the GPU nodes
  gpuops.nvidia.nvidia_gpu_facts:
    backend: nvidia-smi
    nvidia_smi_path: /opt/nvidia/bin/nvidia-smi
    devices:
      - /dev/nvidia[0-9]*
    timeout: 5

# journalctl -k, the default, holds only what the kernel wrote (_TRANSPORT=kernel). On a host
# without the journal, read /dev/kmsg itself: its records of the kernel's facility are the
# kernel's alone. A syslog file (/var/log/kern.log) is refused: anyone can write a line there.
- name: Read Xid errors from /dev/kmsg, through NVML
  gpuops.nvidia.nvidia_gpu_facts:
    backend: nvml
    kernel_log: /dev/kmsg

- name: GPUs that need more than an application restart
  ansible.builtin.debug:
    msg: "GPU {{ item.index }}: {{ item.health.recovery_action }}"
  loop: "{{ ansible_facts.nvidia_gpus | rejectattr('health.recovery_action', 'in', ['none', 'restart_app']) }}"
'''

RETURN = r'''
ansible_facts:
  description: Facts about the host's NVIDIA GPUs.
  returned: success
  type: dict
  contains:
    nvidia_gpus:
      description:
        - One entry per GPU, sorted by index, then the GPUs the host has on its PCI bus that
          the driver or O(backend) does not list (a GPU that fell off the bus at boot), with
          RV(ansible_facts.nvidia_gpus[].index) null, RV(ansible_facts.nvidia_gpus[].state=lost) and the reason in
          RV(ansible_facts.nvidia_gpus[].error), in PCI bus order.
      returned: success
      type: list
      elements: dict
      contains:
        index:
          description:
            - The GPU's index as nvidia-smi numbers it.
            - Null for a GPU on the PCI bus that the driver does not list (see
              RV(ansible_facts.nvidia_gpus[].error)), and for a lost GPU that nvidia-smi names
              by its bus id but does not answer for under any index.
          type: int
          sample: 0
        uuid:
          description: The GPU's UUID.
          type: str
          sample: GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b11
        name:
          description: The product name.
          type: str
          sample: NVIDIA H200
        pci_bus_id:
          description: The PCI bus id, in nvidia-smi's C(00000000:18:00.0) form.
          type: str
          sample: "00000000:18:00.0"
        minor_number:
          description:
            - The driver's minor number of the GPU, the N of its C(/dev/nvidiaN) device node, from
              C(/proc/driver/nvidia/gpus) under O(host_root) (or NVML when that cannot be read).
            - It need not equal RV(ansible_facts.nvidia_gpus[].index). Null when unknown.
          type: int
          sample: 0
        memory_total_mib:
          description: Total memory in MiB.
          type: int
          sample: 143771
        memory_used_mib:
          description:
            - Memory allocated, in MiB, as C(nvidia-smi) shows it (NVML v2 C(used)), without the
              memory the driver reserves. Idle GPUs read a few MiB, not always 0.
            - On an older driver whose NVML has no v2 memory call it is NVML v1 C(used), which
              includes the reserved memory; the module then warns.
          type: int
          sample: 76113
        memory_free_mib:
          description: Free memory, in MiB (total less reserved and used).
          type: int
          sample: 67143
        memory_reserved_mib:
          description:
            - Memory the driver and firmware reserve, in MiB (C(nvidia-smi --query-gpu=memory.reserved),
              NVML v2 C(reserved)); not part of RV(ansible_facts.nvidia_gpus[].memory_used_mib).
            - Null when the driver does not report it apart (older drivers).
          type: int
          sample: 515
        utilization_gpu_pct:
          description: GPU utilisation, in percent, over the driver's last sample period.
          type: int
          sample: 0
        temperature_c:
          description: Core temperature in degrees Celsius.
          type: int
          sample: 34
        persistence_mode:
          description: Whether persistence mode is on.
          type: bool
          sample: true
        compute_mode:
          description: The compute mode, as nvidia-smi names it.
          type: str
          sample: Default
        processes:
          description: Compute processes using this GPU, as the driver reports them.
          type: list
          elements: dict
          contains:
            pid:
              description: Process id.
              type: int
            name:
              description:
                - Process name as the driver reports it; bytes that are not UTF-8 become
                  replacement characters.
                - Null when the driver cannot name the process (C([Not Found]),
                  C([Insufficient Permissions])).
              type: str
            used_memory_mib:
              description: Memory the process uses on this GPU, in MiB.
              type: int
        history:
          description:
            - The GPU's history, by its UUID, kept across reboots in C(/var/lib/gpuops) (under
              O(host_root) on a simulated host) - C(events) the newest 10 (C(time), C(kind) one of
              C(reset), C(reset_failed), C(reboot_asked), C(cure), C(cure_failed), C(probe),
              C(not_attempted), C(index), C(reason), C(how) or C(result), C(outcome) of an attempt, with
              C(proof), C(why), C(to) or C(duration_s), C(count) when repeated), C(counts) the events of each
              kind in the last C(1d), C(7d) and C(30d). Null when the UUID is not known.
          type: dict
        health:
          description: Errors the driver logged for this GPU and its memory repair state.
          type: dict
          contains:
            xid_events:
              description:
                - The driver's messages about this GPU in the kernel log (matched by PCI bus id),
                  one entry per kind and Xid code, in the order of their first appearance (a
                  storm of one Xid is one entry with its count).
                - The driver's messages that it hung (kind C(driver_hung)) count for the GPU
                  whose bus id they name. One that names none is the host's
                  (RV(ansible_facts.nvidia_kernel_log.host_events)), and counts for a GPU only
                  where its own reads bear it out (a read that hangs in the driver, the driver's
                  word that it requires a reset, its recovery action).
                - Null when no kernel log could be read (see O(kernel_log)).
              type: list
              elements: dict
              contains:
                code:
                  description:
                    - The Xid number.
                    - "Null for the driver's messages without one: a GPU fallen off the bus
                      (C(NVRM: The NVIDIA GPU 0000:b3:00.0 ... fallen off the bus)), one it
                      could not initialise (C(NVRM: GPU 0000:98:00.0: RmInitAdapter failed!)), or
                      the driver hung in a full-chip reset (its assertions naming
                      C(NV_ERR_GPU_IN_FULLCHIP_RESET)): C(driver_hung), whose recovery action is a reboot."
                  type: int
                  sample: 79
                kind:
                  description: What the message is.
                  type: str
                  choices: [xid, fallen_off_bus, init_failed, driver_hung]
                  sample: xid
                count:
                  description: How many times the log has it.
                  type: int
                  sample: 1
                first_time:
                  description: When the first of them was logged, as the last one's RV(ansible_facts.nvidia_gpus[].health.xid_events[].time).
                  type: str
                time:
                  description:
                    - When the last of them was logged, in ISO 8601 (as C(journalctl -k) and
                      C(dmesg) print it; for a C(/dev/kmsg) record, the boot time plus its
                      microseconds since boot, in UTC).
                    - Null when the line has no time stamp.
                  type: str
                  sample: "2025-03-05T12:34:56+0000"
                text:
                  description:
                    - The rest of the last line after the Xid number; the whole message, joined
                      into one line, when it carries no Xid.
                  type: str
                  sample: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
                texts:
                  description: The texts of the last few of them (at most 3), oldest first.
                  type: list
                  elements: str
                since_cure:
                  description:
                    - False when the last of them was logged before the GPU's last cure
                      (RV(ansible_facts.nvidia_gpus[].health.last_cure)), history that
                      RV(ansible_facts.nvidia_gpus[].health.recovery_action) no longer counts.
                    - True when there was no cure since, or the time stamp cannot be told.
                  type: bool
            driver_recovery_action:
              description:
                - The driver's own GPU Recovery Action (NVML field
                  C(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), C(nvidia-smi --query-gpu=gpu_recovery_action)),
                  on drivers from 565. V(none) the next job can run; V(reset_gpu) and
                  V(drain_and_reset) a GPU reset is needed
                  (RV(ansible_facts.nvidia_gpus[].state=reset_required)); V(reboot),
                  V(system_reboot), V(drain_p2p), V(recover_imex_domain) and V(bus_reset) ask for
                  more than a GPU reset (RV(ansible_facts.nvidia_gpus[].state=lost)); V(unknown) a
                  value this collection does not know.
                - Null on older drivers, which do not have it.
              type: str
              sample: none
            last_cure:
              description:
                - When the GPU was last cured in this boot (a successful GPU reset by
                  M(gpuops.nvidia.nvidia_device_release)), as recorded in O(state_dir), in UTC.
                - Null when it was not.
              type: str
              sample: "2026-11-30T10:00:05Z"
            remapped_rows_pending:
              description:
                - Whether rows are marked for remapping at the next GPU reset (Ampere and newer).
                - Null where the GPU or backend does not report it.
              type: bool
            remapped_rows_failure:
              description:
                - Whether a row remapping has failed on this GPU (Ampere and newer).
                - Null where the GPU or backend does not report it.
              type: bool
            retired_pages_pending:
              description:
                - Whether retired memory pages wait for the next GPU reset or driver reload
                  (GPUs before Ampere).
                - Null where the GPU or backend does not report it.
              type: bool
            recovery_action:
              description:
                - What the Xid errors since the last cure, the memory repair state, the driver's
                  own recovery action and a lost GPU call for, following NVIDIA's Xid catalogue
                  and memory error recovery guidance. The most severe applies, in this order.
                - V(none) nothing to do.
                - V(restart_app) the application that hit the error has to be restarted; the GPU
                  is usable.
                - V(reset_gpu) reset the GPU (C(nvidia-smi -r)) once no process uses it.
                - V(reboot) reboot the host (for example Xid 79, the GPU has fallen off the bus).
                - V(inspect) a person has to look (an Xid the catalogue does not map to an
                  action, a row remapping failure, a GPU that cannot be read for another reason).
              type: str
              choices: [none, restart_app, reset_gpu, reboot, inspect]
              sample: none
        state:
          description:
            - V(free) no process and memory used at or below O(memory_threshold_mib).
            - V(busy) processes are using the GPU.
            - V(idle_holding) processes hold memory at 0 % utilisation, the signature of a
              hung job.
            - V(orphaned_memory) memory is used but no process holds it; only a GPU reset frees it.
            - V(reset_required) the driver says the GPU needs a GPU reset (C([GPU requires reset])
              values, NVML's C(RESET_REQUIRED), its recovery action); the release's
              O(gpuops.nvidia.nvidia_device_release#module:reset_orphaned) resets it.
            - V(lost) the GPU could not be read, or the driver says that more than a GPU reset
              is needed (see RV(ansible_facts.nvidia_gpus[].error)).
            - A GPU whose RV(ansible_facts.nvidia_gpus[].error) is set is never free.
          type: str
          sample: idle_holding
        error:
          description:
            - "Why the GPU could not be read or cannot be used, or null. Besides nvidia-smi's own
              lines, C(the driver says: GPU requires reset (for temperature.gpu, ...)) for the
              driver's bracketed values and NVML errors, C(the driver's GPU recovery action is
              reset_gpu), and, for a GPU the reader does not list, where it is still seen."
          type: str
          sample: "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"
        mig:
          description:
            - The GPU's MIG (Multi-Instance GPU) mode and MIG devices; null for a GPU without MIG
              (nvidia-smi C([N/A]), NVML not supported) or when the reader cannot tell (a warning says why).
            - With MIG enabled, the GPU's own RV(ansible_facts.nvidia_gpus[].utilization_gpu_pct) is null
              (the driver does not report it), and its memory and processes are those of all its instances.
            - A fault of the GPU (an Xid, the driver's recovery action, a pending row remapping, a lost GPU) is each
              instance's (RV(ansible_facts.nvidia_gpus[].mig.instances[].health)). A MIG mode change that waits for a
              reset is named in a warning.
            - For a GPU the driver cannot read (lost), RV(ansible_facts.nvidia_gpus[].mig.mode_current) and
              RV(ansible_facts.nvidia_gpus[].mig.mode_pending) are null and its MIG devices are those the driver's
              C(/proc/driver/nvidia/capabilities/gpuN/mig) tree lists (without profile, UUID or memory); null when it lists none.
          type: dict
          contains:
            mode_current:
              description: The MIG mode now, V(enabled) or V(disabled) (nvidia-smi C(mig.mode.current)).
              type: str
            mode_pending:
              description:
                - The MIG mode after the next GPU reset, V(enabled) or V(disabled) (C(mig.mode.pending)); a mode that differs from
                  RV(ansible_facts.nvidia_gpus[].mig.mode_current) waits for a reset.
              type: str
            instances:
              description:
                - The GPU's MIG devices, one per compute instance of each GPU instance, in MIG device order
                  (as C(nvidia-smi -L) lists them); empty when MIG is disabled.
              type: list
              elements: dict
              contains:
                gpu_instance_id:
                  description: The GPU instance id (nvidia-smi's C(GI ID)).
                  type: int
                compute_instance_id:
                  description: The compute instance id within the GPU instance (C(CI ID)).
                  type: int
                profile:
                  description: The GPU instance profile.
                  type: str
                  sample: 1g.18gb
                uuid:
                  description: The MIG device's UUID, the name jobs are given in C(CUDA_VISIBLE_DEVICES).
                  type: str
                  sample: MIG-feb88891-0321-5fef-9c87-d4af3b54259e
                memory_used_mib:
                  description: Memory used on the GPU instance (shared by its compute instances), in MiB.
                  type: int
                memory_total_mib:
                  description: Memory of the GPU instance, in MiB.
                  type: int
                processes:
                  description:
                    - The compute processes on this MIG device (C(pid), C(name), C(used_memory_mib)), as the
                      driver reports them.
                  type: list
                  elements: dict
                device_nodes:
                  description:
                    - The device nodes a process on this MIG device holds - the parent's C(/dev/nvidiaN) and
                      the C(/dev/nvidia-caps/nvidia-capM) of its GPU instance and of its compute instance, whose
                      minors come from C(/proc/driver/nvidia/capabilities/gpuN/mig/giG/access) and
                      C(.../giG/ciC/access) (N the GPU's minor number), under O(host_root).
                    - Only the parent's node when an access file cannot be read (a warning names it).
                  type: list
                  elements: str
                  sample: [/dev/nvidia1, /dev/nvidia-caps/nvidia-cap138, /dev/nvidia-caps/nvidia-cap139]
                health:
                  description:
                    - A fault of the parent GPU is each of its MIG devices' fault (an Xid, the driver's recovery
                      action, a pending row remapping, a lost or unreadable parent).
                  type: dict
                  contains:
                    recovery_action:
                      description: The parent's RV(ansible_facts.nvidia_gpus[].health.recovery_action).
                      type: str
                    parent_causes:
                      description: Why the parent calls for it, in words (the driver's word, the Xids since the last
                        cure, the parent's error); empty when it calls for nothing.
                      type: list
                      elements: str
                      sample: [Xid 95 since the last cure]
      sample:
        - index: 0
          uuid: GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b11
          name: NVIDIA H200
          pci_bus_id: "00000000:18:00.0"
          minor_number: 0
          memory_total_mib: 143771
          memory_used_mib: 76113
          memory_free_mib: 67143
          memory_reserved_mib: 515
          utilization_gpu_pct: 0
          temperature_c: 34
          persistence_mode: true
          compute_mode: Default
          processes:
            - pid: 4242
              name: python3
              used_memory_mib: 76113
          health:
            xid_events: []
            remapped_rows_pending: false
            remapped_rows_failure: false
            retired_pages_pending: null
            driver_recovery_action: none
            last_cure: null
            recovery_action: none
          state: idle_holding
          error: null
          mig:
            mode_current: disabled
            mode_pending: disabled
            instances: []
    nvidia_gpu_count:
      description: Number of GPUs found, the lost ones included.
      returned: success
      type: int
      sample: 8
    nvidia_driver_version:
      description: The NVIDIA driver version, or null when it could not be read.
      returned: success
      type: str
      sample: 550.127.05
    nvidia_gpu_backend:
      description: The backend that read the GPUs.
      returned: success
      type: str
      choices: [nvml, nvidia-smi]
      sample: nvml
    nvidia_device_holders:
      description: Every process holding a matching device node, sorted by pid.
      returned: success
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
          description: The matching device nodes it holds.
          type: list
          elements: str
        protected:
          description: True when the process is never signalled (see O(protect)).
          type: bool
      sample:
        - pid: 1201
          user: root
          comm: nvidia-persiste
          name: nvidia-persistenced
          cmdline: /usr/bin/nvidia-persistenced --user nvidia-persistenced
          devices: [/dev/nvidia0, /dev/nvidiactl]
          protected: true
    nvidia_module_holders:
      description:
        - The kernel modules that hold the driver's module C(nvidia), directly or through another
          (C(nvidia_drm) through C(nvidia_modeset)), as C(/sys/module) under O(host_root) shows
          them; empty when C(nvidia) is not loaded. Some keep the driver from resetting a GPU that
          no process holds (an idle C(nvidia_drm)).
      returned: success
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
      sample:
        - {name: nvidia_modeset, refcnt: 1, via: null}
        - {name: nvidia_uvm, refcnt: 0, via: null}
        - {name: nvidia_drm, refcnt: 0, via: nvidia_modeset}
    nvidia_kernel_log:
      description: What the read of the kernel log says of the host rather than of a GPU.
      returned: success
      type: dict
      contains:
        skipped_bytes:
          description:
            - The bytes of new kernel log passed over in this read, the oldest, because there
              was more than a read takes (64 MiB of records, the newest 32 MiB of
              C(journalctl)'s output); their messages are not counted. 0 when none.
          type: int
          sample: 0
        host_events:
          description:
            - The driver's messages that name no GPU (its assertions of a full-chip reset that
              hung, C(GPU0) being the driver's own number), summarised as
              RV(ansible_facts.nvidia_gpus[].health.xid_events) is. No GPU is held at fault for
              them unless its own reads say so.
          type: list
          elements: dict
          contains:
            kind:
              description: What the message is (C(driver_hung)).
              type: str
            count:
              description: How many times the log has it.
              type: int
            first_time:
              description: When the first of them was logged.
              type: str
            time:
              description: When the last of them was logged.
              type: str
            text:
              description: The last one's words after C(NVRM:).
              type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    DEFAULT_MEMORY_THRESHOLD_MIB,
    check_non_negative,
    holders_argument_spec,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gather_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import device_patterns
from ansible_collections.gpuops.nvidia.plugins.module_utils._module import run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir


def main():
    argument_spec = dict(
        timeout=dict(type='float', default=10.0),
        memory_threshold_mib=dict(type='int', default=DEFAULT_MEMORY_THRESHOLD_MIB),
        kernel_log=dict(type='path'),
    )
    argument_spec.update(reader_argument_spec())
    argument_spec.update(holders_argument_spec())
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params

    if params['timeout'] <= 0:
        module.fail_json(msg='timeout must be greater than zero, got %s' % params['timeout'])
    problem = check_non_negative(params, ['memory_threshold_mib', 'expected_gpus'])
    if problem:
        module.fail_json(msg=problem)
    (facts, read_warnings), warnings = run_with_reader(module, lambda reader: gather_facts(
        reader, device_patterns(params['devices'], params['host_root']),
        params['protect'] + params['extra_protect'], params['memory_threshold_mib'],
        params['timeout'], params['kernel_log'], expected_gpus=params['expected_gpus'],
        state=StateDir.for_host(params['state_dir'], params['host_root']), history=History.for_host(params['host_root'], params['state_dir']), mig=True))
    for warning in warnings + read_warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == '__main__':
    main()
