# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_verdict
short_description: The per-host report of the gpu_reset role
version_added: 0.1.0
author:
  - gpuops maintainers
deprecated:
  removed_in: 1.0.0
  why: The action M(gpuops.nvidia.gpu_reset) judges the host and returns the report; the role no longer uses this filter.
  alternative: Use M(gpuops.nvidia.gpu_reset) and its result.
description:
  - Judges one host from what the role P(gpuops.nvidia.gpu_reset#role) registered and returns its
    report. The outcome is C(failed) when O(error) is set; C(clean) when the release signalled
    nothing and left the GPUs clean, or when the GPUs read before it pass O(query); C(would_release)
    in check mode; C(released) when the last read of the GPUs passes O(query); C(failed) otherwise.
  - The reason names each GPU that is not clean and why, and each process that still holds a
    device node.
  - Runs on the controller only.
options:
  _input:
    description: The registered result of M(gpuops.nvidia.nvidia_device_release), or null when it did not run.
    type: dict
  host:
    description: The host's name, for the report.
    type: str
    required: true
  facts_before:
    description: The registered result of M(gpuops.nvidia.nvidia_gpu_facts) read before the release, if any.
    type: dict
  facts:
    description: The registered result of M(gpuops.nvidia.nvidia_gpu_facts) read after the release, if any.
    type: dict
  error:
    description:
      - Why the role could not finish; the host fails with it.
      - A text, or the task that failed as C(task) (its name), C(result) (its result) and C(python)
        (the host's C(ansible_python_interpreter)). A module that gave no result because that
        Python could not run it is then said to be so, with how to pin another.
    type: raw
  gpus:
    description: The GPU indexes in scope; null for every GPU.
    type: list
    elements: int
  query:
    description: The clean query (JMESPath); null for the release module's own test.
    type: str
  memory_threshold_mib:
    description: The threshold of the release module's test, in MiB.
    type: int
    default: 32
  allow_gpu_reset:
    description:
      - Whether a GPU reset was allowed (the release ran with O(gpuops.nvidia.nvidia_device_release#module:reset_orphaned)),
        for the reason and the report's C(escalation).
    type: bool
    default: false
  check_mode:
    description: Whether the role ran in check mode.
    type: bool
    default: false
  started:
    description: When the role started on the host, seconds since the epoch, for C(duration_s).
    type: float
requirements:
  - jmespath (the Python library, on the controller)
seealso:
  - plugin: gpuops.nvidia.gpu_clean
    plugin_type: filter
'''

EXAMPLES = r'''
- name: Judge the host
  ansible.builtin.set_fact:
    gpu_reset_result: >-
      {{ release | gpuops.nvidia.gpu_reset_verdict(host=inventory_hostname, started=started) }}
'''

RETURN = r'''
_value:
  description:
    - The report, with the keys C(host), C(outcome), C(reason), C(check_mode), C(gpus_before),
      C(gpus_after), C(gpus_free), C(gpus_held), C(signalled), C(survivors), C(orphaned_gpus),
      C(escalation), C(release_s), C(duration_s) and C(drained) (false; the role sets it when it
      drains the host).
    - C(gpus_free) counts the GPUs at or below O(memory_threshold_mib) at the end (as read
      before the release on a clean host and in check mode), C(gpus_held) the others, unreadable
      ones included.
    - C(orphaned_gpus) lists the GPUs the release found with orphaned memory, also those its GPU
      reset then freed.
    - C(escalation) is null unless O(allow_gpu_reset) and the release attempted a GPU reset; then
      it has C(gpus) (the GPUs reset), C(persistence_mode_off) (those whose persistence mode was
      switched off meanwhile), C(reset_ok), C(output) (what was done, in nvidia-smi's words) and
      C(persistence_mode_restored) (null when persistence mode was switched off nowhere).
  type: dict
'''

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import verdict


def gpu_reset_verdict(release, host, **kwargs):
    return verdict(host, release=release, **kwargs)


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_verdict': gpu_reset_verdict}
