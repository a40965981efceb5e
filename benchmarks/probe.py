# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the proof by allocation costs, on a clean simulated 8-GPU host (gpusim, its libcuda.so.1).

Times, interleaved so that a change in the machine's load hits every variant alike:

  cuinit       a bare cuInit: a Python child that loads libcuda.so.1 and calls cuInit, once per
               GPU at once (what any per-GPU probe pays before it does anything)
  cuinit-fork  the same children forked from one Python process that has loaded the library (as
               the probe starts its own), timed inside that process
  children     the probe's children alone (_probe.ProbeChild: one forked per GPU, all at once,
               each seeing its own GPU only): cuInit, then context, allocation, write, check,
               free and destroy, timed inside the process that forks them, as the module does
  module       gpuops.nvidia.nvidia_gpu_probe run as a program, as the Slurm hook's runner runs
               it: read the GPUs, the child, wait until the probe's memory reads released
  hook         the Slurm hook's module runner (plugin_utils/_slurm_hook) for one job, probe off
  hook+probe   the same with the probe on (its default)

Prints the median (and min, max) of each, the children against each bare cuInit (target: at most
1.5x), and what the probe adds to the hook. The figures are
gpusim's: on a real host the child's time is the driver's (context creation dominates), which
tests/device/check.sh records.

With --levels, the module instead at probe_level allocation and performance on 1, 4 and 8 GPUs,
interleaved, and what the performance level adds (target: at most 0.5 s more, 1.5 s in all, on 8
GPUs). With --spread N, the performance level N times on the healthy host: for each figure the
lowest a GPU came to against the median of its peers (the spread the default slow_fraction of
0.15 must stay outside), and in how many runs any GPU was called slow (target: none).

With --nvlink 18, the host is an NVSwitch board (every pair of GPUs copies in the pair check).

Usage: python3 benchmarks/probe.py [--runs 7] [--mib 1024] [--levels] [--spread 100] [--nvlink 18]
Needs gcc (gpusim's libcuda.so.1) and ansible-core (the repository's .venv is used when present).
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

COLLECTIONS = os.path.join(REPO, '.build', 'collections')
VARIANTS = ('cuinit', 'cuinit-fork', 'children', 'module', 'hook', 'hook+probe')
# A child that does no more than load the driver library and initialise it.
CUINIT = ('import ctypes, sys\n'
          'sys.exit(ctypes.CDLL("libcuda.so.1").cuInit(0))\n')
# One child per GPU forked from this process (argv: the GPUs as JSON, MiB; each GPU's UUID its
# CUDA_VISIBLE_DEVICES), all at once; prints the seconds from the first fork to the last answer.
# children: the probe's own; cuinit-fork: a bare cuInit in each, the library loaded here first.
FORKED = '''
import ctypes, json, sys, time
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import ProbeChild
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Forked, Runner
variant, gpus, mib = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
library = ctypes.CDLL("libcuda.so.1")
if variant == "children":
    child = ProbeChild()
    started = time.monotonic()
    answers = [child.answer(one, 60) for one in [child.start(gpu, mib) for gpu in gpus]]
    took = time.monotonic() - started
    assert all(answer["gpus"][0]["ok"] for answer in answers), answers
else:
    started = time.monotonic()
    running = [Forked(library.cuInit, (0,), env=dict(CUDA_VISIBLE_DEVICES=gpu["uuid"])) for gpu in gpus]
    codes = [Runner("cuInit").finish(one, 60, ["cuInit"], started=one.started)[0] for one in running]
    took = time.monotonic() - started
    assert codes == [0] * len(gpus), codes
print(took)
'''


def reexec_in_venv():
    """Run under the repository's .venv (ansible-core) when this Python has no ansible."""
    import importlib.util

    venv = os.path.join(REPO, '.venv', 'bin', 'python')
    if importlib.util.find_spec('ansible') is None:
        # Not by resolved paths: a venv's python is a link to the interpreter it was made from.
        if os.path.exists(venv) and os.path.abspath(sys.executable) != os.path.abspath(venv):
            os.execv(venv, [venv] + sys.argv)
        sys.exit('ansible-core is not installed for %s (nor is %s there)' % (sys.executable, venv))


