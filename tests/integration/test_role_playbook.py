# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""playbooks/reset_gpus.yml and the gpu_reset role run with ansible-playbook against a fleet of
simulated hosts (localhost aliases, one gpusim root each)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB
from gpusim.api import Host
from gpusim.state import is_alive as alive

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(REPO, 'playbooks', 'reset_gpus.yml')
BIN = os.path.dirname(sys.executable)

# Tasks of the role that run a module on the managed host (the report is written on the
# controller, "-> localhost").
RELEASED = ('clean', 'hung', 'stubborn', 'daemons', 'orphan_on', 'scoped', 'strict', 'stuck')

# A clean query of the user's own, judged before the release: here one that lets a sidecar
# hold GPU 0, and one that is as strict as the default.
# Idle GPUs read 1 MiB (as real H200s): the queries compare with the default threshold.
SIDECAR_QUERY = ("length(nvidia_gpus[?memory_used_mib > `%d`]) == `0`"
                 " && length(nvidia_device_holders[?!protected && comm != 'gpu-sidecar']) == `0`" % DEFAULT_MEMORY_THRESHOLD_MIB)
STRICT_QUERY = ("length(nvidia_gpus[?error != null || memory_used_mib == null || memory_used_mib > `%d`]) == `0`"
                " && length(nvidia_device_holders[?!protected]) == `0`" % DEFAULT_MEMORY_THRESHOLD_MIB)

HOST_MODULE_TASKS = (
    'Read the GPUs and who holds them',
    'Release the GPUs',
    'Read the GPUs and check that they are clean',
    'Switch persistence mode off on the GPUs to reset',
    'Reset the GPUs with orphaned memory',
    'Switch persistence mode back on',
)


def persistence_mode(host, index):
    proc = host.smi('--query-gpu=persistence_mode', '--format=csv,noheader', '-i', str(index))
    return proc.stdout.strip()


def holds(pid, path):
    for fd in os.listdir('/proc/%d/fd' % pid):
        try:
            if os.readlink('/proc/%d/fd/%s' % (pid, fd)) == path:
                return True
        except OSError:
            pass
    return False


def ansible_env():
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0', ANSIBLE_RETRY_FILES_ENABLED='0',
               ANSIBLE_STDOUT_CALLBACK='default', ANSIBLE_PIPELINING='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0')
    env['PATH'] = BIN + os.pathsep + env.get('PATH', '')
    return env


def host_vars(host, tmp, name, **variables):
    """A simulated host's inventory variables: the collection finds it by its root (its /dev,
    /sys and /proc/driver, and its own state directory, ROOT/run/gpuops, not the machine's), and
    the probe (on by default) its simulated libcuda.so.1."""
    values = dict(ansible_connection='local', ansible_python_interpreter=sys.executable,
                  gpu_reset_nvidia_smi_path=host.smi_path, gpu_reset_host_root=host.root,
                  gpu_reset_probe_cuda_library=host.install_cuda(),
                  gpu_reset_lock_file=str(tmp / ('%s.lock' % name)), gpu_reset_grace_period=0.5,
                  gpu_reset_timeout=3)
    values.update(variables)
    return values


class Run:
    """One ansible-playbook run: exit code, output, recap, the summary, reports, task lines."""

    def __init__(self, proc, report_dir):
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr
        self.reports = {}
        if os.path.isdir(report_dir):
            for name in os.listdir(report_dir):
                with open(os.path.join(report_dir, name)) as handle:
                    self.reports[name[:-len('.json')]] = json.load(handle)
        self.recap = dict((match.group(1), dict(re.findall(r'(\w+)=(\d+)', match.group(2))))
                          for match in re.finditer(r'^(\S+)\s+: (ok=.*)$', proc.stdout, re.M))
        summary = re.search(r'TASK \[Summary\][^\n]*\n[^\n]*=> (\{.*?\n\})', proc.stdout, re.S)
        self.summary = json.loads(summary.group(1))['msg'] if summary else None
        # host -> the messages of its failed tasks, in order
        self.failures = {}
        for match in re.finditer(r'^fatal: \[([^\]\s]+)[^\]]*\]: FAILED! => (\{.*\})$', proc.stdout, re.M):
            self.failures.setdefault(match.group(1), []).append(json.loads(match.group(2)).get('msg'))
        self.tasks = {}  # host -> names of the tasks it ran (ok/changed/failed), not delegated
        task = None
        for line in proc.stdout.splitlines():
            match = re.match(r'TASK \[(?:[\w.]+ : )?(.*?)\]', line)
            if match:
                task = match.group(1)
                continue
            match = re.match(r'(ok|changed|fatal|failed): \[([^\]]+)\]', line)
            if match and task:
                self.tasks.setdefault(match.group(2), []).append(task)

    def module_calls(self, host):
        """What ran a module on host: the steps of gpuops.nvidia.gpu_reset (its report's steps),
        then any other task that runs one."""
        return list(self.reports[host].get('steps') or []) + [
            task for task in self.tasks.get(host, []) if task in HOST_MODULE_TASKS]

    def line(self, host):
        """The summary's line for host: its own, or the one line of the clean hosts naming it."""
        own = [line for line in self.summary if line[10:].split(' ', 1)[0] == host]
        return own or [line for line in self.summary
                       if line.startswith('clean ') and host in line.rsplit(': ', 1)[-1].split(',')]


def playbook(inventory, report_dir, *args, **kwargs):
    command = [os.path.join(BIN, 'ansible-playbook'), '-i', str(inventory), PLAYBOOK, '-f', '12',
               '-e', 'gpu_reset_report_dir=%s' % report_dir] + list(args)
    started = time.monotonic()
    env = kwargs.pop('env', None) or ansible_env()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False, **kwargs)
    sys.stderr.write('ansible-playbook %s: %.1f s\n' % (' '.join(args), time.monotonic() - started))
    return Run(proc, str(report_dir))


@pytest.fixture(scope='module')
def fleet(tmp_path_factory):
    """Ten simulated hosts, one scenario each, and three runs of the playbook: check mode on
    some, the real run on all, and a second run on those made clean (and one that failed)."""
    tmp = tmp_path_factory.mktemp('fleet')
    hosts = {}

    def make(name, **opts):
        host = Host(str(tmp / name))
        hosts[name] = host
        host.init(**opts)
        return host

    try:
        info = {}
        make('clean', gpus=2)
        info['hung'] = make('hung').scenario('hung-job', release_delay=0.3)
        info['stubborn'] = make('stubborn', gpus=2).hold(gpus=[0], mib=2048, ignore_term=True)
        daemons = make('daemons', gpus=2)
        info['daemons'] = dict(
            daemons=[daemons.hold(gpus='all', name=name, daemon=True)['pid']
                     for name in ('nvidia-persistenced', 'nv-hostengine', 'dcgm-exporter')],
            job=daemons.hold(gpus=[1], mib=1024)['pid'])
        info['orphan_off'] = make('orphan_off', gpus=4).hold(gpus=[3], mib=8192, leak=True)
        orphan_on = make('orphan_on', gpus=4)
        info['orphan_on'] = dict(persistenced=orphan_on.hold(gpus='all', name='nvidia-persistenced', daemon=True)['pid'],
                                 job=orphan_on.hold(gpus=[1], mib=4096, leak=True)['pid'])
        refused = make('refused', gpus=2)
        # nvidia-smi refuses the reset of GPU 1 (a client no scan sees holds it); nv-hostengine holds
        # only GPU 0, which needs no reset, so nothing has to be stopped for it.
        info['refused'] = dict(daemon=refused.hold(gpus=[0], name='nv-hostengine', daemon=True)['pid'],
                               persistenced=refused.hold(gpus='all', name='nvidia-persistenced', daemon=True)['pid'])
        refused.hold(gpus=[1], mib=512, leak=True)
        refused.fault('reset-refused', gpu=1)
        make('lost', gpus=4).fault('lost', gpu=2)
        make('stuck', gpus=2).fault('stuck', gpu=1, mib=4096)
        make('drain', gpus=4).fault('lost', gpu=1)
        scoped = make('scoped', gpus=2)
        info['scoped'] = dict(mine=scoped.hold(gpus=[0], mib=1000)['pid'],
                              other=scoped.hold(gpus=[1], mib=2000)['pid'])
        info['tolerant'] = make('tolerant', gpus=2).hold(gpus=[0], name='gpu-sidecar')
        info['strict'] = make('strict', gpus=2).hold(gpus=[1], mib=1024)

        drained = tmp / 'drained.txt'
        inventory_hosts = {}
        for name, host in sorted(hosts.items()):
            extra = {}
            if name in ('orphan_on', 'refused', 'stuck'):
                extra['gpu_reset_allow_gpu_reset'] = True
                # The release keeps a third of its timeout for the reset: room for its nvidia-smi
                # calls on a busy test machine.
                extra['gpu_reset_timeout'] = 12
            if name in ('hung', 'stubborn', 'daemons', 'scoped', 'strict'):
                # Released only once the settle window (1 s after the last exit) fits before the
                # timeout: room for it on a busy test machine with every host at once.
                extra['gpu_reset_timeout'] = 8
            if name == 'drain':
                extra['gpu_reset_on_failure'] = 'drain'
                extra['gpu_reset_drain_command'] = [
                    'sh', '-c', 'printf "%s\\n" "$@" >> "$0"', str(drained),
                    'nodename={{ inventory_hostname_short }}', 'reason={{ gpu_reset_result.reason }}']
            if name == 'scoped':
                extra['gpu_reset_gpus'] = [0]
            if name == 'tolerant':
                extra['gpu_reset_clean_query'] = SIDECAR_QUERY
            if name == 'strict':
                extra['gpu_reset_clean_query'] = STRICT_QUERY
            if name == 'hung':
                extra['gpu_reset_textfile_dir'] = str(tmp / 'textfile')
                (tmp / 'textfile').mkdir()
            inventory_hosts[name] = host_vars(host, tmp, name, **extra)
        # JSON is YAML: the yaml inventory plugin keeps the types (an INI inventory would not).
        inventory = tmp / 'inventory.yml'
        inventory.write_text(json.dumps({'gpu_hosts': {'hosts': inventory_hosts}}, indent=1))

        alive_before = dict((name, [p['pid'] for p in host.ps() if p['alive']]) for name, host in hosts.items())
        runs = dict(check=playbook(inventory, tmp / 'reports-check', '--check', '--limit', 'clean,hung,orphan_on'))
        runs['alive_after_check'] = dict((name, [p['pid'] for p in host.ps() if p['alive']])
                                         for name, host in hosts.items())
        runs['alive_before'] = alive_before
        runs['first'] = playbook(inventory, tmp / 'reports-first')
        runs['metrics'] = (tmp / 'textfile' / 'gpu_reset.prom').read_text()
        runs['persistence_after'] = persistence_mode(hosts['orphan_on'], 1)
        runs['persistence_after_refused'] = persistence_mode(hosts['refused'], 1)
        runs['second'] = playbook(inventory, tmp / 'reports-second', '--limit', ','.join(RELEASED + ('lost',)))
        yield dict(hosts=hosts, info=info, runs=runs, drained=drained, tmp=tmp)
    finally:
        for host in hosts.values():
            host.stop()


