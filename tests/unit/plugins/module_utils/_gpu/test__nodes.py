# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which files a device glob may name (module_utils/_gpu/nodes.py), on simulated nodes (regular
files); the nodes told by identity whatever their path: test__holders.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import expand_devices


def test_expand_devices_skips_directories_and_sorts(devroot):
    paths = expand_devices([str(devroot / 'nvidia*')])
    assert paths == sorted(str(devroot / n) for n in ['nvidia-uvm', 'nvidia0', 'nvidia1', 'nvidiactl'])


def test_expand_devices_matching_nothing_is_empty(devroot):
    assert expand_devices([str(devroot / 'nope*')]) == []


@pytest.mark.parametrize('bad', ['dev/nvidia*', '', 'nvidia0'])
def test_expand_devices_rejects_relative_patterns(bad):
    with pytest.raises(GpuopsError, match='not an absolute path'):
        expand_devices([bad])


@pytest.mark.skipif(os.getuid() != 0, reason='needs root to make a file of another user')
def test_a_regular_file_another_user_owns_is_no_device_node(devroot):
    os.chown(str(devroot / 'nvidia1'), pwd.getpwnam('nobody').pw_uid, -1)
    with pytest.raises(GpuopsError, match=r'nvidia1 .* is a regular file owned by uid \d+, not a device node'):
        expand_devices([str(devroot / 'nvidia*')])


def test_a_regular_file_in_a_directory_others_can_write_is_no_device_node(devroot):
    os.chmod(str(devroot), 0o777)
    with pytest.raises(GpuopsError, match='is a regular file in a directory that other users can write'):
        expand_devices([str(devroot / 'nvidia0')])
