# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_brake_problem
short_description: Why a setting of the fleet brake cannot be read
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes a value of the fleet brake's cap (the action's O(gpuops.nvidia.gpu_reset#module:max_drained), the
    Slurm hooks' C(GPU_RESET_MAX_DRAINED)), a number of nodes or a percentage of the cluster's (V(N%)), or,
    with O(setting=max_drain_rate), of its rate (C(GPU_RESET_MAX_DRAIN_RATE)), V(NODES/WINDOW) with the
    window in V(s), V(m) or V(h) (at least 1 node, within 1 s to 7 days).
  - Returns why the value cannot be read, in a few words that name it, or an empty string when it can.
  - The rule is the one the action M(gpuops.nvidia.gpu_reset) and the Slurm hook check their settings by, so
    the role P(gpuops.nvidia.slurm_hooks#role) refuses exactly the values the hook would.
options:
  _input:
    description: The value; a number is read as its text.
    type: raw
    required: true
  setting:
    description: Which setting the value is for.
    type: str
    choices: [max_drained, max_drain_rate]
    default: max_drained
'''

EXAMPLES = r'''
- name: Check the fleet brake
  ansible.builtin.assert:
    that: slurm_hooks_max_drained | gpuops.nvidia.gpu_reset_brake_problem | length == 0
    fail_msg: "slurm_hooks_max_drained: {{ slurm_hooks_max_drained | gpuops.nvidia.gpu_reset_brake_problem }}"
'''

RETURN = r'''
_value:
  description: Why the value cannot be read (for V(10 %), that it is neither a number of nodes nor a
    percentage), or an empty string when it can.
  type: str
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._brake import drain_rate_problem, max_drained_problem

RULES = {'max_drained': max_drained_problem, 'max_drain_rate': drain_rate_problem}


def gpu_reset_brake_problem(value, setting='max_drained'):
    if setting not in RULES:
        raise AnsibleFilterError('gpu_reset_brake_problem: setting must be %s, got %r' % (' or '.join(sorted(RULES)), setting))
    return RULES[setting](None if value is None else str(value)) or ''


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_brake_problem': gpu_reset_brake_problem}
