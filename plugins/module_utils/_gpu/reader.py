# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The GPU state reader interface, shared by the NVML and nvidia-smi backends."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB

GPU_STATES = ('free', 'busy', 'idle_holding', 'orphaned_memory', 'reset_required', 'lost')

# What the driver says in place of a value. [N/A] and [Not Supported] mean that the value does not
# apply to this GPU (nvidia-smi(1)), as do NVML_ERROR_NOT_SUPPORTED and a function the library does
# not have: the value is null. Every other bracketed value ([GPU requires reset], [GPU is lost],
# [Unknown Error], [Insufficient Permissions], ...) and every other NVML return code is the
# driver's verdict on that GPU: the GPU gets an error, and cannot be called clean.
RESET_REQUIRED_TEXT = 'GPU requires reset'
LOST_TEXT = 'GPU is lost'


class Snapshot:
    """One reading of every GPU.

    gpus: list of dicts with index, uuid, name, pci_bus_id, memory_total_mib,
    memory_used_mib (allocated, as nvidia-smi shows it), memory_free_mib,
    memory_reserved_mib (reserved by the driver), utilization_gpu_pct, temperature_c,
    persistence_mode, compute_mode, processes (pid, name, used_memory_mib), error,
    reset_required (True when the driver says the GPU needs a reset: see driver_error),
    driver_recovery_action (the driver's GPU Recovery Action, or None where it has none).
    A value the driver does not report is None.
    missing: GPUs the host has (on its PCI bus) that the reader does not list, as lost GPU
    dicts with index None (see _host.HostReader); empty unless the host was read.
    full: False for a light read (see GpuReader.read): the GPUs' health is that of the last full
    read.
    """

    def __init__(self, gpus, driver_version, warnings=None, full=True):
        self.gpus = gpus
        self.driver_version = driver_version
        self.warnings = list(warnings or [])
        self.missing = []
        self.full = full


class GpuReader:
    """A backend that reads GPU state. Implementations: SmiReader, NvmlReader.

    driver_hint: the driver's version as the host says it (/proc/driver/nvidia/version), set
    before the first read by whoever knows it (_host.HostReader); a reader may use it to ask
    only for what that driver knows, and must find out when it is wrong."""

    backend = None
    driver_hint = None

    def read(self, timeout=None, full=True):
        """Return a Snapshot; raise GpuopsError when the GPUs cannot be read at all.

        full=False asks for a light read: only what changes while a release waits (memory,
        utilisation, processes) is read again, and every other value, the driver's verdicts
        included, is the last full read's. A reader reads in full when it has no full read to
        build on, or when the light read finds what the full one did not say (another set of
        GPUs, a GPU it cannot read, a new verdict of the driver)."""
        raise NotImplementedError

    def read_mig(self, gpus, timeout=None):
        """({index: mig fact or None}, warnings): the MIG mode and MIG devices of the GPUs of a read
        (see _mig); a reader that cannot tell gives none."""
        return {}, []

    def close(self):
        """Release what the backend holds (NVML handle); nothing by default."""


# What a light read reads again: the values that change while a release waits for the memory.
LIGHT_FACTS = ('memory_used_mib', 'memory_free_mib', 'utilization_gpu_pct')


def light_base(snapshot):
    """{index: GPU} of a full read, for light reads to build on (copies, without processes); None
    when a GPU could not be read or placed, whose state a light read could not tell."""
    gpus = {}
    for gpu in snapshot.gpus:
        if gpu.get('index') is None or gpu.get('uuid') is None or not _answered(gpu):
            return None
        gpus[gpu['index']] = dict(copy.deepcopy(gpu), processes=[])
    return gpus


def light_gpu(base, index, uuid, values, verdict):
    """The GPU of base (see light_base) that a light read found at index, with the values it read
    (LIGHT_FACTS), or None when the light read says what the full one did not: another GPU there,
    or a verdict of the driver (verdict true) on a GPU that had none."""
    known = base.get(index)
    if known is None or known.get('uuid') != uuid or (verdict and not known.get('error')):
        return None
    gpu = copy.deepcopy(known)
    gpu.update((fact, values.get(fact)) for fact in LIGHT_FACTS)
    return gpu


def _answered(gpu):
    """Whether the reader answered for the GPU (with values, some perhaps the driver's verdict)
    rather than an error in place of an answer."""
    return not gpu.get('error') or gpu['error'].startswith('the driver')


def driver_error(gpu, said):
    """Record on gpu (a reader's dict) that the driver answered with an error instead of values.

    said: {the driver's words ('GPU requires reset', 'Unknown Error', ...): [the values it said
    them for, by their nvidia-smi names]}: the same words through both backends, so that their
    facts are the same. The GPU keeps the values it did read; its error names each verdict, and
    reset_required is set when one of them is the driver's request for a reset."""
    if not said:
        return gpu
    parts = ['%s (for %s)' % (words, ', '.join(values)) for words, values in sorted(said.items())]
    text = 'the driver says: ' + '; '.join(parts)
    gpu['error'] = '%s; %s' % (gpu['error'], text) if gpu.get('error') else text
    if any(RESET_REQUIRED_TEXT.lower() in words.lower() for words in said):
        gpu['reset_required'] = True
    return gpu


