# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One reading of a simulated host: the GPUs in scope, their holders found by device identity and
placed by the driver, and a GPU judged clean or not. (Whole releases: test__release.py.)"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, Budget
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.observation import Observer, placements
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions


def observer(host, **options):
    options = ReleaseOptions([host.dev_glob], protect=DEFAULT_PROTECT, state_dir=host.state_dir, **options)
    reader, dummy = select_reader('auto', host.smi_path, 10)
    seen = Observer(reader, options, clock=time.monotonic)
    deadline = time.monotonic() + 10
    seen.start(Budget('the test', 10, time.monotonic), deadline, deadline - 1)
    return seen


@pytest.mark.parametrize('gpus', [None, [4]])
def test_a_holder_is_found_by_its_device_node_and_placed_by_the_driver(gpuhost, gpus):
    held = gpuhost.hold(gpus=[4], mib=2000)
    seen = observer(gpuhost, gpus=gpus)
    snapshot, holders = seen.observe(force_read=True, full=True)
    assert [holder.pid for holder in holders] == [held['pid']]
    assert not holders[0].protected
    assert placements(snapshot) == {held['pid']: set([4])}
    scope = dict((gpu['index'], gpu) for gpu in seen.scope(snapshot))
    assert sorted(scope) == (gpus or list(range(8)))
    assert not seen.gpu_clean(scope[4]) and seen.blocks(holders[0], scope[4])
    assert not seen.clean(snapshot, holders)


def test_a_gpu_named_alone_leaves_the_holder_of_another_out_of_scope(gpuhost):
    gpuhost.hold(gpus=[2], mib=2000)
    seen = observer(gpuhost, gpus=[5])
    snapshot, holders = seen.observe(force_read=True, full=True)
    assert holders == []
    assert seen.clean(snapshot, holders)


def test_an_unreadable_host_is_no_snapshot_and_says_why(gpuhost):
    seen = observer(gpuhost)
    seen.deadline = seen.signal_deadline = time.monotonic()  # no time left to read
    snapshot, holders = seen.observe(force_read=True)
    assert snapshot is None and holders == []
    assert 'no time was left to read the GPUs' in seen.read_error
