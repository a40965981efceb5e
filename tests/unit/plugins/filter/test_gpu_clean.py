# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_clean import FilterModule, gpu_clean


def gpu(index, used=1, state='free'):
    return dict(index=index, memory_used_mib=used, state=state, error=None, processes=[], minor_number=index)


def facts(gpus, holders=()):
    return {'ansible_facts': dict(nvidia_gpus=list(gpus), nvidia_device_holders=list(holders))}


def test_query_must_give_a_boolean():
    with pytest.raises(AnsibleFilterError, match='must give true or false, it gave 2 for these GPUs'):
        gpu_clean(facts([gpu(0), gpu(1)]), query='length(nvidia_gpus)')


def test_default_clean_test_uses_the_threshold():
    assert gpu_clean(facts([gpu(0, 32)])) is True
    assert gpu_clean(facts([gpu(0, 33)])) is False
    assert gpu_clean(facts([gpu(0, 33)]), memory_threshold_mib=40) is True
    assert gpu_clean(facts([gpu(0), gpu(1, 999, 'busy')]), gpus=[0]) is True


def test_protected_holders_do_not_count():
    holders = [dict(pid=1, comm='nvidia-persistenced', protected=True, devices=['/dev/nvidia0'])]
    assert gpu_clean(facts([gpu(0)], holders)) is True
    assert gpu_clean(facts([gpu(0)], holders + [dict(pid=2, protected=False, devices=['/dev/nvidia0'])])) is False


def test_registered_under_its_name():
    assert FilterModule().filters()['gpu_clean'] is gpu_clean
