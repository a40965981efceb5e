# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Time the operators' one-liner against nvidia_device_release on a simulated hung job.

For each repetition, a fresh simulated 8-GPU host runs the hung-job scenario (8 ranks at
76113 MiB that die on SIGTERM, nvidia-persistenced holding every node, a driver release
delay) and each approach frees it in turn:

  one-liner  sleep 5; fuser -k DEV/nvidia* 2>/dev/null; sleep 3; nvidia-smi --query-gpu=...
  module     ansible localhost -c local -m gpuops.nvidia.nvidia_device_release

Reports the median wall time of each, their ratio, whether the protected daemon survived,
and whether every GPU ended idle (at most the default threshold). With --compare-with DIR, the module of another checkout
(an earlier version) runs too, and the time this version adds inside the task (elapsed_s:
the settle window and the safety checks) is printed.

The module runs with its defaults unless --grace-period or --backend is given (the seed's own
scenario: --grace-period 1 --backend nvidia-smi).

Usage: python3 benchmarks/release_vs_oneliner.py [--reps 3] [--release-delay 1.0] [--compare-with DIR]
                                                 [--grace-period S] [--backend auto|nvml|nvidia-smi]
Needs psmisc (fuser) and ansible-core (the repository's .venv is used when present).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))

from gpusim.api import Host  # noqa: E402
from gpusim.state import is_alive as alive  # noqa: E402

# The modules' default memory_threshold_mib (plugins/module_utils/_common.py): an idle GPU reads at most this.
IDLE_MAX_MIB = 32


def find_ansible():
    local = os.path.join(os.path.dirname(sys.executable), 'ansible')
    return local if os.path.exists(local) else shutil.which('ansible')


def collection_env(workdir, repo=REPO, name='collections'):
    """Environment in which ansible imports the checkout repo as gpuops.nvidia."""
    tree = os.path.join(workdir, name, 'ansible_collections', 'gpuops')
    os.makedirs(tree)
    os.symlink(repo, os.path.join(tree, 'nvidia'))
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(workdir, name),
                ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0')


def run_oneliner(host):
    devices = os.path.join(host.root, 'dev', 'nvidia*')
    command = ('sleep 5; fuser -k %s 2>/dev/null; sleep 3; '
               '%s --query-gpu=index,memory.used --format=csv,noheader' % (devices, host.smi_path))
    started = time.monotonic()
    proc = subprocess.run(['bash', '-c', command], capture_output=True, text=True, check=False)
    return time.monotonic() - started, proc.stdout


def run_module(host, ansible, env, workdir, extra):
    # The threshold is given, not left to the default, so that an earlier version (whose default
    # was 0 MiB) judges the idle reading as this one does.
    # The host's root, so that the release keeps its state (kernel-log cursors, cures) there, not in
    # the machine's own /run/gpuops.
    args = dict(nvidia_smi_path=host.smi_path, devices=['/dev/nvidia*'], host_root=host.root,
                lock_file=os.path.join(workdir, 'release.lock'), memory_threshold_mib=IDLE_MAX_MIB, **extra)
    started = time.monotonic()
    proc = subprocess.run([ansible, 'localhost', '-c', 'local', '-i', 'localhost,',
                           '-m', 'gpuops.nvidia.nvidia_device_release', '-a', json.dumps(args)],
                          capture_output=True, text=True, env=env, check=False)
    took = time.monotonic() - started
    payload = proc.stdout.partition(' => ')[2]
    try:
        result = json.JSONDecoder().raw_decode(payload)[0]
    except ValueError:
        raise SystemExit('the module run printed no result:\n%s\n%s' % (proc.stdout, proc.stderr))
    return took, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--reps', type=int, default=3, help='repetitions of each approach (default 3)')
    parser.add_argument('--release-delay', type=float, default=1.0,
                        help="the simulated driver's release delay in seconds (default 1.0)")
    parser.add_argument('--compare-with', metavar='DIR',
                        help='a checkout of another version of the collection, whose module runs too')
    parser.add_argument('--grace-period', type=float, help="the module's grace_period (default: its own)")
    parser.add_argument('--backend', choices=['auto', 'nvml', 'nvidia-smi'], help="the module's backend (default: its own)")
    opts = parser.parse_args()
    extra = dict((name, value) for name, value in (('grace_period', opts.grace_period), ('backend', opts.backend))
                 if value is not None)
    if not shutil.which('fuser'):
        raise SystemExit('fuser (psmisc) is needed for the one-liner')
    ansible = find_ansible()
    if not ansible:
        raise SystemExit('ansible (ansible-core) is needed for the module')

    workdir = tempfile.mkdtemp(prefix='gpuops-bench-')
    envs = {'module': collection_env(workdir)}
    names = ['one-liner', 'module']
    if opts.compare_with:
        envs['other'] = collection_env(workdir, os.path.abspath(opts.compare_with), 'other')
        names.append('other')
    host = Host(os.path.join(workdir, 'host'))
    rows = dict((name, []) for name in names)
    inside = dict((name, []) for name in names)
    try:
        for rep in range(opts.reps):
            for name in names:
                scenario = host.scenario('hung-job', release_delay=opts.release_delay)
                daemon = scenario['persistenced']['pid']
                if name == 'one-liner':
                    took, dummy = run_oneliner(host)
                else:
                    took, result = run_module(host, ansible, envs[name], workdir, extra)
                    inside[name].append(result.get('elapsed_s', float('nan')))
                used = host.memory_used()
                # Idle GPUs read 1 MiB (as real H200s): at or below the default threshold is idle.
                rows[name].append((took, alive(daemon), all(mib <= IDLE_MAX_MIB for mib in used.values())))
                print('rep %d %-9s %6.2f s  daemon alive: %-3s  all GPUs idle: %s'
                      % (rep + 1, name, took, 'yes' if alive(daemon) else 'no',
                         'yes' if rows[name][-1][2] else 'no (%s)' % used), flush=True)
                host.stop()
    finally:
        host.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    settings = ''.join(', %s %s' % item for item in sorted(extra.items()))
    print('hung-job on a simulated 8-GPU host (8 x 76113 MiB, die on SIGTERM, driver release '
          'delay %.1f s), %d repetitions%s' % (opts.release_delay, opts.reps, settings))
    print('%-34s %9s  %-22s %-15s %s' % ('approach', 'median s', 'runs (s)', 'daemon alive', 'all GPUs idle'))
    labels = {'one-liner': 'one-liner (sleep; fuser -k; sleep)',
              'module': 'nvidia_device_release (ansible)',
              'other': 'the same, from --compare-with'}
    medians = {}
    for name in names:
        times = [row[0] for row in rows[name]]
        medians[name] = statistics.median(times)
        print('%-34s %9.2f  %-22s %-15s %s' % (
            labels[name], medians[name], ' '.join('%.2f' % value for value in times),
            '%d/%d runs' % (sum(row[1] for row in rows[name]), len(times)),
            '%d/%d runs' % (sum(row[2] for row in rows[name]), len(times))))
    print('module time inside the task (elapsed_s), median: %.2f s' % statistics.median(inside['module']))
    print('ratio one-liner / module: %.1fx' % (medians['one-liner'] / medians['module']))
    if opts.compare_with:
        other = statistics.median(inside['other'])
        print('--compare-with time inside the task (elapsed_s), median: %.2f s' % other)
        print('this version adds inside the task: %+.2f s' % (statistics.median(inside['module']) - other))


if __name__ == '__main__':
    main()
