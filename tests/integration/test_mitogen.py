# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""playbooks/reset_gpus.yml under Mitogen for Ansible (strategy mitogen_linear, on the
controller only) against simulated hosts: one clean, one after a hung job."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB
from gpusim.state import is_alive

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, 'playbooks', 'reset_gpus.yml')
BIN = os.path.dirname(sys.executable)

ansible_mitogen = pytest.importorskip(
    'ansible_mitogen', reason='mitogen (requirements/test.txt) is not installed in this environment')


def mitogen_env(tmp):
    """Ansible's environment with Mitogen's strategy plugins, as ansible.cfg would set them;
    Mitogen's debug log says which connection each host got."""
    strategies = os.path.join(os.path.dirname(ansible_mitogen.__file__), 'plugins', 'strategy')
    env = dict(os.environ, ANSIBLE_STRATEGY_PLUGINS=strategies, ANSIBLE_STRATEGY='mitogen_linear',
               MITOGEN_LOG_LEVEL='debug', ANSIBLE_REMOTE_TMP=str(tmp / 'remote-tmp'),
               ANSIBLE_NOCOLOR='1', ANSIBLE_RETRY_FILES_ENABLED='0', ANSIBLE_STDOUT_CALLBACK='default',
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0')
    env['PATH'] = BIN + os.pathsep + env.get('PATH', '')
    return env


def inventory(path, hosts, tmp):
    """A YAML (here JSON) inventory: each simulated host through the local connection, found by
    its root (its own state directory too, ROOT/run/gpuops, not the machine's)."""
    entries = {}
    for name, host in hosts.items():
        entries[name] = dict(ansible_connection='local', ansible_python_interpreter=sys.executable,
                             gpu_reset_become=False, gpu_reset_nvidia_smi_path=host.smi_path,
                             gpu_reset_host_root=host.root, gpu_reset_lock_file=str(tmp / (name + '.lock')),
                             gpu_reset_grace_period=0.5, gpu_reset_timeout=8)
    path.write_text(json.dumps({'gpu_hosts': {'hosts': entries}}))
    return path


def run_playbook(inventory_path, report_dir, tmp):
    command = [os.path.join(BIN, 'ansible-playbook'), '-vvv', '-i', str(inventory_path), PLAYBOOK,
               '-e', 'gpu_reset_report_dir=%s' % report_dir]
    return subprocess.run(command, capture_output=True, text=True, env=mitogen_env(tmp), timeout=300, check=False)


def reports(report_dir):
    return dict((name[:-len('.json')], json.loads((report_dir / name).read_text()))
                for name in os.listdir(str(report_dir)))


def test_playbook_under_mitogen_linear_releases_a_hung_job(gpuhost_factory, tmp_path):
    clean = gpuhost_factory('clean', gpus=2)
    hung = gpuhost_factory('hung')
    scenario = hung.scenario('hung-job', release_delay=0.3)
    ranks = [rank['pid'] for rank in scenario['ranks']]
    report_dir = tmp_path / 'reports'

    hosts = inventory(tmp_path / 'inventory.yml', dict(clean=clean, hung=hung), tmp_path)
    proc = run_playbook(hosts, report_dir, tmp_path)
    out = proc.stdout + proc.stderr

    assert proc.returncode == 0, out[-6000:]
    # Each host was reached through a Mitogen context, not Ansible's own local connection.
    for name in ('clean', 'hung'):
        assert 'to connect to "%s"' % name in out, out[-6000:]
    assert 'new child booted successfully' in out
    assert 'ESTABLISH LOCAL CONNECTION' not in out
    found = reports(report_dir)
    assert found['clean']['outcome'] == 'clean' and found['clean']['signalled'] == []
    assert found['hung']['outcome'] == 'released', found['hung']
    assert sorted(entry['pid'] for entry in found['hung']['signalled']) == sorted(ranks)
    assert found['hung']['survivors'] == [] and found['hung']['orphaned_gpus'] == []
    assert not any(is_alive(pid) for pid in ranks)
    assert is_alive(scenario['persistenced']['pid'])
    assert all(mib <= DEFAULT_MEMORY_THRESHOLD_MIB for mib in hung.memory_used().values())
