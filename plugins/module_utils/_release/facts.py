# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Assembles the nvidia_* facts from a reader and holder discovery."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import action_causes, fallen_off_bus, health_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import read_kernel_log
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import add_device_nodes, caps_instances, pending_change
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.modules import module_holders
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import find_holders, uninspectable_warning
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import expand_devices
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import check_expected_gpus, mark_fallen, read_host
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, boot_id, load_cures

GPU_KEYS = ('index', 'uuid', 'name', 'pci_bus_id', 'minor_number', 'memory_total_mib', 'memory_used_mib',
            'memory_free_mib', 'memory_reserved_mib', 'utilization_gpu_pct', 'temperature_c', 'persistence_mode',
            'compute_mode', 'processes', 'health', 'state', 'error')


def gpu_facts(snapshot, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB, xid_events=None, cures=None):
    """The nvidia_gpus list: one dict per GPU with every documented key, state included.

    xid_events: the host's Xid events (see _kernel_log.read_xid_events), or None when unknown;
    cures: {GPU UUID: when it was last cured in this boot} (see _state.load_cures).
    The GPUs the reader does not list but the host has (snapshot.missing, lost, index null)
    come last, in PCI bus order.
    """
    gpus = []
    cures = cures or {}
    for gpu in snapshot.gpus:
        gpus.append(_gpu_fact(gpu, memory_threshold_mib, xid_events, cures))
    # A lost GPU that could not be placed has no index: it comes last.
    gpus.sort(key=lambda gpu: (gpu['index'] is None, gpu['index'] or 0))
    return gpus + [_gpu_fact(gpu, memory_threshold_mib, xid_events, cures) for gpu in getattr(snapshot, 'missing', [])]


def _gpu_fact(gpu, memory_threshold_mib, xid_events, cures):
    health = health_facts(gpu, xid_events, cures.get(gpu.get('uuid')))
    gpu = dict(gpu, state=gpu_state(gpu, memory_threshold_mib), health=health)
    gpu.setdefault('processes', [])
    return dict((key, gpu.get(key)) for key in GPU_KEYS)


def mig_facts(reader, gpus, timeout=None):
    """Set each GPU's mig fact (None: no MIG, or not known), device nodes included; the warnings."""
    migs, warnings = reader.read_mig(gpus, timeout=timeout)
    host_root = getattr(reader, 'host_root', '/')
    for gpu in gpus:
        gpu['mig'] = migs.get(gpu['index']) if gpu.get('index') is not None else None
        if gpu['mig'] is None and gpu.get('error'):
            gpu['mig'] = unreadable_parent_mig(gpu, host_root)
        warnings = warnings + add_device_nodes(dict(gpu, minor_number=_minor(gpu, host_root)), host_root)
        mark_instances(gpu)
        pending = pending_change(gpu['mig'])
        if pending:
            warnings.append('GPU %s: %s; it takes effect at the next GPU reset (reset_orphaned resets the GPU for '
                            'it once no MIG instance is in use)' % (gpu['index'], pending))
    return warnings


def _minor(gpu, host_root):
    """The GPU's minor number: the reader's, else the driver's (a lost GPU's reads give none)."""
    if gpu.get('minor_number') is not None or not gpu.get('pci_bus_id'):
        return gpu.get('minor_number')
    return read_host(host_root).minor(gpu['pci_bus_id'])


def unreadable_parent_mig(gpu, host_root):
    """The mig fact of a GPU the driver cannot read (lost): its modes unknown, its MIG devices as the
    driver's capabilities tree lists them; None when it lists none."""
    minor = _minor(gpu, host_root)
    instances = caps_instances(minor, host_root) if minor is not None else []
    return {'mode_current': None, 'mode_pending': None, 'instances': instances} if instances else None