def test_check_mode_kills_nothing(fleet):
    run = fleet['runs']['check']
    assert run.rc == 0, run.out
    assert fleet['runs']['alive_after_check'] == fleet['runs']['alive_before']
    report = run.reports['hung']
    assert report['outcome'] == 'would_release' and report['check_mode'] is True
    assert len(report['signalled']) == 8
    assert all(entry['signals_sent'] == [] for entry in report['signalled'])
    assert run.reports['clean']['outcome'] == 'clean'
    assert run.reports['orphan_on']['outcome'] == 'would_release'
    assert run.reports['orphan_on']['escalation'] is None
    assert run.summary[0] == '3 of 3 host(s): 1 clean, 0 released, 0 failed, 2 would be released (check mode)'
    assert 'would signal 8 process(es)' in run.line('hung')[0]
    assert not any('Reset the GPUs with orphaned memory' in tasks for tasks in run.tasks.values())


def test_fleet_exits_non_zero_and_summarises_every_host(fleet):
    run = fleet['runs']['first']
    print('\n'.join(run.summary))
    assert run.rc == 2, run.out
    assert run.summary[0] == '13 of 13 host(s): 2 clean, 7 released, 4 failed'
    outcomes = dict((name, report['outcome']) for name, report in run.reports.items())
    assert outcomes == dict(clean='clean', hung='released', stubborn='released', daemons='released',
                            orphan_off='failed', orphan_on='released', lost='failed', drain='failed',
                            scoped='released', refused='failed', tolerant='clean', strict='released',
                            stuck='released')
    for name, outcome in outcomes.items():
        assert len(run.line(name)) == 1
        assert run.line(name)[0].startswith({'clean': 'clean', 'released': 'released', 'failed': 'FAILED'}[outcome])
    # Failed hosts are listed first.
    assert [line.split()[0] for line in run.summary[1:5]] == ['FAILED'] * 4
    for name in ('orphan_off', 'lost', 'drain', 'refused'):
        assert run.recap[name]['failed'] == '1'
    for name in RELEASED + ('tolerant',):
        assert run.recap[name]['failed'] == '0'


def test_clean_host_is_one_module_call_and_no_change(fleet):
    run = fleet['runs']['first']
    assert run.recap['clean']['changed'] == '0'
    ran = run.module_calls('clean')
    assert ran == ['Release the GPUs']
    report = run.reports['clean']
    assert report['reason'] is None and report['signalled'] == [] and report['escalation'] is None
    assert report['gpus_before'] == report['gpus_after'] == [{'index': 0, 'memory_used_mib': 1},
                                                             {'index': 1, 'memory_used_mib': 1}]
    assert 'nothing to do' in run.line('clean')[0]


def test_hung_job_released_in_one_module_call(fleet):
    run = fleet['runs']['first']
    # The metrics are written by the same task, over its connection: no module call.
    assert run.module_calls('hung') == ['Release the GPUs']
    report = run.reports['hung']
    scenario = fleet['info']['hung']
    ranks = set(rank['pid'] for rank in scenario['ranks'])
    assert set(entry['pid'] for entry in report['signalled']) == ranks
    assert all(entry['signals_sent'] == ['TERM'] and entry['exited'] for entry in report['signalled'])
    assert report['gpus_before'] == [{'index': i, 'memory_used_mib': 1 + 76113} for i in range(8)]
    assert report['gpus_after'] == [{'index': i, 'memory_used_mib': 1} for i in range(8)]
    assert report['survivors'] == [] and report['orphaned_gpus'] == [] and report['escalation'] is None
    assert report['duration_s'] > 0 and report['release_s'] > 0
    assert alive(scenario['persistenced']['pid'])
    assert not any(alive(pid) for pid in ranks)
    metrics = fleet['runs']['metrics']
    assert 'gpu_reset_success 1\n' in metrics and 'gpu_reset_processes_signalled 8\n' in metrics
    assert 'gpu_reset_outcome{outcome="released"} 1\n' in metrics
    assert re.search(r'^gpu_reset_last_run_timestamp_seconds \d+\.\d+$', metrics, re.M)
    assert re.search(r'^gpu_reset_duration_seconds \d+\.\d+$', metrics, re.M)
    assert re.search(r'8 process\(es\) stopped \(python3; TERM\), 8 GPU\(s\) free in [\d.]+ s', run.line('hung')[0])


def test_sigterm_ignoring_holder_gets_kill(fleet):
    report = fleet['runs']['first'].reports['stubborn']
    assert [entry['signals_sent'] for entry in report['signalled']] == [['TERM', 'KILL']]
    assert not alive(fleet['info']['stubborn']['pid'])


def test_protected_daemons_are_left_alone(fleet):
    report = fleet['runs']['first'].reports['daemons']
    info = fleet['info']['daemons']
    assert [entry['pid'] for entry in report['signalled']] == [info['job']]
    assert all(alive(pid) for pid in info['daemons'])
    assert not alive(info['job'])


def test_orphaned_memory_without_escalation_fails_naming_the_gpu(fleet):
    run = fleet['runs']['first']
    report = run.reports['orphan_off']
    assert report['orphaned_gpus'] == [3] and report['escalation'] is None
    assert report['reason'].startswith('GPU 3: 8193 MiB held with no process left (orphaned memory')
    assert 'gpu_reset_allow_gpu_reset' in report['reason']
    assert 'GPU 3: 8193 MiB held' in run.line('orphan_off')[0]
    # The host fails once, after the summary, in one line: its reason, not its whole report.
    assert run.failures['orphan_off'] == [report['reason']]
    assert run.tasks['orphan_off'][-1] == 'Fail the hosts that are not clean'


