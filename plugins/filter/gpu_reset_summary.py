# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_summary
short_description: One line per host from the reports of the gpu_reset role
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the hosts of a play and their variables, where the role P(gpuops.nvidia.gpu_reset#role)
    left each host's report in C(gpu_reset_result), and returns the summary the playbook
    C(gpuops.nvidia.reset_gpus) prints.
  - The first line counts the hosts by outcome. Then one line per host that is not clean, failed
    hosts first, then released and checked (check mode) ones; a failed host's line gives how long
    it took and its reason, the others the processes stopped, the GPUs free and held and how long
    the release took.
  - Then one line for all the clean hosts, however many, with their count, their GPUs and their
    names, numbered names written in ranges as Slurm writes hostlists (V(gpu[001-095,097])). A
    summary of 100 hosts of which 95 are clean is 7 lines.
  - A last line names the hosts without a report (unreachable, or in a later serial batch).
  - Runs on the controller only.
options:
  _input:
    description: The hosts to summarise, usually C(ansible_play_hosts_all).
    type: list
    elements: str
    required: true
  hostvars:
    description: The hosts' variables, usually C(hostvars).
    type: dict
    required: true
  sliced:
    description: The inventory is one slice of a sliced job; the first line says so.
    type: bool
    default: false
seealso:
  - plugin: gpuops.nvidia.gpu_reset_verdict
    plugin_type: filter
'''

EXAMPLES = r'''
- name: Summary
  ansible.builtin.debug:
    msg: "{{ ansible_play_hosts_all | gpuops.nvidia.gpu_reset_summary(hostvars) }}"
  run_once: true
'''

RETURN = r'''
_value:
  description: The summary, a line per item.
  type: list
  elements: str
  sample:
    - "3 of 3 host(s): 1 clean, 1 released, 1 failed"
    - "FAILED    gpu03  after 4.1 s: GPU 3: 512 MiB held with no process left (orphaned memory; only a GPU reset frees it)"
    - "released  gpu02  8 process(es) stopped (python3; TERM), 8 GPU(s) free in 1.2 s"
    - "clean     1 host(s), nothing to do (8 GPU(s) free): gpu01"
'''

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import summary


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_summary': summary}
