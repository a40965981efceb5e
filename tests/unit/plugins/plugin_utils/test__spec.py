# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one spec of the gpu_reset settings (plugin_utils/_spec.py): the role's argument spec and
defaults, the action's documentation and the modules' own declarations are it; a typo of a
variable is named with the nearest one."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import (
    PREFIX, SETTINGS_SPEC, defaults, nearest_variable, unknown_variables)

ROLE = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'gpu_reset')


def test_the_role_argument_spec_is_the_one_spec():
    with open(os.path.join(ROLE, 'meta', 'argument_specs.yml')) as handle:
        options = yaml.safe_load(handle)['argument_specs']['main']['options']
    spec = dict((PREFIX + name, option) for name, option in SETTINGS_SPEC.items())
    assert sorted(options) == sorted(spec)
    for name, option in spec.items():
        role = options[name]
        for key in ('type', 'elements', 'choices'):
            assert role.get(key) == option.get(key), (name, key)
        assert role.get('default') == option.get('default'), name


def test_the_action_documents_the_one_spec():
    """The action's options are the spec's, with the same types, choices and defaults."""
    from ansible_collections.gpuops.nvidia.plugins.action.gpu_reset import ActionModule
    from ansible_collections.gpuops.nvidia.plugins.modules import gpu_reset

    from ansible_collections.gpuops.nvidia.plugins.doc_fragments.gpu import ModuleDocFragment

    options = yaml.safe_load(gpu_reset.DOCUMENTATION)['options']
    options.update(yaml.safe_load(ModuleDocFragment.MEMORY_THRESHOLD)['options'])
    assert sorted(options) == sorted(SETTINGS_SPEC) == sorted(ActionModule._VALID_ARGS)
    for name, option in SETTINGS_SPEC.items():
        documented = options[name]
        for key in ('type', 'elements', 'choices'):
            assert documented.get(key, 'str' if key == 'type' else None) == option.get(key, 'str' if key == 'type' else None), (name, key)
        assert documented.get('default') == option.get('default'), name


def test_the_role_defaults_are_the_spec_s():
    with open(os.path.join(ROLE, 'defaults', 'main.yml')) as handle:
        role = yaml.safe_load(handle)
    assert role == dict((PREFIX + name, value) for name, value in defaults().items())


def test_a_typo_is_named_and_the_other_variables_are_not():
    names = ['gpu_reset_timout', 'gpu_reset_timeout', 'gpu_reset_result', 'gpu_reset__release', 'gpu_reset_serial',
             'gpu_reset_sliced', 'other', 'gpu_reset_probe_mib']
    assert unknown_variables(names) == ['gpu_reset_timout']


@pytest.mark.parametrize('typo, nearest', [
    ('gpu_reset_timout', 'gpu_reset_timeout'),
    ('gpu_reset_singals', 'gpu_reset_signals'),
    ('gpu_reset_serail', 'gpu_reset_serial'),
    ('gpu_reset_memory_threshold', 'gpu_reset_memory_threshold_mib'),
    ('gpu_reset_foo', None),
])
def test_a_typo_is_told_the_nearest_variable(typo, nearest):
    assert nearest_variable(typo) == nearest


@pytest.mark.parametrize('module', ['nvidia_device_release', 'nvidia_gpu_probe'])
def test_a_setting_passed_to_a_module_is_declared_as_the_module_declares_it(module):
    """The settings the sequence passes to a module under the same name have the module's type,
    elements, choices and default: the two declarations cannot drift apart."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _sequence

    specs = {
        'nvidia_device_release': ('_release', 'release_argument_spec', _sequence.RELEASE_OPTIONS),
        'nvidia_gpu_probe': ('_probe', 'probe_argument_spec', _sequence.PROBE_OPTIONS),
    }
    name, function, passed = specs[module]
    utils = __import__('ansible_collections.gpuops.nvidia.plugins.module_utils.' + name, fromlist=[function])
    module_spec = getattr(utils, function)()
    for option in passed:
        ours, theirs = SETTINGS_SPEC[option], module_spec[option]
        for key in ('type', 'elements', 'choices', 'default'):
            if (module, option, key) == ('nvidia_gpu_probe', 'gpus', 'elements'):
                continue  # the sequence probes whole GPUs only (probe_gpus): indexes, never MIG instances
            assert ours.get(key, 'str' if key == 'type' else None) == theirs.get(key, 'str' if key == 'type' else None), \
                (module, option, key)