def test_orphaned_memory_with_escalation_resets_and_restores_persistence(fleet):
    run = fleet['runs']['first']
    report = run.reports['orphan_on']
    info = fleet['info']['orphan_on']
    assert report['orphaned_gpus'] == [1]
    escalation = dict(report['escalation'])
    output = escalation.pop('output')
    # nvidia-persistenced lets the GPU go for the reset itself: nothing is stopped for it.
    assert escalation.pop('quiesced') == {'held_by': [], 'to_stop': [], 'mps_to_quit': False, 'refusal': None,
                                          'stopped': [], 'started': [], 'active_after': {}, 'mps_quit': False,
                                          'problems': [], 'host_engines': []}
    assert escalation == {'gpus': [1], 'reasons': [{'index': 1, 'reasons': ['orphaned memory']}],
                          'persistence_mode_off': [1], 'reset_ok': True, 'persistence_mode_restored': True,
                          'problems': [], 'fabric': [{'index': 1, 'state': '[N/A]', 'status': '[N/A]', 'ok': True,
                                                     'note': 'no NVLink fabric'}]}
    assert 'was successfully reset' in output
    assert report['gpus_after'][1] == {'index': 1, 'memory_used_mib': 1}
    assert fleet['runs']['persistence_after'] == 'Enabled'
    assert alive(info['persistenced'])
    assert holds(info['persistenced'], fleet['hosts']['orphan_on'].dev_path(1))
    assert 'GPU(s) 1 reset' in run.line('orphan_on')[0]


def test_orphaned_memory_alone_is_released_by_a_reset(fleet):
    run = fleet['runs']['first']
    report = run.reports['stuck']
    # Nothing to signal, but the GPU needed a reset: that is a release, not a clean host.
    assert report['signalled'] == [] and report['orphaned_gpus'] == [1]
    assert report['escalation']['gpus'] == [1] and report['escalation']['reset_ok'] is True
    assert report['gpus_before'][1] == {'index': 1, 'memory_used_mib': 1 + 4096}
    assert report['gpus_after'][1] == {'index': 1, 'memory_used_mib': 1}
    assert run.recap['stuck']['changed'] != '0'


def test_refused_reset_still_restores_persistence_mode(fleet):
    report = fleet['runs']['first'].reports['refused']
    info = fleet['info']['refused']
    escalation = report['escalation']
    assert escalation['gpus'] == [1] and escalation['reset_ok'] is False
    assert escalation['persistence_mode_off'] == [1] and escalation['persistence_mode_restored'] is True
    assert 'could not be reset' in escalation['output']
    assert fleet['runs']['persistence_after_refused'] == 'Enabled'
    assert report['reason'].startswith('GPU 1: 513 MiB held with no process left (orphaned memory; '
                                       'only a GPU reset frees it, and the reset failed: ')
    assert alive(info['daemon']) and alive(info['persistenced'])
    assert holds(info['persistenced'], fleet['hosts']['refused'].dev_path(1))


def test_lost_gpu_fails_naming_it(fleet):
    run = fleet['runs']['first']
    report = run.reports['lost']
    assert report['outcome'] == 'failed'
    assert report['reason'].startswith('GPU 2 lost or unreadable (Unable to determine the device handle')
    assert report['drained'] is False
    assert 'GPU 2 lost' in run.line('lost')[0]


def test_drain_runs_the_command_then_fails(fleet):
    run = fleet['runs']['first']
    report = run.reports['drain']
    assert report['outcome'] == 'failed' and report['drained'] is True
    written = fleet['drained'].read_text().splitlines()
    assert written[0] == 'nodename=drain'
    assert written[1].startswith('reason=GPU 1 lost or unreadable')
    # Drained, then failed in the same task (Ansible's recap counts no change of a failed task).
    assert run.recap['drain']['failed'] == '1' and len(run.failures['drain']) == 1


def test_scoped_release_leaves_other_gpus_alone(fleet):
    report = fleet['runs']['first'].reports['scoped']
    info = fleet['info']['scoped']
    assert [entry['pid'] for entry in report['signalled']] == [info['mine']]
    assert report['gpus_after'] == [{'index': 0, 'memory_used_mib': 1}]
    assert alive(info['other']) and not alive(info['mine'])


def test_second_run_changes_nothing_on_released_hosts(fleet):
    run = fleet['runs']['second']
    assert run.rc == 2
    for name in RELEASED:
        assert run.reports[name]['outcome'] == 'clean', name
        assert run.recap[name]['changed'] == '0', name
        # strict reads first (a query of its own), then proves what it judged clean.
        assert run.module_calls(name) == (
            ['Read the GPUs and who holds them', 'Prove the GPUs by allocation'] if name == 'strict'
            else ['Release the GPUs']), name
        assert run.reports[name]['probe']['probed'] is True, name
    assert run.reports['lost']['outcome'] == 'failed'
    assert run.summary[0] == '9 of 9 host(s): 8 clean, 0 released, 1 failed'


def test_own_clean_query_is_judged_before_anything_is_signalled(fleet):
    run = fleet['runs']['first']
    # The sidecar passes the query, so nothing is released, the sidecar lives, and the GPUs the
    # query judged clean are proven by the probe module (no release proved them).
    assert run.module_calls('tolerant') == [
        'Read the GPUs and who holds them', 'Prove the GPUs by allocation']
    assert run.reports['tolerant']['signalled'] == [] and alive(fleet['info']['tolerant']['pid'])
    # A dirty host is read, then released; the release's own final read proves it clean.
    assert run.module_calls('strict') == [
        'Read the GPUs and who holds them', 'Release the GPUs']
    report = run.reports['strict']
    assert [entry['pid'] for entry in report['signalled']] == [fleet['info']['strict']['pid']]
    assert report['gpus_before'] == [{'index': 0, 'memory_used_mib': 1}, {'index': 1, 'memory_used_mib': 1 + 1024}]
    assert report['gpus_after'] == [{'index': 0, 'memory_used_mib': 1}, {'index': 1, 'memory_used_mib': 1}]


HOOK = os.path.join(REPO, 'roles', 'slurm_hooks', 'files', 'gpu-reset-hook.sh')


def run_hook(host, tmp, mode, gres_conf=None, **env_extra):
    """Run the Slurm hook script as slurmd would, with a recording scontrol on PATH, and gres_conf
    (default: the GPUs in index order) beside SLURM_CONF."""
    fake = tmp / 'bin'
    fake.mkdir(exist_ok=True)
    calls = tmp / 'scontrol.calls'
    scontrol = fake / 'scontrol'
    scontrol.write_text('#!/bin/sh\nprintf "%%s\\n" "$*" >> %s\n' % calls)
    scontrol.chmod(0o755)
    variables = tmp / 'gpu_reset.yml'
    variables.write_text(json.dumps(dict(
        ansible_python_interpreter=sys.executable, gpu_reset_nvidia_smi_path=host.smi_path,
        gpu_reset_host_root=host.root, gpu_reset_lock_file=str(tmp / 'hook.lock'),
        gpu_reset_grace_period=0.5, gpu_reset_timeout=3)))
    # slurmd gives its hooks SLURM_CONF; gres.conf beside it lists the GPUs in index order.
    (tmp / 'gres.conf').write_text(gres_conf or 'Name=gpu File=%s/dev/nvidia[0-%d]\n' % (
        host.root, len(host.memory_used()) - 1))
    env = ansible_env()
    env.update(PATH=str(fake) + os.pathsep + env['PATH'], SLURMD_NODENAME='node01', SLURM_JOB_ID='4242',
               SLURM_CONF=str(tmp / 'slurm.conf'),
               GPU_RESET_HOOK_CONF=str(tmp / 'absent.conf'), GPU_RESET_VARS_FILE=str(variables),
               GPU_RESET_PLAYBOOK=PLAYBOOK, GPU_RESET_ANSIBLE_PLAYBOOK=os.path.join(BIN, 'ansible-playbook'),
               GPU_RESET_LOG=str(tmp / 'hook.log'), GPU_RESET_BUDGET_S='30',
               GPU_RESET_ANSIBLE_HOME=str(tmp / 'ansible-home'),
               GPU_RESET_PYTHON=sys.executable, GPU_RESET_SCONTROL=str(scontrol),
               GPU_RESET_COLLECTIONS_PATH=os.path.join(REPO, '.build', 'collections'))
    env.update(env_extra)
    proc = subprocess.run([HOOK, mode], capture_output=True, text=True, env=env, timeout=120, check=False)
    log = (tmp / 'hook.log').read_text() if (tmp / 'hook.log').exists() else None
    # The calls that change Slurm's state: listpids only reads the jobs on the node (none here).
    calls = [line for line in calls.read_text().splitlines() if line != 'listpids'] if calls.exists() else []
    return proc, calls, log


