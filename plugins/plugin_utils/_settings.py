# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset role's variables checked against its argument spec, in one short line each.

Ansible's own check of a role's argument spec fails with the whole spec in its result and a
message about Python classes; this one says which variable, what it is and what it must be,
by the same spec (roles/gpu_reset/meta/argument_specs.yml) and the same conversions."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import plain

SPEC_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'roles', 'gpu_reset', 'meta',
                         'argument_specs.yml')

EXPECTED = {'float': 'a number', 'int': 'a whole number', 'bool': 'true or false', 'list': 'a list',
            'dict': 'a mapping', 'str': 'a string', 'path': 'a path'}
ELEMENTS = {'int': 'whole numbers', 'str': 'strings', 'float': 'numbers'}

_SPEC = {}


def role_options():
    """The options of the role's main entry point, read once."""
    if not _SPEC:
        import yaml
        with open(SPEC_FILE) as handle:
            _SPEC.update(yaml.safe_load(handle)['argument_specs']['main']['options'])
    return _SPEC


def _converts(kind, value):
    """Whether Ansible's conversion for kind accepts value."""
    checker = DEFAULT_TYPE_VALIDATORS.get(kind)
    if checker is None:
        return True
    try:
        checker(value)
    except (TypeError, ValueError):
        return False
    return True


def _expected(option):
    """What an option's value must be, in words."""
    if option.get('choices'):
        return 'one of %s' % ', '.join(str(choice) for choice in option['choices'])
    kind = option.get('type', 'str')
    if kind == 'list' and option.get('elements') in ELEMENTS:
        return 'a list of %s' % ELEMENTS[option['elements']]
    return EXPECTED.get(kind, 'a %s' % kind)


def _fits(option, value):
    kind = option.get('type', 'str')
    if not _converts(kind, value):
        return False
    if kind == 'list' and option.get('elements'):
        items = DEFAULT_TYPE_VALIDATORS['list'](value)
        return all(_converts(option['elements'], item) for item in items)
    return not option.get('choices') or value in option['choices']


def spec_problems(variables, options=None):
    """One text per role variable (name: value) whose value does not fit the argument spec,
    naming the variable, its value and what it must be. None is every option's 'not set'."""
    options = role_options() if options is None else options
    found = []
    for name in sorted(variables):
        option, value = options.get(name), plain(variables[name])
        if option is None or value is None or _fits(option, value):
            continue
        found.append('%s is %r, expected %s' % (name, value, _expected(option)))
    return found
