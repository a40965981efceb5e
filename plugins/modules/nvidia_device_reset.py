#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: nvidia_device_reset
short_description: Reset the NVIDIA GPUs a release leaves needing a reset
version_added: 0.1.0
description:
  - The reset of the GPUs that M(gpuops.nvidia.nvidia_device_release) names in its
    RV(gpuops.nvidia.nvidia_device_release#module:reset_due) (O(reset_due)), or, without
    O(reset_due), the whole release followed by the reset of the GPUs it leaves needing one, as
    M(gpuops.nvidia.nvidia_device_release) with
    O(gpuops.nvidia.nvidia_device_release#module:reset_orphaned) names them. The role
    P(gpuops.nvidia.gpu_reset#role) calls it only on a host whose release named such a GPU, so
    that a clean host never loads the reset's code.
  - With O(reset_due), nothing is signalled. The host is read again first, and a GPU is reset only
    if it still needs it now - no process on it (a process of the job still there, another
    job's, or a foreign holder keeps it from the reset, and the task fails naming it), its memory
    still held when that was the only reason, no MIG instance in use on it.
  - For each GPU reset, persistence mode is switched off when it is on (C(nvidia-smi -i N -pm 0);
    it counts as a client of the device, and C(nvidia-persistenced) lets the GPU go), then
    C(nvidia-smi --gpu-reset -i N) runs, and persistence mode is switched back on whatever
    the reset did. On NVSwitch systems the reset GPUs must register with the NVLink fabric
    again, so the module waits, within O(timeout), until each reports the fabric state
    C(Completed) with status C(Success) (RV(escalation.fabric)); a GPU whose fabric does
    not come back is not released. The GPUs are then read again, so its
    RV(gpuops.nvidia.nvidia_device_release#module:gpus_after),
    RV(gpuops.nvidia.nvidia_device_release#module:orphaned_gpus) and
    RV(gpuops.nvidia.nvidia_device_release#module:released) tell the state after the reset;
    RV(escalation) tells what was done. A successful reset cures the GPU, so older Xid errors no
    longer count.
  - When nvidia-smi refuses the reset and names other GPUs with it (NVLink peers that the
    driver requires to be reset in the same command), the reset is tried once more with
    them, provided they are GPUs in scope that need a reset themselves. A refusal
    is reported in nvidia-smi's own words and fails the task.
  - A refusal that says the platform does not allow the reset (C(Unknown Error),
    C(Not Supported) or C(Insufficient Permissions) for the GPU, as on AWS bare metal and EKS,
    where the hypervisor blocks the function-level reset) names the GPU in
    RV(escalation.flr_refused), its recovery action in
    RV(gpuops.nvidia.nvidia_device_release#module:gpu_states) becomes V(reboot), and the
    failure says C(reset_refused) - a driver reload or a reboot is needed. With
    O(reset_reload_modules), the driver's kernel modules are reloaded instead.
  - The reset always runs through nvidia-smi (O(nvidia_smi_path)), whatever O(backend)
    reads the GPUs, and needs root. It fits in O(timeout); the read after it keeps its own.
    Restoring persistence mode is allowed a few seconds more.
  - Protected processes that hold a GPU to be reset (DCGM's host engine, dcgm-exporter, NVSM)
    are stopped for it through their systemd units, as O(reset_stop_units) allows.
  - It returns every value M(gpuops.nvidia.nvidia_device_release) returns, with RV(escalation).
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
    details: RV(escalation) says which GPUs would be reset, and why, and nothing is done.
  diff_mode:
    support: full
    details: The holders before and after, one line per process.
  platform:
    platforms: posix
options:
  reset_due:
    description:
      - The GPUs to reset and why, as RV(gpuops.nvidia.nvidia_device_release#module:reset_due)
        of M(gpuops.nvidia.nvidia_device_release) gives them. Each is read again first and reset
        only if it still needs it; nothing is signalled.
      - Left out, the module runs the whole release first (its signals included) and then resets
        the GPUs the release leaves needing a reset.
    type: list
    elements: dict
    suboptions:
      index:
        description: The GPU's index.
        type: int
        required: true
      reasons:
        description: Why it needs a reset.
        type: list
        elements: str
        required: true
  reset_reload_modules:
    description:
      - When the platform refuses a GPU's reset (RV(escalation.flr_refused)),
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
      - The systemd services that may be stopped for the reset, as shell globs
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
seealso:
  - module: gpuops.nvidia.nvidia_device_release
'''

EXAMPLES = r'''
- name: Free the GPUs, and name those that need a reset
  gpuops.nvidia.nvidia_device_release:
    reset_orphaned: true
  become: true
  register: release
  failed_when: release.failed and not release.reset_due

- name: Reset them, read again first
  gpuops.nvidia.nvidia_device_reset:
    reset_due: "{{ release.reset_due }}"
    timeout: 90
  become: true
  when: release.reset_due | length > 0

- name: Free the GPUs and reset those left with orphaned memory, in one task
  gpuops.nvidia.nvidia_device_reset:
    timeout: 90
  become: true
'''

RETURN = r'''
released:
  description:
    - Whether every GPU in scope is clean after the reset, as
      RV(gpuops.nvidia.nvidia_device_release#module:released) says of a release. The module also
      returns every other value of M(gpuops.nvidia.nvidia_device_release).
  returned: always
  type: bool
escalation:
  description:
    - What the reset did. Null when no reset was attempted (no GPU needed a reset, or a holder
      remained).
  returned: always
  type: dict
  contains:
    attempted:
      description: V(true) when nvidia-smi was asked to reset; V(false) in check mode, where
        nothing is done, and when no time was left to start the reset (the GPU's history then says
        C(not_attempted)).
      type: bool
    gpus:
      description: Indexes of the GPUs the reset was (or, in check mode, would be) tried on,
        the NVLink peers reset with them included.
      type: list
      elements: int
    gpus_reset:
      description: Indexes of the GPUs whose reset worked (all of RV(escalation.gpus) when
        RV(escalation.ok) is true). Where some worked and others did not, each is judged and
        recorded in its history as its own reset went; empty in check mode.
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
            C(name) (as in RV(gpuops.nvidia.nvidia_device_release#module:protected[].name)),
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
        device_nodes:
          description:
            - The device nodes a reload leaves stale (a module loaded again gets a new device
              major; C(modprobe) makes none of them again), made again with C(nvidia-modprobe), the
              driver's own tool (beside O(nvidia_smi_path), else on C(PATH)) - C(-u -c 0) for
              C(/dev/nvidia-uvm) and C(nvidia-uvm-tools), C(-m) for C(/dev/nvidia-modeset), C(-f) with
              each MIG capability's procfs file for C(/dev/nvidia-caps/*).
            - C(made) the nodes there again, C(missing) those not (the reload is then not ok), C(gone)
              the capability nodes of MIG instances the reload ended. Containers started before the
              reload keep the old nodes and must be restarted (the message says so).
          type: dict
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
        device_nodes: {made: [/dev/nvidia-uvm, /dev/nvidia-uvm-tools], missing: [], gone: []}
        persistence_mode_off: [0, 1, 2, 3, 4, 5, 6, 7]
        persistence_mode_restored: true
    mig:
      description:
        - What the reset did to the MIG of each reset GPU that had MIG enabled or a MIG mode change
          pending, read before and after it as the driver reports it. A reset applies a pending MIG
          mode, and GPU and compute instances do not survive it.
        - Where the mode stayed enabled and no instance is there after the reset, the GPU and compute
          instances read before it are made again (C(nvidia-smi mig -cgi), C(-cci); new ids and MIG
          UUIDs) and proven (RV(escalation.mig[].restored)). The MIG mode is never changed. A layout not
          made again or not proven fails the release, naming the GPU, and holds the GPU for a person
          (RV(gpuops.nvidia.nvidia_device_release#module:held), and its history).
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
        restored:
          description:
            - The instances the reset ended, made again largest first as they were read before it, then
              read again and proven each - listed by the driver with its profile, no process and no memory
              used on it, its capability nodes there.
            - C(ok), C(made) (V(GI 5 2g.35gb), one per GPU instance made), C(problems) (what failed, in
              words) and C(after) (the layout read once they were made, as RV(escalation.mig[].after)).
          type: dict
          returned: when the GPU had instances before the reset and its MIG mode stayed enabled
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
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.escalation import Escalation, reset_argument_spec
from ansible_collections.gpuops.nvidia.plugins.module_utils._module import exit_with_release, run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions, release, release_argument_spec
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.reset_plan import due_from_entries


def argument_spec():
    spec = release_argument_spec()
    del spec['reset_orphaned']
    spec.update(reset_argument_spec())
    return spec


def options(params):
    return ReleaseOptions.from_params(dict(params, reset_orphaned=True))


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    try:
        due = None if module.params['reset_due'] is None else due_from_entries(module.params['reset_due'])
    except GpuopsError as exc:
        module.fail_json(msg=str(exc))
    exit_with_release(module, lambda: run_with_reader(
        module, lambda reader, parsed: release(reader, parsed, check_mode=module.check_mode, escalation=Escalation, due=due),
        options), 'reset')


if __name__ == '__main__':
    main()