def test_a_health_check_that_finds_another_running_does_nothing(gpuhost_factory, tmp_path):
    # slurmd runs each health check slurmctld asks for in a thread of its own: two can meet.
    host = gpuhost_factory(gpus=1)
    holder = host.hold(gpus=[0], mib=1024)['pid']
    with open(HOOK) as running:
        fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc, calls, log = run_hook(host, tmp_path, 'health')
    assert proc.returncode == 0, log
    assert log.strip() == '=== health check: another health check is running; nothing done', log
    # Not even asked about the node; nothing signalled.
    assert not (tmp_path / 'scontrol.calls').exists() and alive(holder)


def test_slurm_epilog_frees_only_the_jobs_gpus(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=2)
    finished = host.hold(gpus=[0], mib=30000)['pid']
    neighbour = host.hold(gpus=[1], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='0')
    assert proc.returncode == 0, log
    assert calls == []
    assert not alive(finished) and alive(neighbour)
    assert '"outcome": "released"' in log, log
    assert 'epilog job 4242 on node01' in log


def test_slurm_prolog_drains_a_node_with_a_lost_gpu(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=4)
    host.fault('lost', gpu=2)
    # Every GPU of the node, as for a node given whole to one job (no GPUs in gres.conf).
    proc, calls, log = run_hook(host, tmp_path, 'prolog', GPU_RESET_SCOPE='node')
    assert proc.returncode == 1, log
    assert 'gpu_reset prolog failed on node01' in proc.stderr
    assert len(calls) == 1, calls
    assert calls[0].startswith('update nodename=node01 state=drain reason=gpu_reset: GPU 2 lost or unreadable')


@pytest.mark.parametrize('runner', ['module', 'playbook'])
def test_observe_mode_signals_nothing_drains_nothing_and_says_what_it_would_do(gpuhost_factory, tmp_path, runner):
    """GPU_RESET_MODE=observe: a hung job and a lost GPU; the hook reads and decides, signals and
    drains nothing, and exits 0 (a failed Prolog would have Slurm drain the node)."""
    host = gpuhost_factory(gpus=2)
    host.fault('lost', gpu=1)
    job = host.hold(gpus=[0], mib=30000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'prolog', GPU_RESET_SCOPE='node', GPU_RESET_MODE='observe',
                                GPU_RESET_RUNNER=runner)
    assert proc.returncode == 0, log
    assert calls == [] and alive(job) and host.memory_used()[0] == 1 + 30000
    assert 'GPU 1 lost or unreadable' in log, log
    if runner == 'module':
        assert 'observe mode, nothing changed: node01 would be drained: ' in log, log
        assert '"would_drain": true' in log and '"signals_sent": []' in log, log
    else:
        # ansible-playbook --check: the host fails in check mode; the hook leaves the node as it is.
        assert 'observe mode: the node is left as it is' in log, log


@pytest.mark.parametrize('runner', ['module', 'playbook'])
@pytest.mark.parametrize('value', ['ten', '10%%', '%5', '5%3', '-1'])
def test_a_fleet_brake_that_is_neither_a_number_nor_a_percentage_is_named(gpuhost_factory, tmp_path, value, runner):
    """A broken setting: the hook does not check the GPUs, and drains the node saying why (the
    runner checks it, by the rule of the action and the role slurm_hooks, whichever runner runs)."""
    host = gpuhost_factory(gpus=1)
    job = host.hold(gpus=[0], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='0', GPU_RESET_MAX_DRAINED=value,
                                GPU_RESET_RUNNER=runner)
    assert proc.returncode == 2 and alive(job), log
    assert 'GPU_RESET_MAX_DRAINED: %r is neither a number of nodes nor a percentage' % value in log, log
    assert calls == ['update nodename=node01 state=drain reason=gpu_reset: epilog hook could not check the GPUs '
                     '(job 4242, GPUs 0), see %s' % (tmp_path / 'hook.log')], calls


@pytest.mark.parametrize('value, said', [
    ('5', "GPU_RESET_MAX_DRAIN_RATE: '5' is not NODES/WINDOW, such as 5/10m (s, m or h)"),
    ('5/10d', "GPU_RESET_MAX_DRAIN_RATE: '5/10d' is not NODES/WINDOW, such as 5/10m (s, m or h)"),
    ('5;id/10m', "GPU_RESET_MAX_DRAIN_RATE: '5;id/10m' is not NODES/WINDOW, such as 5/10m (s, m or h)"),
    ('0/10m', "GPU_RESET_MAX_DRAIN_RATE: '0/10m' must be at least 1 node within 1 s to 7 days"),
])
def test_a_fleet_brake_rate_that_is_not_nodes_per_window_is_named(gpuhost_factory, tmp_path, value, said):
    host = gpuhost_factory(gpus=1)
    job = host.hold(gpus=[0], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='0', GPU_RESET_MAX_DRAIN_RATE=value)
    assert proc.returncode == 2 and alive(job), log
    assert said in log, log
    assert len(calls) == 1 and calls[0].startswith('update nodename=node01 state=drain'), calls


def test_a_mode_that_is_neither_enforce_nor_observe_changes_nothing(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    job = host.hold(gpus=[0], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='0', GPU_RESET_MODE='observ')
    assert proc.returncode == 0 and calls == [] and alive(job), log
    assert 'GPU_RESET_MODE is neither enforce nor observe' in log and 'observe mode: the node is left as it is' in log


def test_slurm_hook_names_a_python_that_cannot_run_it(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    proc, calls, log = run_hook(host, tmp_path, 'prolog', SLURM_JOB_GPUS='0', GPU_RESET_PYTHON='/opt/none/bin/python')
    assert proc.returncode == 2, log  # could not run its checks
    assert calls == ['update nodename=node01 state=drain reason=gpu_reset: prolog hook cannot run GPU_RESET_PYTHON '
                     '/opt/none/bin/python: no such executable; set GPU_RESET_PYTHON to the Python that has ansible-core '
                     '(job 4242, GPUs 0), see %s' % (tmp_path / 'hook.log')], calls


@pytest.mark.parametrize('printed, said', [
    ('echo \'  File "<stdin>", line 4\' >&2\necho "SyntaxError: invalid syntax" >&2\nexit 1\n',
     'SyntaxError: invalid syntax'),
    # pyenv's shim for a version it has but does not use: its help text is left out.
    ("echo 'pyenv: python2: command not found' >&2\necho >&2\n"
     "echo \"The \\`python2' command exists in these Python versions:\" >&2\necho '  2.7.18' >&2\n"
     "echo \"Note: See 'pyenv help global' for tips on allowing multiple\" >&2\nexit 127\n",
     'pyenv: python2: command not found'),
])
def test_host_whose_python_cannot_run_the_modules_is_told_how_to_pin_one(gpuhost_factory, tmp_path, printed, said):
    host = gpuhost_factory(gpus=1)
    python2 = tmp_path / 'python2'
    python2.write_text('#!/bin/sh\n' + printed)
    python2.chmod(0o755)
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', ansible_python_interpreter=str(python2))}}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2
    assert re.match(r'FAILED    node  after [0-9.]+ s: ', run.line('node')[0]), run.line('node')
    assert run.line('node')[0].split(' s: ', 1)[1] == (
        'Release the GPUs: %s could not run the module; set ansible_python_interpreter for this host to a Python 3 '
        'that can, for example /usr/bin/python3 (it printed: %s)' % (python2, said))
    assert 'deserialization' not in ' '.join(run.summary) and 'pyenv help' not in run.out


def test_example_configuration_keeps_one_line_per_reason_and_no_skipped_lines(gpuhost_factory, tmp_path):
    # A small fleet: 21 clean hosts, 2 with a job left, 1 with a lost GPU.
    hosts = dict(('gpu%02d' % n, gpuhost_factory('gpu%02d' % n, gpus=1)) for n in range(1, 25))
    hosts['gpu04'].fault('lost', gpu=0)
    for name in ('gpu10', 'gpu20'):
        hosts[name].hold(gpus=[0], mib=1024)
    inventory = tmp_path / 'inventory.yml'
    # 24 hosts share the machine's cores: a read may wait its turn for seconds.
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': dict(
        (name, host_vars(host, tmp_path, name, gpu_reset_timeout=30)) for name, host in hosts.items())}}))
    env = dict(ansible_env(), ANSIBLE_CONFIG=os.path.join(REPO, 'examples', 'ansible.cfg'))
    del env['ANSIBLE_STDOUT_CALLBACK']
    proc = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', str(inventory), PLAYBOOK],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout
    failed = [line for line in proc.stdout.splitlines() if 'FAILED    gpu04' in line]
    assert len(failed) == 1, proc.stdout
    # The whole reason on that one line, however long.
    assert re.search(r'after [0-9.]+ s: GPU 0 lost or unreadable \(.*\)"?,?$', failed[0]), failed[0]
    assert len(failed[0]) > 100
    summary = json.loads(re.search(r'TASK \[Summary\][^\n]*\n[^\n]*=> (\{.*?\n\})', proc.stdout, re.S).group(1))['msg']
    assert len(summary) == 5, summary
    assert summary[0] == '24 of 24 host(s): 21 clean, 2 released, 1 failed'
    assert [line.split()[:2] for line in summary[2:4]] == [['released', 'gpu10'], ['released', 'gpu20']]
    assert summary[4] == 'clean     21 host(s), nothing to do (21 GPU(s) free): gpu[01-03,05-09,11-19,21-24]'
    assert 'skipping:' not in proc.stdout


