# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import (
    blocks, gpu_node_number, gpus_in_scope, node_number)


def test_node_number_is_that_of_gpu_nodes_only():
    assert node_number('/dev/nvidia3') == 3
    assert node_number('/host/dev/nvidia12') == 12
    assert [node_number(path) for path in ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia3x', '/dev/nvidia')] == [None] * 4


def test_gpu_node_number_is_the_minor_number_when_known():
    assert gpu_node_number({'index': 0, 'minor_number': 2}) == 2
    assert gpu_node_number({'index': 1, 'minor_number': None}) == 1


def test_scope_keeps_the_wanted_gpus_in_index_order_and_unplaced_lost_ones_last():
    gpus = [{'index': 2}, {'index': None, 'error': 'lost'}, {'index': 0}, {'index': 1}]
    assert gpus_in_scope(gpus) == [{'index': 0}, {'index': 1}, {'index': 2}, {'index': None, 'error': 'lost'}]
    assert gpus_in_scope(gpus, [2, 0]) == [{'index': 0}, {'index': 2}]


def test_a_process_blocks_by_node_or_by_the_drivers_word():
    gpu = {'index': 1, 'processes': [{'pid': 40}]}
    assert blocks(['/dev/nvidiactl', '/dev/nvidia2'], 7, {2}, [gpu])
    # Only the shared nodes, and not on the driver's list: it blocks nothing.
    assert not blocks(['/dev/nvidiactl', '/dev/nvidia-uvm'], 7, {2}, [gpu])
    # No node of the GPU's, but the driver reports it there (a process in a container).
    assert blocks([], 40, {2}, [gpu])
    assert not blocks(['/dev/nvidia1'], 41, {2}, [gpu])
