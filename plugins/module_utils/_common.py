# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Errors and option specs shared by the collection's modules."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


DEFAULT_DEVICES = ['/dev/nvidia*']

# NVIDIA's own daemons and the display servers: stopping them can wedge a GPU until a
# reboot (persistenced, fabric manager) or take down a desktop, so they are never signalled.
DEFAULT_PROTECT = [
    'nvidia-persistenced',
    'nvidia-fabricmanager',
    'nv-fabricmanager',
    'nv-hostengine',
    'dcgm-exporter',
    'nvidia-powerd',
    'nvidia-imex',
    'Xorg',
    'Xwayland',
]


class GpuopsError(Exception):
    """An error with a message meant for the operator; modules turn it into fail_json."""


def reader_argument_spec():
    """Options of the GPU state reader, shared by every module that reads the GPUs."""
    return dict(
        backend=dict(type='str', default='auto', choices=['auto', 'nvml', 'nvidia-smi']),
        nvidia_smi_path=dict(type='str', default='nvidia-smi'),
        host_root=dict(type='path', default='/'),
        expected_gpus=dict(type='int'),
    )


def holders_argument_spec():
    """Options of holder discovery, shared by every module that looks for holders."""
    return dict(
        devices=dict(type='list', elements='str', default=list(DEFAULT_DEVICES)),
        protect=dict(type='list', elements='str', default=list(DEFAULT_PROTECT)),
        extra_protect=dict(type='list', elements='str', default=[]),
    )


def check_non_negative(params, names):
    """Return an error message for the first option in names that is negative, or None."""
    for name in names:
        value = params.get(name)
        if value is not None and value < 0:
            return '%s must be zero or more, got %s' % (name, value)
    return None