def test_slurm_hook_playbook_runner_names_a_python_that_cannot_run_the_modules(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    python2 = tmp_path / 'python2'
    python2.write_text('#!/bin/sh\necho "SyntaxError: invalid syntax" >&2\nexit 1\n')
    python2.chmod(0o755)
    variables = tmp_path / 'node.yml'
    variables.write_text(json.dumps(dict(
        ansible_python_interpreter=str(python2), gpu_reset_nvidia_smi_path=host.smi_path,
        gpu_reset_host_root=host.root, gpu_reset_lock_file=str(tmp_path / 'hook.lock'))))
    proc, calls, log = run_hook(host, tmp_path, 'prolog', SLURM_JOB_GPUS='0', GPU_RESET_RUNNER='playbook',
                                GPU_RESET_VARS_FILE=str(variables))
    assert proc.returncode == 1, log
    # Drained by the role all the same (its drain needs no Python), with the reason: its first 200
    # characters, the remedy among them.
    assert len(calls) == 1, log
    assert calls[0].startswith('update nodename=node01 state=drain reason=gpu_reset: Release the GPUs: %s could not '
                               'run the module; set ansible_python_interpreter for this host' % python2), calls
    assert 'deserialization failed' not in log.split('TASK [Summary]')[1]


@pytest.mark.parametrize('runner', ['module', 'playbook'])
def test_slurm_hook_drains_naming_why_when_the_jobs_gpus_cannot_be_told(gpuhost_factory, tmp_path, runner):
    """gres.conf leaves the GPUs to AutoDetect: neither runner releases anything (the playbook is
    not started), and the node is drained with why."""
    host = gpuhost_factory(gpus=2)
    holder = host.hold(gpus=[0], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', gres_conf='AutoDetect=nvml\nName=gpu Type=h200 Count=2\n',
                                SLURM_JOB_GPUS='0', GPU_RESET_RUNNER=runner)
    assert proc.returncode == 1, log
    # The whole reason, the remedy included, within the 200 characters sinfo -R keeps.
    assert calls == ['update nodename=node01 state=drain reason=gpu_reset: SLURM_JOB_GPUS=0: gres.conf line 1: '
                     'AutoDetect=nvml, so Slurm orders the GPUs itself and gres.conf cannot tell their device nodes; '
                     'list them with File= and AutoDetect=off'], calls
    assert alive(holder)
    assert 'PLAY' not in log and 'Traceback' not in log, log


def test_target_matching_nothing_fails(tmp_path):
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text('{"gpu_hosts": {"hosts": {"a": {"ansible_connection": "local"}, "b": {}}}}')
    run = playbook(inventory, tmp_path / 'reports', '-e', 'target=rack9')
    assert run.rc != 0
    assert "No host in the inventory matches 'rack9'" in run.out
    assert run.summary is None


def test_a_rolling_reset_runs_every_batch_and_names_each_host_that_failed(gpuhost_factory, tmp_path):
    """One host per batch: gpu02 fails and gpu04 cannot be reached, each in a batch of its own,
    after which Ansible would end the play; every later batch still runs, the summary names both
    hosts and why, each fails in one short line and the run exits non-zero. With
    gpu_reset_max_fail_percentage=0 the batches after a failed one are not run, and say so."""
    names = ('gpu01', 'gpu02', 'gpu03', 'gpu05')
    hosts = dict((name, gpuhost_factory(name, gpus=2)) for name in names)
    jobs = dict((name, hosts[name].hold(gpus=[0], mib=1024)['pid']) for name in ('gpu01', 'gpu03', 'gpu05'))
    hosts['gpu02'].fault('lost', gpu=1)
    inventory_hosts = dict((name, host_vars(hosts[name], tmp_path, name)) for name in names)
    # Nothing listens on port 9 of this machine: ssh is refused at once.
    inventory_hosts['gpu04'] = dict(ansible_connection='ssh', ansible_host='127.0.0.1', ansible_port=9,
                                    ansible_ssh_common_args='-o ConnectTimeout=5 -o BatchMode=yes')
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': dict(sorted(inventory_hosts.items()))}}))
    run = playbook(inventory, tmp_path / 'reports', '-e', 'gpu_reset_serial=1')
    assert run.rc == 2, run.out
    for name in ('gpu01', 'gpu03', 'gpu05'):
        assert run.reports[name]['outcome'] == 'released', run.out
        assert not alive(jobs[name])
    assert run.out.count('TASK [Summary]') == 1, run.out
    assert run.summary[0] == '4 of 5 host(s): 0 clean, 3 released, 1 failed', run.summary
    assert run.line('gpu02')[0].startswith('FAILED') and 'GPU 1 lost' in run.line('gpu02')[0], run.summary
    assert run.line('gpu04')[0].startswith('UNREACHED gpu04  ') and 'port 9' in run.line('gpu04')[0], run.summary
    assert run.failures == {'gpu02': [run.reports['gpu02']['reason']], 'gpu04': ['no report, see the summary above']}
    assert dict((name, run.recap[name]['failed']) for name in sorted(inventory_hosts)) == dict(
        gpu01='0', gpu02='1', gpu03='0', gpu04='1', gpu05='0')

    run = playbook(inventory, tmp_path / 'reports-stopped', '-e', 'gpu_reset_serial=1', '-e',
                   'gpu_reset_max_fail_percentage=0', '--limit', 'gpu01,gpu02,gpu03')
    assert run.rc == 2, run.out
    assert sorted(run.reports) == ['gpu01', 'gpu02'], run.out
    assert run.summary[0] == '2 of 3 host(s): 1 clean, 0 released, 1 failed', run.summary
    assert run.line('gpu03') == ['NOT RUN   gpu03  no result: the play ended before the role ran on it'], run.summary
    assert sorted(run.failures) == ['gpu02', 'gpu03'], run.out


def test_drain_command_words_reach_it_as_they_are(gpuhost_factory, tmp_path):
    # The drain runs through the host's shell (raw, no Python needed), every word quoted.
    host = gpuhost_factory(gpus=1)
    host.fault('lost', gpu=0)
    written = tmp_path / 'drained.txt'
    words = ["x'; touch %s; '" % (tmp_path / 'quote'), '$(touch %s)' % (tmp_path / 'subst'), '`id`', 'a  b', '*']
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', gpu_reset_on_failure='drain',
        gpu_reset_drain_command=['sh', '-c', 'printf "%s\\n" "$@" >> "$0"', str(written)] + words)}}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2 and run.reports['node']['drained'] is True, run.out
    assert written.read_text().splitlines() == words
    assert not (tmp_path / 'quote').exists() and not (tmp_path / 'subst').exists()


def test_bad_setting_fails_the_host_clearly(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', gpu_reset_on_failure='reboot', gpu_reset_timeout=0)}}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2
    [failure] = run.failures['node']
    assert failure.startswith('gpu_reset is misconfigured: ') and 'gpu_reset_on_failure' in failure, failure
    assert 'fail, drain' in failure, failure
    assert run.reports['node']['reason'] == failure


def test_wrong_value_on_the_command_line_is_named_in_one_short_line(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    job = host.hold(gpus=[0], mib=1024)['pid']
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(host, tmp_path, 'node')}}}))
    run = playbook(inventory, tmp_path / 'reports', '-e', 'gpu_reset_timeout=5s', '-e', 'gpu_reset_backend=nvml2')
    assert run.rc == 2
    said = ("gpu_reset is misconfigured: gpu_reset_backend is 'nvml2', expected one of auto, nvml, "
            "nvidia-smi; gpu_reset_timeout is '5s', expected a number")
    assert run.failures == {'node': [said]}, run.out
    # ansible-core's one error line for the failed task is that message.
    assert [line for line in run.out.splitlines() if line.startswith('[ERROR]')] == [
        '[ERROR]: Task failed: Action failed: ' + said], run.out
    # No dump of the argument spec, no Python class names, nothing signalled.
    for noise in ('argument_spec_data', 'Validating arguments', '_AnsibleTaggedStr', 'cannot be converted'):
        assert noise not in run.out, run.out
    # Short lines, but the failed task's result (the host's report) that Ansible prints.
    assert max(len(line) for line in run.out.splitlines() if not line.startswith('fatal: ')) < 300, run.out
    assert alive(job)


