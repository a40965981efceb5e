# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""--playbook-vars (plugin_utils/_hook/playbook.py): the variables the hook fixes for the playbook
runner, written as JSON built in Python; a node whose job's GPUs cannot be told is drained instead."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status
from slurm_texts import identity_gres_conf


def playbook_runner_args(host, tmp_path, gres_text):
    variables = tmp_path / 'gpu_reset.yml'
    variables.write_text('gpu_reset_host_root: %s\n' % json.dumps(host.root))
    gres_conf = tmp_path / 'gres.conf'
    gres_conf.write_text(gres_text)
    return ['--node', 'n1', '--vars-file', str(variables), '--gres-conf', str(gres_conf)]


def test_the_playbook_runner_gets_its_variables_as_json_built_in_python(gpuhost, tmp_path):
    """What the hook fixes for ansible-playbook (-e @FILE): the GPUs parsed and mapped as for the
    module runner, never spliced into a shell word (that is how a drain command could be injected)."""
    path = tmp_path / 'hook-vars.json'
    args = playbook_runner_args(gpuhost, tmp_path, identity_gres_conf(gpuhost))
    assert _slurm_hook.main(args + ['--gpus', '0-2,5', '--timeout', '7', '--playbook-vars', str(path)]) == 0
    assert json.loads(path.read_text()) == {'gpu_reset_on_failure': 'drain', 'gpu_reset_gpus': [0, 1, 2, 5],
                                            'gpu_reset_timeout': 7.0, 'gpu_reset_max_drained': '100%'}


def test_the_playbook_runner_is_not_started_when_the_jobs_gpus_cannot_be_told(gpuhost, tmp_path, capsys):
    """gres.conf names a GPU the host does not have: the node is drained with why, and no
    variables are written for a playbook that would release some other GPU."""
    path = tmp_path / 'hook-vars.json'
    scontrol = tmp_path / 'scontrol'
    scontrol.write_text('#!/bin/sh\necho "$@" > %s\n' % (tmp_path / 'drained'))
    scontrol.chmod(0o755)
    args = playbook_runner_args(gpuhost, tmp_path, 'Name=gpu File=%s/dev/nvidia9\n' % gpuhost.root)
    rc = _slurm_hook.main(args + ['--gpus', '0', '--scontrol', str(scontrol), '--playbook-vars', str(path)])
    assert rc == _hook_status.RUNNER_DRAINED
    assert not path.exists()
    reason = (tmp_path / 'drained').read_text()
    assert reason.startswith("update nodename=n1 state=drain reason=gpu_reset: SLURM_JOB_GPUS=0: gres.conf's "
                             '%s/dev/nvidia9 cannot be read' % gpuhost.root), reason
    assert 'Traceback' not in capsys.readouterr().err
