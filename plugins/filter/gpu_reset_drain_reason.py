# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_drain_reason
short_description: The Slurm drain reason of a host that gpu_reset could not make clean
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the reason of a host's report (C(gpu_reset_result.reason)) and returns the drain
    reason of the role's default C(gpu_reset_drain_command), as the Slurm hook gives it too, the
    reason after the prefix C(gpu_reset:) and a space.
  - Control characters (newlines, terminal escapes such as ESC and CSI/OSC sequences, Unicode line and
    bidirectional-override characters) and the backslash become C(\xNN) or C(\uNNNN) escapes,
    since the reason is made of text users choose and reaches every terminal that runs C(sinfo -R).
  - The escaped reason is cut at 200 characters, saying how many more there were.
  - An empty or null reason gives the text C(GPUs not clean) after the prefix.
options:
  _input:
    description: The reason.
    type: str
    required: true
'''

EXAMPLES = r'''
- name: Drain the host with the reason of its report
  ansible.builtin.command:
    argv:
      - scontrol
      - update
      - nodename={{ inventory_hostname_short }}
      - state=drain
      - "reason={{ gpu_reset_result.reason | gpuops.nvidia.gpu_reset_drain_reason }}"
  changed_when: true
'''

RETURN = r'''
_value:
  description: The drain reason, one line of at most about 240 characters.
  type: str
'''

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_reason


def gpu_reset_drain_reason(reason):
    return drain_reason(None if reason is None else str(reason))


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_drain_reason': gpu_reset_drain_reason}
