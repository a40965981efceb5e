# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""PCI bus ids, as the driver, nvidia-smi, NVML and sysfs spell them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re


# A bus id anywhere in a line: domain (1 to 8 hex digits; 4 in sysfs, 8 in nvidia-smi, 3 in
# some driver messages), bus, device and function.
PCI_BUS_ID_RE = re.compile(r'([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])')


def bus_key(bus_id):
    """(domain, bus, device) of a PCI bus id in any of the driver's spellings, or None."""
    if not bus_id:
        return None
    match = re.match(r'^(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})', bus_id.strip())
    if not match:
        return None
    return tuple(int(part, 16) for part in match.groups())


def normalize_bus_id(bus_id):
    """Upper-case, 8-digit-domain form of a PCI bus id, as nvidia-smi prints it."""
    if not bus_id:
        return None
    domain, rest = bus_id.strip().split(':', 1)
    return ('%08X:%s' % (int(domain, 16), rest)).upper()


def bus_ids_in(text):
    """The bus ids a text names, normalized, in order of first mention."""
    found = []
    for match in PCI_BUS_ID_RE.finditer(text or ''):
        bus_id = normalize_bus_id(match.group(1))
        if bus_id not in found:
            found.append(bus_id)
    return found