def test_a_list_given_as_text_on_the_command_line_is_told_to_be_json(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(host, tmp_path, 'node')}}}))
    run = playbook(inventory, tmp_path / 'reports', '-e', 'gpu_reset_signals=[TERM,KILL]')
    assert run.rc == 2
    assert run.failures == {'node': [
        "gpu_reset is misconfigured: gpu_reset_signals is '[TERM,KILL]', a text that looks like a list: on the "
        """command line a list is given as JSON, -e '{"gpu_reset_signals": ["TERM", "KILL"]}'"""]}, run.out
    run = playbook(inventory, tmp_path / 'reports', '-e', '{"gpu_reset_signals": ["TERM", "KILL"]}')
    assert run.rc == 0, run.out
    assert run.reports['node']['outcome'] == 'clean'


@pytest.mark.parametrize('timeout, problem', [
    (0, 'must be more than 0 seconds, got 0.0'),
    ('nan', 'must be a finite number of seconds, got nan'),
    ('inf', 'must be a finite number of seconds, got inf'),
    (3000000, 'must be at most 2147483 seconds, got 3000000.0'),
])
def test_misconfigured_host_fails_before_anything_is_signalled(gpuhost_factory, tmp_path, timeout, problem):
    host = gpuhost_factory(gpus=1)
    job = host.hold(gpus=[0], mib=1024)['pid']
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', gpu_reset_timeout=timeout, gpu_reset_on_failure='drain',
        gpu_reset_drain_command=['touch', str(tmp_path / 'drained')])}}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2
    # One failure, after the summary, naming the setting; no second, generic one.
    assert run.failures == {'node': ['gpu_reset is misconfigured: gpu_reset_timeout ' + problem]}, run.out
    assert run.recap['node']['failed'] == '1'
    assert run.out.count('[ERROR]') == 1 and 'see the summary above' not in run.out, run.out
    assert 'after 0.0 s' not in run.out and run.tasks['node'][-1] == 'Fail the hosts that are not clean', run.out
    assert alive(job) and not (tmp_path / 'drained').exists()
    # Its report is written all the same.
    assert run.reports['node']['signalled'] == [] and run.reports['node']['drained'] is False


def test_the_playbook_runs_without_a_warning(gpuhost_factory, tmp_path):
    """The collection's own playbook prints no warning and no deprecation, with a --limit too (its
    once-per-run play then says no "skipping: no hosts matched"); a removed filter is named as
    removed where it is used, saying what to use instead."""
    hosts = dict(hung=gpuhost_factory('hung', gpus=2), clean=gpuhost_factory('clean', gpus=1))
    hosts['hung'].hold(gpus=[0, 1], mib=1024)
    inventory = tmp_path / 'inventory.yml'
    # The release's time is not what is tested here: room for a busy machine (the file's 3 s left
    # the kernel log unread beside other tests, which the role rightly warns about).
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': dict(
        (name, host_vars(host, tmp_path, name, gpu_reset_timeout=30)) for name, host in hosts.items())}}))
    # Ansible's warnings as a new user gets them: none turned off.
    env = ansible_env()
    for name in ('ANSIBLE_LOCALHOST_WARNING', 'ANSIBLE_INVENTORY_UNPARSED_WARNING'):
        del env[name]
    env['ANSIBLE_DEPRECATION_WARNINGS'] = '1'
    for args, summary in (((), '2 of 2 host(s): 1 clean, 1 released, 0 failed'),
                          (('--limit', 'clean'), '1 of 1 host(s): 1 clean, 0 released, 0 failed')):
        run = playbook(inventory, tmp_path / 'reports', *args, env=env)
        assert run.rc == 0, run.out
        assert run.summary[0] == summary, run.out
        for noise in ('[WARNING]', '[DEPRECATION WARNING]', 'skipping: no hosts matched'):
            assert noise not in run.out, run.out
    used = tmp_path / 'removed.yml'
    used.write_text(json.dumps([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'ansible.builtin.debug': {'msg': "{{ {'timeout': 0} | gpuops.nvidia.gpu_reset_problems }}"}}]}]))
    proc = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', 'localhost,', str(used)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("'gpuops.nvidia.gpu_reset_problems' filter plugin has been removed. The action gpuops.nvidia.gpu_reset "
            "checks the role's settings itself") in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_bad_clean_query_fails_the_host_naming_the_setting(gpuhost_factory, tmp_path):
    hosts = dict(empty=gpuhost_factory('empty', gpus=1), number=gpuhost_factory('number', gpus=2))
    job = hosts['number'].hold(gpus=[0], mib=1024)['pid']
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {
        'empty': host_vars(hosts['empty'], tmp_path, 'empty', gpu_reset_clean_query='  '),
        'number': host_vars(hosts['number'], tmp_path, 'number', gpu_reset_clean_query='length(nvidia_gpus)'),
    }}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2
    assert 'gpu_reset_clean_query must be a JMESPath expression or null, it is empty' in run.line('empty')[0]
    assert 'gpu_reset_clean_query must give true or false, it gave 2' in run.line('number')[0]
    # Each host failed once, with its reason; how long the misconfigured one took says nothing.
    assert run.failures['empty'] == [run.reports['empty']['reason']] and ' after ' not in run.line('empty')[0]
    assert run.failures['number'] == [run.reports['number']['reason']]
    # judged before the release: nothing was signalled
    assert alive(job) and run.reports['number']['signalled'] == []


def test_expected_gpus_and_host_root_reach_the_modules(gpuhost_factory, tmp_path):
    short = gpuhost_factory('short', gpus=4, fallen=[2])
    job = short.hold(gpus=[0], mib=1024)['pid']
    renumbered = gpuhost_factory('renumbered', gpus=2, minors=[1, 0])
    mine = renumbered.hold(gpus=[0], mib=1000)['pid']
    other = renumbered.hold(gpus=[1], mib=2000)['pid']
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {
        'short': host_vars(short, tmp_path, 'short', gpu_reset_host_root=short.root, gpu_reset_expected_gpus=4,
                           gpu_reset_devices=['/dev/nvidia*']),
        'renumbered': host_vars(renumbered, tmp_path, 'renumbered', gpu_reset_host_root=renumbered.root,
                                gpu_reset_gpus=[0], gpu_reset_devices=['/dev/nvidia*']),
    }}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2, run.out
    line = run.line('short')[0]
    assert line.startswith('FAILED') and 'expected_gpus: 4 GPUs expected, 3 seen' in line, line
    assert '00000000:5D:00.0' in run.reports['short']['reason']
    assert alive(job) and run.reports['short']['signalled'] == []
    assert run.line('renumbered')[0].startswith('released'), run.summary
    assert not alive(mine) and alive(other)


def collection_with_appended_task(tmp_path, task):
    """A copy of the collection whose role has task added at the end of tasks/main.yml; returns
    its collections path."""
    root = tmp_path / 'collections' / 'ansible_collections' / 'gpuops' / 'nvidia'
    root.mkdir(parents=True)
    for name in os.listdir(REPO):
        if name not in ('roles', '.build', '.git'):
            os.symlink(os.path.join(REPO, name), str(root / name))
    role = root / 'roles' / 'gpu_reset'
    for directory in ('defaults', 'meta', 'tasks', 'templates', 'vars'):
        (role / directory).mkdir(parents=True)
        for name in os.listdir(os.path.join(REPO, 'roles', 'gpu_reset', directory)):
            os.symlink(os.path.join(REPO, 'roles', 'gpu_reset', directory, name), str(role / directory / name))
    with open(os.path.join(REPO, 'roles', 'gpu_reset', 'tasks', 'main.yml')) as f:
        tasks = yaml.safe_load(f)
    tasks.append(task)
    (role / 'tasks' / 'main.yml').unlink()
    (role / 'tasks' / 'main.yml').write_text(yaml.safe_dump(tasks, sort_keys=False))
    return str(tmp_path / 'collections')


