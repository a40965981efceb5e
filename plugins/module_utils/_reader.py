# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The GPU state reader interface, shared by the NVML and nvidia-smi backends."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB

GPU_STATES = ('free', 'busy', 'idle_holding', 'orphaned_memory', 'lost')


class Snapshot:
    """One reading of every GPU.

    gpus: list of dicts with index, uuid, name, pci_bus_id, memory_total_mib,
    memory_used_mib (allocated, as nvidia-smi shows it), memory_free_mib,
    memory_reserved_mib (reserved by the driver), utilization_gpu_pct, temperature_c,
    persistence_mode, compute_mode, processes (pid, name, used_memory_mib), error.
    A value the driver does not report is None.
    missing: GPUs the host has (on its PCI bus) that the reader does not list, as lost GPU
    dicts with index None (see _host.HostReader); empty unless the host was read.
    """

    def __init__(self, gpus, driver_version, warnings=None):
        self.gpus = gpus
        self.driver_version = driver_version
        self.warnings = list(warnings or [])
        self.missing = []


class GpuReader:
    """A backend that reads GPU state. Implementations: SmiReader, NvmlReader."""

    backend = None

    def read(self, timeout=None):
        """Return a Snapshot; raise GpuopsError when the GPUs cannot be read at all."""
        raise NotImplementedError

    def close(self):
        """Release what the backend holds (NVML handle); nothing by default."""


def gpu_state(gpu, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB):
    """Classify one GPU: one of GPU_STATES.

    idle_holding is the deadlock signature: processes hold memory at 0 % utilisation.
    orphaned_memory is memory in use with no process left: only a GPU reset frees it.
    When the driver does not report a value, the state follows from what it does report.
    """
    if gpu.get('error'):
        return 'lost'
    used = gpu.get('memory_used_mib')
    if gpu.get('processes'):
        return 'idle_holding' if gpu.get('utilization_gpu_pct') == 0 else 'busy'
    if used is not None and used > memory_threshold_mib:
        return 'orphaned_memory'
    return 'free'
