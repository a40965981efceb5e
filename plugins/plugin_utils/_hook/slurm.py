# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Slurm's commands as the hook runs them on the node (scontrol, squeue, sinfo): argv never
through a shell, each within its time."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner


# Seconds each scontrol or squeue call may take.
SLURM_CALL_S = 10


class SlurmUnreadable(Exception):
    """What scontrol or squeue said cannot be read: the health check does nothing."""


def slurm_call(argv, seconds):
    """(rc, stdout, stderr) of a Slurm command, argv never through a shell; SlurmUnreadable when
    it cannot run or does not answer within seconds."""
    try:
        return Runner(argv[0]).run(argv[1:], timeout=max(seconds, 1))
    except GpuopsError as exc:
        raise SlurmUnreadable(printable(str(exc), 300))


def slurm_command(scontrol, name):
    """Slurm's command name (squeue, sinfo), next to scontrol when that is a path."""
    return os.path.join(os.path.dirname(scontrol), name) if '/' in scontrol else name
