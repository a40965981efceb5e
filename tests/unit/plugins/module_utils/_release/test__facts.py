# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gpu_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import Snapshot


def test_a_lost_gpu_without_index_comes_last_with_its_bus_id_and_error():
    line = 'Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU'
    lost = {'index': None, 'pci_bus_id': '00000000:3B:00.0', 'error': line}
    healthy = [{'index': i, 'pci_bus_id': '00000000:%02X:00.0' % (0x18 + i), 'memory_used_mib': 0, 'error': None}
               for i in (1, 0)]
    gpus = gpu_facts(Snapshot([lost] + healthy, '550.127.05', []))
    assert [(gpu['index'], gpu['state']) for gpu in gpus] == [(0, 'free'), (1, 'free'), (None, 'lost')]
    assert gpus[2]['pci_bus_id'] == '00000000:3B:00.0' and gpus[2]['health']['recovery_action'] == 'reboot'
