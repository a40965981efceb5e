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

from ansible_collections.gpuops.nvidia.plugins.module_utils._backend import MissingLibraryError, select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._host import HostReader


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
