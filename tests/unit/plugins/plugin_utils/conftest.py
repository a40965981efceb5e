# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fixtures of the Slurm hook's tests (plugin_utils/_slurm_hook.py and its modes, _hook_*.py):
the hook run as slurmd runs it on a simulated host, a fake Slurm, the hook's variables file."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import subprocess
import sys

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from slurm_texts import identity_gres_conf


@pytest.fixture
def hook(gpuhost, tmp_path):
    """run(*args) -> (exit status, report, drain command's arguments or None): the runner as the
    hook starts it, on gpuhost, with a drain command that writes down its arguments, and
    tmp_path/gres.conf (the GPUs listed in index order unless a test writes its own)."""
    scontrol = tmp_path / 'scontrol'
    drained = tmp_path / 'drained.json'
    scontrol.write_text('#!%s\nimport json, sys\njson.dump(sys.argv[1:], open(%r, "w"))\n' % (sys.executable, str(drained)))
    scontrol.chmod(0o755)
    variables = tmp_path / 'gpu_reset.yml'
    gres_conf = tmp_path / 'gres.conf'
    gres_conf.write_text(identity_gres_conf(gpuhost))
    cuda = gpuhost.install_cuda()

    def run(*args, **more):
        """more: gpu_reset_* variables over the fixture's own."""
        variables.write_text(yaml.safe_dump(dict({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': cuda,
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}, **more)))
        proc = subprocess.run([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                               '--node', 'gpu07', '--vars-file', str(variables), '--scontrol', str(scontrol),
                               '--gres-conf', str(gres_conf)] + list(args),
                              capture_output=True, text=True, timeout=60, check=False)
        report = json.loads(proc.stdout) if proc.stdout.strip() else None
        return proc.returncode, report, json.loads(drained.read_text()) if drained.exists() else None
    return run


@pytest.fixture
def slurm(tmp_path):
    """A fake scontrol and squeue: they print what the test gives them and write down their calls."""
    calls = tmp_path / 'calls.jsonl'
    script = ('#!%s\nimport json, os, sys\n'
              'open(%r, "a").write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")\n'
              'name = os.path.basename(sys.argv[0])\n'
              'if sys.argv[1:2] == ["update"]:\n    sys.exit(0)\n'
              'sys.stdout.write(open(os.path.join(os.path.dirname(sys.argv[0]), name + ".out")).read())\n'
              % (sys.executable, str(calls)))
    for name in ('scontrol', 'squeue', 'sinfo'):
        (tmp_path / name).write_text(script)
        (tmp_path / name).chmod(0o755)
        (tmp_path / (name + '.out')).write_text('')

    class Slurm:
        scontrol = str(tmp_path / 'scontrol')

        def says(self, scontrol=None, squeue=None, sinfo=None):
            if scontrol is not None:
                (tmp_path / 'scontrol.out').write_text(scontrol)
            if squeue is not None:
                (tmp_path / 'squeue.out').write_text(squeue)
            if sinfo is not None:
                (tmp_path / 'sinfo.out').write_text(sinfo)

        def calls(self):
            return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

        def check(self, capsys, *more):
            rc = _slurm_hook.main(['--health-check', '--node', 'gpu07', '--scontrol', self.scontrol,
                                   '--deadline', '20'] + list(more))
            return rc, capsys.readouterr()
    return Slurm()


@pytest.fixture
def hook_vars(gpuhost, tmp_path):
    """hook_vars() -> a gpu_reset.yml for gpuhost, as the hook fixture writes it."""
    def write():
        path = tmp_path / 'health.yml'
        path.write_text(yaml.safe_dump({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': gpuhost.install_cuda(),
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}))
        return str(path)
    return write
