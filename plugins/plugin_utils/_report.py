# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Where a host's report goes: gpu_reset_report_dir/<host>.json, with the host name escaped.

Host names come from the inventory, or from SLURMD_NODENAME in the Slurm hook: a name such as
../victim must not write beside the report directory. One function names the file for the
role (through the filter gpuops.nvidia.gpu_reset_report_path) and for the hook.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable

# What a file name keeps as it is; every other byte of the name's UTF-8 becomes %XX (the percent
# sign too, so two hosts never share a file), and so does a leading dot (no hidden files, no . or ..).
KEPT_RE = re.compile(r'[A-Za-z0-9_.-]')
SUFFIX = '.json'
# The longest file name Linux file systems take (NAME_MAX), in bytes.
NAME_MAX = 255


class ReportPathError(ValueError):
    """A host name that cannot be made a report file inside the report directory."""


def report_name(host):
    """The report's file name for host: <host>.json, escaped; ReportPathError when it cannot be."""
    if not isinstance(host, str) or not host:
        raise ReportPathError('gpu_reset_report_dir: the host name %r cannot name a report file' % (host,))
    escaped = ''.join(char if KEPT_RE.match(char) else _percent(char) for char in host)
    if escaped.startswith('.'):
        escaped = '%2E' + escaped[1:]
    name = escaped + SUFFIX
    if len(name) > NAME_MAX:
        raise ReportPathError('gpu_reset_report_dir: the report file of host %s would be named with %d bytes once '
                              'escaped; a file name holds at most %d' % (printable(host, 80), len(name), NAME_MAX))
    return name


def _percent(char):
    return ''.join('%%%02X' % byte for byte in bytearray(char.encode('utf-8', 'surrogatepass')))


def report_path(directory, host):
    """directory/<host>.json, checked to resolve to a file directly inside directory."""
    path = os.path.join(directory, report_name(host))
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise ReportPathError('gpu_reset_report_dir: the report file of host %s, %s, resolves to %s, outside %s; '
                              'refusing to write it' % (printable(host, 80), printable(path), printable(os.path.realpath(path)),
                                                        printable(directory)))
    return path
