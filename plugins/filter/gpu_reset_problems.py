# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_problems
short_description: What is wrong with the settings of the gpu_reset role
version_added: 0.1.0
author:
  - gpuops maintainers
deprecated:
  removed_in: 1.0.0
  why: The action M(gpuops.nvidia.gpu_reset) checks the role's settings itself; the role no longer uses this filter.
  alternative: Use M(gpuops.nvidia.gpu_reset), or the role, which checks its settings.
description:
  - The checks of the role P(gpuops.nvidia.gpu_reset#role) that its argument specs cannot express
    (ranges, lists that must not be empty, settings that depend on each other).
  - The settings that are options of M(gpuops.nvidia.nvidia_device_release) (C(devices), C(gpus),
    C(signals), C(grace_period), C(timeout), C(memory_threshold_mib)) are checked by the module's
    own rules, so the role refuses on the controller what the module would refuse on the host.
  - Runs on the controller only.
options:
  _input:
    description:
      - The role's settings without the C(gpu_reset_) prefix, C(timeout), C(grace_period),
        C(memory_threshold_mib), C(signals), C(devices), C(gpus), C(clean_query),
        C(on_failure) and C(drain_command).
    type: dict
    required: true
  variables:
    description:
      - Every C(gpu_reset_*) variable by its name, checked against the role's argument spec
        first. A value that does not fit its type or choices gives one text naming the variable,
        its value and what it must be, and the other checks are left out.
    type: dict
'''

EXAMPLES = r'''
- name: Check the settings
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
  vars:
    problems: "{{ {'timeout': 0, 'signals': ['TERM']} | gpuops.nvidia.gpu_reset_problems }}"
'''

RETURN = r'''
_value:
  description: One text per problem, naming the variable; empty when there is none.
  type: list
  elements: str
'''

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._settings import settings_problems
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX


def gpu_reset_problems(settings, variables=None):
    """settings_problems over the settings and the variables, naming the role's variables."""
    given = dict(settings)
    given.update((name[len(PREFIX):], value) for name, value in (variables or {}).items() if name.startswith(PREFIX))
    return settings_problems(given, lambda option: PREFIX + option)[1]


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_problems': gpu_reset_problems}
