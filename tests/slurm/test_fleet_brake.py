# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet brake on a real Slurm cluster of four nodes: one slurmd per node on this machine
(NodeName=... NodeHostname=... Port=..., started with slurmd -N), each node's hook pointed at a
simulated host of its own (its hook settings chosen by SLURMD_NODENAME), and the same fault on
every node."""

import os
import shutil
import tempfile

import pytest
import yaml

from bench import SlurmBench, deploy_hooks, free_port, skip_reason, which
from conftest import BUDGET_S, PROLOG_EPILOG_TIMEOUT, Cluster, slurm_commands
from gpusim.api import Host
from gpusim.state import is_alive as alive

# One Slurm cluster at a time on this machine (slurmd's cgroups, the node named after the host): every
# test of tests/slurm runs on one pytest-xdist worker (scripts/test.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group('slurm')

EXTRA_NODES = ('gpb1', 'gpb2', 'gpb3')
GPUS = 2
# Chooses the node's settings; slurmd gives a Prolog and an Epilog SLURMD_NODENAME.
DISPATCH = '#!/bin/sh\nGPU_RESET_HOOK_CONF=%s/node-$SLURMD_NODENAME.conf\nexport GPU_RESET_HOOK_CONF\nexec %s/%s.sh "$@"\n'


class FleetBench(SlurmBench):
    """The bench with more nodes, each a slurmd of its own on this machine."""

    def __init__(self, directory, extra_nodes, **options):
        super(FleetBench, self).__init__(directory, **options)
        self.extra_nodes = tuple(extra_nodes)

    @property
    def nodes(self):
        return (self.node,) + self.extra_nodes

    def _write_conf(self):
        super(FleetBench, self)._write_conf()
        with open(self.conf) as handle:
            text = handle.read()
        for name in ('SlurmdSpoolDir=%s/spool', 'SlurmdPidFile=%s/slurmd', 'SlurmdLogFile=%s/slurmd'):
            text = text.replace(name % self.dir, name % self.dir + '-%n')
        lines = ['NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d %s Gres=gpu:%d State=UNKNOWN' % (
            name, name, free_port(), self.topology, self.gpus) for name in self.extra_nodes]
        text = text.replace('PartitionName=gpu Nodes=%s ' % self.node, '\n'.join(lines) + '\nPartitionName=gpu Nodes=%s ' % (
            ','.join(self.nodes)))
        with open(self.conf, 'w') as handle:
            handle.write(text)

    def _prepare(self):
        super(FleetBench, self)._prepare()
        for name in self.nodes:
            os.makedirs(os.path.join(self.dir, 'spool-%s' % name), mode=0o700, exist_ok=True)

    def start(self):
        try:
            super(FleetBench, self).start()
            for name in self.extra_nodes:
                self._spawn('slurmd-' + name, [which('slurmd'), '-D', '-N', name, '-f', self.conf])
            self._until(lambda: self.states() == dict((name, 'idle') for name in self.nodes), 30, 'every node to be idle')
        except BaseException:
            self.stop()
            raise
        return self

    def _stop_daemons(self):
        for name in self.extra_nodes:
            self._stop('slurmd-' + name)
        super(FleetBench, self)._stop_daemons()

    def _stop(self, name):
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)

    def node_state(self):
        return self.command('sinfo', '-h', '-n', self.node, '-o', '%T', check=False).stdout.strip()

    def states(self):
        """{node: its state as sinfo prints it (%T)}."""
        out = self.command('sinfo', '-h', '-N', '-o', '%N %T', check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def listing(self):
        """Every node's state and reason, as an operator reads them."""
        return self.command('sinfo', '-h', '-N', '-o', '%N|%T|%E').stdout

    def resume_all(self):
        for name, state in self.states().items():
            if state != 'idle':
                self.command('scontrol', 'update', 'nodename=%s' % name, 'state=resume', check=False)
        self._until(lambda: set(self.states().values()) == {'idle'}, 30, 'every node to be idle again')


