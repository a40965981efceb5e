# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Picks the GPU state reader once per module run."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._smi import SmiReader, SmiRunner


class MissingLibraryError(GpuopsError):
    """The selected backend needs a Python library that is not installed."""

    def __init__(self, library, exception):
        super(MissingLibraryError, self).__init__(library)
        self.library = library
        self.exception = exception


def select_reader(backend, nvidia_smi_path='nvidia-smi', timeout=10.0):
    """Return (reader, warnings) for backend 'auto', 'nvml' or 'nvidia-smi'."""
    if backend in ('auto', 'nvidia-smi'):
        return SmiReader(SmiRunner(nvidia_smi_path, timeout)), []
    if backend == 'nvml':
        raise GpuopsError('backend nvml is not available in this version of gpuops.nvidia; '
                          'use backend auto or nvidia-smi')
    raise GpuopsError('backend must be one of auto, nvml, nvidia-smi, got %r' % (backend,))
