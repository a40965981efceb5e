# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Run one module of the collection through the ansible command line, as a user would."""

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
