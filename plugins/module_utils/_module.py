# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""What every module of the collection does around its work: open the reader its options choose
(on host_root), run the work, close the reader, and turn the collection's errors into fail_json."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import MissingLibraryError, select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Terminated, sigterm_raises


def run_with_reader(module, work, options=None):
    """(work(reader) or work(reader, options), the reader's warnings). options: a callable that
    validates the module's parameters first (its GpuopsError fails the task before any read)."""
    params = module.params
    try:
        parsed = options(params) if options is not None else None
        reader, warnings = select_reader(params['backend'], params['nvidia_smi_path'], params['timeout'])
        reader = HostReader(reader, params['host_root'])
        try:
            return (work(reader) if options is None else work(reader, parsed)), warnings
        finally:
            reader.close()
    except MissingLibraryError as exc:
        module.fail_json(msg=exc.library, exception=exc.exception)
    except GpuopsError as exc:
        module.fail_json(msg=str(exc))


def exit_with_release(module, run, what):
    """Exit the module with a release's result: run() -> (ReleaseResult, warnings) under
    sigterm_raises, so that a SIGTERM (the Slurm hook stopping it at its deadline) ends the release
    through its finally blocks - the units stopped for a reset are started again, the lock is let
    go. what: 'release' or 'reset', for the message of that SIGTERM."""
    try:
        with sigterm_raises():
            result, warnings = run()
    except Terminated:
        module.fail_json(msg='the %s was stopped by SIGTERM before its end; the units it had stopped for a GPU reset, '
                             'if any, were asked to start again before it exited' % what)
    for warning in warnings + result.warnings:
        module.warn(warning)
    values = result.dump(diff=module._diff)
    if result.failure:
        module.fail_json(msg=result.failure, **values)
    module.exit_json(**values)