class NodeHooks(Cluster):
    """One node's simulated host, hook settings and log, as conftest's Cluster for one node."""

    def __init__(self, directory, hooks, name, bench):
        super(NodeHooks, self).__init__(directory)
        self.name, self.bench, self.hooks = name, bench, hooks
        self.host = Host(os.path.join(directory, 'host-%s' % name))
        self.log = os.path.join(hooks, 'hook-%s.log' % name)
        self.conf = os.path.join(hooks, 'node-%s.conf' % name)

    def write_settings(self, base_conf):
        """This node's gpu_reset.yml and gpu-reset-hook.conf: the installed ones, pointed at its host."""
        self.host.init(gpus=GPUS, idle_used_mib=0)
        variables = os.path.join(self.hooks, 'gpu_reset-%s.yml' % self.name)
        with open(variables, 'w') as handle:
            yaml.safe_dump({'gpu_reset_nvidia_smi_path': self.host.smi_path, 'gpu_reset_host_root': self.host.root,
                            'gpu_reset_probe_cuda_library': self.host.install_cuda(),
                            'gpu_reset_lock_file': os.path.join(self.dir, 'release-%s.lock' % self.name),
                            'gpu_reset_grace_period': 0.5}, handle)
        with open(self.conf, 'w') as handle:
            handle.write(base_conf)
        self.set_conf(vars_file=variables, log=self.log)
        self.conf_text = open(self.conf).read()


