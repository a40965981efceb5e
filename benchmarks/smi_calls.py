# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Count the nvidia-smi calls of one nvidia_device_release on a simulated host.

A simulated 8-GPU host (gpusim, its default 550 driver) is put into each scenario, and the
module runs once per repetition as a program (python -m ...nvidia_device_release args.json, as
the Slurm hook runs it), with nvidia_smi_path pointing at a wrapper that logs every call:

  hung-job   8 ranks at 76113 MiB that die on SIGTERM, nvidia-persistenced holding every node,
             1 s driver release delay
  clean      no process holds a GPU
  orphaned   GPU 3 holds 8192 MiB that no process holds (only a reset frees it); timeout 60

Prints, per scenario, the calls of the median run: in all and by kind (--query-gpu,
--query-remapped-rows, --query-compute-apps, other), and the seconds the module took (for
orphaned: until it reported the memory orphaned). With --compare-with DIR, the module of another
checkout (an earlier version) runs on the same scenarios.

Usage: python3 benchmarks/smi_calls.py [--reps 3] [--compare-with DIR] [--scenario NAME]...
Needs ansible-core importable by this Python (the repository's .venv).
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

MODULE = 'ansible_collections.gpuops.nvidia.plugins.modules.nvidia_device_release'
KINDS = ('--query-gpu', '--query-remapped-rows', '--query-compute-apps')
SCENARIOS = ('hung-job', 'clean', 'orphaned')
# The modules' default memory_threshold_mib; given, so that every version judges alike.
IDLE_MAX_MIB = 32


def collections_root(workdir, repo, name):
    """A directory from which Python imports the checkout repo as ansible_collections.gpuops.nvidia."""
    tree = os.path.join(workdir, name, 'ansible_collections', 'gpuops')
    os.makedirs(tree)
    os.symlink(os.path.abspath(repo), os.path.join(tree, 'nvidia'))
    return os.path.join(workdir, name)


def kind_of(argv):
    return next((kind for kind in KINDS if any(arg.startswith(kind) for arg in argv)), 'other')


def set_up(host, scenario):
    if scenario == 'hung-job':
        host.scenario('hung-job', release_delay=1.0)
        return {}
    host.stop()
    host.init(gpus=8)
    if scenario == 'orphaned':
        host.fault('stuck', gpu=3, mib=8192)
        return {'timeout': 60}
    return {}


def run_release(host, root, workdir, options):
    log = os.path.join(workdir, 'calls.log')
    if os.path.exists(log):
        os.unlink(log)
    args = dict(nvidia_smi_path=host.counting_smi(log), devices=['/dev/nvidia*'], host_root=host.root,
                backend='nvidia-smi', lock_file=os.path.join(workdir, 'release.lock'),
                memory_threshold_mib=IDLE_MAX_MIB, **options)
    args_file = os.path.join(workdir, 'args.json')
    with open(args_file, 'w') as handle:
        json.dump({'ANSIBLE_MODULE_ARGS': args}, handle)
    env = dict(os.environ, PYTHONPATH=root)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, '-m', MODULE, args_file], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    took = time.monotonic() - started
    out = proc.stdout.strip()
    try:
        result = json.loads(out[out.index('{'):])
    except ValueError:
        raise SystemExit('the module printed no result (rc %d):\n%s\n%s' % (proc.returncode, proc.stdout, proc.stderr))
    calls = host.smi_calls(log)
    counts = dict((kind, 0) for kind in KINDS + ('other',))
    for argv in calls:
        counts[kind_of(argv)] += 1
    return {'total': len(calls), 'kinds': counts, 'seconds': took, 'released': result.get('released'),
            'orphaned_gpus': result.get('orphaned_gpus'), 'msg': result.get('msg')}


def median_run(runs):
    totals = sorted(run['total'] for run in runs)
    middle = totals[(len(totals) - 1) // 2]
    return next(run for run in runs if run['total'] == middle)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--reps', type=int, default=3, help='repetitions of each scenario (default 3)')
    parser.add_argument('--compare-with', metavar='DIR',
                        help='a checkout of another version of the collection, whose module runs too')
    parser.add_argument('--scenario', action='append', choices=SCENARIOS,
                        help='run only this scenario (may be repeated)')
    opts = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix='gpuops-smi-calls-')
    versions = [('this checkout', collections_root(workdir, REPO, 'this'))]
    if opts.compare_with:
        versions.insert(0, ('--compare-with', collections_root(workdir, opts.compare_with, 'other')))
    host = Host(os.path.join(workdir, 'host'))
    rows = []
    try:
        for scenario in opts.scenario or SCENARIOS:
            for label, root in versions:
                runs = []
                for dummy in range(opts.reps):
                    options = set_up(host, scenario)
                    runs.append(run_release(host, root, workdir, options))
                    host.stop()
                rows.append((scenario, label, runs))
                run = median_run(runs)
                print('%-9s %-15s calls %s  %.1f s  released %s  orphaned %s' % (
                    scenario, label, ' '.join(str(r['total']) for r in runs), run['seconds'], run['released'],
                    run['orphaned_gpus']), flush=True)
    finally:
        host.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print('nvidia-smi calls per nvidia_device_release on a simulated 8-GPU host (driver 550.127.05), '
          'median of %d runs' % opts.reps)
    header = ('scenario', 'version', 'total', '--query-gpu', '--query-remapped-rows', '--query-compute-apps', 'other',
              'seconds')
    print('%-9s %-15s %5s %11s %22s %21s %5s %9s' % header)
    for scenario, label, runs in rows:
        run = median_run(runs)
        print('%-9s %-15s %5d %11d %22d %21d %5d %9.1f' % (
            scenario, label, run['total'], run['kinds']['--query-gpu'], run['kinds']['--query-remapped-rows'],
            run['kinds']['--query-compute-apps'], run['kinds']['other'], statistics.median(r['seconds'] for r in runs)))


if __name__ == '__main__':
    main()
