# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The kernel modules that hold the NVIDIA driver's module, as /sys/module shows them.

A module that depends on nvidia is listed in /sys/module/nvidia/holders (nvidia_uvm,
nvidia_modeset, nvidia_peermem, gdrdrv, nvidia_fs, ...), and those that depend on one of them in
its own holders (nvidia_drm through nvidia_modeset). Some of them keep the driver from resetting a
GPU although no process holds it: an idle nvidia_drm makes nvidia-smi --gpu-reset answer "In use
by another client" (NVIDIA/mig-parted#181), as do peermem and GPUDirect Storage modules. A reset
that fails names them, so that an operator knows what else is there.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

DRIVER = 'nvidia'
# Kernel module names: letters, digits, underscores and dashes; anything else in the directory
# is not a module.
MODULE_RE = re.compile(r'^[A-Za-z0-9_-]{1,64}\Z')
# A host has a handful: more is not sysfs.
MODULES_AT_MOST = 64


def module_holders(host_root='/'):
    """[{name, refcnt, via}]: the modules that hold nvidia, directly (via None) or through the
    module via, breadth first; refcnt is the module's own use count (None when unreadable). []
    when nvidia is not loaded or /sys/module cannot be read."""
    base = os.path.join(host_root or '/', 'sys', 'module')
    found, queue, seen = [], [DRIVER], set([DRIVER])
    while queue and len(found) < MODULES_AT_MOST:
        holder_of = queue.pop(0)
        try:
            names = sorted(os.listdir(os.path.join(base, holder_of, 'holders')))
        except OSError:
            continue
        for name in names:
            if name in seen or not MODULE_RE.match(name):
                continue
            seen.add(name)
            found.append({'name': name, 'refcnt': _refcnt(base, name), 'via': None if holder_of == DRIVER else holder_of})
            queue.append(name)
    return found


def _refcnt(base, name):
    try:
        with open(os.path.join(base, name, 'refcnt')) as handle:
            return int(handle.read(32).strip())
    except (OSError, ValueError):
        return None


def describe(holders):
    """One line: 'nvidia_uvm (used by 0), nvidia_drm (through nvidia_modeset, used by 1)'."""
    return ', '.join('%s (%sused by %s)' % (
        holder['name'], 'through %s, ' % holder['via'] if holder['via'] else '',
        '?' if holder['refcnt'] is None else holder['refcnt']) for holder in holders)