def link_collection():
    link = os.path.join(COLLECTIONS, 'ansible_collections', 'gpuops', 'nvidia')
    if not os.path.exists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(REPO, link)


def timed(argv, env):
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - started
    return took, proc


class Bench:
    def __init__(self, host, mib, workdir):
        self.host = host
        self.mib = mib
        self.workdir = workdir
        self.env = dict(host.env(cuda=True), PYTHONPATH=COLLECTIONS, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS)
        self.gpus = [dict(index=g['index'], pci_bus_id=g['pci_bus_id'], uuid=g['uuid']) for g in host.state['gpus']]
        self.uuids = [g['uuid'] for g in host.state['gpus']]

    def at_once(self, argvs):
        """Run one child per GPU, all at once (each seeing its own GPU); the time until the last exits."""
        started = time.monotonic()
        procs = [subprocess.Popen(argv, env=dict(self.env, CUDA_VISIBLE_DEVICES=uuid), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True) for argv, uuid in argvs]
        outputs = [(proc.communicate(timeout=120)[0], proc.returncode) for proc in procs]
        took = time.monotonic() - started
        assert all(rc == 0 for dummy, rc in outputs), outputs
        return took, [out for out, dummy in outputs]

    def cuinit(self):
        return self.at_once([([sys.executable, '-I', '-S', '-c', CUINIT], uuid) for uuid in self.uuids])[0]

    def forked(self, variant):
        dummy, proc = timed([sys.executable, '-c', FORKED, variant, json.dumps(self.gpus), str(self.mib)], self.env)
        assert proc.returncode == 0, proc.stderr
        return float(proc.stdout)

    def module(self, level='allocation', gpus=None):
        """The probe module's time (and its result) at level, on gpus (None: every GPU)."""
        args = os.path.join(self.workdir, 'args.json')
        options = dict(nvidia_smi_path=self.host.smi_path, backend='nvidia-smi', host_root=self.host.root,
                       probe_mib=self.mib, probe_level=level)
        if gpus is not None:
            options['gpus'] = gpus
        with open(args, 'w') as handle:
            json.dump({'ANSIBLE_MODULE_ARGS': options}, handle)
        took, proc = timed([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.modules.nvidia_gpu_probe',
                            args], self.env)
        result = json.loads(proc.stdout)
        assert not result.get('failed') and all(gpu['released'] for gpu in result['gpus']), proc.stdout
        self.result = result
        return took

    def hook(self, probe):
        variables = os.path.join(self.workdir, 'gpu_reset.yml')
        with open(variables, 'w') as handle:
            json.dump({'gpu_reset_nvidia_smi_path': self.host.smi_path, 'gpu_reset_host_root': self.host.root,
                       'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_lock_file': os.path.join(self.workdir, 'lock'),
                       'gpu_reset_probe': probe, 'gpu_reset_probe_mib': self.mib}, handle)
        took, proc = timed([sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook',
                            '--node', 'bench', '--vars-file', variables, '--scontrol', '/bin/true'], self.env)
        report = json.loads(proc.stdout)
        assert proc.returncode == 0 and report['outcome'] == 'clean', proc.stdout + proc.stderr
        assert ('probe' in report) is probe
        return took

    def run(self, variant):
        if variant == 'cuinit':
            return self.cuinit()
        if variant in ('cuinit-fork', 'children'):
            return self.forked(variant)
        if variant == 'module':
            return self.module()
        return self.hook(variant == 'hook+probe')


def line(name, values):
    return '%-14s median %6.3f s   min %6.3f   max %6.3f   (%d runs)' % (
        name, statistics.median(values), min(values), max(values), len(values))


FIGURES = ('h2d_gbps', 'd2h_gbps', 'hbm_gbps')


