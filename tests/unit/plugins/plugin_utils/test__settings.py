# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._settings import role_options, spec_problems
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import problems


@pytest.mark.parametrize('name, value, expected', [
    ('gpu_reset_timeout', '5s', "gpu_reset_timeout is '5s', expected a number"),
    ('gpu_reset_memory_threshold_mib', '1.5', "gpu_reset_memory_threshold_mib is '1.5', expected a whole number"),
    ('gpu_reset_backend', 'nvml2', "gpu_reset_backend is 'nvml2', expected one of auto, nvml, nvidia-smi"),
    ('gpu_reset_gpus', [0, 'two'], "gpu_reset_gpus is [0, 'two'], expected a list of whole numbers"),
    ('gpu_reset_allow_gpu_reset', 'maybe', "gpu_reset_allow_gpu_reset is 'maybe', expected true or false"),
    ('gpu_reset_drain_command', {'argv': 'x'}, "gpu_reset_drain_command is {'argv': 'x'}, expected a list of strings"),
])
def test_a_wrong_value_is_named_with_what_it_must_be(name, value, expected):
    assert spec_problems({name: value}) == [expected]


@pytest.mark.parametrize('name, value', [
    ('gpu_reset_timeout', '5'),            # -e gives text; Ansible converts it
    ('gpu_reset_timeout', 2.5),
    ('gpu_reset_allow_gpu_reset', 'yes'),
    ('gpu_reset_gpus', '0,2'),             # a list given as text, as Ansible splits it
    ('gpu_reset_gpus', None),              # not set
    ('gpu_reset_serial', 'anything'),      # a playbook variable, not the role's
])
def test_what_ansible_accepts_is_no_problem(name, value):
    assert spec_problems({name: value}) == []


def test_every_role_variable_has_a_type_the_check_knows():
    for name, option in role_options().items():
        assert option.get('type', 'str') in ('float', 'int', 'bool', 'list', 'dict', 'str', 'path', 'raw'), name


def test_a_wrong_type_ends_the_check_before_the_release_rules():
    # The release's rules would add a second text about the same value.
    assert problems({'timeout': '5s'}, {'gpu_reset_timeout': '5s'}) == ["gpu_reset_timeout is '5s', expected a number"]
