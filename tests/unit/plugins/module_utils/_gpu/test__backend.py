# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The reader a module run picks (module_utils/_gpu/backend.py): nvidia-smi, NVML, or NVML where it
initialises and nvidia-smi otherwise. With NVML's bindings faked: test__nvml.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import backend as _backend
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader


def test_the_nvidia_smi_backend_reads_the_host_with_the_path_and_time_given(gpuhost):
    reader, warnings = _backend.select_reader('nvidia-smi', gpuhost.smi_path, 7)
    assert isinstance(reader, SmiReader) and warnings == []
    assert (reader.runner.path, reader.runner.timeout) == (gpuhost.smi_path, 7)
    snapshot = reader.read(timeout=7)
    assert [gpu['index'] for gpu in snapshot.gpus] == list(range(8))
    assert all(gpu['memory_used_mib'] == 1 and gpu['error'] is None for gpu in snapshot.gpus)


def test_auto_is_nvml_where_it_initialises_and_nvidia_smi_without_a_word_elsewhere(gpuhost):
    """Whichever this host has: NVML without its library (or the bindings) is a normal host."""
    try:
        nvml, dummy = _backend.select_reader('nvml', gpuhost.smi_path, 5)
    except GpuopsError:
        nvml = None
    reader, warnings = _backend.select_reader('auto', gpuhost.smi_path, 5)
    try:
        assert warnings == []
        if nvml is None:
            assert isinstance(reader, SmiReader) and reader.runner.path == gpuhost.smi_path
        else:
            assert reader.backend == 'nvml'
    finally:
        reader.close()
        if nvml is not None:
            nvml.close()


@pytest.mark.parametrize('backend', ['NVML', 'smi', '', None])
def test_an_unknown_backend_is_refused_naming_the_choices(backend):
    with pytest.raises(GpuopsError, match='backend must be one of auto, nvml, nvidia-smi, got %r' % (backend,)):
        _backend.select_reader(backend)
