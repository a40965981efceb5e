# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile
import time

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _hook_reset


def test_a_modules_arguments_are_in_no_file_with_a_name(gpuhost, tmp_path, monkeypatch):
    """A hook killed while a module runs (SIGKILL: no finally block runs) leaves nothing in the
    temporary directory: the module reads its arguments from a file without a name."""
    temp = tmp_path / 'tmp'
    temp.mkdir()
    monkeypatch.setattr(tempfile, 'tempdir', str(temp))
    seen = []
    run = _hook_reset.Runner.run

    def watched(runner, args, timeout=None, input_text=None):
        seen.append((args[-1], os.listdir(str(temp))))
        return run(runner, args, timeout, input_text)
    monkeypatch.setattr(_hook_reset.Runner, 'run', watched)
    args = dict(nvidia_smi_path=gpuhost.smi_path, backend='nvidia-smi', devices=[gpuhost.dev_glob],
                state_dir=gpuhost.state_dir, timeout=20)
    result = _hook_reset.ModuleRunner(time.monotonic() + 30)('nvidia_gpu_facts', args)
    assert len(result['ansible_facts']['nvidia_gpus']) == 8, result
    [(path, listed)] = seen
    assert path.startswith('/proc/self/fd/') and listed == []
    assert os.listdir(str(temp)) == []
