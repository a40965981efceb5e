# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""GPU scoping, the one rule: which GPUs a release is about, and which processes block them.

A process blocks a GPU when it holds the GPU's device node /dev/nvidiaN, N being the GPU's minor
number (not always its index), or when the driver reports it as a process on that GPU. Processes
that hold only the shared nodes (nvidiactl, nvidia-uvm) block no GPU of their own.

A MIG instance is named N:G (GPU N, GPU instance G: each of its compute instances), N:G:C (one
compute instance, one MIG device) or by its MIG UUID; see _mig_scope for what blocks one."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

GPU_NODE_RE = re.compile(r'^nvidia([0-9]+)$')
INSTANCE_RE = re.compile(r'^([0-9]{1,4}):([0-9]{1,2})(?::([0-9]{1,2}))?\Z')
# MIG-<uuid> (R470 and later drivers), MIG-GPU-<uuid>/<GI>/<CI> (earlier ones).
MIG_UUID_RE = re.compile(r'^MIG-[0-9A-Za-z][0-9A-Za-z-]{0,79}(?:/[0-9]{1,2}/[0-9]{1,2})?\Z')
GPU_FORMS = 'a GPU index, N:G (GPU N, its GPU instance G), N:G:C (and compute instance C) or a MIG UUID (MIG-...)'


def parse_gpu(value):
    """One entry of gpus: an int for a whole GPU, the text of a MIG instance (N:G or N:G:C with
    the numbers as ints write them, or a MIG UUID); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = value.strip() if isinstance(value, str) else ''
    if text.isdigit() and len(text) <= 4:
        return int(text)
    match = INSTANCE_RE.match(text)
    if match:
        return ':'.join(str(int(part)) for part in match.groups() if part is not None)
    return text if MIG_UUID_RE.match(text) else None


def split_gpus(gpus):
    """(whole GPU indexes, MIG instances) of parsed gpus entries; None for gpus None."""
    if gpus is None:
        return None, []
    return [gpu for gpu in gpus if isinstance(gpu, int)], [gpu for gpu in gpus if not isinstance(gpu, int)]


def instance_parent(ref):
    """The GPU index of an N:G[:C] instance; None for a MIG UUID (the host's read tells)."""
    match = INSTANCE_RE.match(ref)
    return int(match.group(1)) if match else None


def node_number(path):
    """N of a /dev/nvidiaN path, or None for any other node."""
    match = GPU_NODE_RE.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def gpu_node_number(gpu):
    """N of the GPU's /dev/nvidiaN: its minor number, or its index when the minor is unknown."""
    return gpu.get('index') if gpu.get('minor_number') is None else gpu['minor_number']


def no_such_gpus(unknown, known):
    """The one wording of GPU indexes asked for that the host does not have."""
    return 'no GPU %s on this host (it has %s)' % (
        ', '.join(str(index) for index in sorted(unknown)),
        ', '.join(str(index) for index in sorted(index for index in known if index is not None)) or 'none')


def gpus_in_scope(gpus, wanted=None):
    """The GPUs whose index is in wanted (every GPU when wanted is None), by index; a lost GPU
    that could not be placed has no index and comes last."""
    if wanted is not None:
        gpus = [gpu for gpu in gpus if gpu.get('index') in wanted]
    return sorted(gpus, key=lambda gpu: (gpu.get('index') is None, gpu.get('index') or 0))


def blocks(devices, pid, nodes, gpus):
    """Whether a process (its open device nodes, its pid) blocks GPUs whose device node numbers
    are nodes and whose facts (with the processes the driver reports) are gpus."""
    if any(node_number(path) in nodes for path in devices):
        return True
    return any(process.get('pid') == pid for gpu in gpus for process in gpu.get('processes') or [])
