# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_clean
short_description: Whether GPU facts are clean, by the test of the gpu_reset role
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the facts returned by M(gpuops.nvidia.nvidia_gpu_facts), narrows them to O(gpus)
    like P(gpuops.nvidia.gpu_scope#filter), and evaluates a JMESPath clean query over them
    with the code of P(gpuops.nvidia.json_query#filter).
  - Without O(query), the test is the one of M(gpuops.nvidia.nvidia_device_release), so every GPU
    in scope readable and at or below O(memory_threshold_mib), and no holder that is not
    protected.
  - Runs on the controller only.
options:
  _input:
    description: The facts, a dict with C(nvidia_gpus) and C(nvidia_device_holders).
    type: dict
    required: true
  query:
    description: A JMESPath expression that must give true or false; null for the default test.
    type: str
  gpus:
    description: GPU indexes to judge; null judges every GPU.
    type: list
    elements: int
  memory_threshold_mib:
    description: The threshold of the default test, in MiB.
    type: int
    default: 32
requirements:
  - jmespath (the Python library, on the controller)
seealso:
  - module: gpuops.nvidia.gpu_reset
'''

EXAMPLES = r'''
- name: Read the GPUs
  gpuops.nvidia.nvidia_gpu_facts:
  register: gpu_facts

- name: Fail unless GPUs 2 and 3 are clean
  ansible.builtin.assert:
    that: gpu_facts.ansible_facts | gpuops.nvidia.gpu_clean(gpus=[2, 3])
'''

RETURN = r'''
_value:
  description: True when the GPUs are clean. A query that gives anything but a boolean is an error.
  type: bool
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import QueryError
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import is_clean


def gpu_clean(facts, query=None, gpus=None, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB):
    if isinstance(facts, dict) and isinstance(facts.get('ansible_facts'), dict):
        facts = facts['ansible_facts']
    try:
        return is_clean(facts, query, gpus, memory_threshold_mib)
    except QueryError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):

    def filters(self):
        return {'gpu_clean': gpu_clean}
