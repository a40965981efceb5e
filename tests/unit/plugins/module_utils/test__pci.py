# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""PCI bus ids (module_utils/_pci.py), in every spelling of the driver, nvidia-smi, NVML and sysfs."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import bus_ids_in, bus_key, normalize_bus_id


def test_bus_key_matches_every_spelling():
    assert bus_key('00000000:3B:00.0') == bus_key('0000:3b:00') == bus_key('PCI:0000:3B:00') == (0, 0x3b, 0)
    assert bus_key(None) is None and bus_key('GPU-x') is None


@pytest.mark.parametrize('bus_id, normalized', [
    ('0000:3b:00.0', '00000000:3B:00.0'),
    ('00000000:3B:00.0', '00000000:3B:00.0'),
    (' 1:a2:00.0 ', '00000001:A2:00.0'),
    (None, None),
    ('', None),
])
def test_a_bus_id_is_spelled_as_nvidia_smi_spells_it(bus_id, normalized):
    assert normalize_bus_id(bus_id) == normalized


def test_the_bus_ids_a_text_names_are_normalized_once_each_in_order():
    text = ("NVRM: Xid (PCI:0000:3b:00.0): 79, GPU has fallen off the bus; GPU 00000000:18:00.0 and again "
            "0000:3B:00.0, not GPU-5c4e1b4a or 12:34:56")
    assert bus_ids_in(text) == ['00000000:3B:00.0', '00000000:18:00.0']
    assert bus_ids_in(None) == [] and bus_ids_in('') == []
