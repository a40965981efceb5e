# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fixtures of the module_utils tests."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest


@pytest.fixture
def devroot(tmp_path):
    """A /dev of simulated NVIDIA nodes (regular files) and an empty nvidia-caps directory."""
    dev = tmp_path / 'dev'
    dev.mkdir()
    for name in ['nvidia0', 'nvidia1', 'nvidiactl', 'nvidia-uvm']:
        (dev / name).write_bytes(b'\0' * 4096)
    (dev / 'nvidia-caps').mkdir()
    return dev
