# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Picks the GPU state reader once per module run."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import nvml as _nvml
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner


class MissingLibraryError(GpuopsError):
    """The selected backend needs a Python library that is not installed."""

    def __init__(self, library, exception):
        super(MissingLibraryError, self).__init__(library)
        self.library = library
        self.exception = exception


def select_reader(backend, nvidia_smi_path='nvidia-smi', timeout=10.0):
    """Return (reader, warnings) for backend 'auto', 'nvml' or 'nvidia-smi'.

    auto uses NVML when nvidia-ml-py imports and nvmlInit succeeds, and nvidia-smi otherwise,
    without a word: a host without the Python bindings or the library is a normal host.
    """
    if backend == 'nvidia-smi':
        return SmiReader(SmiRunner(nvidia_smi_path, timeout)), []
    if backend not in ('auto', 'nvml'):
        raise GpuopsError('backend must be one of auto, nvml, nvidia-smi, got %r' % (backend,))
    if not _nvml.HAS_PYNVML:
        if backend == 'nvml':
            raise MissingLibraryError(missing_required_lib('nvidia-ml-py'), _nvml.PYNVML_IMPORT_ERROR)
        return SmiReader(SmiRunner(nvidia_smi_path, timeout)), []
    reader = _nvml.NvmlReader(timeout)
    try:
        reader.open()
    except GpuopsError:
        if backend == 'nvml':
            raise
        return SmiReader(SmiRunner(nvidia_smi_path, timeout)), []
    return reader, []
