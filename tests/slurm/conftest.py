# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Slurm bench for the hook tests: one cluster per test file, the hooks installed by the role
gpuops.nvidia.slurm_hooks, and a simulated host reset before every test."""

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import SlurmBench, deploy_hooks, skip_reason  # noqa: E402
from gpusim.api import Host  # noqa: E402

# The hook's budget (small, so that the failing cases end quickly; more for the playbook, whose
# start-up alone takes seconds on a loaded machine) and Slurm's limit for it.
BUDGET_S = 15
PLAYBOOK_BUDGET_S = 45
PROLOG_EPILOG_TIMEOUT = 60


# How the hook's log names a run: "prolog job 42", "health check" or "cure".
RUN_NAME = r'(?:(?P<mode>prolog|epilog) job (?P<job>\S+)|(?P<health>health) check|(?P<cure>cure))'


def _run_named(runs, match):
    """The latest of runs that the end line match names (RUN_NAME's groups), else the last."""
    mode, job = match.group('mode') or match.group('health') or match.group('cure'), match.group('job')
    for run in reversed(runs):
        if run.mode == mode and run.job == job:
            return run
    return runs[-1]


class HookRun:
    """One run of the hook as its log tells it: mode, job, report (the module runner's), exit."""

    def __init__(self, mode, job, gpus, runner):
        self.mode, self.job, self.gpus, self.runner = mode, job, gpus, runner
        self.report = None
        self.exit = None  # the runner's status
        self.hook_exit = None  # the hook's own, what slurmd gets
        self.seconds = None
        self.lines = []

    def __repr__(self):
        return 'HookRun(%s job %s, exit %s, hook exit %s: %s)' % (
            self.mode, self.job, self.exit, self.hook_exit, '\n'.join(self.lines)[-1500:])


class Cluster:
    """The bench, its simulated host and the installed hooks."""

    def __init__(self, directory, minors=None):
        self.dir = directory
        self.minors = minors
        self.host = Host(os.path.join(directory, 'gpuhost'))
        self.hooks = os.path.join(directory, 'hooks')
        self.log = os.path.join(self.hooks, 'hook.log')
        self.conf = os.path.join(self.hooks, 'gpu-reset-hook.conf')
        self.bench = None
        self.conf_text = None

    def runs(self):
        """Every run of the hook logged so far."""
        runs = []
        if not os.path.exists(self.log):
            return runs
        with open(self.log, errors='replace') as handle:
            for line in handle:
                line = line.rstrip('\n')
                head = re.match(r'=== \S+ %s on \S+, GPUs (?P<gpus>\S+), (?P<runner>\w+)$' % RUN_NAME, line)
                if head:
                    runs.append(HookRun(head.group('mode') or head.group('health') or head.group('cure'), head.group('job'),
                                        head.group('gpus'), head.group('runner')))
                    continue
                if not runs:
                    continue
                # A health check runs beside a Prolog or an Epilog and logs to the same file: an
                # end line names its run, and goes to that run, not to the one logged last.
                hook_end = re.match(r'=== %s: hook exit (?P<status>\d+)$' % RUN_NAME, line)
                if hook_end:
                    _run_named(runs, hook_end).hook_exit = int(hook_end.group('status'))
                end = re.match(r'=== %s: exit (?P<status>\d+) after (?P<seconds>\d+) s$' % RUN_NAME, line)
                if end:
                    named = _run_named(runs, end)
                    named.exit = int(end.group('status'))
                    named.seconds = int(end.group('seconds'))
                elif line.startswith('{"host"'):
                    runs[-1].report = json.loads(line)
                runs[-1].lines.append(line)
        return runs

    def wait_run(self, mode, job, seconds=60):
        """The hook's run for job (a Prolog or an Epilog), once it has ended."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for run in self.runs():
                if run.mode == mode and run.job == str(job) and run.hook_exit is not None:
                    return run
            time.sleep(0.1)
        raise AssertionError('no %s run for job %s ended within %s s; log:\n%s\n%s' % (
            mode, job, seconds, open(self.log).read()[-3000:] if os.path.exists(self.log) else '(none)',
            self.bench.logs()))

    def health_runs(self):
        """The health checks logged so far, ended or not."""
        return [run for run in self.runs() if run.mode == 'health']

    def health_mark(self):
        """How many health checks have ended so far (one runs at a time): wait_health(mark)
        waits for one that ends after this call."""
        return len([run for run in self.health_runs() if run.hook_exit is not None])

    def wait_health(self, after, seconds, said=''):
        """The first health check past the first `after` ones that has ended, and whose log says
        `said`."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for run in self.health_runs()[after:]:
                if run.hook_exit is not None and said in '\n'.join(run.lines):
                    return run
            time.sleep(0.2)
        raise AssertionError('no health check saying %r within %s s; log:\n%s\n%s' % (
            said, seconds, open(self.log).read()[-3000:] if os.path.exists(self.log) else '(none)', self.bench.logs()))

    def set_conf(self, **settings):
        """Change settings of the installed hook (GPU_RESET_<NAME>=value in gpu-reset-hook.conf)."""
        with open(self.conf) as handle:
            lines = handle.read().splitlines()
        for name, value in settings.items():
            key = 'GPU_RESET_%s=' % name.upper()
            lines = [line for line in lines if not line.startswith(key)] + [key + str(value)]
        with open(self.conf, 'w') as handle:
            handle.write('\n'.join(lines) + '\n')

    def set_runner(self, runner):
        """Switch the installed hook to the module or the playbook runner, with its budget."""
        self.set_conf(runner=runner, budget_s=BUDGET_S if runner == 'module' else PLAYBOOK_BUDGET_S)

    def path(self, name):
        return os.path.join(self.dir, name)

    def kill_cures(self):
        """SIGKILL the cures the hooks started (gpu-reset-hook.sh cure, in sessions of their own)
        that still run, and what they run."""
        script = os.path.join(self.hooks, 'gpu-reset-hook.sh').encode()
        cures = set()
        for pid in os.listdir('/proc'):
            try:
                with open('/proc/%s/cmdline' % pid, 'rb') as handle:
                    argv = handle.read().split(b'\0')
            except OSError:
                continue
            if script in argv and b'cure' in argv:
                cures.add(int(pid))
        for pid in cures:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass
        return sorted(cures)

    def kill_nvidia_smi(self):
        """SIGKILL the simulated nvidia-smi processes still running (a hung one the hook left)."""
        left = []
        for pid in os.listdir('/proc'):
            if not pid.isdigit():
                continue
            try:
                with open('/proc/%s/cmdline' % pid, 'rb') as handle:
                    argv = handle.read().split(b'\0')
            except OSError:
                continue
            if self.host.smi_path.encode() in argv:
                left.append(int(pid))
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        return left


def slurm_commands(directory, conf):
    """scontrol, squeue and sinfo in directory that read conf: slurmd gives a HealthCheckProgram no
    SLURM_CONF, and this cluster's slurm.conf is not Slurm's default one."""
    os.makedirs(directory, exist_ok=True)
    for name in ('scontrol', 'squeue', 'sinfo'):
        path = os.path.join(directory, name)
        with open(path, 'w') as handle:
            handle.write('#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' % (conf, shutil.which(name, path='/usr/bin:/bin')))
        os.chmod(path, 0o755)
    return os.path.join(directory, 'scontrol')


# slurmd's RebootProgram: writes down that it was called, never reboots.
REBOOT_PROGRAM = '#!/bin/sh\necho "reboot asked at $(date +%%s)" >> %s\n'


def reboot_program(directory):
    """A RebootProgram in directory that appends a line to directory/reboots; its path."""
    path = os.path.join(directory, 'reboot-program')
    with open(path, 'w') as handle:
        handle.write(REBOOT_PROGRAM % os.path.join(directory, 'reboots'))
    os.chmod(path, 0o755)
    return path


@pytest.fixture(scope='module')
def hook_role_vars():
    """Variables of the role slurm_hooks for this file's cluster (a test file overrides this): no
    health check, so that none runs between a Prolog's drain and what a test reads."""
    return {'slurm_hooks_health_check': False}


@pytest.fixture(scope='module')
def gres_order():
    """The order in which gres.conf lists the device nodes nvidiaN (a test file overrides this);
    None: nvidia0 to nvidia7."""
    return None


@pytest.fixture(scope='module')
def host_minors():
    """The simulated GPUs' minor numbers, in index order (a test file overrides this); None: the
    index."""
    return None


@pytest.fixture(scope='module')
def bench_options():
    """More options of the SlurmBench (a test file overrides this): shards, proctrack, gpus, gres_conf."""
    return {}


@pytest.fixture(scope='module')
def cluster(hook_role_vars, gres_order, host_minors, bench_options):
    """A Slurm node whose Prolog and Epilog are the collection's hooks, installed by its role,
    pointed at a simulated host of 8 GPUs (gres.conf's device nodes in gres_order, the GPUs'
    minor numbers host_minors). Stopped at the end, pass or fail."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    # munged runs as the munge user and must reach its socket: not under pytest's private tmp.
    directory = tempfile.mkdtemp(prefix='gpuops-slurm-')
    os.chmod(directory, 0o711)
    found = Cluster(directory, host_minors)
    try:
        found.host.init(gpus=8, idle_used_mib=0, minors=host_minors)
        bench_dir = os.path.join(directory, 'slurm')
        scontrol = slurm_commands(os.path.join(directory, 'bin'), os.path.join(bench_dir, 'slurm.conf'))
        deploy_hooks(found.hooks, {
            'gpu_reset_nvidia_smi_path': found.host.smi_path,
            'gpu_reset_host_root': found.host.root,
            'gpu_reset_lock_file': os.path.join(directory, 'release.lock'),
            'gpu_reset_grace_period': 0.5,
        }, slurm_hooks_budget_s=BUDGET_S, slurm_hooks_prolog_epilog_timeout=PROLOG_EPILOG_TIMEOUT,
            slurm_hooks_scontrol=scontrol, slurm_hooks_check_running_clocks=False,  # no slurmctld answers yet
            # No cure at once unless a test file asks for one: it would resume a node that a test reads drained.
            **dict({'slurm_hooks_cure': False}, **hook_role_vars))
        found.bench = SlurmBench(bench_dir, include=os.path.join(found.hooks, 'slurm-hooks.conf'),
                                 extra=['RebootProgram=%s' % reboot_program(directory)], gres_order=gres_order,
                                 **bench_options)
        found.bench.start()
        with open(found.conf) as handle:
            found.conf_text = handle.read()
        yield found
    finally:
        try:
            found.kill_cures()
            if found.bench is not None:
                found.bench.stop()
        finally:
            found.host.stop()
            found.kill_nvidia_smi()
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node(cluster):
    """The cluster with no job, the node idle, a fresh host (no holder, no fault) and an empty
    hook log; what a test leaves running is stopped afterwards."""
    cluster.bench.reset()
    cluster.host.stop()
    shutil.rmtree(cluster.host.paths.procs, ignore_errors=True)
    cluster.host.init(gpus=8, idle_used_mib=0, minors=cluster.minors)
    with open(cluster.conf, 'w') as handle:
        handle.write(cluster.conf_text)
    open(cluster.log, 'w').close()
    try:
        yield cluster
    finally:
        cluster.bench.command('scancel', '--full', '--quiet', '-u', 'root', check=False)
        cluster.kill_cures()
        cluster.host.fault('clear')
        cluster.host.stop()
        cluster.kill_nvidia_smi()


@pytest.fixture
def resets_allowed(node):
    """The hook may reset a GPU (gpu_reset_allow_gpu_reset in its variables), with a history of its
    own: the path of that history; the variables as they were, and no history, afterwards."""
    path = os.path.join(node.hooks, 'gpu_reset.yml')
    history = os.path.join(node.host.root, 'var', 'lib', 'gpuops', 'history.json')
    with open(path) as handle:
        original = handle.read()
    with open(path, 'w') as handle:
        handle.write(yaml.safe_dump(dict(yaml.safe_load(original), gpu_reset_allow_gpu_reset=True)))
    if os.path.exists(history):
        os.remove(history)
    try:
        yield history
    finally:
        with open(path, 'w') as handle:
            handle.write(original)
        if os.path.exists(history):
            os.remove(history)
