# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How many hosts one controller handles: gpuops.nvidia.reset_gpus on N simulated hosts.

Every host is a simulated 8-GPU host (gpusim) reached with the local connection, with the
settings of examples/ansible.cfg (pipelining, no facts injected as variables). Two paths:

  clean    no process holds a GPU (the release reads, signals nothing)
  release  one job process holds all 8 GPUs (4096 MiB each) and dies on SIGTERM

Each module runs through a small bash interpreter wrapper that logs its CPU seconds (the
module and everything it starts, e.g. nvidia-smi), so that the controller's share is the CPU
of the whole ansible-playbook process tree (getrusage(RUSAGE_CHILDREN)) less the modules':
on a real fleet the modules run on the hosts. SSH is not measured (the local connection has
no ssh client processes); over SSH the controller also pays for them.

Prints, per run: wall-clock seconds, controller CPU seconds (total and per host), the CPU
seconds of the main ansible-playbook process alone (it runs the strategy and cannot use more
than one core), host-side CPU seconds, and the controller's peak memory (proportional set size
of the ansible-playbook processes). The last two controller figures are sampled every 0.2 s.
Then:

  capacity  controller CPU per extra host (the slope between the smallest and largest N) and
            hosts per controller core per minute (60 s / that), for each path; the same for the
            main process alone: what one ansible-playbook handles per minute on any number of cores
  slices    from those, how many slices a fleet needs to finish within a given time
  forks     the release path at the largest N with forks 5, 20 and N
  serial    the release path at the largest N in batches (serial) of a quarter of N
  set_stats the release path at the largest N without publishing the reports (set_stats)
  slicing   through ansible-runner (as AWX runs it): one job of the largest N hosts against
            the same hosts in 4 slices (every 4th host, as AWX slices) run concurrently

