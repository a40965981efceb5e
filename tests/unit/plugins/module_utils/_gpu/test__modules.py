# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kernel modules that hold nvidia, read from a /sys/module of files as sysfs lays it out."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.modules import describe, module_holders


def module(root, name, holds=None, refcnt='0\n'):
    base = root / 'sys' / 'module'
    (base / name / 'holders').mkdir(parents=True, exist_ok=True)
    if refcnt is not None:
        (base / name / 'refcnt').write_text(refcnt)
    if holds:
        (base / holds / 'holders').mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.join('..', '..', name), str(base / holds / 'holders' / name))


def test_holders_directly_and_through_another_module_breadth_first(tmp_path):
    module(tmp_path, 'nvidia', refcnt='412\n')
    module(tmp_path, 'nvidia_uvm', 'nvidia', '2\n')
    module(tmp_path, 'nvidia_modeset', 'nvidia', '1\n')
    module(tmp_path, 'nvidia_drm', 'nvidia_modeset', refcnt=None)
    holders = module_holders(str(tmp_path))
    assert holders == [{'name': 'nvidia_modeset', 'refcnt': 1, 'via': None}, {'name': 'nvidia_uvm', 'refcnt': 2, 'via': None},
                       {'name': 'nvidia_drm', 'refcnt': None, 'via': 'nvidia_modeset'}]
    assert describe(holders) == 'nvidia_modeset (used by 1), nvidia_uvm (used by 2), nvidia_drm (through nvidia_modeset, used by ?)'


def test_no_driver_loaded_or_no_sysfs_is_no_holder(tmp_path):
    assert module_holders(str(tmp_path)) == []
    module(tmp_path, 'nvidia')
    assert module_holders(str(tmp_path)) == []


def test_a_name_that_is_no_module_name_and_a_loop_are_left_out(tmp_path):
    module(tmp_path, 'nvidia')
    module(tmp_path, 'gdrdrv', 'nvidia', 'garbage\n')
    os.symlink('../../nvidia', str(tmp_path / 'sys' / 'module' / 'gdrdrv' / 'holders' / 'nvidia'))
    (tmp_path / 'sys' / 'module' / 'nvidia' / 'holders' / 'bad name;x').mkdir()
    assert module_holders(str(tmp_path)) == [{'name': 'gdrdrv', 'refcnt': None, 'via': None}]