# The driver's own verdict on whether the next job can run: its "GPU Recovery Action"
# (nvmlGpuRecoveryAction_t, NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230, which replaces
# the deprecated NVML_FI_DEV_RESET_STATUS and ..._DRAIN_AND_RESET_STATUS). NVIDIA added the field
# in the 565 drivers ("Changes between v560 and v565", NVML API reference); nvidia-smi prints it
# as --query-gpu=gpu_recovery_action and as "GPU Recovery Action" in -q on those drivers (a real
# 8-GPU host: "1, Reset" beside "0, None", NVIDIA/DCGM#263). Older drivers refuse the field
# (NVML: not supported; nvidia-smi: not a valid field): the action is then null.
# Values: NVIDIA, "Error Recovery and Response Flags" (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)
# and nvidia-ml-py's NVML_GPU_RECOVERY_ACTION_* constants.
DRIVER_RECOVERY_ACTIONS = {
    0: 'none', 1: 'reset_gpu', 2: 'reboot', 3: 'drain_p2p', 4: 'drain_and_reset',
    5: 'recover_imex_domain', 6: 'bus_reset', 7: 'system_reboot',
}
# How nvidia-smi spells them (DCGM#263 shows "None" and "Reset"; the others follow NVIDIA's
# names for them, "Node Reboot", "Drain P2P", "Drain and Reset"), matched by their words.
_RECOVERY_WORDS = (
    ('drain and reset', 'drain_and_reset'), ('drain', 'drain_p2p'), ('imex', 'recover_imex_domain'),
    ('bus', 'bus_reset'), ('system', 'system_reboot'), ('reboot', 'reboot'), ('reset', 'reset_gpu'),
    ('none', 'none'),
)
# The actions a GPU reset carries out: the GPU is reset_required; any other action but none
# leaves it lost until a person acts (a reboot, draining NVLink peers, the IMEX domain).
RESET_CURES = frozenset(['reset_gpu', 'drain_and_reset'])
# The first driver branch that knows the recovery action (see DRIVER_RECOVERY_ACTIONS).
RECOVERY_ACTION_BRANCH = 565


def driver_branch(version):
    """The branch (major number) of a driver version such as '550.127.05'; None when unknown."""
    head = str(version or '').split('.', 1)[0].strip()
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
    return int(head) if head.isascii() and head.isdigit() else None


def parse_recovery_action(text):
    """The driver recovery action that nvidia-smi's words name; 'unknown' for words it does not
    know; None for none given."""
    words = ' '.join((text or '').lower().replace('_', ' ').split())
    if not words:
        return None
    for key, action in _RECOVERY_WORDS:
        if key in words:
            return action
    return 'unknown'


def recovery_verdict(gpu, action):
    """Record the driver's recovery action on gpu; an action other than none is an error of it."""
    gpu['driver_recovery_action'] = action
    if action is None or action == 'none':
        return gpu
    text = "the driver's GPU recovery action is %s" % action
    gpu['error'] = '%s; %s' % (gpu['error'], text) if gpu.get('error') else text
    if action in RESET_CURES:
        gpu['reset_required'] = True
    return gpu


def _beyond_reset(gpu):
    """Whether the driver says more than a reset is needed: the GPU is lost or has fallen off the
    bus, or its recovery action is one a reset does not carry out."""
    action = gpu.get('driver_recovery_action')
    error = gpu.get('error') or ''
    return LOST_TEXT in error or 'fallen off the bus' in error or (
        action not in (None, 'none') and action not in RESET_CURES)


def gpu_state(gpu, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB):
    """Classify one GPU: one of GPU_STATES.

    idle_holding is the deadlock signature: processes hold memory at 0 % utilisation.
    orphaned_memory is memory in use with no process left: only a GPU reset frees it.
    reset_required: the driver says the GPU needs a reset (a [GPU requires reset] value, NVML's
    RESET_REQUIRED, or its recovery action); lost: it cannot be read, or the driver says only a
    reboot brings it back.
    When the driver does not report a value, the state follows from what it does report.
    """
    if gpu.get('error'):
        return 'reset_required' if gpu.get('reset_required') and not _beyond_reset(gpu) else 'lost'
    used = gpu.get('memory_used_mib')
    if gpu.get('processes'):
        return 'idle_holding' if gpu.get('utilization_gpu_pct') == 0 else 'busy'
    if used is not None and used > memory_threshold_mib:
        return 'orphaned_memory'
    return 'free'
