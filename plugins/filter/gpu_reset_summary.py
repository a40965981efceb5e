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
  - Then one line per host without a report, saying why - V(UNREACHED) with Ansible's message,
    V(FAILED) with the message of a task that failed without a report, or V(NOT RUN) when the role
    never ran on it (the play ended before its serial batch).
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
  - module: gpuops.nvidia.gpu_reset
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
    - "UNREACHED gpu04  Failed to connect to the host via ssh: ssh: connect to host gpu04 port 22: No route to host"
'''

from collections.abc import Mapping

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import plain
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import reports, summary

# The most of Ansible's message shown for a host without a report.
MESSAGE_AT_MOST = 300


def why_no_report(result):
    """(label, why) for a host whose gpu_reset_result holds no report: what its task registered,
    or the role's placeholder or nothing where the task never ran on it."""
    if not isinstance(result, Mapping) or not (result.get('unreachable') or result.get('failed')):
        return 'NOT RUN', 'no result: the play ended before the role ran on it'
    message = printable(' '.join(str(result.get('msg') or 'no message').split()), MESSAGE_AT_MOST)
    if result.get('unreachable'):
        return 'UNREACHED', message
    return 'FAILED', message


def gpu_reset_summary(hosts, hostvars, sliced=False):
    """The summary of _verdict.summary, with one line per host without a report, saying why, in
    place of its one line naming them all."""
    lines = [line for line in summary(hosts, hostvars, sliced) if not line.startswith('no result from ')]
    found = reports(hosts, hostvars)
    missing = [str(host) for host in hosts if str(host) not in found]
    if not missing:
        return lines
    width = max(len(host) for host in missing)
    said = []
    for host in missing:
        label, why = why_no_report(plain(hostvars[host].get('gpu_reset_result')))
        said.append('%s %s  %s' % (label.ljust(9), host.ljust(width), why))
    return lines + said


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_summary': gpu_reset_summary}
