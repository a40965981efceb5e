# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The scan of /proc for holders (scan_holders) on a crowded host: 1,000 and 10,000 processes,
and 50 processes with 20,000 descriptors each (1,000,000 descriptors), with the scanning process's
peak memory (max MiB, its maximum resident set).

A simulated host with one job holding GPU 0; then each crowd in turn (sleep processes; processes
holding dup'ed /dev/null descriptors), run as user nobody when root. Prints, per crowd, the first
scan of a release (every process read) and the median of the later ones (--runs - 1 rescans, which
read only what changed: scan_holders' known), the holders found, and the processes read only in
part. A checkout whose scan_holders has no known reads every process each time. As root it
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
import inspect, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import scan_holders
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import expand_devices
paths = expand_devices([sys.argv[2]])
incremental = 'known' in inspect.signature(scan_holders).parameters
runs = []
scan = None
for _ in range(int(sys.argv[3])):
    started = time.monotonic()
    known = dict(known=scan.clean) if incremental and scan is not None else {}
    scan = scan_holders(paths, deadline=time.monotonic() + 60, **known)
    runs.append(time.monotonic() - started)
print(json.dumps(dict(runs=runs, holders=len(scan.holders), complete=scan.complete,
                      partial=len(getattr(scan, 'partial', [])), incremental=incremental,
                      max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)))
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
    first, later = found['runs'][0], found['runs'][1:] or found['runs']
    row = (crowd, side, first, statistics.median(later), ' '.join('%.3f' % took for took in later),
           found['holders'], found['partial'], 'yes' if found['complete'] else 'no', found.get('max_rss_mib', 0))
    print('%-30s %-16s %7.3f %8.3f  %-30s %7d %8d  %-8s %7.0f' % row)


def run_crowds(opts, roots):
    workdir = tempfile.mkdtemp(prefix='gpuops-bench-scan-')
    uid = pwd.getpwnam('nobody').pw_uid if os.geteuid() == 0 else None
    host = Host(os.path.join(workdir, 'host'))
    host.init(gpus=8)
    crowds = [('%d processes' % count, lambda crowd, count=count: crowd.start_sleepers(count))
              for count in opts.processes]
    crowds.append(('%d x %d descriptors' % (opts.tenants, opts.descriptors),
                   lambda crowd: crowd.start_tenants(opts.tenants, opts.descriptors)))
    header = ('crowd', 'checkout', 'first', 'later', 'later runs (s)', 'holders', 'partial', 'complete', 'max MiB')
    print('%-30s %-16s %7s %8s  %-30s %7s %8s  %-8s %7s' % header)
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
    parser.add_argument('--processes', type=lambda text: [int(part) for part in text.split(',')], default=[1000, 10000],
                        help='processes of the sleeper crowds, comma-separated (default 1000,10000)')
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
