#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: nvidia_gpu_probe
short_description: Prove that the next job can use each NVIDIA GPU, by allocating on it
version_added: 0.1.0
description:
  - Counters (memory used, processes listed, Xids logged) can read clean on a GPU that still
    fails the next job's first CUDA call. This module asks CUDA itself, on each GPU and in
    parallel.
  - For each GPU in scope it opens the CUDA driver API (C(libcuda.so.1), installed with every
    NVIDIA driver; no CUDA toolkit and no PyTorch needed) through Python's C(ctypes), addresses
    the GPU by its PCI bus id (C(cuDeviceGetByPCIBusId)), creates a context, allocates
    O(probe_mib) MiB, writes a pattern over all of it, reads both ends back and compares, frees
    the memory and destroys the context.
  - The CUDA calls run in a child process with a deadline. A hung C(cuInit) cannot be
    interrupted; the child is then killed with everything it started, which frees its contexts.
    E(CUDA_VISIBLE_DEVICES) and E(CUDA_DEVICE_ORDER) are removed from the child's environment,
    so they never hide or renumber a GPU.
  - After the child has exited, the module reads the GPUs until none shows the probe's memory
    (its process listed, or memory used above what it read before and above
    O(memory_threshold_mib)), so that the probe is never what the next job finds.
  - A GPU whose probe fails, or whose probe memory is still held when O(timeout) runs out, fails
    the task with a message that names the GPU (index and bus id), the CUDA call and the CUDA
    error (C(cuGetErrorName), C(cuGetErrorString)); every GPU's result is still returned.
  - A GPU proven so (its probe passed and its memory was released) is recorded as cured in
    O(state_dir), as a successful GPU reset is, so that its older Xid errors no longer count in
    its health (see M(gpuops.nvidia.nvidia_gpu_facts)). Nothing else on the host changes. In
    check mode nothing is probed or recorded; the GPUs in scope are read and listed with
    RV(gpus[].ok) null.
