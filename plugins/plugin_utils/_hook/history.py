# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""--clear-history UUID|all: forget a GPU's history (module_utils/_state/history.py). With scontrol update
nodename=NODE state=resume, what returns a GPU held for a person to service."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import sys

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.status import RUNNER_SETTINGS_UNREADABLE
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.vars import host_root_of


def clear_history(args):
    """--clear-history UUID|all: forget the GPU's history (each GPU's); 0, or 2 saying why not."""
    history = History.for_host(host_root_of(args.vars_file))
    try:
        if not history.state.usable:
            raise GpuopsError(history.warnings[0])
        gone = history.clear(args.clear_history)
    except GpuopsError as exc:
        sys.stderr.write('gpu_reset: the history was not cleared: %s\n' % printable(str(exc), 300))
        return RUNNER_SETTINGS_UNREADABLE
    sys.stderr.write('gpu_reset: history cleared in %s: %s\n' % (
        history.state.path, ', '.join(gone) if gone else 'no history of %s was kept' % printable(args.clear_history, 100)))
    return 0
