# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_history_report
short_description: What a fleet's GPU histories say, per node and GPU, the worst first
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes each host's GPU history file (C(/var/lib/gpuops/history.json)), as M(ansible.builtin.slurp) reads
    it, by host, and returns the lines of a table, per node and per GPU - incidents (an incident opens at the
    first fault event after a cure and closes at the next cure; V(open) while none has), cures by kind
    (GPU resets that worked, probes that checked every byte, reboots asked for), the mean time between
    incidents, the time lost (the incidents' durations, an open one until now) and whether the GPU or the
    node is held for a person. Nodes and GPUs that lost the most time come first.
  - Only what is valid of each file is read; a host whose file could not be read or is not a history is
    named with why.
  - The playbook C(gpuops.nvidia.history_report) prints it for a fleet.
options:
  _input:
    description: The hosts' files, C({host - slurp result}); a result whose message is C(file not found)
      is a host with no history, one of an unreachable host or another error is named with its message.
    type: dict
    required: true
'''

EXAMPLES = r'''
- name: Print the fleet's GPU history
  ansible.builtin.debug:
    msg: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'history_file')))
             | gpuops.nvidia.gpu_reset_history_report }}"
  run_once: true
'''

RETURN = r'''
_value:
  description: The table's lines, a header first, then each node's line (its incidents, its reboots asked
    for, its time lost) followed by its GPUs' lines.
  type: list
  elements: str
'''

import base64
import binascii

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.collections import is_sequence
from ansible.module_utils.six import string_types

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._history_report import Unreadable, lines, report


def _text(result):
    """(the file's text of a slurp result, None), an empty history's for a host without the file,
    or (None, why it was not read)."""
    if not isinstance(result, dict):
        return None, 'not read (%s)' % type(result).__name__
    if 'content' not in result:
        said = ' '.join(str(result.get('msg') or '').split())
        if 'file not found' in said.lower() and not result.get('unreachable'):
            return '{"gpus": {}}', None
        return None, '%s%s' % ('unreachable: ' if result.get('unreachable') else '', said[:200] or 'not read')
    try:
        return base64.b64decode(result['content']).decode('utf-8', 'replace'), None
    except (binascii.Error, TypeError, ValueError):
        return None, 'not base64 as slurp gives it'


def gpu_reset_history_report(files):
    if not isinstance(files, dict) or is_sequence(files) or isinstance(files, string_types):
        raise AnsibleFilterError('gpu_reset_history_report: expected {host: slurp result}, got %s' % type(files).__name__)
    histories = {}
    for host, result in files.items():
        text, why = _text(result)
        histories[str(host)] = text if why is None else Unreadable(why)
    return lines(report(histories))


class FilterModule(object):
    def filters(self):
        return {'gpu_reset_history_report': gpu_reset_history_report}