def test_a_task_appended_to_the_role_runs_only_where_the_host_is_not_failed(gpuhost_factory, tmp_path):
    """The role's one task fails a host that is not clean (a breaking change for roles that
    appended tasks): an appended task runs on the clean and released hosts only; every host still
    has its report, written by that one task."""
    hosts = dict(clean=gpuhost_factory('clean', gpus=1), held=gpuhost_factory('held', gpus=2),
                 lost=gpuhost_factory('lost', gpus=2), bad=gpuhost_factory('bad', gpus=1))
    hosts['held'].hold(gpus=[1], mib=1024)
    hosts['lost'].fault('lost', gpu=1)
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': dict(
        (name, host_vars(host, tmp_path, name, **({'gpu_reset_signals': []} if name == 'bad' else {})))
        for name, host in hosts.items())}}))
    collections = collection_with_appended_task(tmp_path, {
        'name': 'Appended to the role',
        'ansible.builtin.debug': {'msg': 'finished {{ inventory_hostname }} {{ gpu_reset_result.outcome }}'}})
    env = ansible_env()
    env['ANSIBLE_COLLECTIONS_PATH'] = collections
    # The role in a play of its own (the playbook reset_gpus.yml fails the hosts after the role).
    play = tmp_path / 'play.yml'
    play.write_text(json.dumps([{'hosts': 'gpu_hosts', 'gather_facts': False, 'become': False,
                                 'roles': ['gpuops.nvidia.gpu_reset']}]))
    command = [os.path.join(BIN, 'ansible-playbook'), '-i', str(inventory), str(play),
               '-e', 'gpu_reset_report_dir=%s' % (tmp_path / 'reports')]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    run = Run(proc, str(tmp_path / 'reports'))
    assert run.rc == 2, run.out
    finished = sorted(re.findall(r'"msg": "finished (\S+ \S+)"', proc.stdout))
    assert finished == ['clean clean', 'held released'], run.out
    assert sorted(run.reports) == ['bad', 'clean', 'held', 'lost']
    assert run.reports['bad']['outcome'] == run.reports['lost']['outcome'] == 'failed'
    assert 'Appended to the role' not in run.tasks['bad'] + run.tasks['lost']


def test_unwritable_report_dir_fails_the_host(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    job = host.hold(gpus=[0], mib=1024)['pid']
    blocker = tmp_path / 'not-a-directory'
    blocker.write_text('')
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(host, tmp_path, 'node')}}}))
    run = playbook(inventory, blocker / 'reports')
    assert run.rc == 2, run.out
    assert not alive(job)
    line = run.line('node')[0]
    assert line.startswith('FAILED') and 'write the report on the controller: ' in line, line


def test_drain_command_is_bounded_by_the_drain_timeout(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=2)
    host.fault('lost', gpu=1)
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', gpu_reset_on_failure='drain', gpu_reset_drain_command=['sleep', '60'],
        gpu_reset_drain_timeout=2)}}}))
    started = time.monotonic()
    run = playbook(inventory, tmp_path / 'reports')
    assert time.monotonic() - started < 50
    assert run.rc == 2, run.out
    report = run.reports['node']
    assert report['outcome'] == 'failed' and report['drained'] is False
    assert report['reason'].startswith('GPU 1 lost or unreadable')
    assert 'the drain command failed' in report['reason'], report['reason']


def test_unwritable_textfile_dir_fails_the_host(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=1)
    blocker = tmp_path / 'not-a-directory'
    blocker.write_text('')
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', gpu_reset_textfile_dir=str(blocker / 'textfile'))}}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2, run.out
    report = run.reports['node']
    assert report['outcome'] == 'failed' and report['gpus_after'] == [{'index': 0, 'memory_used_mib': 1}]
    assert report['reason'].startswith('write node_exporter metrics: '), report['reason']
    assert run.line('node')[0].startswith('FAILED')


# -- release safety: a host name that is a path ----------------------------------------------

def test_a_host_named_with_dot_dot_writes_its_report_inside_the_report_dir(gpuhost_factory, tmp_path):
    """Inventory host ../victim: the report is %2E.%2Fvictim.json in the report directory, and
    nothing is written beside it."""
    host = gpuhost_factory(gpus=1)
    reports = tmp_path / 'reports'
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'../victim': host_vars(host, tmp_path, 'victim')}}}))
    run = playbook(inventory, reports)
    assert run.rc == 0, run.out
    assert os.listdir(str(reports)) == ['%2E.%2Fvictim.json'], run.out
    assert not (tmp_path / 'victim.json').exists()
    assert run.reports['%2E.%2Fvictim']['host'] == '../victim'


# -- release safety: the drain reason ---------------------------------------------------------

def test_the_default_drain_command_escapes_and_caps_the_reason(tmp_path):
    """The role's default gpu_reset_drain_command as Ansible renders it: the reason (text users
    chose) with its control characters escaped, cut at 200 characters, in one argument."""
    reason = 'GPU 1: held by pid 5 (x\n\x1b]0;owned\x07\x9b2J)' + 'y' * 400
    (tmp_path / 'result.json').write_text(json.dumps({'gpu_reset_result': {'reason': reason}}))
    (tmp_path / 'render.yml').write_text(yaml.safe_dump([{
        'name': 'Render the default drain command', 'hosts': 'localhost', 'gather_facts': False,
        'tasks': [{'name': 'Read the defaults', 'ansible.builtin.include_vars':
                   os.path.join(REPO, 'roles', 'gpu_reset', 'defaults', 'main.yml')},
                  {'name': 'Write the command', 'ansible.builtin.copy': {
                      'content': '{{ gpu_reset_drain_command | to_json }}', 'dest': str(tmp_path / 'argv.json'),
                      'mode': '0644'}}]}]))
    proc = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', 'localhost,', '-c', 'local',
                           '-e', '@%s' % (tmp_path / 'result.json'), str(tmp_path / 'render.yml')],
                          capture_output=True, text=True, env=ansible_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = json.loads((tmp_path / 'argv.json').read_text())
    assert argv[:4] == ['scontrol', 'update', 'nodename=localhost', 'state=drain'] and len(argv) == 5
    escaped = 'GPU 1: held by pid 5 (x\\x0a\\x1b]0;owned\\x07\\x9b2J)'
    kept = 200 - len(escaped)
    assert argv[4] == 'reason=gpu_reset: %s%s...(%d more characters)' % (escaped, 'y' * kept, 400 - kept), argv[4]


# -- release safety: the hook's exit statuses and its GPU list ---------------------------------

def test_a_hook_whose_collection_cannot_be_imported_drains_saying_so(gpuhost_factory, tmp_path):
    """Python starts but cannot import the collection and exits 1 itself: not "drained with the
    reason" (the hook's 1), but 2, and the node is drained saying the hook could not run."""
    host = gpuhost_factory(gpus=2)
    proc, calls, log = run_hook(host, tmp_path, 'prolog', SLURM_JOB_GPUS='0',
                                GPU_RESET_COLLECTIONS_PATH=str(tmp_path / 'no-collection'))
    assert proc.returncode == 2, log
    assert 'No module named' in log and log.rstrip().endswith('=== prolog job 4242: hook exit 2'), log
    assert calls == ['update nodename=node01 state=drain reason=gpu_reset: prolog hook GPU_RESET_PYTHON %s cannot '
                     'import gpuops.nvidia; install the collection for it or set GPU_RESET_COLLECTIONS_PATH '
                     '(job 4242, GPUs 0), see %s' % (sys.executable, tmp_path / 'hook.log')], calls


@pytest.mark.parametrize('text', ['GPU_RESET_BUDGET_S=30\nif then fi (\n', 'GPU_RESET_BUDGET_S=30s\n'])
def test_a_hook_settings_file_that_is_not_shell_drains_saying_so(gpuhost_factory, tmp_path, text):
    """Sourcing a file that does not parse, or arithmetic on a budget that is not a number, would
    end the hook where it stands, with no reason."""
    host = gpuhost_factory(gpus=2)
    conf = tmp_path / 'broken.conf'
    conf.write_text(text)
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='1', GPU_RESET_HOOK_CONF=str(conf))
    assert proc.returncode == 2, (proc.stderr, log)
    assert '%s is not valid shell' % conf in log, log
    assert len(calls) == 1 and 'reason=gpu_reset: epilog hook could not check the GPUs (job 4242, GPUs 1)' in calls[0]


def test_a_hook_whose_log_cannot_be_written_still_checks_the_gpus(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=2)
    job = host.hold(gpus=[1], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='1',
                                GPU_RESET_LOG=str(tmp_path / 'no-such-dir' / 'hook.log'))
    assert (proc.returncode, calls) == (0, []), proc.stderr
    assert not alive(job)


