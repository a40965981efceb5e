# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""playbooks/reset_gpus.yml run the way AWX runs it: through `ansible-runner run` (a private data
dir with the project, the inventory and env/, process isolation off) against simulated hosts,
and as a sliced job, whose slices run concurrently. What is checked is what AWX shows: the
runner's status and rc, the per-host results of the job events, and the job's artifacts (the
set_stats of the run, in the playbook_on_stats event)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import glob
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from gpusim.state import is_alive as alive
from test_role_playbook import BIN, REPO, host_vars

RUNNER = os.path.join(BIN, 'ansible-runner')
pytestmark = pytest.mark.skipif(not os.path.exists(RUNNER), reason='ansible-runner is not installed')

ROLE = 'gpu_reset'
# The role's task that runs the sequence and returns the report (gpu_reset_result).
RESET_TASK = 'Put the GPUs back into a clean state'


# The playbook of an AWX project: AWX runs a playbook of the project, which imports the
# collection's (docs/docsite/rst/guide_scale.rst, "AWX and job slicing").
PROJECT_PLAYBOOK = """---
- name: Reset the GPUs
  ansible.builtin.import_playbook: gpuops.nvidia.reset_gpus
"""


def private_data_dir(root, inventory, extravars=None):
    """An ansible-runner private data dir as AWX lays it out for a job: project/ (the checkout
    of the project), inventory/, env/. The collection is found on ANSIBLE_COLLECTIONS_PATH, as
    an execution environment has it installed."""
    (root / 'project').mkdir(parents=True)
    (root / 'project' / 'reset_gpus.yml').write_text(PROJECT_PLAYBOOK)
    (root / 'inventory').mkdir()
    # JSON is YAML: the yaml inventory plugin keeps the types.
    (root / 'inventory' / 'hosts.yml').write_text(json.dumps(inventory, indent=1))
    (root / 'env').mkdir()
    (root / 'env' / 'envvars').write_text(yaml.safe_dump({
        'ANSIBLE_COLLECTIONS_PATH': os.path.join(REPO, '.build', 'collections'),
        'ANSIBLE_PYTHON_INTERPRETER': sys.executable, 'ANSIBLE_RETRY_FILES_ENABLED': 'False',
        'ANSIBLE_LOCALHOST_WARNING': 'False', 'ANSIBLE_PIPELINING': 'True'}))
    variables = dict(gpu_reset_become=False)
    variables.update(extravars or {})
    (root / 'env' / 'extravars').write_text(yaml.safe_dump(variables))
    (root / 'env' / 'settings').write_text(yaml.safe_dump({'process_isolation': False, 'job_timeout': 240}))
    return root


