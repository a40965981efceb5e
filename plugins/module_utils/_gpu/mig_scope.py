# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""A release scoped to MIG instances: which MIG devices gpus: names (N:G, N:G:C, MIG UUIDs), and
each of them as the release judges it, a view: the parent GPU's dict with the MIG device's own
memory and processes.

A process holds a MIG device when it holds the caps node of its compute instance
(/dev/nvidia-caps/nvidia-capM, M from the driver's capabilities tree), by device identity as for
any node, or when the driver places it on that device. The parent's /dev/nvidiaN proves nothing
here: with MIG on, every process of every instance of the GPU holds it. The GPU instance's own caps
node proves nothing either when the GPU instance has several compute instances (each of their
processes holds it), so the compute instance's node decides.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import os

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import under_root
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import CAPABILITIES, caps_minor
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import INSTANCE_RE

# What a view takes from its MIG device instead of its parent GPU.
VIEW_KEYS = ('memory_used_mib', 'memory_total_mib', 'processes')


def _matches(ref, index, instance):
    match = INSTANCE_RE.match(ref)
    if match is None:
        return instance.get('uuid') == ref
    gpu, gi, ci = match.groups()
    return int(gpu) == index and int(gi) == instance.get('gpu_instance_id') \
        and (ci is None or int(ci) == instance.get('compute_instance_id'))


def caps_node(gpu_minor, gi, ci, host_root='/'):
    """The path of the caps node of compute instance ci of GPU instance gi of the GPU of minor
    number gpu_minor; None when the driver's access file cannot be read."""
    number = caps_minor(under_root('%s/gpu%d/mig/gi%d/ci%d/access' % (CAPABILITIES, gpu_minor, gi, ci), host_root))
    return None if number is None else os.path.normpath(under_root('/dev/nvidia-caps/nvidia-cap%d' % number, host_root))


class InstanceScope:
    """The MIG devices of refs (gpus: entries that name instances), found on the first read that
    has them (resolve), then kept by GPU index, GPU and compute instance and MIG UUID."""

    def __init__(self, refs, host_root='/'):
        self.refs = list(refs)
        self.host_root = host_root
        self.keys = None  # [(GPU index, GI, CI, MIG UUID)], once resolved
        self.problem = None  # why refs could not be resolved
        self.missing = list(refs)  # the refs not found (every one until resolved)
        self.nodes = {}  # key -> the caps node of its compute instance (None: unreadable)

    def attach(self, reader, snapshot, timeout):
        """Read the MIG devices of the parents in scope onto snapshot (snapshot.mig: {index: mig
        fact}); returns the reader's warnings."""
        parents = [gpu for gpu in snapshot.gpus if gpu.get('index') is not None and self._may_hold(gpu.get('index'))]
        migs, warnings = reader.read_mig(parents, timeout=timeout) if parents else ({}, [])
        snapshot.mig = dict((index, fact) for index, fact in migs.items() if fact)
        return warnings

    def _may_hold(self, index):
        if self.keys is not None:
            return any(key[0] == index for key in self.keys)
        return any(INSTANCE_RE.match(ref) is None or int(INSTANCE_RE.match(ref).group(1)) == index for ref in self.refs)

    def resolve(self, snapshot, gpu_nodes):
        """Find each ref among the MIG devices of snapshot (first time only); the problem of refs
        the host does not have is kept for check()."""
        if self.keys is not None:
            return
        found, missing = [], []
        for ref in self.refs:
            keys = [(index, instance['gpu_instance_id'], instance['compute_instance_id'], instance['uuid'])
                    for index, fact in sorted(getattr(snapshot, 'mig', {}).items())
                    for instance in fact.get('instances') or [] if _matches(ref, index, instance)]
            found.extend(key for key in keys if key not in found)
            if not keys:
                missing.append(ref)
        self.missing = missing
        if missing:
            self.problem = 'gpus: no MIG instance %s on this host (%s)' % (
                ', '.join(printable(ref, 100) for ref in missing), self._known(snapshot))
        self.keys = found
        for key in found:
            minor = gpu_nodes.get(key[0])
            self.nodes[key] = None if minor is None or key[1] is None else caps_node(minor, key[1], key[2], self.host_root)

    @staticmethod
    def _known(snapshot):
        known = ['%d:%s:%s %s' % (index, instance['gpu_instance_id'], instance['compute_instance_id'], instance['uuid'])
                 for index, fact in sorted(getattr(snapshot, 'mig', {}).items()) for instance in fact.get('instances') or []]
        return 'it has %s' % ', '.join(known) if known else 'no GPU in scope has MIG instances'

    def check(self):
        """GpuopsError for refs the host does not have: nothing is signalled then."""
        if self.problem:
            raise GpuopsError(self.problem)

    def parents(self):
        return set(key[0] for key in self.keys or ())

    def node_paths(self):
        return sorted(set(path for path in self.nodes.values() if path))

    def unmapped(self):
        """The MIG devices in scope whose caps node is unknown: only the driver's placement finds their holders."""
        return [key for key in self.keys or () if self.nodes.get(key) is None]

    def views(self, snapshot):
        """A view of each MIG device in scope (see the module's doc) on the parents of snapshot."""
        parents = dict((gpu.get('index'), gpu) for gpu in snapshot.gpus)
        views = [self._view(parents.get(key[0]), getattr(snapshot, 'mig', {}).get(key[0]), key) for key in self.keys or ()]
        return views + [self._unfound(ref) for ref in self.missing]

    @staticmethod
    def _unfound(ref):
        """A view of a ref no read has found (never clean): the release fails on it, or names it at the end."""
        return {'index': None, 'memory_used_mib': None, 'processes': [], 'error': 'MIG instance %s not found' % printable(ref, 100),
                'mig_instance': {'gpu_instance_id': None, 'compute_instance_id': None, 'uuid': None, 'profile': None,
                                 'caps_node': None}}

    def _view(self, parent, fact, key):
        instance = next((item for item in (fact or {}).get('instances') or []
                         if (item['gpu_instance_id'], item['compute_instance_id'], item['uuid']) == key[1:]), None)
        view = dict(copy.deepcopy(parent or {'index': key[0]}), utilization_gpu_pct=None, memory_free_mib=None,
                    memory_reserved_mib=None)
        view['mig_instance'] = {'gpu_instance_id': key[1], 'compute_instance_id': key[2], 'uuid': key[3],
                                'profile': instance.get('profile') if instance else None, 'caps_node': self.nodes.get(key)}
        view.update((name, (instance or {}).get(name)) for name in VIEW_KEYS)
        view['processes'] = view['processes'] or []
        if instance is None and not view.get('error'):
            view['error'] = 'MIG instance %d:%s:%s (%s) not read: gone, or its GPU\'s MIG devices could not be read' % key
        return view

    def holds(self, devices, view=None):
        """Whether a process with devices open holds the MIG device of view (None: any in scope) by
        its caps node."""
        nodes = [view['mig_instance']['caps_node']] if view is not None else self.node_paths()
        return any(node is not None and node in devices for node in nodes)

    @staticmethod
    def placed_on(pid, views):
        """Whether the driver places pid on the MIG device of one of views."""
        return any(process.get('pid') == pid for view in views for process in view.get('processes') or [])
