# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The probe's PTX (_cuda.PTX), assembled by NVIDIA's real ptxas (PyPI's nvidia-cuda-nvcc-cu12,
pinned in requirements/test.txt; no GPU needed) for the oldest target it declares and for sm_90
(H100, H200). No GPU here has ever run it: a PTX that a real compiler rejects would fail the probe
on every node of a fleet and drain them all."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda

WHEEL = 'nvidia-cuda-nvcc-cu12'


def find_ptxas():
    """ptxas of the nvidia-cuda-nvcc-cu12 wheel installed beside this Python, or None."""
    for entry in sys.path:
        path = os.path.join(entry, 'nvidia', 'cuda_nvcc', 'bin', 'ptxas')
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


PTXAS = find_ptxas()
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason='%s (NVIDIA ptxas) is not installed in this Python: the '
                                 "probe's PTX is not assembled (scripts/test.sh installs it from requirements/test.txt)"
                                 % WHEEL)


def assemble(tmp_path, text, arch):
    """(exit status, ptxas's output) of assembling text for arch, verbosely."""
    source = tmp_path / 'probe.ptx'
    source.write_text(text)
    proc = subprocess.run([PTXAS, '-v', '-arch=%s' % arch, '-o', str(tmp_path / ('probe.%s.cubin' % arch)),
                           str(source)], capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_ptx_declares_the_version_and_target_the_comment_gives():
    head = _cuda.PTX.splitlines()[:3]
    assert head == ['.version %s' % _cuda.PTX_VERSION, '.target %s' % _cuda.PTX_TARGET, '.address_size 64']
    assert (_cuda.PTX_VERSION, _cuda.PTX_TARGET, _cuda.PTX_SINCE_CUDA) == ('7.0', 'sm_50', '11.0')
    assert re.findall(r'\.visible \.entry (\w+)\(', _cuda.PTX) == list(_cuda.KERNELS)


@needs_ptxas
@pytest.mark.parametrize('arch', [_cuda.PTX_TARGET, 'sm_90'])
def test_ptxas_accepts_the_probe_ptx(tmp_path, arch):
    rc, said = assemble(tmp_path, _cuda.PTX, arch)
    assert rc == 0, 'ptxas rejected the probe PTX for %s: %s' % (arch, said.strip())
    for kernel in _cuda.KERNELS:
        assert "Compiling entry function '%s' for '%s'" % (kernel, arch) in said
    # Registers only: no stack, no spills to local memory (which would cost a launch memory).
    assert said.count('0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads') == len(_cuda.KERNELS), said


@needs_ptxas
def test_ptxas_names_what_is_wrong_in_a_broken_ptx(tmp_path):
    # The check above can fail: ptxas says which line it rejects and why.
    rc, said = assemble(tmp_path, _cuda.PTX.replace('red.global.min.u64', 'red.global.least.u64'), 'sm_90')
    assert rc != 0 and 'probe.ptx, line' in said and 'error' in said
    rc, said = assemble(tmp_path, _cuda.PTX.replace('.version 7.0', '.version 99.0'), _cuda.PTX_TARGET)
    assert rc != 0 and 'Unsupported .version 99.0' in said