def levels(bench, runs):
    """The module at each level on 1, 4 and 8 GPUs, interleaved; what performance adds."""
    sizes = (1, 4, 8)
    times = dict(((level, size), []) for level in ('allocation', 'performance') for size in sizes)
    for run in range(runs + 1):  # the first round warms up
        for (level, size), values in times.items():
            took = bench.module(level, list(range(size)))
            if run:
                values.append(took)
    print('The probe module by level on a clean simulated host (gpusim), %d MiB per GPU, %d CPUs:'
          % (bench.mib, os.cpu_count()))
    for (level, size), values in sorted(times.items(), key=lambda item: (item[0][1], item[0][0])):
        print(line('%s %d' % (level[:5], size), values))
    for size in sizes:
        extra = statistics.median(times[('performance', size)]) - statistics.median(times[('allocation', size)])
        print('performance adds %.3f s to allocation on %d GPU%s (medians; target on 8: at most 0.5 s, 1.5 s in all)'
              % (extra, size, '' if size == 1 else 's'))
    gpus = bench.result['gpus']
    pairs = sum(len((gpu['peers'] or {}).get('pairs') or []) for gpu in gpus) // 2
    print('where its time goes (last run, 8 GPUs): children %.0f ms at most, copy rounds %s, %d peer pairs copied'
          % (max(gpu['ms'] for gpu in gpus), sorted(set(gpu['copy_round'] for gpu in gpus)), pairs))


def spread(bench, runs):
    """The performance level runs times on a healthy host: how far below its peers' median each
    figure of a GPU came, at worst, and how many runs called a GPU slow."""
    worst = dict((figure, 1.0) for figure in FIGURES)
    slow_runs = 0
    for dummy in range(runs):
        bench.module('performance')
        gpus = bench.result['gpus']
        slow_runs += any(gpu['slow'] for gpu in gpus)
        for figure in FIGURES:
            for gpu in gpus:
                peers = [other[figure] for other in gpus if other is not gpu]
                worst[figure] = min(worst[figure], gpu[figure] / statistics.median(peers))
    print('The performance level %d times on a healthy simulated 8-GPU host:' % runs)
    for figure in FIGURES:
        print('  %-9s at worst %.1f %% below its peers\' median' % (figure, (1 - worst[figure]) * 100))
    print('  runs with a GPU called slow (slow_fraction 0.15): %d of %d' % (slow_runs, runs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--runs', type=int, default=7)
    parser.add_argument('--mib', type=int, default=1024)
    parser.add_argument('--levels', action='store_true', help='the module by level on 1, 4 and 8 GPUs')
    parser.add_argument('--spread', type=int, default=0, metavar='N', help='the performance level N times')
    parser.add_argument('--nvlink', type=int, default=0, metavar='LINKS',
                        help='an NVSwitch board: every GPU with LINKS NVLinks (the pair check copies every pair)')
    args = parser.parse_args()
    reexec_in_venv()
    link_collection()
    workdir = tempfile.mkdtemp(prefix='gpuops-probe-bench-')
    host = Host(os.path.join(workdir, 'host'))
    try:
        host.init(gpus=8)
        host.install_cuda()
        if args.nvlink:
            host.nvlink(args.nvlink)
        bench = Bench(host, args.mib, workdir)
        if args.levels or args.spread:
            if args.levels:
                levels(bench, args.runs)
            if args.spread:
                spread(bench, args.spread)
            return
        times = dict((variant, []) for variant in VARIANTS)
        for variant in VARIANTS:  # warm up: the library build, the page cache
            bench.run(variant)
        for dummy in range(args.runs):
            for variant in VARIANTS:
                times[variant].append(bench.run(variant))
        print('Proof by allocation on a clean simulated 8-GPU host (gpusim), %d MiB per GPU, %d CPUs:'
              % (args.mib, os.cpu_count()))
        for variant in VARIANTS:
            print(line(variant, times[variant]))
        for baseline in ('cuinit', 'cuinit-fork'):
            print('the children take %.2fx a bare cuInit (%s; medians; target at most 1.5x)'
                  % (statistics.median(times['children']) / statistics.median(times[baseline]), baseline))
        print('the probe adds %.3f s to the hook per job (medians)'
              % (statistics.median(times['hook+probe']) - statistics.median(times['hook'])))
    finally:
        host.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
    main()
