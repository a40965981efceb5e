# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""playbooks/history_report.yml with ansible-playbook over simulated hosts: the histories the
collection wrote on them, read where the role keeps them, printed the worst first; a host with no
history is one with nothing to say."""

import json
import os
import subprocess
import sys
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, 'playbooks', 'history_report.yml')
BIN = os.path.dirname(sys.executable)
UUID = 'GPU-11111111-2222-3333-4444-555555555555'


def test_the_fleets_histories_are_printed_worst_first(tmp_path):
    now = time.time()
    sick = History.for_host(str(tmp_path / 'gpu01'))
    for days in (6, 3):
        sick.record([(UUID, 2, 'orphaned memory')], 'reset', when=now - days * 86400, outcome='cured', duration_s=30.0)
        sick.record([(UUID, 2, 'orphaned memory')], 'cure', when=now - days * 86400, how='reset')
    (tmp_path / 'gpu02').mkdir()
    hosts = dict((name, {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                         'gpu_reset_host_root': str(tmp_path / name)}) for name in ('gpu01', 'gpu02'))
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': hosts}}))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_RETRY_FILES_ENABLED='0', ANSIBLE_STDOUT_CALLBACK='default',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_LOCALHOST_WARNING='0')
    proc = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', str(inventory), PLAYBOOK, '-e',
                           'gpu_reset_become=false'], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    table = [line.strip().strip('",') for line in out.splitlines() if line.strip().startswith('"gpu0')]
    assert table[0].startswith('gpu01') and table[0].endswith('1.0m'), out
    assert UUID in table[1] and '2/0/0' in table[1] and '3.0d' in table[1], out
    assert table[-1].startswith('gpu02') and 'unreadable' not in out, out
    assert 'changed=0' in out and 'failed=0' in out
