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
    idle (the signature of a hung distributed job), holding orphaned memory, or lost.
  - Lists every process that holds a GPU device node, as C(fuser -v /dev/nvidia*) would, and
    marks NVIDIA's own daemons as protected.
  - Changes nothing on the host.
author:
  - gpuops maintainers
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - gpuops.nvidia.gpu
  - gpuops.nvidia.gpu.holders
attributes:
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
  memory_threshold_mib:
    description:
      - Memory used, in MiB, at or below which a GPU with no process counts as free rather
        than holding orphaned memory.
    type: int
    default: 0
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
'''

RETURN = r'''
ansible_facts:
  description: Facts about the host's NVIDIA GPUs.
  returned: success
  type: dict
  contains:
    nvidia_gpus:
      description: One entry per GPU, sorted by index.
      returned: success
      type: list
      elements: dict
      contains:
        index:
          description: The GPU's index as nvidia-smi numbers it.
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
        memory_total_mib:
          description: Total memory in MiB.
          type: int
          sample: 143771
        memory_used_mib:
          description: Memory in use, in MiB.
          type: int
          sample: 76113
        memory_free_mib:
          description: Free memory, in MiB.
          type: int
          sample: 67658
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
              description: Process name as the driver reports it.
              type: str
            used_memory_mib:
              description: Memory the process uses on this GPU, in MiB.
              type: int
        state:
          description:
            - V(free) no process and memory used at or below O(memory_threshold_mib).
            - V(busy) processes are using the GPU.
            - V(idle_holding) processes hold memory at 0 % utilisation, the signature of a
              hung job.
            - V(orphaned_memory) memory is used but no process holds it; only a GPU reset frees it.
            - V(lost) the GPU could not be read (see RV(ansible_facts.nvidia_gpus[].error)).
          type: str
          sample: idle_holding
        error:
          description: Why the GPU could not be read, or null.
          type: str
          sample: "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"
      sample:
        - index: 0
          uuid: GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b11
          name: NVIDIA H200
          pci_bus_id: "00000000:18:00.0"
          memory_total_mib: 143771
          memory_used_mib: 76113
          memory_free_mib: 67658
          utilization_gpu_pct: 0
          temperature_c: 34
          persistence_mode: true
          compute_mode: Default
          processes:
            - pid: 4242
              name: python3
              used_memory_mib: 76113
          state: idle_holding
          error: null
    nvidia_gpu_count:
      description: Number of GPUs found.
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
      sample: nvidia-smi
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
          cmdline: /usr/bin/nvidia-persistenced --user nvidia-persistenced
          devices: [/dev/nvidia0, /dev/nvidiactl]
          protected: true
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils._backend import MissingLibraryError, select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    GpuopsError,
    check_non_negative,
    holders_argument_spec,
    reader_argument_spec,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._facts import gather_facts


def main():
    argument_spec = dict(
        timeout=dict(type='float', default=10.0),
        memory_threshold_mib=dict(type='int', default=0),
    )
    argument_spec.update(reader_argument_spec())
    argument_spec.update(holders_argument_spec())
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = module.params

    problem = check_non_negative(params, ['timeout', 'memory_threshold_mib'])
    if problem:
        module.fail_json(msg=problem)
    try:
        reader, warnings = select_reader(params['backend'], params['nvidia_smi_path'], params['timeout'])
        try:
            facts, read_warnings = gather_facts(
                reader, params['devices'], params['protect'] + params['extra_protect'],
                params['memory_threshold_mib'], params['timeout'])
        finally:
            reader.close()
    except MissingLibraryError as exc:
        module.fail_json(msg=exc.library, exception=exc.exception)
    except GpuopsError as exc:
        module.fail_json(msg=str(exc))
    for warning in warnings + read_warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == '__main__':
    main()