@pytest.mark.parametrize('runner', ['module', 'playbook'])
def test_slurm_job_gpus_with_a_huge_range_is_refused_at_once(gpuhost_factory, tmp_path, runner):
    host = gpuhost_factory(gpus=2)
    started = time.monotonic()
    proc, calls, log = run_hook(host, tmp_path, 'prolog', SLURM_JOB_GPUS='0-2000000', GPU_RESET_RUNNER=runner)
    assert time.monotonic() - started < 10
    assert proc.returncode == 2, log
    assert 'SLURM_JOB_GPUS: GPU 2000000 is past the 64 GPUs a node can have' in log and 'Traceback' not in log, log
    assert len(calls) == 1 and 'could not check the GPUs (job 4242, GPUs 0-2000000)' in calls[0], calls


def test_the_playbook_runner_takes_ranges_as_the_module_runner_does(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=3)
    job = host.hold(gpus=[1], mib=1000)['pid']
    neighbour = host.hold(gpus=[2], mib=1000)['pid']
    proc, calls, log = run_hook(host, tmp_path, 'epilog', SLURM_JOB_GPUS='0-1', GPU_RESET_RUNNER='playbook')
    assert (proc.returncode, calls) == (0, []), log
    assert not alive(job) and alive(neighbour)


def test_slurm_job_gpus_cannot_inject_a_drain_command_into_the_playbook(gpuhost_factory, tmp_path):
    """SLURM_JOB_GPUS spliced into -e JSON could close the list and add variables of its own."""
    host = gpuhost_factory(gpus=2)
    host.fault('lost', gpu=0)  # the job's GPU: the host fails, and its drain command runs
    pwned = tmp_path / 'pwned'
    gpus = '0], "gpu_reset_drain_command": ["touch", "%s"], "x": [0' % pwned
    proc, calls, log = run_hook(host, tmp_path, 'prolog', SLURM_JOB_GPUS=gpus, GPU_RESET_RUNNER='playbook')
    assert not pwned.exists(), log
    assert proc.returncode == 2, log
    assert "SLURM_JOB_GPUS: '0]' is not a GPU index" in log, log
    assert len(calls) == 1 and 'could not check the GPUs' in calls[0], calls
    # The reason shows the list's first 40 characters, each not of a GPU list as '?'.
    assert '(job 4242, GPUs 0?,??gpu?reset?drain?command?????touch?,)' in calls[0], calls


def test_a_mistyped_variable_is_named_in_a_warning(gpuhost_factory, tmp_path):
    """gpu_reset_timout: 600 is no setting: the run warns about it, naming it, and goes on with
    gpu_reset_timeout as it is."""
    host = gpuhost_factory(gpus=1)
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'node': host_vars(
        host, tmp_path, 'node', gpu_reset_timout=600)}}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 0 and run.reports['node']['outcome'] == 'clean', run.out
    assert ('node: gpu_reset_timout is no setting of gpu_reset (a typo of gpu_reset_timeout?); it is ignored'
            in ' '.join(run.out.split())), run.out


def test_the_probe_runs_in_the_release_and_a_failed_probe_fails_the_host(gpuhost_factory, tmp_path):
    """gpu_reset_probe: true (the default) proves the GPUs released by allocation (gpusim's
    libcuda.so.1) in the release's own module call; a GPU whose allocation fails makes the host
    failed, the CUDA error in the reason."""
    hosts = dict(good=gpuhost_factory('good', gpus=2), ecc=gpuhost_factory('ecc', gpus=2))
    cuda = dict((name, host.install_cuda()) for name, host in hosts.items())
    hosts['ecc'].fault('cuda', gpu=1, code='ECC_UNCORRECTABLE')
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': dict((name, host_vars(
        host, tmp_path, name, gpu_reset_probe=True, gpu_reset_probe_mib=64,
        gpu_reset_probe_cuda_library=cuda[name])) for name, host in hosts.items())}}))
    run = playbook(inventory, tmp_path / 'reports')
    assert run.rc == 2, run.out
    good, ecc = run.reports['good'], run.reports['ecc']
    assert good['outcome'] == 'clean' and good['probe']['probed'] is True, good
    assert good['steps'] == ecc['steps'] == ['Release the GPUs']
    assert ecc['outcome'] == 'failed' and 'CUDA_ERROR_ECC_UNCORRECTABLE' in ecc['reason'], ecc['reason']


# A fake Slurm on the hosts' PATH: scontrol update ... state=drain appends the node to a file,
# sinfo lists the cluster's ten nodes from it (the reason's time as SLURM_TIME_FORMAT=%s asks),
# taking a second, long enough for hosts that did not wait for each other to count alike.
FAKE_SCONTROL = '''#!/bin/sh
node= reason=
for word in "$@"; do
  case $word in nodename=*) node=${word#nodename=} ;; reason=*) reason=${word#reason=} ;; esac
done
printf '%%s|drain|%%s|%%s\\n' "$node" "$(date +%%s)" "$reason" >> %(state)s
'''
FAKE_SINFO = '''#!/bin/sh
[ "$SLURM_TIME_FORMAT" = %%s ] || exit 3
sleep 1
for node in n1 n2 n3 n4 spare1 spare2 spare3 spare4 spare5 spare6; do
  grep -m1 "^$node|" %(state)s 2>/dev/null || echo "$node|idle|Unknown|none"
done
'''


def fake_slurm(directory, state):
    directory.mkdir()
    for name, text in (('scontrol', FAKE_SCONTROL), ('sinfo', FAKE_SINFO)):
        (directory / name).write_text(text % {'state': state})
        (directory / name).chmod(0o755)
    return str(directory)


def test_the_fleet_brake_drains_no_more_hosts_than_the_cap_however_many_fail_at_once(gpuhost_factory, tmp_path):
    """Four hosts fail the probe alike (a fault they share), in parallel: with a cap of 2 of 10
    nodes, two are drained and two held by the brake, whichever finish first."""
    state = tmp_path / 'slurm-state'
    env = ansible_env()
    env['PATH'] = fake_slurm(tmp_path / 'slurm', state) + os.pathsep + env['PATH']
    hosts = {}
    for name in ('n1', 'n2', 'n3', 'n4'):
        host = gpuhost_factory(name, gpus=2)
        host.fault('cuda', gpu=1, code='ECC_UNCORRECTABLE')
        hosts[name] = host_vars(host, tmp_path, name, gpu_reset_on_failure='drain', gpu_reset_max_drained='2')
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': hosts}}))
    run = playbook(inventory, tmp_path / 'reports', env=env)
    assert run.rc == 2 and sorted(run.reports) == ['n1', 'n2', 'n3', 'n4'], run.out
    drained = sorted(name for name, report in run.reports.items() if report['drained'])
    in_order = [line.split('|')[0] for line in state.read_text().splitlines()]
    assert sorted(in_order) == drained and len(drained) == 2, in_order
    for name, report in run.reports.items():
        assert report['outcome'] == 'failed', report['reason']
        brake = report['brake']
        if name in drained:
            assert brake['held'] is False and brake['drained_nodes'] == in_order.index(name), brake
        else:
            assert brake == {'held': True, 'rule': 'count', 'drained_nodes': 2, 'nodes': 10, 'cap': 2}, brake
            assert report['reason'].endswith('; not drained: the brake holds (count: 2 of 10 nodes drained by '
                                             'gpu_reset already, at most 2)'), report['reason']


def test_a_fleet_brake_that_cannot_count_is_said_and_the_host_drained(gpuhost_factory, tmp_path):
    state = tmp_path / 'slurm-state'
    env = ansible_env()
    env['PATH'] = fake_slurm(tmp_path / 'slurm', state) + os.pathsep + env['PATH']
    (tmp_path / 'slurm' / 'sinfo').write_text('#!/bin/sh\necho "sinfo: error: slurm_load_partitions: Unable to contact" >&2\nexit 1\n')
    host = gpuhost_factory('n1', gpus=2)
    host.fault('cuda', gpu=1, code='ECC_UNCORRECTABLE')
    inventory = tmp_path / 'inventory.yml'
    inventory.write_text(json.dumps({'gpu_hosts': {'hosts': {'n1': host_vars(host, tmp_path, 'n1', gpu_reset_on_failure='drain')}}}))
    run = playbook(inventory, tmp_path / 'reports', env=env)
    report = run.reports['n1']
    assert report['drained'] is True and state.read_text().startswith('n1|drain|'), run.out
    assert report['brake'] == {'held': False, 'why': 'the drained nodes could not be counted: sinfo on the host failed '
                                                     '(rc 1): sinfo: error: slurm_load_partitions: Unable to contact'}