Usage: python3 benchmarks/capacity.py [--sizes 1,8,32] [--reps 1] [--skip-runner]
Needs ansible-core (and ansible-runner for the slicing part); run it in the test venv.
"""

import argparse
import glob
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))

from gpusim.api import Host  # noqa: E402

BIN = os.path.dirname(sys.executable)
WRAPPER = '''#!/bin/bash
# The module's interpreter: logs the CPU seconds (user system) of the module and its children.
exec 4>&2
TIMEFORMAT='%%3U %%3S'
{ time %s "$@" 2>&4 ; } 2>>%s
'''
SLICES = 4


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree(root):
    """Pids of root and its descendants."""
    parents = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/stat' % name) as handle:
                    fields = handle.read().rsplit(')', 1)[1].split()
                parents.setdefault(int(fields[1]), []).append(int(name))
            except (OSError, IndexError):
                pass
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def controller(root):
    """(KiB of proportional set size of the Ansible processes under root, not the modules;
    CPU seconds so far of the first ansible-playbook process, the one that runs the strategy)."""
    total, main = 0, None
    for pid in tree(root):
        try:
            with open('/proc/%d/cmdline' % pid, 'rb') as handle:
                command = handle.read()
            if b'ansible-playbook' not in command and b'ansible-runner' not in command:
                continue
            if b'ansible-playbook' in command and (main is None or pid < main):
                main = pid
            with open('/proc/%d/smaps_rollup' % pid) as handle:
                for line in handle:
                    if line.startswith('Pss:'):
                        total += int(line.split()[1])
        except OSError:
            pass
    cpu = 0.0
    if main is not None:
        try:
            with open('/proc/%d/stat' % main) as handle:
                fields = handle.read().rsplit(')', 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / float(os.sysconf('SC_CLK_TCK'))
        except (OSError, IndexError):
            pass
    return total, cpu


class Fleet:
    """N simulated hosts, an inventory of them, and the wrapper that logs module CPU."""

    def __init__(self, workdir, count):
        self.workdir = workdir
        self.log = os.path.join(workdir, 'module-cpu.log')
        self.interpreter = os.path.join(workdir, 'python')
        with open(self.interpreter, 'w') as handle:
            handle.write(WRAPPER % (sys.executable, self.log))
        os.chmod(self.interpreter, 0o755)
        self.hosts = {}
        for index in range(1, count + 1):
            name = 'gpu%03d' % index
            self.hosts[name] = Host(os.path.join(workdir, name)).init()
        self.inventory = os.path.join(workdir, 'inventory.yml')
        self.write_inventory(self.inventory, sorted(self.hosts))

    def host_vars(self, name):
        host = self.hosts[name]
        return dict(ansible_connection='local', ansible_python_interpreter=self.interpreter,
                    gpu_reset_host_root=host.root, gpu_reset_nvidia_smi_path=host.smi_path,
                    gpu_reset_lock_file=os.path.join(self.workdir, name + '.lock'))

    def write_inventory(self, path, names):
        with open(path, 'w') as handle:
            yaml.safe_dump({'gpu_hosts': {'hosts': dict((name, self.host_vars(name)) for name in names)}}, handle)

    def hold(self):
        """Put every host on the release path: one job process holding all its GPUs."""
        for host in self.hosts.values():
            host.hold(gpus='all', mib=4096)

    def module_cpu(self):
        """CPU seconds logged by the wrapper since the last call."""
        total = 0.0
        if os.path.exists(self.log):
            with open(self.log) as handle:
                for line in handle:
                    total += sum(float(value) for value in line.split())
            os.unlink(self.log)
        return total

    def stop(self):
        for host in self.hosts.values():
            host.stop()


def measure(commands, fleet, env):
    """Run commands concurrently; (wall s, controller CPU s, module CPU s, peak controller PSS
    MiB, CPU s of the main ansible-playbook processes, sampled: up to 0.2 s short)."""
    fleet.module_cpu()
    cpu, started = children_cpu(), time.monotonic()
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) for command in commands]
    peak, main, done = [0], [0.0] * len(procs), threading.Event()

    def sample():
        while not done.wait(0.2):
            seen = [controller(proc.pid) for proc in procs]
            peak[0] = max(peak[0], sum(pss for pss, dummy in seen))
            for index, (dummy, seconds) in enumerate(seen):
                main[index] = max(main[index], seconds)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        outputs = [proc.communicate()[0] for proc in procs]
    finally:
        done.set()
    sampler.join()
    wall, cpu = time.monotonic() - started, children_cpu() - cpu
    for proc, output in zip(procs, outputs):
        if proc.returncode != 0:
            raise SystemExit('%s failed (rc %d):\n%s' % (' '.join(commands[0][:4]), proc.returncode,
                                                         output.decode(errors='replace')[-4000:]))
    modules = fleet.module_cpu()
    return wall, cpu - modules, modules, peak[0] / 1024.0, sum(main)


def playbook_command(inventory, forks, *extra):
    return [os.path.join(BIN, 'ansible-playbook'), '-i', inventory, 'gpuops.nvidia.reset_gpus', '-f', str(forks),
            '-e', 'gpu_reset_become=false'] + list(extra)


def runner_dir(fleet, root, names, extravars):
    os.makedirs(os.path.join(root, 'env'))
    os.makedirs(os.path.join(root, 'inventory'))
    shutil.copytree(os.path.join(REPO, 'playbooks'), os.path.join(root, 'project'))
    fleet.write_inventory(os.path.join(root, 'inventory', 'hosts.yml'), names)
    with open(os.path.join(root, 'env', 'extravars'), 'w') as handle:
        yaml.safe_dump(dict(extravars, gpu_reset_become=False), handle)
    return root


def artifact_bytes(root):
    """Size of the artifacts (set_stats) of the one ansible-runner job under root, as JSON."""
    for path in glob.glob(os.path.join(root, 'artifacts', '*', 'job_events', '*.json')):
        with open(path) as handle:
            event = json.load(handle)
        if event['event'] == 'playbook_on_stats':
            return len(json.dumps(event['event_data'].get('artifact_data') or {}))
    raise SystemExit('no playbook_on_stats event under %s' % root)


def row(label, count, result):
    wall, cpu, modules, pss, main = result
    print('%-40s %4d %7.1f %8.2f %8.3f %8.2f %8.2f %8.0f' % (label, count, wall, cpu, cpu / count, main, modules, pss),
          flush=True)


def header(title):
    print()
    print(title)
    print('%-40s %4s %7s %8s %8s %8s %8s %8s' % ('run', 'N', 'wall s', 'ctl CPU', 'per host', 'main', 'host CPU', 'PSS MiB'))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--sizes', default='1,8,32', help='fleet sizes (default 1,8,32)')
    parser.add_argument('--reps', type=int, default=1, help='repetitions of each run; medians are printed (default 1)')
    parser.add_argument('--skip-runner', action='store_true', help='leave out the ansible-runner slicing comparison')
    opts = parser.parse_args()
    sizes = sorted(int(size) for size in opts.sizes.split(','))
    largest = sizes[-1]
    runner = os.path.join(BIN, 'ansible-runner')
    if not opts.skip_runner and not os.path.exists(runner):
        raise SystemExit('ansible-runner is needed for the slicing comparison (or give --skip-runner)')

    # Stopped (SIGTERM), the simulated hosts are stopped too.
    signal.signal(signal.SIGTERM, lambda *dummy: sys.exit(143))
    workdir = tempfile.mkdtemp(prefix='gpuops-capacity-')
    collections = os.path.join(workdir, 'collections', 'ansible_collections', 'gpuops')
    os.makedirs(collections)
    os.symlink(REPO, os.path.join(collections, 'nvidia'))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(workdir, 'collections'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_CONFIG=os.path.join(REPO, 'examples', 'ansible.cfg'), ANSIBLE_LOCALHOST_WARNING='0',
               ANSIBLE_INVENTORY_UNPARSED_WARNING='0')
    env['PATH'] = BIN + os.pathsep + env.get('PATH', '')
    fleet = Fleet(workdir, largest)
    started = time.monotonic()

    def repeat(commands, path):
        results = []
        for dummy in range(opts.reps):
            if path == 'release':
                fleet.hold()
            results.append(measure(commands, fleet, env))
        return tuple(statistics.median(result[i] for result in results) for i in range(5))

    try:
        print('gpuops.nvidia.reset_gpus, simulated 8-GPU hosts, local connection, examples/ansible.cfg; '
              '%s (%d CPUs), median of %d' % (platform.platform(terse=True), os.cpu_count(), opts.reps))
        header('paths (forks = N)')
        measured = {}
        for path in ('clean', 'release'):
            for count in sizes:
                inventory = os.path.join(workdir, 'inventory-%d.yml' % count)
                fleet.write_inventory(inventory, sorted(fleet.hosts)[:count])
                measured[path, count] = repeat([playbook_command(inventory, max(count, 5))], path)
                row('%s path' % path, count, measured[path, count])

        header('forks and serial (release path)')
        for forks in (5, 20):
            row('forks %d' % forks, largest, repeat([playbook_command(fleet.inventory, forks)], 'release'))
        row('forks %d (every host at once)' % max(largest, 5), largest, measured['release', largest])
        batch = max(largest // 4, 1)
        row('forks 50, serial %d' % batch, largest,
            repeat([playbook_command(fleet.inventory, 50, '-e', 'gpu_reset_serial=%d' % batch)], 'release'))

        if not opts.skip_runner:
            header('ansible-runner, release path, forks 50')
            one = runner_dir(fleet, os.path.join(workdir, 'runner-one'), sorted(fleet.hosts), {})
            names = sorted(fleet.hosts)
            slices = [runner_dir(fleet, os.path.join(workdir, 'runner-slice%d' % number), names[number - 1::SLICES],
                                 {'gpu_reset_sliced': True}) for number in range(1, SLICES + 1)]
            runner_env = dict(env)

            def runner_command(root):
                return [runner, 'run', root, '-p', 'reset_gpus.yml', '--forks', '50']
            results = []
            for rep in range(opts.reps):
                fleet.hold()
                if rep:
                    shutil.rmtree(os.path.join(one, 'artifacts'))
                results.append(measure([runner_command(one)], fleet, runner_env))
            row('one job', largest, tuple(statistics.median(r[i] for r in results) for i in range(5)))
            artifacts = artifact_bytes(one)
            results = []
            for dummy in range(opts.reps):
                fleet.hold()
                results.append(measure([runner_command(root) for root in slices], fleet, runner_env))
                for root in slices:
                    shutil.rmtree(os.path.join(root, 'artifacts'))
            row('%d slices, concurrently' % SLICES, largest, tuple(statistics.median(r[i] for r in results) for i in range(5)))
            print('job artifacts (set_stats gpu_reset_reports, release path): %d bytes of JSON, %d per host'
                  % (artifacts, artifacts / largest))

        print()
        if largest == sizes[0]:
            print('capacity: needs two sizes (--sizes 1,32) to tell the cost of one more host')
            return
        print('capacity (controller CPU per extra host, between N=%d and N=%d)' % (sizes[0], largest))
        slopes = {}
        for path in ('clean', 'release'):
            low, high = measured[path, sizes[0]], measured[path, largest]
            slope, main = [(high[i] - low[i]) / (largest - sizes[0]) for i in (1, 4)]
            slopes[path] = slope, main
            print('  %-8s %.3f s per host (%.3f s in the main process), fixed %.2f s per run: %.0f hosts per controller '
                  'core per minute; one ansible-playbook at most %.0f per minute'
                  % (path, slope, main, low[1] - slope * sizes[0], 60 / slope, 60 / main))
        if sizes[0] == 1:
            print('pre-job hook (each node runs the playbook on itself): %.1f s wall, %.2f s CPU (clean); '
                  '%.1f s wall, %.2f s CPU (release), on any fleet size'
                  % (measured['clean', 1][0], measured['clean', 1][1] + measured['clean', 1][2],
                     measured['release', 1][0], measured['release', 1][1] + measured['release', 1][2]))
        print()
        print('slices for the release path: controller time of a job of N hosts on C cores =')
        print('  N x max(main process s per host, controller s per host / C); slices = that / the time allowed, rounded up')
        slope, main = slopes['release']
        print('  %8s %6s %10s %12s %7s' % ('hosts', 'cores', 'allowed s', 'one job s', 'slices'))
        for count in (1000, 10000):
            for cores in (4, 16):
                for allowed in (60, 300):
                    seconds = count * max(main, slope / cores)
                    print('  %8d %6d %10d %12.0f %7d' % (count, cores, allowed, seconds, -(-seconds // allowed)))
        print('took %.0f s' % (time.monotonic() - started))
    finally:
        fleet.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
    main()
