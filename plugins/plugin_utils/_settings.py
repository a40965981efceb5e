# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset settings checked against the one spec (_spec.py), in one short line each, and
by the release's own rules, before any host is touched.

Ansible's own check of an argument spec fails with the whole spec in its result and a message
about Python classes; this one says which setting, what it is and what it must be, by the same
conversions Ansible makes (extra variables arrive as text: '5' is a number, '0,2' a list)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import re
import shlex

from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import check_hold_options
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.jobs import check_job
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import check_escalation_options, check_release_options
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.performance import check_slow_fraction
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import check_probe_mib
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import parse_gpu
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._brake import max_drained_problem
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import plain
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import SETTINGS_SPEC

EXPECTED = {'float': 'a number', 'int': 'a whole number', 'bool': 'true or false', 'list': 'a list',
            'dict': 'a mapping', 'str': 'a string', 'path': 'a path'}
ELEMENTS = {'int': 'whole numbers', 'str': 'strings', 'float': 'numbers'}

# The option a module's message starts with ("timeout must be ...", "signals: ..."), and the
# setting it is.
MODULE_OPTION_RE = re.compile(r'^(devices|gpus|signals|grace_period|timeout|memory_threshold_mib|bug_report_dir|'
                              r'bug_report_timeout|reset_stop_units|probe_mib|slow_fraction|hold_after_cures|hold_window_days|reset_budget|'
                              r'reboot_budget)\b')
# The setting a module's option of another name is (the spec's passed(): reset_stop_units is stop_units).
SETTING_OF_OPTION = dict((option['module'][1], setting) for setting, option in SETTINGS_SPEC.items()
                         if option.get('module', (None, setting))[1] != setting)
# The settings that are options of the release module, checked by the module's own rules.
RELEASE_SETTINGS = ('devices', 'gpus', 'signals', 'grace_period', 'timeout', 'memory_threshold_mib')


def _convert(kind, value):
    """value as Ansible converts it to kind; TypeError or ValueError when it cannot."""
    checker = DEFAULT_TYPE_VALIDATORS.get(kind)
    return value if checker is None else checker(value)


def _converted(option, value):
    """value converted as option says; ValueError when it does not fit."""
    try:
        converted = _convert(option.get('type', 'str'), value)
        if option.get('elements'):
            converted = [_convert(option['elements'], item) for item in converted]
    except (TypeError, ValueError):
        raise ValueError(value)
    if option.get('choices') and converted not in option['choices']:
        raise ValueError(value)
    return converted


def _expected(option):
    """What an option's value must be, in words."""
    if option.get('choices'):
        return 'one of %s' % ', '.join(str(choice) for choice in option['choices'])
    kind = option.get('type', 'str')
    if kind == 'list' and option.get('elements') in ELEMENTS:
        return 'a list of %s' % ELEMENTS[option['elements']]
    return EXPECTED.get(kind, 'a %s' % kind)


def convert(settings, name=None, spec=None):
    """(options, problems): every option of spec (SETTINGS_SPEC) from settings ({option: value};
    one not given, or None, is not set: it takes its default), converted; one text per value that
    does not fit, naming the setting as name(option) says, its value and what it must be (the
    option then keeps its default)."""
    spec = SETTINGS_SPEC if spec is None else spec
    name = name or (lambda option: option)
    options, found = {}, []
    for option in sorted(spec):
        value = plain(settings.get(option))
        # A copy: the spec's own lists are never handed out to be changed.
        options[option] = copy.deepcopy(spec[option].get('default'))
        if value is None:
            continue
        if _looks_like_a_list(spec[option], value):
            found.append('%s is %r, a text that looks like a list: on the command line a list is given as JSON, %s' % (
                name(option), value, _as_json(name(option), value)))
            continue
        try:
            options[option] = _converted(spec[option], value)
        except ValueError:
            found.append('%s is %r, expected %s' % (name(option), value, _expected(spec[option])))
    return options, found


def _looks_like_a_list(option, value):
    """Whether value is a text in brackets where a list is expected: what -e NAME=[A,B] gives,
    which Ansible would read as the list of the one text '[A,B]' or of '[A' and 'B]'."""
    text = value.strip() if isinstance(value, str) else ''
    return option.get('type') == 'list' and text.startswith('[') and text.endswith(']')


def _as_json(name, value):
    """The -e argument that gives the list value meant ('[TERM,KILL]'), as JSON."""
    items = [item.strip().strip('\'"') for item in value.strip()[1:-1].split(',')]
    items = [int(item) if re.match(r'^-?[0-9]+$', item) else item for item in items if item]
    return '-e %s' % shlex.quote(json.dumps({name: items}))


def settings_problems(settings, name=None):
    """(options, problems) of convert, then, when every value fits, the modules' own rules
    (module_utils/_options.py: the limits the release and the probe apply on the host) and the
    rules between settings."""
    name = name or (lambda option: option)
    options, found = convert(settings, name)
    if found:
        return options, found
    checks = (
        lambda: check_release_options(**dict((option, options[option]) for option in RELEASE_SETTINGS
                                             if options[option] is not None)),
        lambda: check_escalation_options(options['bug_report_dir'], options['bug_report_timeout'],
                                         options['stop_units']),
        lambda: check_probe_mib(options['probe_mib']),
        lambda: check_slow_fraction(options['probe_slow_fraction']),
        lambda: check_hold_options(options['hold_after_cures'], options['hold_window_days'], options['reset_budget'],
                                   options['reboot_budget']),
    )
    for check in checks:
        try:
            check()
        except GpuopsError as exc:
            found.append(MODULE_OPTION_RE.sub(
                lambda match: name(SETTING_OF_OPTION.get(match.group(1), match.group(1))), str(exc), count=1))
    if options['gpus'] is not None and not found:
        # As the release reads them: '3' is GPU 3, a MIG instance in one spelling.
        options['gpus'] = [parse_gpu(gpu) for gpu in options['gpus']]
    try:
        check_job(options['job'])
    except GpuopsError as exc:
        found.append(str(exc).replace('job', name('job'), 1))
    query = options['clean_query']
    if query is not None and not query.strip():
        found.append('%s must be a JMESPath expression or null, it is empty' % name('clean_query'))
    if options['on_failure'] == 'drain' and not options['drain_command']:
        found.append('%s is drain but %s is empty' % (name('on_failure'), name('drain_command')))
    if max_drained_problem(options['max_drained']):
        found.append('%s: %s' % (name('max_drained'), max_drained_problem(options['max_drained'])))
    return options, found
