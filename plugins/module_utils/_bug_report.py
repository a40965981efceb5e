# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Evidence of a failed GPU reset: NVIDIA's nvidia-bug-report.sh, which NVIDIA support asks for,
run with a deadline into a directory only root can read (the log holds the host's kernel log,
process list and configuration)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._lock import directory_chain, shared_dir_problem
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

PROGRAM = 'nvidia-bug-report.sh'
DEFAULT_TIMEOUT_S = 120.0
# The longest text of the program's output kept in a message.
QUOTE_MAX = 300


def program_next_to(nvidia_smi_path):
    """nvidia-bug-report.sh beside nvidia_smi_path when that is a path (the driver installs both in
    one directory), else the one on PATH."""
    if os.sep in nvidia_smi_path:
        return os.path.join(os.path.dirname(nvidia_smi_path), PROGRAM)
    return PROGRAM


def _private_directory(directory):
    """Create directory (mode 0700) when missing; GpuopsError unless it is a real directory of
    this user that nobody else can write to or read, below directories nobody else can replace it
    in."""
    try:
        os.makedirs(directory, 0o700)
    except OSError:
        pass
    try:
        info = os.lstat(directory)
    except OSError as exc:
        raise GpuopsError('bug_report_dir %s cannot be created: %s' % (printable(directory), exc.strerror))
    if not stat.S_ISDIR(info.st_mode):
        raise GpuopsError('bug_report_dir %s is not a directory (a symbolic link is not followed)' % printable(directory))
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise GpuopsError('bug_report_dir %s must belong to uid %d with mode 0700 (it is uid %d, mode %04o): the report '
                          'holds the kernel log and the process list' % (
                              printable(directory), os.geteuid(), info.st_uid, stat.S_IMODE(info.st_mode)))
    # The report is written as root by a program that follows links: a directory above it that
    # another user can write lets them swap it for a link after this check.
    for above in directory_chain(os.path.dirname(os.path.abspath(directory))):
        problem = shared_dir_problem(os.stat(above), os.geteuid(), parent=False)
        if problem:
            raise GpuopsError('bug_report_dir %s is below %s, which %s: another user could replace it with a link '
                              'to where the report would then be written; use a directory only root can write '
                              'above it' % (printable(directory), printable(above), problem))


def collect(directory, timeout, program=PROGRAM, now=time.time):
    """Run program into directory within timeout seconds. Returns {path, ok, message}: path the
    report's file (None when none was written)."""
    base = os.path.join(directory, 'nvidia-bug-report-%s.log' % time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now())))
    try:
        _private_directory(directory)
        rc, stdout, stderr = Runner(program, name=PROGRAM).run(['--output-file', base], timeout=timeout)
    except GpuopsError as exc:
        return {'path': None, 'ok': False, 'message': '%s was not run to the end: %s' % (PROGRAM, exc)}
    written = [path for path in (base + '.gz', base) if os.path.isfile(path)]
    said = printable(' '.join((stdout + ' ' + stderr).split()))[-QUOTE_MAX:]
    if rc != 0 or not written:
        return {'path': written[0] if written else None, 'ok': False,
                'message': '%s exited %d without a report: %s' % (PROGRAM, rc, said or '(no output)')}
    return {'path': written[0], 'ok': True, 'message': '%s wrote %s' % (PROGRAM, written[0])}