author:
  - gpuops maintainers (@gpuops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.actiongroups
  - gpuops.nvidia.gpu
  - gpuops.nvidia.gpu.memory_threshold
attributes:
  action_group:
    membership: [gpuops.nvidia.nvidia]
  check_mode:
    support: full
    details: In check mode no GPU is probed.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  gpus:
    description:
      - Probe only these GPUs (indexes as nvidia-smi numbers them). Each is addressed by the PCI
        bus id the reader gives for it, never by CUDA's device order.
      - By default every GPU is probed. A lost GPU in scope (unreadable, or on the PCI bus but
        not listed by the driver) is not probed and fails the task.
      - An index that the host does not have, or an empty list, is an error.
    type: list
    elements: int
  probe_mib:
    description:
      - MiB to allocate and write on each GPU. A CUDA context costs a few hundred MiB more.
      - The default proves that memory the counters call free can be allocated and written,
        across many of the driver's pages, in about a millisecond of writing; a job that starts
        at the same moment loses 1 GiB for well under a second.
      - When the GPU has less free memory than this, the probe fails with
        C(CUDA_ERROR_OUT_OF_MEMORY).
    type: int
    default: 1024
  timeout:
    description:
      - Seconds the whole probe may take, the reads of the GPUs and the wait for the probe's
        memory to be released included. A child that has not answered by then is killed, and
        each GPU it probed fails with RV(gpus[].error_name=PROBE_TIMEOUT).
      - One second of it is kept from the child for the reads after it, and no call is started with
        less than half a second left for it. At least 2.
    type: float
    default: 30
  missing_library:
    description:
      - What to do when C(libcuda.so.1) cannot be loaded or lacks an entry point the probe
        calls (no NVIDIA driver, a container without the driver's libraries).
      - V(fail) fails the task, naming the library and why.
      - V(skip) probes nothing, returns RV(library_missing=true) and warns.
    type: str
    choices: [fail, skip]
    default: fail
  cuda_library:
    description:
      - The CUDA driver library to load, as a name the dynamic loader looks up (E(LD_LIBRARY_PATH),
        the loader's cache) or as a path.
    type: str
    default: libcuda.so.1
requirements:
  - The NVIDIA driver's C(libcuda.so.1) on the managed host (no CUDA toolkit).
notes:
  - What the probe proves, what it does not, and what it costs are in the collection's README,
    section "Proof by allocation".
  - The probe's context and allocation show for a moment as a compute process on each GPU, as
    any CUDA program's would.
seealso:
  - module: gpuops.nvidia.nvidia_device_release
  - module: gpuops.nvidia.nvidia_gpu_facts
'''

EXAMPLES = r'''
- name: Prove every GPU usable before the next job
  gpuops.nvidia.nvidia_gpu_probe:
  become: true

- name: Probe GPUs 2 and 3 with 4 GiB each, through nvidia-smi
  gpuops.nvidia.nvidia_gpu_probe:
    gpus: [2, 3]
    probe_mib: 4096
    backend: nvidia-smi
    timeout: 10

- name: On hosts that may lack the driver's libraries, go on without the probe
  gpuops.nvidia.nvidia_gpu_probe:
    missing_library: skip
  register: probe

- name: GPUs whose probe failed, with the CUDA error
  ansible.builtin.debug:
    msg: "GPU {{ item.index }} ({{ item.pci_bus_id }}): {{ item.error_name }}"
  loop: "{{ probe.gpus | rejectattr('ok') }}"
'''

RETURN = r'''
probed:
  description: Whether the CUDA probe ran (false in check mode, with RV(library_missing), or with no readable GPU in scope).
  returned: always
  type: bool
  sample: true
library_missing:
  description: True when C(libcuda.so.1) could not be used and O(missing_library=skip); nothing was probed.
  returned: always
  type: bool
  sample: false
duration_ms:
  description: Milliseconds the module took, from the first read to the probe's memory released.
  returned: always
  type: float
  sample: 412.7
gpus:
  description: One result per GPU in scope, in the reader's order (lost GPUs last).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index as nvidia-smi numbers it; null for a GPU the driver does not list.
      type: int
      sample: 0
    pci_bus_id:
      description: The PCI bus id the probe addressed the GPU by, in nvidia-smi's form.
      type: str
      sample: "00000000:18:00.0"
    ok:
      description:
        - True when the context, the allocation, the write, the read back, the free and the
          context's destruction all succeeded, the pattern read back was the one written, and the
          probe's memory was released.
        - Null when nothing was probed (check mode, O(missing_library=skip)).
      type: bool
      sample: true
    ms:
      description: Milliseconds this GPU's probe took inside the child, context creation and destruction included.
      type: float
      sample: 183.2
    mib:
      description: MiB the probe allocated on the GPU (0 when the allocation did not happen).
      type: int
      sample: 1024
    released:
      description:
        - Whether the reader showed the probe's memory released before the module returned.
        - Null when nothing was probed on this GPU.
      type: bool
      sample: true
    call:
      description: The CUDA driver API call that failed, such as C(cuCtxCreate_v2) or C(cuMemAlloc_v2); null otherwise.
      type: str
      sample: cuMemAlloc_v2
    error_code:
      description: The CUresult of the failed call, as numbered in C(cuda.h); null otherwise.
      type: int
      sample: 2
    error_name:
      description:
        - The CUDA error's name (C(cuGetErrorName)), such as C(CUDA_ERROR_DEVICE_UNAVAILABLE),
          C(CUDA_ERROR_OUT_OF_MEMORY), C(CUDA_ERROR_ECC_UNCORRECTABLE) or C(CUDA_ERROR_NO_DEVICE).
        - The probe's own names where CUDA gave none - V(PATTERN_MISMATCH) (the read back differs),
          V(PROBE_TIMEOUT) (the child was killed at O(timeout)), V(PROBE_ERROR) (the child died or
          printed no answer), V(PROBE_MEMORY_HELD) (the probe's memory still read as used at
          O(timeout)), V(GPU_LOST) (the GPU cannot be read, and was not probed).
        - Null when the probe succeeded.
      type: str
      sample: CUDA_ERROR_OUT_OF_MEMORY
    error_string:
      description: The CUDA error's description (C(cuGetErrorString)) or the probe's words; null when it succeeded.
      type: str
      sample: out of memory
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils._module import run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import ProbeOptions, probe, probe_argument_spec


def main():
    module = AnsibleModule(argument_spec=probe_argument_spec(), supports_check_mode=True)
    result, warnings = run_with_reader(
        module, lambda reader, options: probe(reader, options, check_mode=module.check_mode),
        ProbeOptions.from_params)
    for warning in warnings + result.warnings:
        module.warn(warning)
    if result.failure:
        module.fail_json(msg=result.failure, **result.dump())
    module.exit_json(**result.dump())


if __name__ == '__main__':
    main()
