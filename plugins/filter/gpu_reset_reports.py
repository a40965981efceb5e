# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_reports
short_description: The reports of the gpu_reset role, by host
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the hosts of a play and their variables, where the role P(gpuops.nvidia.gpu_reset#role)
    left each host's report in C(gpu_reset_result), and returns the reports by host name. Hosts
    without a report (unreachable, or in a later serial batch) are left out.
  - The playbook C(gpuops.nvidia.reset_gpus) publishes this with C(ansible.builtin.set_stats) as
    C(gpu_reset_reports), which AWX and ansible-runner keep as the job's artifacts.
  - Runs on the controller only.
options:
  _input:
    description: The hosts, usually C(ansible_play_hosts_all).
    type: list
    elements: str
    required: true
  hostvars:
    description: The hosts' variables, usually C(hostvars).
    type: dict
    required: true
seealso:
  - plugin: gpuops.nvidia.gpu_reset_summary
    plugin_type: filter
'''

EXAMPLES = r'''
- name: Publish the reports as job artifacts
  ansible.builtin.set_stats:
    data:
      gpu_reset_reports: "{{ ansible_play_hosts_all | gpuops.nvidia.gpu_reset_reports(hostvars) }}"
    per_host: false
    aggregate: true
  run_once: true
'''

RETURN = r'''
_value:
  description: Each host's report (the result of M(gpuops.nvidia.gpu_reset)), by host name.
  type: dict
'''

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import reports


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_reports': reports}
