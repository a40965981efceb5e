# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one spec of the gpu_reset settings (plugin_utils/_spec.py): the role's argument spec and
defaults, the action's documentation and the Slurm hooks' settings are generated from it
(scripts/gen_settings.py) and current; the modules' own declarations are it; a typo of a
variable is named with the nearest one."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib.util
import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import (
    PREFIX, SETTINGS_SPEC, nearest_variable, unknown_variables)

REPO = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')


def generator():
    """scripts/gen_settings.py, imported from the checkout."""
    path = os.path.join(REPO, 'scripts', 'gen_settings.py')
    spec = importlib.util.spec_from_file_location('gen_settings', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_files_are_the_spec_s(capsys):
    """The role's argument spec, defaults and README table, the action's options and the Slurm
    hooks' settings are written from the spec: none is stale (run scripts/gen_settings.py)."""
    assert generator().main(['--check']) == 0, capsys.readouterr().err


def test_a_change_to_the_spec_makes_the_files_that_say_it_stale(monkeypatch, capsys):
    monkeypatch.setitem(SETTINGS_SPEC['max_drained'], 'default', '20%')
    assert generator().main(['--check']) == 1
    err = capsys.readouterr().err
    for path in ('roles/gpu_reset/meta/argument_specs.yml', 'roles/gpu_reset/defaults/main.yml',
                 'roles/gpu_reset/README.md', 'plugins/modules/gpu_reset.py',
                 'roles/slurm_hooks/meta/argument_specs.yml', 'roles/slurm_hooks/defaults/main.yml',
                 'roles/slurm_hooks/README.md'):
        assert path in err, err


def test_the_action_takes_the_spec_s_options():
    from ansible_collections.gpuops.nvidia.plugins.action.gpu_reset import ActionModule

    assert sorted(ActionModule._VALID_ARGS) == sorted(SETTINGS_SPEC)


def test_an_option_passed_to_a_module_is_described_by_the_module_in_the_spec_s_names():
    """probe_level's description is the probe module's: its O(probe_mib) is the setting probe_mib,
    its other options and return values are named with the module's name."""
    module = generator()
    described = module.descriptions(*module.import_spec())
    assert 'O(probe_mib)' in ' '.join(described['probe_level'])
    assert 'O(allow_gpu_reset)' in described['stop_units'][-1]
    reload_modules = ' '.join(described['reload_modules'])
    assert 'RV(gpuops.nvidia.nvidia_device_reset#module:escalation.flr_refused)' in reload_modules
    assert 'O(stop_units)' in reload_modules and 'O(reset_stop_units)' not in reload_modules
    assert described['hold_after_cures'][-1] == 'Between 1 and 100.'


def test_the_role_refuses_a_reference_to_no_option():
    module = generator()
    with pytest.raises(ValueError, match=r'O\(no_such_option\) names no option of the spec'):
        module.spec_to(lambda name: PREFIX + name, SETTINGS_SPEC)('See O(no_such_option).')


def test_every_option_is_described():
    for name, option in SETTINGS_SPEC.items():
        assert option.get('description') or option.get('module'), name


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
        'nvidia_device_release': ('_release.release', 'release_argument_spec', _sequence.RELEASE_OPTIONS),
        'nvidia_gpu_probe': ('_probe.probe', 'probe_argument_spec', _sequence.PROBE_OPTIONS),
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
