# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""GPU scoping, the one rule: which GPUs a release is about, and which processes block them.

A process blocks a GPU when it holds the GPU's device node /dev/nvidiaN, N being the GPU's minor
number (not always its index), or when the driver reports it as a process on that GPU. Processes
that hold only the shared nodes (nvidiactl, nvidia-uvm) block no GPU of their own."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

GPU_NODE_RE = re.compile(r'^nvidia([0-9]+)$')


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
