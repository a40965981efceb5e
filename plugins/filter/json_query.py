# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: json_query
short_description: Select or test data with a JMESPath expression
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Evaluates a JMESPath expression (U(https://jmespath.org)) over the input and returns the
    result.
  - The role P(gpuops.nvidia.gpu_reset#role) decides with it whether a host is clean
    (C(gpu_reset_clean_query)), over the facts of M(gpuops.nvidia.nvidia_gpu_facts).
  - Runs on the controller only. Managed hosts never need C(jmespath).
  - Before the search the input is turned into plain Python values (dicts, lists, strings,
    numbers, booleans, null), so that JMESPath functions such as C(length) or C(contains) accept
    values that Ansible has templated.
options:
  _input:
    description: The data to search.
    type: raw
    required: true
  expr:
    description: The JMESPath expression.
    type: str
    required: true
requirements:
  - jmespath (the Python library, on the controller)
notes:
  - Numbers in an expression are JSON literals between backquotes, for example C(`16`).
  - A malformed expression or a function applied to the wrong type fails the task with the
    JMESPath error message; a path that does not exist gives null.
seealso:
  - module: gpuops.nvidia.nvidia_gpu_facts
  - plugin: gpuops.nvidia.gpu_scope
    plugin_type: filter
'''

EXAMPLES = r'''
- name: Indexes of the GPUs that hold more than 16 MiB
  ansible.builtin.debug:
    msg: "{{ ansible_facts | gpuops.nvidia.json_query('nvidia_gpus[?memory_used_mib > `16`].index') }}"

- name: Fail when a process that is not protected holds the GPUs
  ansible.builtin.assert:
    that:
      - ansible_facts | gpuops.nvidia.json_query('length(nvidia_device_holders[?!protected])') == 0
    fail_msg: GPU device nodes are still held

- name: A stricter clean test for gpu_reset that also rejects pending row remaps
  ansible.builtin.set_fact:
    gpu_reset_clean_query: >-
      length(nvidia_gpus[?error != null || memory_used_mib > `0` || health.remapped_rows_pending]) == `0`
      && length(nvidia_device_holders[?!protected]) == `0`
'''

RETURN = r'''
_value:
  description: The result of the expression; null when the path does not exist.
  type: raw
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _jmespath

try:
    import jmespath
except ImportError:
    jmespath = None


def json_query(data, expr):
    """Evaluate the JMESPath expression expr over data."""
    if jmespath is None:
        raise AnsibleFilterError(
            'json_query needs the jmespath Python library on the controller (pip install jmespath)')
    try:
        return _jmespath.search(data, expr, library=jmespath)
    except _jmespath.QueryError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):

    def filters(self):
        return {'json_query': json_query}
