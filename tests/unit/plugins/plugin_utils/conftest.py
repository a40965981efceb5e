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
import time

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from slurm_texts import identity_gres_conf


# A fake scontrol that keeps the node's state: update state=drain reason=... drains it, reboot
# marks it REBOOT_REQUESTED with its reason, show node answers as Slurm does (from node.json; with
# node.pinned, a test's state that updates leave as it is); each call is written down (calls.jsonl).
FAKE_SCONTROL = r"""#!%(python)s
import json, os, sys
here = %(here)r
args = sys.argv[1:]
with open(os.path.join(here, 'calls.jsonl'), 'a') as log:
    log.write(json.dumps(args) + '\n')
path = os.path.join(here, 'node.json')
node = json.load(open(path)) if os.path.exists(path) else {'state': 'IDLE', 'reason': ''}
if os.path.exists(os.path.join(here, 'node.pinned')):
    pass  # a test set the node's state: it answers updates and keeps it
elif args[:1] == ['update'] or args[:1] == ['reboot']:
    reason = [arg[len('reason='):] for arg in args if arg.startswith('reason=')]
    node['reason'] = reason[0] if reason else node['reason']
    node['state'] = 'IDLE+DRAIN' if args[:1] == ['update'] else 'IDLE+DRAIN+REBOOT_REQUESTED'
    json.dump(node, open(path, 'w'))
elif args[:2] == ['show', 'node']:
    sys.stdout.write('NodeName=%%s\n   State=%%s ThreadsPerCore=1\n%%s' %% (
        args[2], node['state'], '   Reason=%%s [root@2026-12-01T12:00:00]\n' %% node['reason'] if node['reason'] else ''))
"""


@pytest.fixture
def hook(gpuhost, tmp_path):
    """run(*args) -> (exit status, report, the last drain or reboot command's arguments or None):
    the runner as the hook starts it, on gpuhost, with a fake scontrol that keeps the node's state
    (FAKE_SCONTROL; run.calls() lists every call), and tmp_path/gres.conf (the GPUs listed in
    index order unless a test writes its own)."""
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text(FAKE_SCONTROL % {'python': sys.executable, 'here': str(tmp_path)})
    scontrol.chmod(0o755)
    variables = tmp_path / 'gpu_reset.yml'
    gres_conf = tmp_path / 'gres.conf'
    gres_conf.write_text(identity_gres_conf(gpuhost))
    cuda = gpuhost.install_cuda()

    def calls():
        path = tmp_path / 'calls.jsonl'
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def run(*args, **more):
        """more: gpu_reset_* variables over the fixture's own."""
        variables.write_text(yaml.safe_dump(dict({
            'gpu_reset_nvidia_smi_path': gpuhost.smi_path, 'gpu_reset_host_root': gpuhost.root,
            'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe_cuda_library': cuda,
            'gpu_reset_lock_file': str(tmp_path / 'release.lock'), 'gpu_reset_grace_period': 0.5}, **more)))
        before = len(calls())
        proc = subprocess.run([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                               '--node', 'gpu07', '--vars-file', str(variables), '--scontrol', str(scontrol),
                               '--gres-conf', str(gres_conf)] + list(args),
                              capture_output=True, text=True, timeout=60, check=False)
        report = json.loads(proc.stdout) if proc.stdout.strip() else None
        acts = [call for call in calls()[before:] if call[:1] == ['update']] or \
            [call for call in calls()[before:] if call[:1] == ['reboot']]
        return proc.returncode, report, acts[-1] if acts else None

    def reboot(seconds=30):
        """The reboot asked of the fake scontrol (by the hook's evidence process, which runs on
        after the hook), once asked; None when none is within seconds."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            found = [call for call in calls() if call[:1] == ['reboot']]
            if found:
                return found[-1]
            time.sleep(0.1)
        return None
    run.calls, run.reboot = calls, reboot
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
