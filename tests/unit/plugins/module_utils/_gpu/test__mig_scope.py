# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A release scoped to MIG instances (module_utils/_gpu/mig_scope.py): the instances gpus: names, found
on a simulated host's read, each held through the caps node of its compute instance. The release
of MIG instances itself: test__release.py and tests/integration/test_release_mig.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import gpu_nodes
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig_scope import InstanceScope, caps_node
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner
from gpusim.mig import ci_minor


def resolved(host, refs):
    """(the InstanceScope of refs, resolved on a read of host, that read)."""
    scope = InstanceScope(refs, host.root)
    reader = SmiReader(SmiRunner(host.smi_path, 10))
    snapshot = reader.read(timeout=10)
    assert scope.attach(reader, snapshot, 10) == []
    nodes, warning = gpu_nodes([host.dev_path(index) for index in range(8)], host.root)
    assert warning is None
    scope.resolve(snapshot, nodes)
    return scope, snapshot


def caps_path(host, gpu, gi, ci):
    return os.path.join(host.root, 'dev', 'nvidia-caps', 'nvidia-cap%d' % ci_minor(gpu, gi, ci))


def test_the_instances_named_are_found_each_with_the_caps_node_of_its_compute_instance(gpuhost):
    first, second = gpuhost.mig(3, ['1g.18gb', '2g.35gb'])['instances']
    job = gpuhost.hold(gpus='3', mib=3000, mig=second['gi'])
    scope, snapshot = resolved(gpuhost, ['3:%d' % first['gi'], second['uuid']])
    scope.check()
    assert scope.parents() == set([3]) and scope.unmapped() == []
    first_node, second_node = caps_path(gpuhost, 3, first['gi'], first['ci']), caps_path(gpuhost, 3, second['gi'], second['ci'])
    assert caps_node(3, second['gi'], second['ci'], gpuhost.root) == second_node
    assert scope.node_paths() == sorted([first_node, second_node])
    views = scope.views(snapshot)
    assert [(view['index'], view['mig_instance']['uuid'], view['mig_instance']['caps_node']) for view in views] == [
        (3, first['uuid'], first_node), (3, second['uuid'], second_node)]
    # Each view has its instance's own memory and processes, not its parent GPU's.
    assert [process['pid'] for process in views[1]['processes']] == [job['pid']] and views[0]['processes'] == []
    assert views[1]['memory_used_mib'] >= 3000 > views[0]['memory_used_mib']
    assert InstanceScope.placed_on(job['pid'], views) and not InstanceScope.placed_on(job['pid'], views[:1])
    # The compute instance's node proves a holder; the parent's /dev/nvidia3, which every instance's holds, does not.
    assert scope.holds([second_node], views[1]) and not scope.holds([second_node], views[0])
    assert not scope.holds([gpuhost.dev_path(3)])


def test_an_instance_the_host_does_not_have_is_named_with_those_it_has(gpuhost):
    [instance] = gpuhost.mig(3, ['1g.18gb'])['instances']
    scope, snapshot = resolved(gpuhost, ['5:1', 'MIG-00000000-0000-0000-0000-000000000000', '3:%d' % instance['gi']])
    with pytest.raises(GpuopsError) as info:
        scope.check()
    assert str(info.value) == 'gpus: no MIG instance 5:1, MIG-00000000-0000-0000-0000-000000000000 on this host (it has ' \
        '3:%d:%d %s)' % (instance['gi'], instance['ci'], instance['uuid'])
    views = scope.views(snapshot)
    assert [view['mig_instance']['uuid'] for view in views] == [instance['uuid'], None, None]
    assert [view.get('error') for view in views[1:]] == ['MIG instance 5:1 not found',
                                                         'MIG instance MIG-00000000-0000-0000-0000-000000000000 not found']
