# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The scan of /proc for holders (scan_holders) on a crowded host: 10,000 processes, and 50
processes with 20,000 descriptors each (1,000,000 descriptors).

A simulated host with one job holding GPU 0; then each crowd in turn (sleep processes; processes
holding dup'ed /dev/null descriptors), run as user nobody when root. Prints, per crowd, the median
and every one of --runs scans, the holders found, and the processes read only in part. As root it
runs in a private PID namespace (unshare -pf --mount-proc), so that /proc holds only the crowd.
With --compare-with DIR, the scan of another checkout of the collection runs on the same crowds.

    . scripts/lib.sh && link_collection && .venv/bin/python benchmarks/scan.py [--runs 5] [--compare-with DIR]
"""

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))

from crowd import Crowd  # noqa: E402
from gpusim.api import Host  # noqa: E402

INSIDE = 'GPUOPS_SCAN_BENCHMARK_NAMESPACE'

# Run in a child, with the collection root first on sys.path: times scan_holders over /proc.
MEASURE = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuops.nvidia.plugins.module_utils._holders import expand_devices, scan_holders
paths = expand_devices([sys.argv[2]])
runs = []
for _ in range(int(sys.argv[3])):
    started = time.monotonic()
    scan = scan_holders(paths, deadline=time.monotonic() + 60)
    runs.append(time.monotonic() - started)
print(json.dumps(dict(runs=runs, holders=len(scan.holders), complete=scan.complete,
                      partial=len(getattr(scan, 'partial', [])))))
'''


def collection_root(workdir, checkout, name):
    """A directory with ansible_collections/gpuops/nvidia linked to checkout."""
    root = os.path.join(workdir, name)
    os.makedirs(os.path.join(root, 'ansible_collections', 'gpuops'))
    os.symlink(checkout, os.path.join(root, 'ansible_collections', 'gpuops', 'nvidia'))
    return root


def measure(root, host, runs):
    out = subprocess.run([sys.executable, '-c', MEASURE, root, host.dev_glob, str(runs)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def report(crowd, side, found):
    runs = ' '.join('%.3f' % took for took in found['runs'])
    row = (crowd, side, statistics.median(found['runs']), runs, found['holders'], found['partial'],
           'yes' if found['complete'] else 'no')
    print('%-34s %-18s %8.3f  %-32s %7d %8d  %s' % row)


def run_crowds(opts, roots):
    workdir = tempfile.mkdtemp(prefix='gpuops-bench-scan-')
    uid = pwd.getpwnam('nobody').pw_uid if os.geteuid() == 0 else None
    host = Host(os.path.join(workdir, 'host'))
    host.init(gpus=8)
    crowds = [('%d processes' % opts.processes, lambda crowd: crowd.start_sleepers(opts.processes)),
              ('%d x %d descriptors' % (opts.tenants, opts.descriptors),
               lambda crowd: crowd.start_tenants(opts.tenants, opts.descriptors))]
    header = ('crowd', 'checkout', 'median s', 'runs (s)', 'holders', 'partial', 'complete')
    print('%-34s %-18s %8s  %-32s %7s %8s  %s' % header)
    try:
        host.hold(gpus=[0], mib=1000)
        for name, start in crowds:
            with Crowd(uid) as crowd:
                start(crowd)
                for side, root in roots:
                    report(name, side, measure(root, host, opts.runs))
    finally:
        host.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--runs', type=int, default=5, help='scans of each crowd (default 5)')
    parser.add_argument('--processes', type=int, default=10000, help='processes of the first crowd (default 10000)')
    parser.add_argument('--tenants', type=int, default=50, help='processes of the second crowd (default 50)')
    parser.add_argument('--descriptors', type=int, default=20000, help='descriptors of each (default 20000)')
    parser.add_argument('--compare-with', metavar='DIR', help='a checkout of another version of the collection')
    opts = parser.parse_args()
    if os.geteuid() == 0 and os.environ.get(INSIDE) != '1' and shutil.which('unshare'):
        env = dict(os.environ, **{INSIDE: '1'})
        sys.exit(subprocess.call(['unshare', '-pf', '--mount-proc', sys.executable] + sys.argv, env=env))
    workdir = tempfile.mkdtemp(prefix='gpuops-bench-roots-')
    roots = [('this checkout', collection_root(workdir, REPO, 'this'))]
    if opts.compare_with:
        roots.append(('--compare-with', collection_root(workdir, os.path.abspath(opts.compare_with), 'other')))
    try:
        run_crowds(opts, roots)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
    main()
