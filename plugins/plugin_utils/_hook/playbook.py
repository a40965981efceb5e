# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""--playbook-vars: the variables the hook fixes (drain on failure, the release's time, the job's
GPUs and the job, parsed as for the module runner), written as JSON for ansible-playbook -e @FILE."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import sys

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.job import job_gpus, job_setting
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import drain
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.slurm import SLURM_CALL_S
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.status import RUNNER_DRAINED, RUNNER_NOT_DRAINED
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.vars import hook_vars, host_root_of
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX


# The role's fleet brake in the hook's playbook runner: every node, which never holds (the node
# itself is not counted).
PLAYBOOK_RUNNER_MAX_DRAINED = '100%'


def playbook_vars(args):
    """--playbook-vars: the hook's variables for ansible-playbook; when the job's GPUs cannot be
    told, the node drained with why instead (RUNNER_DRAINED or RUNNER_NOT_DRAINED)."""
    host_root = host_root_of(args.vars_file)
    gpus, problem = job_gpus(args, host_root)
    if problem is None:
        variables = hook_vars(args, gpus, job_setting(args, gpus, host_root))
        # ansible-playbook exits 2 whether the role drained the node or its brake held it, and
        # Slurm drains a node whose Prolog fails, with a reason that says nothing: no brake here.
        variables[PREFIX + 'max_drained'] = PLAYBOOK_RUNNER_MAX_DRAINED
        return write_playbook_vars(args.playbook_vars, variables)
    result = drain({'host': args.node, 'outcome': 'failed', 'reason': problem}, args.scontrol, args.node, SLURM_CALL_S)
    sys.stdout.write(json.dumps(result) + '\n')
    sys.stderr.write('gpu_reset: %s is not clean: %s\n' % (printable(args.node), printable(result['reason'])))
    return RUNNER_DRAINED if result['drained'] else RUNNER_NOT_DRAINED


def write_playbook_vars(path, variables):
    """The playbook runner's extra variables (-e @path), as JSON: never spliced into a shell word."""
    with open(path, 'w') as handle:
        json.dump(variables, handle)
        handle.write('\n')
    return 0
