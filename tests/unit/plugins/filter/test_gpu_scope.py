# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_scope import gpu_scope, FilterModule

SHARED = ['/dev/nvidia-uvm', '/dev/nvidiactl']


def facts():
    gpus = [dict(index=0, processes=[dict(pid=10)]), dict(index=1, processes=[]),
            dict(index=2, processes=[dict(pid=30)])]
    holders = [
        dict(pid=10, devices=SHARED + ['/dev/nvidia0'], protected=False),
        dict(pid=11, devices=SHARED + ['/dev/nvidia1'], protected=False),
        dict(pid=12, devices=SHARED, protected=False),              # only the shared nodes
        dict(pid=13, devices=SHARED + ['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia2'], protected=True),
        dict(pid=30, devices=SHARED, protected=False),              # reported by the driver on GPU 2
        dict(pid=31, devices=['/sim/root/dev/nvidia12'], protected=False),
    ]
    return dict(nvidia_gpus=gpus, nvidia_device_holders=holders, nvidia_driver_version='550.127.05')


def pids(scoped):
    return [holder['pid'] for holder in scoped['nvidia_device_holders']]


def test_no_scope_keeps_everything():
    data = facts()
    assert gpu_scope(data) == data
    assert gpu_scope(data, None) is not data


def test_one_gpu_keeps_its_holders_only():
    scoped = gpu_scope(facts(), [1])
    assert [gpu['index'] for gpu in scoped['nvidia_gpus']] == [1]
    assert pids(scoped) == [11, 13]
    assert scoped['nvidia_driver_version'] == '550.127.05'


def test_driver_reported_processes_count():
    assert pids(gpu_scope(facts(), [2])) == [13, 30]
    assert pids(gpu_scope(facts(), [0, 2])) == [10, 13, 30]


def test_node_numbers_are_matched_whole():
    assert 31 not in pids(gpu_scope(facts(), [1]))


def test_unknown_gpu_is_an_error():
    with pytest.raises(AnsibleFilterError, match=r'no GPU 7 on this host \(it has 0, 1, 2\)'):
        gpu_scope(facts(), [1, 7])


@pytest.mark.parametrize('gpus', ['0', 3, ['a']])
def test_bad_gpus_are_errors(gpus):
    with pytest.raises(AnsibleFilterError, match='list of GPU indexes'):
        gpu_scope(facts(), gpus)


def test_input_must_be_facts():
    with pytest.raises(AnsibleFilterError, match='expects the GPU facts'):
        gpu_scope([], [0])


def test_registered_under_its_name():
    assert FilterModule().filters()['gpu_scope'] is gpu_scope


def test_nodes_are_matched_by_minor_number():
    # GPU 0 is /dev/nvidia2 and GPU 2 is /dev/nvidia0: the driver numbered them that way.
    data = facts()
    minors = {0: 2, 1: 1, 2: 0}
    for gpu in data['nvidia_gpus']:
        gpu['minor_number'] = minors[gpu['index']]
    data['nvidia_gpus'].append({'index': None, 'minor_number': None, 'pci_bus_id': '00000000:5D:00.0',
                                'processes': [], 'state': 'lost', 'error': 'on the PCI bus but not attached'})
    assert pids(gpu_scope(data, [2])) == [10, 13, 30]   # by index it would be [13, 30]
    with pytest.raises(AnsibleFilterError, match=r'no GPU 5 on this host \(it has 0, 1, 2\)'):
        gpu_scope(data, [5])
