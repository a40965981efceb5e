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
    the GPU by its PCI bus id (C(cuDeviceGetByPCIBusId)), creates a context, loads a small PTX
    module of the collection's own (C(cuModuleLoadDataEx); the driver compiles it), allocates
    O(probe_mib) MiB (or, with O(probe_level=memory), all the free memory), and launches two
    kernels on the GPU (C(cuLaunchKernel)) - one writes a pattern that depends on each word's
    address and a seed new at each run over every byte, the other reads every byte back and counts
    the words that differ. Only the counts are copied back, with the number of words each kernel
    covered, which proves that the kernels ran (a launch that silently did nothing fails). Then
    it frees the memory, unloads the module and destroys the context.
  - What a passed probe proves, per level - V(allocation) (the default), that a context can be
    made, the driver's JIT compiles and the GPU runs kernels, and O(probe_mib) MiB can be
    allocated, written and read back unchanged by the GPU itself; V(memory), the same of every
    MiB the driver calls free but 256 MiB. What it does not prove - that memory it did not cover
    is sound (at the V(allocation) level, the rest of the GPU), that the memory holds a value
    over time (it is read back within milliseconds), that NCCL works (peer copies and NVLinks are
    checked at the V(performance) level only), or that the GPU stays sound under sustained load (no
    stress test). DCGM's diagnostics test those, in minutes.
  - Each GPU is probed by a child process of its own, all at once, each with the same deadline.
    A hung CUDA call cannot be interrupted; a child that has not answered by then is killed with
    everything it started, which frees its contexts, and its GPU fails with the call it hung in.
    A child that crashes fails its GPU alone. The other GPUs keep their results.
  - Each child sees only its own GPU, by UUID (E(CUDA_VISIBLE_DEVICES) set to the UUID the
    driver reports), so its C(cuInit) brings up no other GPU; the caller's
    E(CUDA_VISIBLE_DEVICES) and E(CUDA_DEVICE_ORDER) never reach it, so they never hide or
    renumber a GPU.
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
      - Not used with O(probe_level=memory).
    type: int
    default: 1024
  probe_level:
    description:
      - How much of each GPU the kernels write and check.
      - V(allocation) - O(probe_mib) MiB. At HBM bandwidth the kernels take about a millisecond
        per GiB; the probe's time is the driver's context creation and JIT.
      - V(memory) - all the memory the driver calls free, but 256 MiB left for the driver, in
        allocations of 4 GiB. It runs at memory bandwidth, written once and read once (about 0.1 s
        for 140 GiB at 4.8 TB/s on an H200, plus the allocations); a job that starts at the same
        moment finds almost no memory free, so run it where no job can start (a drained node, the
        Slurm prolog).
      - V(performance) - the V(allocation) level, and before it, per GPU, pinned copies of 256 MiB
        host to device and back timed with CUDA events (RV(gpus[].h2d_gbps), RV(gpus[].d2h_gbps)),
        the PCIe link read through the O(backend) while the copies run (RV(gpus[].link); an idle
        link drops to Gen1 by design, so it is never read idle), the PCIe replay counter before
        and after (NVML only), and the kernels timed with events (RV(gpus[].hbm_gbps)). GPUs under
        one PCIe switch (NVML's topology, or C(nvidia-smi topo -m)) never copy at once, so each
        figure is the GPU's own. A GPU is slow when its link runs below its own maximum, when
        replays grew, or when a bandwidth is more than O(slow_fraction) below the median of the
        other GPUs of the host (RV(gpus[].slow)); a slow GPU is warned about and never recorded as
        verified, but does not fail the task. It costs about 0.2 s more than V(allocation) on 8
        GPUs (the probe guide has the figures). Every two GPUs that can reach each other's memory also copy to
        each other directly, once, before that (RV(gpus[].peers)), with the NVLinks read around it
        (RV(gpus[].nvlink)).
    type: str
    choices: [allocation, memory, performance]
    default: allocation
  slow_fraction:
    description:
      - With O(probe_level=performance), how far below the median of the host's other GPUs a
        GPU's copy or memory bandwidth may be before the GPU is called slow (0.15 - 15 %).
      - Healthy GPUs of one host differ by a few percent; a link trained down or a slow memory
        costs a half or more.
    type: float
    default: 0.15
  timeout:
    description:
      - Seconds the whole probe may take, the reads of the GPUs and the wait for the probe's
        memory to be released included. A GPU's child that has not answered by then is killed,
        and that GPU fails with RV(gpus[].error_name=PROBE_TIMEOUT).
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
  - What the probe proves, what it does not, and what it costs are in
    R(the probe guide, ansible_collections.gpuops.nvidia.docsite.guide_probe).
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

- name: On a drained node, write and check all of each GPU's free memory
  gpuops.nvidia.nvidia_gpu_probe:
    probe_level: memory
    timeout: 120

- name: Between jobs, also time each GPU's copies and memory and read its PCIe link under load
  gpuops.nvidia.nvidia_gpu_probe:
    probe_level: performance
  register: probe

- name: GPUs slower than their peers, or with a degraded link
  ansible.builtin.debug:
    msg: "{{ item.slow | map(attribute='message') }}"
  loop: "{{ probe.gpus | selectattr('slow', 'defined') | selectattr('slow') }}"

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
verified:
  description:
    - The last pass of the probe on each GPU of the host, by GPU UUID, as kept in O(state_dir)
      (C(verified.json), the newest 256 GPUs), this run's passes included; only this run's when the
      directory cannot be used. Also said in one line per run to the host's syslog (tag C(gpuops)).
    - Each has C(index), C(pci_bus_id), C(verified_at) (Unix time), C(level), C(mib), C(kernel)
      (whether the probe's kernel checked every byte it allocated), C(driver_version) and
      C(duration_ms).
  returned: always
  type: dict
  sample:
    GPU-8932f937-d72c-4106-c12f-20bd9faed9f6:
      index: 0
      pci_bus_id: "00000000:18:00.0"
      verified_at: 1796198400.125
      level: allocation
      mib: 1024
      kernel: true
      driver_version: "550.127.05"
      duration_ms: 412.7
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
    verified_at:
      description: When this GPU's probe passed and its memory read released (Unix time); null when it did not.
      type: float
      sample: 1796198400.125
    compute_mode:
      description:
        - The GPU's compute mode as read before the probe (C(Default), C(Exclusive_Process), C(Prohibited)); null when unknown.
        - In an exclusive mode the GPU takes one context at a time, so a job starting while the probe holds it fails
          with C(CUDA_ERROR_DEVICE_UNAVAILABLE), and a warning says so; the Slurm Prolog probes before the job starts.
      type: str
      sample: Default
    ok:
      description:
        - True when the context, the module, the allocation, both kernels, the copy of their counts,
          the free and the context's destruction all succeeded, the kernels covered every word and
          every word read back as written, and the probe's memory was released.
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
    level:
      description: What the probe set out to prove on the GPU, O(probe_level); null when it was not probed.
      type: str
      sample: allocation
    kernel:
      description:
        - Whether the probe's fill and check kernels covered every word it allocated (each counted on the GPU).
          Only such a probe records a cure of the GPU.
      type: bool
      sample: true
    bytes_checked:
      description: Bytes the check kernel read back and compared on the GPU.
      type: int
      sample: 1073741824
    kernel_ms:
      description: Milliseconds from the first launch to the end of the check kernel; null when no kernel ran.
      type: float
      sample: 0.9
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
        - A JIT failure is C(CUDA_ERROR_INVALID_PTX) or C(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) at
          C(cuModuleLoadDataEx), its RV(gpus[].error_string) naming the PTX's ISA version and target,
          the driver's CUDA version and the JIT's log; a kernel that faulted is met at
          C(cuCtxSynchronize) (such as C(CUDA_ERROR_LAUNCH_FAILED), C(CUDA_ERROR_ILLEGAL_ADDRESS)).
        - The probe's own names where CUDA gave none - V(PROBE_MISMATCH) (words read back differ
          from what the fill kernel wrote; RV(gpus[].error_string) says how many and the byte
          offset of the first), V(PROBE_KERNEL_NOT_RUN) (the launches succeeded but a kernel did
          not cover its memory), V(PROBE_NO_FREE_MEMORY) (O(probe_level=memory) found nothing free
          beyond its margin),
          V(PROBE_TIMEOUT) (the GPU's child was killed at O(timeout); RV(gpus[].call) is the CUDA
          call it hung in, null when it had made none), V(PROBE_CRASHED) (the child was killed by a
          signal, such as a crash in the driver library, in RV(gpus[].call)), V(PROBE_ERROR) (the
          child exited with an error or printed no answer), V(PROBE_MEMORY_HELD) (the probe's memory still read as used at
          O(timeout)), V(GPU_LOST) (the GPU cannot be read, and was not probed).
        - Null when the probe succeeded.
      type: str
      sample: CUDA_ERROR_OUT_OF_MEMORY
    error_string:
      description: The CUDA error's description (C(cuGetErrorString)) or the probe's words; null when it succeeded.
      type: str
      sample: out of memory
    h2d_gbps:
      description:
        - With O(probe_level=performance), the best of three timed copies of 256 MiB from page-locked host memory
          to the GPU, in GB/s (10^9 bytes a second); null when the GPU did not copy.
        - The copies come first, so the figure is there even when a later step of the probe failed.
      type: float
      returned: with O(probe_level=performance)
      sample: 55.1
    d2h_gbps:
      description: As RV(gpus[].h2d_gbps), from the GPU to page-locked host memory.
      type: float
      returned: with O(probe_level=performance)
      sample: 54.8
    hbm_gbps:
      description:
        - With O(probe_level=performance), the bytes the fill kernel wrote and the check kernel read, over their
          time on the GPU (CUDA events), in GB/s; null when the kernels did not cover their memory.
      type: float
      returned: with O(probe_level=performance)
      sample: 3710.4
    link:
      description:
        - With O(probe_level=performance), the PCIe link read while the GPU's copies ran - C(gen) and C(width)
          (current), C(max_gen) and C(max_width) (the most the GPU and its slot allow); null when it was not read.
      type: dict
      returned: with O(probe_level=performance)
      sample: {gen: 5, width: 16, max_gen: 5, max_width: 16}
    replays:
      description: With O(probe_level=performance) and the NVML reader, by how much the GPU's PCIe replay counter grew
        during its copies; null when not read (the nvidia-smi reader has no such field).
      type: int
      returned: with O(probe_level=performance)
      sample: 0
    uuid:
      description: With O(probe_level=performance), the GPU's UUID as the reader gave it; null when it gave none.
      type: str
      returned: with O(probe_level=performance)
      sample: GPU-8932f937-d72c-4106-c12f-20bd9faed9f6
    remap_histogram:
      description:
        - With O(probe_level=performance), the row remapper's histogram (NVML's
          C(nvmlDeviceGetRowRemapperHistogram), C(nvidia-smi -q -d ROW_REMAPPER)) - how many of the GPU's memory
          banks have all (C(max)), many (C(high)), some (C(partial)), few (C(low)) or no (C(none)) spare rows left;
          null when not read (a GPU before Ampere has no row remapper).
      type: dict
      returned: with O(probe_level=performance)
      sample: {max: 3072, high: 0, partial: 0, low: 0, none: 0}
    peers:
      description:
        - With O(probe_level=performance), the GPU's peer copies - every two GPUs that C(cuDeviceCanAccessPeer) lets
          reach each other's memory (every pair on an NVSwitch board, the GPUs under one PCIe switch elsewhere) copy
          256 MiB directly (C(cuMemcpyPeerAsync)), timed with events, one child for every pair, before the GPUs' own
          copies.
        - C(median_gbps) (of its pairs), C(pairs) (each C(peer), C(direction) C(to) or C(from), C(gbps)), C(hung) and
          C(failed) (the pairs whose copy hung or failed); null when the GPU was in no pair.
      type: dict
      returned: with O(probe_level=performance)
      sample: {median_gbps: 368.2, pairs: [{peer: 1, direction: to, gbps: 369.0}], hung: [], failed: []}
    nvlink:
      description:
        - With O(probe_level=performance), the GPU's NVLinks as the reader gives them (NVML, or C(nvidia-smi nvlink -s)
          and C(-e)) around the peer copies - C(links) (0 without NVLink), C(active) and C(down) (link numbers), and
          C(errors) (how much each counter, C(replay), C(recovery), C(crc_flit), C(crc_data), grew during the copies;
          null when not read); null when not read.
      type: dict
      returned: with O(probe_level=performance)
      sample: {links: 18, active: [0, 1, 2], down: [], errors: {replay: 0, recovery: 0, crc_flit: 0, crc_data: 0}}
    copy_round:
      description: With O(probe_level=performance), in which round the GPU copied (GPUs under one PCIe switch copy in
        different rounds); null when it did not copy.
      type: int
      returned: with O(probe_level=performance)
      sample: 1
    slow:
      description:
        - With O(probe_level=performance), why the GPU is slow, each with C(reason) and C(message) (naming the GPU,
          the figure, its peers' median and the bound); empty when it is not.
        - C(reason) is V(PCIE_LINK_DEGRADED) (the link ran below its own maximum generation or width while loaded),
          V(PCIE_REPLAYS) (the replay counter grew during the copies), V(REMAP_HEADROOM_NONE) (a memory bank has no
          spare row left, RV(gpus[].remap_histogram)), V(H2D_BELOW_PEERS), V(D2H_BELOW_PEERS) or
          V(HBM_BELOW_PEERS) (that bandwidth more than O(slow_fraction) below the median of the host's other GPUs),
          V(NVLINK_DOWN) (fewer NVLinks active than the most another GPU of the host has, or a link inactive),
          V(NVLINK_ERRORS) (an NVLink error counter grew during the peer copies), V(P2P_BELOW_PEERS) (its median peer
          copy more than O(slow_fraction) below the other GPUs'), V(P2P_HUNG) or V(P2P_FAILED) (a peer copy hung or
          failed; the GPU none of whose copies went through is named, or both when each copied with others).
        - A slow GPU is warned about and has no RV(gpus[].verified_at).
      type: list
      elements: dict
      returned: with O(probe_level=performance)
      sample: [{reason: PCIE_LINK_DEGRADED, message: "PCIE_LINK_DEGRADED: GPU 3 (00000000:9A:00.0): its PCIe link
            ran at Gen3 x8 while loaded, below its maximum of Gen5 x16"}]
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.nvidia.plugins.module_utils._module import run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.performance import (
    PerformanceOptions,
    probe,
    probe_module_argument_spec,
)


def main():
    module = AnsibleModule(argument_spec=probe_module_argument_spec(), supports_check_mode=True)
    result, warnings = run_with_reader(
        module, lambda reader, options: probe(reader, options, check_mode=module.check_mode),
        PerformanceOptions.from_params)
    for warning in warnings + result.warnings:
        module.warn(warning)
    if result.failure:
        module.fail_json(msg=result.failure, **result.dump())
    module.exit_json(**result.dump())


if __name__ == '__main__':
    main()