def mark_instances(gpu):
    """A fault of the parent GPU is each of its MIG devices' fault: an Xid, the driver's recovery
    action, a pending remapping, a lost or unreadable parent. Each instance gets the parent's
    recovery action and why (health)."""
    health = gpu.get('health') or {}
    causes = action_causes(dict(gpu, reset_required=gpu.get('state') == 'reset_required'), health)
    if gpu.get('error') and gpu['error'] not in causes:
        causes.append(gpu['error'])
    for instance in (gpu.get('mig') or {}).get('instances') or []:
        instance['health'] = {'recovery_action': health.get('recovery_action'), 'parent_causes': list(causes)}


def holder_facts(device_patterns, protect):
    """(nvidia_device_holders, warnings) for the device globs."""
    warnings = []
    paths = expand_devices(device_patterns)
    if not paths:
        warnings.append('devices: no device node matches %s; this host may have no NVIDIA GPU '
                        'or driver' % ', '.join(device_patterns))
    holders, unreadable = find_holders(paths, protect)
    warning = uninspectable_warning(unreadable, 'see')
    if warning:
        warnings.append(warning)
    return [holder.to_dict() for holder in holders], warnings


def gather_facts(reader, device_patterns, protect, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB, timeout=None,
                 kernel_log=None, holder_warnings=True, expected_gpus=None, snapshot=None, state=None,
                 history=None, mig=False):
    """Return (ansible_facts, warnings). kernel_log: a /dev/kmsg record source to read Xid errors
    from instead of journalctl -k or dmesg (nvidia_kernel_log: what the read says of the host).
    holder_warnings: False leaves out the warnings about unmatched globs and uninspectable
    processes, for callers that give their own. expected_gpus: raise
    GpuopsError when fewer GPUs can be read. snapshot: the GPUs as the reader read them just
    before, instead of reading them again. A GPU the kernel log says has fallen off the bus is lost.
    state: the host's _state.StateDir (None: /run/gpuops), where the kernel log's last read and
    the GPUs' cures are kept. history: the host's _history.History (None: beside state, else
    /var/lib/gpuops), each GPU's history (nvidia_gpus[].history). mig: read each GPU's MIG mode and
    devices too (nvidia_gpus[].mig)."""
    if snapshot is None:
        snapshot = reader.read(timeout=timeout)
    state = state if state is not None else StateDir.for_host()
    boot = boot_id()
    xid_events, log_warnings, kernel_report = read_kernel_log(kernel_log, 10.0 if timeout is None else timeout,
                                                              state=state, boot=boot)
    unusable = state.unusable_warning('the kernel log is read from its start each time (within its bounds) and health '
                                      'counts every message of this boot')
    log_warnings = ([unusable] if unusable else []) + log_warnings
    mark_fallen(snapshot.gpus + snapshot.missing, fallen_off_bus(xid_events))
    check_expected_gpus(snapshot.gpus + snapshot.missing, expected_gpus)
    holders, warnings = holder_facts(device_patterns, protect)
    if not holder_warnings:
        warnings = []
    warnings = warnings + log_warnings
    facts = {
        'nvidia_gpus': gpu_facts(snapshot, memory_threshold_mib, xid_events, load_cures(state, boot)),
        'nvidia_gpu_count': len(snapshot.gpus) + len(snapshot.missing),
        'nvidia_driver_version': snapshot.driver_version,
        'nvidia_gpu_backend': reader.backend,
        'nvidia_device_holders': holders,
        'nvidia_module_holders': module_holders(getattr(reader, 'host_root', '/')),
        'nvidia_kernel_log': kernel_report,
    }
    if history is None:  # beside the state the caller gave, else the host's own
        history = History.for_host(state_dir=state.path) if state is not None else History.for_host()
    for gpu in facts['nvidia_gpus']:
        gpu['history'] = history.summary(gpu['uuid']) if gpu.get('uuid') else None
    if mig:
        warnings = warnings + mig_facts(reader, facts['nvidia_gpus'], timeout)
    return facts, snapshot.warnings + warnings + [warning for warning in history.warnings if warning not in warnings]
