# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Run one module of the collection through the ansible command line, as a user would; and the
Slurm hook's module runner as slurmd runs it."""

import json
import os
import subprocess
import sys


def run_module(module, args, *flags, **kwargs):
    """Run gpuops.nvidia.MODULE ad hoc on localhost; return (result dict, completed process).

    The result gains 'failed' (from the status word) and 'warning_text' (stderr, unwrapped).
    env= (keyword): the environment to run in instead of this process's.
    """
    env = dict(kwargs.get('env') or os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run(['ansible', 'localhost', '-c', 'local', '-i', 'localhost,'] + list(flags)
                          + ['-m', 'gpuops.nvidia.' + module, '-a', json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    # "localhost | SUCCESS => {json}" (or CHANGED, FAILED!), then any diff.
    status, dummy, payload = proc.stdout.partition(' => ')
    result, dummy = json.JSONDecoder().raw_decode(payload)
    result['failed'] = 'FAILED' in status
    result['warning_text'] = ' '.join(proc.stderr.split())
    return result, proc


def run_hook_runner(directory, variables, env, timeout, deadline):
    """(exit status, report, the drain command's arguments or None) of the Slurm hook's module
    runner on node gpu07, every GPU, with the gpu_reset_* variables given (written to
    directory/gpu_reset.yml), a scontrol that writes down its arguments instead of draining, and
    env (SLURM_* left out: no job)."""
    scontrol = os.path.join(str(directory), 'scontrol')
    drained = os.path.join(str(directory), 'drained.json')
    with open(scontrol, 'w') as handle:
        handle.write('#!%s\nimport json, sys\njson.dump(sys.argv[1:], open(%r, "w"))\n' % (sys.executable, drained))
    os.chmod(scontrol, 0o755)
    settings = os.path.join(str(directory), 'gpu_reset.yml')
    with open(settings, 'w') as handle:
        json.dump(variables, handle)
    env = dict((name, value) for name, value in env.items() if not name.startswith('SLURM_'))
    proc = subprocess.run([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                           '--node', 'gpu07', '--vars-file', settings, '--scontrol', scontrol,
                           '--gres-conf', os.path.join(str(directory), 'gres.conf'), '--timeout', str(timeout),
                           '--deadline', str(deadline)],
                          capture_output=True, text=True, timeout=deadline * 2, env=env, check=False)
    assert proc.stdout.strip(), 'the hook gave no report (rc %d): %s' % (proc.returncode, proc.stderr)
    drain = None
    if os.path.exists(drained):
        with open(drained) as handle:
            drain = json.load(handle)
    return proc.returncode, json.loads(proc.stdout), drain
