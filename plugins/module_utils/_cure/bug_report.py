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
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.dirfd import DirRefused, open_private_dir
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
    """Create directory (mode 0700) when missing, and open it: its fd. GpuopsError unless it is a
    real directory of this user that nobody else can write to or read, reached from / by
    descriptor through directories nobody else can replace it in (_dirfd). The report is written
    through the fd (the program runs in it), never through the path again."""
    try:
        fd = open_private_dir(directory, parents_mode=0o700)
    except DirRefused as exc:
        raise GpuopsError('bug_report_dir %s %s (the report, written as root, holds the kernel log and the process '
                          'list: use a directory only root can write, below directories only root can write)'
                          % (printable(directory), exc))
    try:
        _check_private(directory, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_private(directory, info):
    """GpuopsError unless the open directory (stat info) is private enough."""
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise GpuopsError('bug_report_dir %s must belong to uid %d with mode 0700 (it is uid %d, mode %04o): the report '
                          'holds the kernel log and the process list' % (
                              printable(directory), os.geteuid(), info.st_uid, stat.S_IMODE(info.st_mode)))


def collect(directory, timeout, program=PROGRAM, now=time.time):
    """Run program into directory within timeout seconds. Returns {path, ok, message}: path the
    report's file (None when none was written). The program runs in the directory opened and
    checked (its cwd is that open directory, /proc/self/fd/N) and writes a name relative to it: a
    directory swapped for a link after the check is not where the report goes."""
    name = 'nvidia-bug-report-%s.log' % time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now()))
    fd = None
    try:
        fd = _private_directory(directory)
        rc, stdout, stderr = Runner(program, name=PROGRAM, cwd='/proc/self/fd/%d' % fd, pass_fds=(fd,)).run(
            ['--output-file', name], timeout=timeout)
        written = [os.path.join(directory, found) for found in (name + '.gz', name) if _is_file(found, fd)]
    except GpuopsError as exc:
        return {'path': None, 'ok': False, 'message': '%s was not run to the end: %s' % (PROGRAM, exc)}
    finally:
        if fd is not None:
            os.close(fd)
    said = printable(' '.join((stdout + ' ' + stderr).split()))[-QUOTE_MAX:]
    if rc != 0 or not written:
        return {'path': written[0] if written else None, 'ok': False,
                'message': '%s exited %d without a report: %s' % (PROGRAM, rc, said or '(no output)')}
    return {'path': written[0], 'ok': True, 'message': '%s wrote %s' % (PROGRAM, written[0])}


def _is_file(name, dir_fd):
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
