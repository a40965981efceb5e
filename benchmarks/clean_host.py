# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Time gpuops.nvidia.reset_gpus on a host that is already clean, against a one-task playbook.

A simulated 8-GPU host (gpusim init: no process holds a GPU) is reached with the local
connection; each repetition runs, in turn, with the same inventory, host and connection:

  baseline    ansible-playbook of one task, ansible.builtin.command: true
  module      ansible-playbook of one task, gpuops.nvidia.nvidia_device_release: the floor of
              any playbook that releases the GPUs (the module's start-up and its reads)
  collection  ansible-playbook gpuops.nvidia.reset_gpus -e gpu_reset_become=false
  DIR         the same playbook from each checkout given with --compare-with (earlier versions)
  variant     the same playbook with the extra variables given with --variant (JSON), e.g.
              '{"gpu_reset_textfile_dir": "/tmp/textfile"}' for the cost of one setting

Prints, for each, the median wall-clock seconds and controller CPU seconds (user + system of
the whole ansible-playbook process tree, from getrusage(RUSAGE_CHILDREN)) and their ratio to
the baseline (target for the wall clock: at most 1.3x), and where the time above the target goes
(the release module task over the one task, the playbook over the module task).

Usage: python3 benchmarks/clean_host.py [--reps 5] [--compare-with DIR]... [--variant JSON]
Needs ansible-core (the repository's .venv is used when present).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))

from gpusim.api import Host  # noqa: E402
from release_vs_oneliner import collection_env  # noqa: E402

BASELINE = [{'name': 'One task', 'hosts': 'all', 'gather_facts': False,
             'tasks': [{'name': 'Run true', 'ansible.builtin.command': 'true', 'changed_when': False}]}]
MODULE = [{'name': 'One module call', 'hosts': 'all', 'gather_facts': False,
           'tasks': [{'name': 'Release the GPUs', 'gpuops.nvidia.nvidia_device_release': {
               'host_root': '{{ gpu_reset_host_root }}', 'nvidia_smi_path': '{{ gpu_reset_nvidia_smi_path }}',
               'lock_file': '{{ gpu_reset_lock_file }}'}}]}]


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command, env):
    """Wall-clock and CPU seconds of one ansible-playbook run (its whole reaped process tree)."""
    cpu, started = children_cpu(), time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    took, cpu = time.monotonic() - started, children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit('%s failed (rc %d):\n%s\n%s' % (' '.join(command), proc.returncode, proc.stdout, proc.stderr))
    return took, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--reps', type=int, default=5, help='repetitions of each side (default 5)')
    parser.add_argument('--compare-with', metavar='DIR', action='append', default=[],
                        help='a checkout of an earlier version, whose playbook runs too (may be repeated)')
    parser.add_argument('--variant', metavar='JSON', help='extra variables for one more run of this version\'s playbook')
    opts = parser.parse_args()
    local = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    playbook = local if os.path.exists(local) else shutil.which('ansible-playbook')
    if not playbook:
        raise SystemExit('ansible-playbook (ansible-core) is needed')

    workdir = tempfile.mkdtemp(prefix='gpuops-clean-')
    host = Host(os.path.join(workdir, 'host')).init()
    inventory = os.path.join(workdir, 'inventory.yml')
    # The host's simulated libcuda.so.1, for the probe (on by default since the probe moved into
    # the release's own module call).
    host_vars = dict(ansible_connection='local', ansible_python_interpreter=sys.executable,
                     gpu_reset_host_root=host.root, gpu_reset_probe_cuda_library=host.install_cuda(),
                     gpu_reset_nvidia_smi_path=host.smi_path, gpu_reset_lock_file=os.path.join(workdir, 'reset.lock'))
    with open(inventory, 'w') as handle:
        yaml.safe_dump({'gpu_hosts': {'hosts': {'simulated': host_vars}}}, handle)
    for name, plays in (('one-task.yml', BASELINE), ('one-module.yml', MODULE)):
        with open(os.path.join(workdir, name), 'w') as handle:
            yaml.safe_dump(plays, handle, sort_keys=False)
    env = collection_env(workdir)
    sides = [('baseline', [os.path.join(workdir, 'one-task.yml')], env),
             ('module', [os.path.join(workdir, 'one-module.yml')], env),
             ('collection', ['gpuops.nvidia.reset_gpus', '-e', 'gpu_reset_become=false'], env)]
    for number, directory in enumerate(opts.compare_with):
        # A version without gpu_reset_host_root is given a device glob that names the host's nodes,
        # and the threshold (its default was 0 MiB; idle simulated GPUs read 1 MiB, as real H200s).
        other = {'gpu_reset_become': False, 'gpu_reset_memory_threshold_mib': 32}
        with open(os.path.join(directory, 'roles', 'gpu_reset', 'defaults', 'main.yml')) as handle:
            if 'gpu_reset_host_root' not in yaml.safe_load(handle):
                other['gpu_reset_devices'] = [host.dev_glob]
        sides.append((directory, ['gpuops.nvidia.reset_gpus', '-e', json.dumps(other)],
                      collection_env(workdir, os.path.abspath(directory), 'other%d' % number)))
    if opts.variant:
        variant = dict(json.loads(opts.variant), gpu_reset_become=False)
        sides.append(('variant', ['gpuops.nvidia.reset_gpus', '-e', json.dumps(variant)], env))
    rows = dict((name, []) for name, dummy, dummy in sides)
    try:
        for rep in range(opts.reps):
            for name, args, side_env in sides:
                rows[name].append(timed([playbook, '-i', inventory] + args, side_env))
                print('rep %d %-10s %5.2f s wall  %5.2f s CPU' % ((rep + 1, os.path.basename(name)) + rows[name][-1]), flush=True)
    finally:
        host.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print('clean simulated 8-GPU host, local connection, %d repetitions (medians)' % opts.reps)
    print('%-42s %8s %6s %8s %6s' % ('side', 'wall s', 'ratio', 'CPU s', 'ratio'))
    labels = {'baseline': 'one task (ansible.builtin.command: true)', 'module': 'one task (nvidia_device_release)',
              'collection': 'gpuops.nvidia.reset_gpus',
              'variant': 'the same, with --variant'}
    base = [statistics.median(row[i] for row in rows['baseline']) for i in (0, 1)]
    for name, dummy, dummy in sides:
        wall, cpu = [statistics.median(row[i] for row in rows[name]) for i in (0, 1)]
        label = labels.get(name, 'the same, from ' + os.path.basename(os.path.normpath(name)))
        print('%-42s %8.2f %5.2fx %8.2f %5.2fx' % (label, wall, wall / base[0], cpu, cpu / base[1]))
    module, collection = [statistics.median(row[0] for row in rows[name]) for name in ('module', 'collection')]
    print('the target (1.3x) is %.2f s wall; of what is above it, the release module task adds %.2f s to the one task '
          '(its payload built on the controller, its start-up on the host, its reads and the probe), the playbook '
          '%.2f s to the module task (the target check, the summary and the artifacts, once per run)'
          % (1.3 * base[0], module - base[0], collection - module))


if __name__ == '__main__':
    main()