def start(root, ident):
    env = dict(os.environ)
    env['PATH'] = BIN + os.pathsep + env.get('PATH', '')
    return subprocess.Popen([RUNNER, 'run', str(root), '-p', 'reset_gpus.yml', '--ident', ident],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


class Job:
    """What AWX keeps of one ansible-runner run: its status and rc, its job events, the host
    summary and the artifacts (artifacts/<ident>/)."""

    def __init__(self, root, ident, proc):
        out = proc.communicate(timeout=300)[0].decode(errors='replace')
        self.exit_code = proc.returncode
        self.out = out
        artifacts = root / 'artifacts' / ident
        self.status = (artifacts / 'status').read_text().strip()
        self.rc = int((artifacts / 'rc').read_text())
        self.events = sorted((json.loads(open(path).read()) for path in glob.glob(str(artifacts / 'job_events' / '*.json'))),
                             key=lambda event: event['counter'])
        stats = [event['event_data'] for event in self.events if event['event'] == 'playbook_on_stats']
        assert len(stats) == 1, out
        self.stats = stats[0]
        self.artifacts = self.stats.get('artifact_data') or {}

    def results(self, role=None, task=None):
        """(event, host, task, res) of each task result, only the role's when role is given."""
        for event in self.events:
            data = event['event_data']
            if event['event'] in ('runner_on_ok', 'runner_on_failed', 'runner_on_skipped', 'runner_on_unreachable') \
                    and (role is None or data.get('role') == role) and (task is None or data.get('task') == task):
                yield event['event'], data['host'], data['task'], data.get('res') or {}

    @property
    def outcomes(self):
        """{host: outcome} from the role's results: the report it sets, gpu_reset_result."""
        found = {}
        for kind, host, dummy, res in self.results(ROLE, RESET_TASK):
            if kind in ('runner_on_ok', 'runner_on_failed') and res.get('outcome'):
                found[host] = res['outcome']
        return found

    @property
    def role_hosts(self):
        return set(host for dummy, host, dummy, dummy in self.results(ROLE))

    @property
    def failed_hosts(self):
        """The hosts AWX marks failed: failures or unreachable in the host summary."""
        return set(self.stats['failures']) | set(self.stats['dark'])

    @property
    def summary(self):
        lines = [res['msg'] for kind, host, task, res in self.results(task='Summary') if kind == 'runner_on_ok']
        return lines[0] if lines else None


def run_jobs(jobs):
    """Run (root, ident) pairs concurrently through ansible-runner; their Jobs, in order."""
    started = time.monotonic()
    procs = [(root, ident, start(root, ident)) for root, ident in jobs]
    done = [Job(root, ident, proc) for root, ident, proc in procs]
    sys.stderr.write('ansible-runner x%d: %.1f s\n' % (len(jobs), time.monotonic() - started))
    return done


def awx_slice(inventory, number, count):
    """The inventory AWX gives slice number (1-based) of a job sliced count ways: every host of
    the inventory sorted by name, from the number-th on, every count-th; every group is kept,
    one left without a host too."""
    every = sorted(set(name for group in inventory.values() for name in group.get('hosts', {})))
    mine = set(every[number - 1::count])
    return dict((name, dict(group, hosts=dict((host, values) for host, values in group.get('hosts', {}).items()
                                              if host in mine)))
                for name, group in inventory.items())


def scenario(make, tmp, names, failing, holding):
    """Simulated hosts: failing has orphaned memory (and no GPU reset allowed), holding has a
    job holding GPU 0, the others are clean; {'gpu_hosts': {'hosts': ...}} and the holder pids."""
    hosts, holders = {}, {}
    for name in names:
        host = make(name, gpus=2)
        if name == failing:
            host.hold(gpus=[1], mib=8192, leak=True)
        elif name == holding:
            holders[name] = host.hold(gpus=[0], mib=2048)['pid']
        hosts[name] = host_vars(host, tmp, name)
    return {'gpu_hosts': {'hosts': hosts}}, holders


@contextlib.contextmanager
def simulated_hosts(tmp):
    """make(name, **opts): a simulated host under tmp, initialised; all are stopped at the end."""
    from gpusim.api import Host
    made = []

    def make(name, **opts):
        host = Host(str(tmp / name))
        made.append(host)
        host.init(**opts)
        return host

    try:
        yield make
    finally:
        for host in made:
            host.stop()


@pytest.fixture(scope='module')
def job(tmp_path_factory):
    """One job of three hosts: clean, hung (a job holding GPU 0) and failing (orphaned memory)."""
    tmp = tmp_path_factory.mktemp('runner')
    with simulated_hosts(tmp) as make:
        inventory, holders = scenario(make, tmp, ['clean', 'hung', 'failing'], 'failing', 'hung')
        root = private_data_dir(tmp / 'job', inventory)
        yield dict(job=run_jobs([(root, 'job')])[0], holders=holders, root=root)


def test_runner_status_and_rc_of_a_job_with_a_failing_host(job):
    run = job['job']
    assert run.status == 'failed' and run.rc == 2, run.out
    assert run.exit_code == 2
    assert run.failed_hosts == {'failing'}


def test_per_host_outcomes_from_the_job_events(job):
    run = job['job']
    assert run.outcomes == {'clean': 'clean', 'hung': 'released', 'failing': 'failed'}
    # The host fails once, in the playbook's last play (after every serial batch); the others fail
    # nowhere. Its report is the role's task's result all the same.
    failed = [(host, task) for kind, host, task, dummy in run.results() if kind == 'runner_on_failed']
    assert failed == [('failing', 'Fail the hosts that are not clean')], failed
    released = [res for kind, host, task, res in run.results(ROLE, RESET_TASK) if host == 'hung']
    assert released[0]['changed'] is True
    assert [entry['pid'] for entry in released[0]['signalled']] == [job['holders']['hung']]
    assert not alive(job['holders']['hung'])
    assert run.summary[0] == '3 of 3 host(s): 1 clean, 1 released, 1 failed'


def test_artifacts_hold_every_hosts_report(job):
    run = job['job']
    reports = run.artifacts['gpu_reset_reports']
    assert sorted(reports) == ['clean', 'failing', 'hung']
    assert dict((host, report['outcome']) for host, report in reports.items()) == run.outcomes
    assert reports['failing']['reason'].startswith('GPU 1: 8193 MiB held with no process left (orphaned memory')
    assert reports['failing']['orphaned_gpus'] == [1]
    assert reports['hung']['gpus_after'] == [{'index': 0, 'memory_used_mib': 1}, {'index': 1, 'memory_used_mib': 1}]
    # The same reports as the role set on each host (the fact in the job events).
    facts = dict((host, res) for kind, host, task, res in run.results(ROLE, RESET_TASK)
                 if kind in ('runner_on_ok', 'runner_on_failed'))
    assert dict((host, report['reason']) for host, report in reports.items()) == \
        dict((host, report['reason']) for host, report in facts.items())


def test_reports_of_every_serial_batch_are_kept(gpuhost_factory, tmp_path):
    hosts = dict((name, gpuhost_factory(name, gpus=1)) for name in ('node1', 'node2', 'node3'))
    holder = hosts['node2'].hold(gpus=[0], mib=1024)['pid']
    inventory = {'gpu_hosts': {'hosts': dict((name, host_vars(host, tmp_path, name)) for name, host in hosts.items())}}
    root = private_data_dir(tmp_path / 'job', inventory, {'gpu_reset_serial': 2})
    run = run_jobs([(root, 'serial')])[0]
    assert run.status == 'successful' and run.rc == 0, run.out
    # Published once per batch, for the hosts of that batch: aggregated, the job keeps all three.
    published = [host for kind, host, dummy, dummy in run.results(task='Publish the reports as job artifacts')]
    assert len(published) == 2, published
    reports = run.artifacts['gpu_reset_reports']
    assert dict((name, report['outcome']) for name, report in reports.items()) == dict(
        node1='clean', node2='released', node3='clean')
    assert [entry['pid'] for entry in reports['node2']['signalled']] == [holder]


def test_ee_installs_the_tested_ansible_runner():
    with open(os.path.join(REPO, 'meta', 'execution-environment.yml')) as f:
        ee = yaml.safe_load(f)
    with open(os.path.join(REPO, 'requirements', 'test.txt')) as f:
        tested = [line.strip() for line in f if line.startswith('ansible-runner==')]
    assert tested == [ee['dependencies']['ansible_runner']['package_pip']]


# Job slicing: five GPU hosts and a login node (in the inventory, not a GPU host), three slices.
GPU_HOSTS = ['gpu01', 'gpu02', 'gpu03', 'gpu04', 'gpu05']
SLICES = 3


@pytest.fixture(scope='module')
def sliced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('sliced')
    with simulated_hosts(tmp) as make:
        inventory, holders = scenario(make, tmp, GPU_HOSTS, 'gpu04', 'gpu02')
        inventory['login'] = {'hosts': {'login01': dict(ansible_connection='local', ansible_python_interpreter=sys.executable)}}
        slices = [awx_slice(inventory, number, SLICES) for number in range(1, SLICES + 1)]
        roots = [(private_data_dir(tmp / ('slice%d' % number), part, {'gpu_reset_sliced': True}), 'slice%d' % number)
                 for number, part in enumerate(slices, 1)]
        yield dict(jobs=run_jobs(roots), slices=slices, holders=holders)


def test_slices_split_the_inventory_as_awx_does(sliced):
    hosts = [sorted(part['gpu_hosts']['hosts']) + sorted(part['login']['hosts']) for part in sliced['slices']]
    assert hosts == [['gpu01', 'gpu04'], ['gpu02', 'gpu05'], ['gpu03', 'login01']]


def test_every_host_is_handled_exactly_once(sliced):
    handled = [host for run in sliced['jobs'] for host in run.role_hosts]
    assert sorted(handled) == GPU_HOSTS
    assert not any('login01' in run.role_hosts for run in sliced['jobs'])
    assert not alive(sliced['holders']['gpu02'])


def test_a_failing_host_fails_its_slice_only(sliced):
    assert [(run.status, run.rc) for run in sliced['jobs']] == [('failed', 2), ('successful', 0), ('successful', 0)]
    assert [run.failed_hosts for run in sliced['jobs']] == [{'gpu04'}, set(), set()]
    assert sliced['jobs'][0].summary[0] == '2 of 2 host(s) in this slice: 1 clean, 0 released, 1 failed'
    assert sliced['jobs'][1].summary[0] == '2 of 2 host(s) in this slice: 1 clean, 1 released, 0 failed'


def test_the_slices_artifacts_hold_every_hosts_report(sliced):
    reports = {}
    for run in sliced['jobs']:
        part = run.artifacts['gpu_reset_reports']
        assert sorted(part) == sorted(run.role_hosts)
        reports.update(part)
    assert dict((host, report['outcome']) for host, report in reports.items()) == dict(
        gpu01='clean', gpu02='released', gpu03='clean', gpu04='failed', gpu05='clean')
    assert 'orphaned memory' in reports['gpu04']['reason']


LOGIN_ONLY = {'gpu_hosts': {'hosts': {}}, 'rack2': {'hosts': {}},
              'login': {'hosts': {'login01': dict(ansible_connection='local', ansible_python_interpreter=sys.executable)}}}


def test_a_slice_without_a_target_host(tmp_path):
    """A slice can hold none of the target's hosts (AWX slices every host of the inventory):
    with gpu_reset_sliced that passes. It stays an error without it, for a group that the
    inventory lacks, and when the one host of a slice is no GPU host (no gpu_hosts group)."""
    cases = [('empty', LOGIN_ONLY, {'gpu_reset_sliced': True}),
             ('rack', LOGIN_ONLY, {'gpu_reset_sliced': True, 'target': 'rack2'}),
             ('whole', LOGIN_ONLY, {}),
             ('typo', LOGIN_ONLY, {'gpu_reset_sliced': True, 'target': 'rack9'}),
             ('nogroup', {'login': LOGIN_ONLY['login']}, {'gpu_reset_sliced': True})]
    runs = dict(zip([name for name, dummy, dummy in cases], run_jobs(
        [(private_data_dir(tmp_path / name, inventory, extravars), name) for name, inventory, extravars in cases])))
    for name in ('empty', 'rack'):
        assert (runs[name].status, runs[name].rc) == ('successful', 0), runs[name].out
        assert not runs[name].role_hosts and 'gpu_reset_reports' not in runs[name].artifacts
    for name, target in (('whole', 'gpu_hosts'), ('typo', 'rack9'), ('nogroup', 'gpu_hosts')):
        assert runs[name].status == 'failed' and runs[name].rc == 2, runs[name].out
        failed = [res['msg'] for kind, host, task, res in runs[name].results() if kind == 'runner_on_failed']
        assert failed == ["No host in the inventory matches '%s'. Name the hosts to reset with -e target=PATTERN, "
                          "or put them in the group gpu_hosts." % target], failed
        assert not runs[name].role_hosts
