# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_scope
short_description: Narrow GPU facts down to some GPUs and the processes that hold them
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the facts returned by M(gpuops.nvidia.nvidia_gpu_facts) and keeps only the GPUs
    named, and only the device holders that block them, the same way
    M(gpuops.nvidia.nvidia_device_release) scopes a release with its O(gpuops.nvidia.nvidia_device_release#module:gpus)
    option.
  - A holder blocks a GPU when it holds the GPU's C(nvidiaN) device node (N is the GPU's
    C(minor_number), or its index when the minor number is unknown) or when the driver
    reports it as a process on that GPU. Processes that hold only the shared nodes
    (C(nvidiactl), C(nvidia-uvm)) are dropped, since every CUDA process holds those.
  - Every other key of the facts is kept as it is.
options:
  _input:
    description: The facts, a dict with C(nvidia_gpus) and C(nvidia_device_holders).
    type: dict
    required: true
  gpus:
    description:
      - GPU indexes to keep. Null keeps every GPU and every holder.
      - A MIG instance (V(N:G), V(N:G:C) or a MIG UUID found in the GPUs' C(mig) facts) keeps its
        whole GPU, whose facts count every instance of it.
    type: list
    elements: raw
seealso:
  - module: gpuops.nvidia.nvidia_gpu_facts
  - plugin: gpuops.nvidia.json_query
    plugin_type: filter
'''

EXAMPLES = r'''
- name: Read the GPUs
  gpuops.nvidia.nvidia_gpu_facts:
  register: gpu_facts

- name: Memory used on GPUs 2 and 3
  ansible.builtin.debug:
    msg: "{{ gpu_facts.ansible_facts | gpuops.nvidia.gpu_scope([2, 3]) | gpuops.nvidia.json_query('nvidia_gpus[].memory_used_mib') }}"

- name: Who blocks the GPUs of this Slurm job
  ansible.builtin.debug:
    msg: "{{ (gpu_facts.ansible_facts | gpuops.nvidia.gpu_scope(job_gpus)).nvidia_device_holders | map(attribute='pid') }}"
  vars:
    job_gpus: "{{ lookup('ansible.builtin.env', 'SLURM_JOB_GPUS') | split(',') | map('int') }}"
'''

RETURN = r'''
_value:
  description: The facts with C(nvidia_gpus) and C(nvidia_device_holders) narrowed down.
  type: dict
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import QueryError
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _verdict


def gpu_scope(facts, gpus=None):
    try:
        return _verdict.gpu_scope(facts, gpus)
    except QueryError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):

    def filters(self):
        return {'gpu_scope': gpu_scope}
