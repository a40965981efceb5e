# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: gpu_reset_report_path
short_description: The file of a host's gpu_reset report inside the report directory
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the report directory (C(gpu_reset_report_dir)) and returns the path of a host's report
    in it, C(<host>.json), as the role P(gpuops.nvidia.gpu_reset#role) and the Slurm hook write it.
  - The host name is escaped so that the report stays inside the directory whatever the
    inventory calls the host. Letters, digits, C(.), C(_) and C(-) are kept; every other byte of the
    name (C(/), C(%), spaces, control characters) becomes C(%XX), and so does a leading dot, so
    C(../victim) is written as C(%2E.%2Fvictim.json) inside the directory.
  - A name that cannot be made safe (empty, too long for a file name once escaped, or a path that
    resolves outside the directory through a symbolic link) is an error that names the host.
options:
  _input:
    description: The report directory.
    type: path
    required: true
  host:
    description: The host name, usually C(inventory_hostname).
    type: str
    required: true
'''

EXAMPLES = r'''
- name: Write the report on the controller
  ansible.builtin.copy:
    content: "{{ gpu_reset_result | to_nice_json }}\n"
    dest: "{{ gpu_reset_report_dir | gpuops.nvidia.gpu_reset_report_path(inventory_hostname) }}"
    mode: "0644"
  delegate_to: localhost
'''

RETURN = r'''
_value:
  description: The path of the host's report file, directly inside the report directory.
  type: path
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._report import ReportPathError, report_path


def gpu_reset_report_path(directory, host):
    if not isinstance(directory, str) or not directory:
        raise AnsibleFilterError('gpu_reset_report_path: gpu_reset_report_dir must be a directory, got %r' % (directory,))
    try:
        return report_path(directory, host)
    except ReportPathError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_report_path': gpu_reset_report_path}
