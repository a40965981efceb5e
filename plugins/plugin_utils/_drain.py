# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The Slurm drain reason, for the role's default gpu_reset_drain_command and the Slurm hook.

The reason is made of text users choose (process names, command lines, paths): it reaches
scontrol, slurmctld's state and every operator's terminal through sinfo -R. It is one element
of scontrol's argv (reason=...), never split by a shell: scontrol takes everything after the
first '=' of that one argument as the reason (dropping one leading and one trailing double
quote), so no text in it can add a key such as state=resume or nodename=... of its own, and it
never starts with '-' (scontrol's options), since it starts with 'reason='.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable

PREFIX = 'gpu_reset: '
# The reason of a node drained for a person (a fault that what the hook tried did not cure): the
# health check never resumes it; only an operator does (scontrol update nodename=NODE
# state=resume). The fleet brake counts it as it counts PREFIX.
HOLD_PREFIX = 'gpu_reset(hold): '
# The reason of a node drained for a reboot that waits for its evidence (nvidia-bug-report.sh,
# run first, outside the Prolog's time): the health check leaves it to the reboot.
REBOOT_PREFIX = 'gpu_reset(reboot): '
PREFIXES = (PREFIX, HOLD_PREFIX, REBOOT_PREFIX)
# A Slurm node name as the brake's listing, the health check and a reboot request accept it: one
# name, never a list or a range (a,b; n[1-4]).
NODE_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z')
# Characters of the reason kept, once escaped (then "...(N more characters)"). scontrol takes a
# reason of any length, but its argument must fit execve's MAX_ARG_STRLEN (128 KiB) or the drain
# command cannot start at all; sinfo -R shows a reason on one line, and 200 characters name the
# first GPUs and why.
REASON_CHARS = 200


def drain_reason(reason, hold=False, prefix=None):
    """'gpu_reset: <reason>' ('gpu_reset(hold): <reason>' for a person; prefix: another of
    PREFIXES), control characters escaped (printable) and capped at REASON_CHARS. The verdict's
    reasons are printable already: their backslashes are not doubled again."""
    prefix = prefix or (HOLD_PREFIX if hold else PREFIX)
    return prefix + printable(reason or 'GPUs not clean', REASON_CHARS, backslashes=False)


def drain_command(scontrol, node, reason, hold=False, prefix=None):
    """The default drain command (the role's gpu_reset_drain_command renders the same argv):
    scontrol update nodename=NODE state=drain reason=..., the reason one argument."""
    return [scontrol, 'update', 'nodename=%s' % node, 'state=drain', 'reason=' + drain_reason(reason, hold, prefix)]