@pytest.fixture(scope='module')
def fleet():
    """Four Slurm nodes whose Prolog and Epilog are the collection's hooks, installed by its role,
    each pointed at a simulated host of two GPUs. Stopped at the end, pass or fail."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tempfile.mkdtemp(prefix='gpuops-slurm-')
    os.chmod(directory, 0o711)
    hooks = os.path.join(directory, 'hooks')
    bench = FleetBench(os.path.join(directory, 'slurm'), EXTRA_NODES, gpus=GPUS, prolog=os.path.join(hooks, 'dispatch-prolog.sh'),
                       epilog=os.path.join(hooks, 'dispatch-epilog.sh'), prolog_epilog_timeout=PROLOG_EPILOG_TIMEOUT)
    nodes = dict((name, NodeHooks(directory, hooks, name, bench)) for name in bench.nodes)
    try:
        scontrol = slurm_commands(os.path.join(directory, 'bin'), bench.conf)
        deploy_hooks(hooks, {}, slurm_hooks_budget_s=BUDGET_S, slurm_hooks_scontrol=scontrol, slurm_hooks_health_check=False,
                     slurm_hooks_check_running_clocks=False)  # no slurmctld answers yet
        with open(os.path.join(hooks, 'gpu-reset-hook.conf')) as handle:
            base_conf = handle.read()
        for node in nodes.values():
            node.write_settings(base_conf)
        for mode in ('prolog', 'epilog'):
            path = os.path.join(hooks, 'dispatch-%s.sh' % mode)
            with open(path, 'w') as handle:
                handle.write(DISPATCH % (hooks, hooks, mode))
            os.chmod(path, 0o755)
        bench.start()
        yield nodes
    finally:
        try:
            bench.stop()
        finally:
            for node in nodes.values():
                node.host.stop()
                node.kill_nvidia_smi()
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def nodes(fleet):
    """The fleet with no job, every node idle, fresh hosts, the installed settings, empty logs."""
    bench = list(fleet.values())[0].bench
    bench.command('scancel', '--full', '--quiet', '-u', 'root', check=False)
    bench.resume_all()
    for node in fleet.values():
        node.host.stop()
        node.host.init(gpus=GPUS, idle_used_mib=0)
        with open(node.conf, 'w') as handle:
            handle.write(node.conf_text)
        open(node.log, 'w').close()
    try:
        yield fleet
    finally:
        bench.command('scancel', '--full', '--quiet', '-u', 'root', check=False)
        for node in fleet.values():
            node.host.fault('clear')
            node.host.stop()
            node.kill_nvidia_smi()


def faulty_job(node):
    """A probe that fails on the node's GPU 0 (a fault every node shares, such as a driver update),
    and a job there: (the job, its Prolog's run)."""
    node.host.fault('cuda', gpu=0, code='ECC_UNCORRECTABLE')
    job = node.bench.sbatch('-w', node.name, '--gres=gpu:1', '--wrap', 'true')
    return job, node.wait_run('prolog', job)


def settled(bench, drained):
    """Wait until the drained nodes are drained and the others idle (their jobs and Epilogs done)."""
    def done():
        states = bench.states()
        return all(state.startswith('drain') == (name in drained) and (name in drained or state == 'idle')
                   for name, state in states.items())
    bench._until(done, PROLOG_EPILOG_TIMEOUT, 'nodes %s drained, the others idle' % ', '.join(drained))


def test_a_fault_on_every_node_drains_only_up_to_the_cap(nodes):
    names = sorted(nodes)
    for node in nodes.values():
        node.set_conf(max_drained='25%')
    runs = [faulty_job(nodes[name])[1] for name in names]
    first, rest = runs[0], runs[1:]
    assert first.exit == 10 and first.report['drained'] is True, first
    assert first.report['brake'] == {'held': False, 'drained_nodes': 0, 'nodes': 4, 'cap': 1, 'rate': '5/10m',
                                     'recent_drains': 0}, first
    for run in rest:
        assert run.exit == 12 and run.hook_exit == 0 and run.report['drained'] is False, run
        assert run.report['brake'] == {'held': True, 'rule': 'count', 'drained_nodes': 1, 'nodes': 4, 'cap': 1,
                                       'rate': '5/10m'}, run
        assert run.report['reason'].endswith('; not drained: the brake holds (count: 1 of 4 nodes drained by gpu_reset '
                                             'already, at most 1)'), run
        assert any('the fleet brake holds' in line for line in run.lines), run
    bench = nodes[names[0]].bench
    settled(bench, [names[0]])
    reasons = dict(line.split('|', 2)[0::2] for line in bench.listing().splitlines())
    assert reasons[names[0]].startswith('gpu_reset: Prove the GPUs by allocation: ') and 'GPU 0' in reasons[names[0]], reasons
    assert [reasons[name] for name in names[1:]] == ['none'] * 3, reasons


def test_the_rate_holds_what_the_count_would_let_through(nodes):
    """One node drained by gpu_reset within the hour, at most 1 an hour: the next is held by the
    rate, its reason saying so, though the cap (every node) is far."""
    names = sorted(nodes)
    for node in nodes.values():
        node.set_conf(max_drained='100%', max_drain_rate='1/1h')
    first, second = faulty_job(nodes[names[0]])[1], faulty_job(nodes[names[1]])[1]
    assert first.exit == 10 and first.report['brake']['held'] is False, first
    assert second.exit == 12 and second.report['brake'] == {
        'held': True, 'rule': 'rate', 'drained_nodes': 1, 'nodes': 4, 'cap': 4, 'rate': '1/1h', 'recent_drains': 1}, second
    assert second.report['reason'].endswith('; not drained: the brake holds (rate: 1 nodes drained by gpu_reset within '
                                            '3600 s, at most 1/1h)'), second
    settled(nodes[names[0]].bench, [names[0]])


def test_observe_mode_changes_nothing_on_any_node(nodes):
    """Memory held with no process on every node, and a leftover holder on one: each hook says
    what it found, and no node is drained, no process signalled."""
    names = sorted(nodes)
    bench = nodes[names[0]].bench
    for node in nodes.values():
        node.set_conf(mode='observe', max_drained='1')
        node.host.fault('stuck', gpu=0, mib=4096)
    leftover = nodes[names[1]].host.hold(gpus=[0], mib=1024)['pid']
    before = bench.listing()
    for name in names:
        job = bench.sbatch('-w', name, '--gres=gpu:1', '--wrap', 'true')
        prolog = nodes[name].wait_run('prolog', job)
        assert prolog.hook_exit == 0 and prolog.report['check_mode'] is True, prolog
        found = 'would signal 1 process(es): pid %d' % leftover if name == names[1] else 'GPU 0: 4096 MiB held with no process left'
        assert found in prolog.report['reason'], prolog
        assert nodes[name].wait_run('epilog', job).hook_exit == 0
    settled(bench, [])
    assert bench.listing() == before
    assert alive(leftover)
