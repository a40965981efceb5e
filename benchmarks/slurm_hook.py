# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Time what the gpu_reset Prolog adds to every job on a clean node, through real Slurm.

Starts the Slurm bench of tests/slurm (munged, slurmctld and slurmd from Debian's packages, as
children of this process; installs them when missing, as root), installs the hooks with the role
gpuops.nvidia.slurm_hooks against a clean simulated 8-GPU host, and runs jobs with
``srun --gres=gpu:8 true``, timing each from submission until srun returns. The node's Prolog
is, in turn (interleaved, so that a change in the machine's load hits every variant alike):

  empty     a Prolog that exits 0 at once
  module    the hook with its default runner: the release module and the role's verdict run
            directly, without ansible-playbook
  playbook  the hook running ansible-playbook gpuops.nvidia.reset_gpus

Prints the median (and min, max) of each and what each hook adds to the empty Prolog's median,
the hook's Prolog's own wall-clock time, and the module runner's own time as its reports in the
hook's log give it. Slurm notices the Prolog's end in steps (on the 2-core bench a job returned 0.14, 0.34,
0.64 or 1.04 s after its submission, nothing between: each wait a tenth of a second longer than
the last), so the Prolog's own time says what the hook itself costs.
The node is idle again (Epilog done) before every job; there is no Epilog, so only the Prolog
is timed.

Usage: python3 benchmarks/slurm_hook.py [--jobs 7] [--variants empty,module,playbook] [--no-probe]
Needs root (slurmd), and ansible-core (the repository's .venv is used when present).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'slurm'))

from bench import SlurmBench, deploy_hooks, skip_reason, which  # noqa: E402
from gpusim.api import Host  # noqa: E402

VARIANTS = ('empty', 'module', 'playbook')

# The node's Prolog: the variant named in a file, so that variants take turns without
# reconfiguring Slurm (a sh and a cat, the same for every variant); a hook's own wall-clock
# time written down (two date calls more, about 2 ms).
DISPATCH = """#!/bin/sh
variant=$(cat {dir}/variant)
[ "$variant" = empty ] && exit 0
started=$(date +%s.%N)
{hooks}/prolog.sh
status=$?
echo "$started $(date +%s.%N)" >>{dir}/prolog-seconds
exit $status
"""


def reexec_in_venv():
    """Run under the repository's .venv (ansible-core) when this Python has no ansible."""
    import importlib.util

    venv = os.path.join(REPO, '.venv', 'bin', 'python')
    if importlib.util.find_spec('ansible') is None:
        # Not by resolved paths: a venv's python is a link to the interpreter it was made from.
        if os.path.exists(venv) and os.path.abspath(sys.executable) != os.path.abspath(venv):
            os.execv(venv, [venv] + sys.argv)
        sys.exit('ansible-core is not installed for %s (nor is %s there)' % (sys.executable, venv))


def set_runner(conf, runner):
    with open(conf) as handle:
        lines = handle.read().splitlines()
    lines = [line for line in lines if not line.startswith('GPU_RESET_RUNNER=')] + ['GPU_RESET_RUNNER=%s' % runner]
    with open(conf, 'w') as handle:
        handle.write('\n'.join(lines) + '\n')


def one_job(bench, seconds=120):
    """Seconds from submission until srun returns, for a job asking for every GPU."""
    started = time.monotonic()
    proc = subprocess.run([which('srun'), '--gres=gpu:8', 'true'], env=bench.env, capture_output=True, text=True,
                          timeout=seconds, check=False)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError('srun failed (rc %d): %s\n%s' % (proc.returncode, proc.stderr, bench.logs()))
    return took


def runner_seconds(log):
    """duration_s of each report the module runner wrote to the hook's log (a JSON line)."""
    seconds = []
    for line in log:
        if line.startswith('{') and '"duration_s"' in line:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report.get('duration_s'), (int, float)):
                seconds.append(report['duration_s'])
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--jobs', type=int, default=7, help='jobs per variant (default 7)')
    parser.add_argument('--variants', default=','.join(VARIANTS), help='comma-separated, of %s' % ', '.join(VARIANTS))
    parser.add_argument('--no-probe', action='store_true', help='gpu_reset_probe: false (the hook probes by default)')
    args = parser.parse_args()
    variants = [v for v in args.variants.split(',') if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error('unknown variant(s): %s' % ', '.join(sorted(unknown)))
    reexec_in_venv()
    reason = skip_reason()
    if reason:
        sys.exit(reason)

    directory = tempfile.mkdtemp(prefix='gpuops-slurm-bench-')
    os.chmod(directory, 0o711)
    host = Host(os.path.join(directory, 'gpuhost')).init(gpus=8, idle_used_mib=0)
    hooks = os.path.join(directory, 'hooks')
    bench = None
    try:
        settings = {'gpu_reset_nvidia_smi_path': host.smi_path, 'gpu_reset_host_root': host.root,
                    'gpu_reset_lock_file': os.path.join(directory, 'release.lock')}
        if args.no_probe:
            settings['gpu_reset_probe'] = False
        else:
            # The probe proves the 8 GPUs through the simulated libcuda.so.1.
            settings['gpu_reset_probe_cuda_library'] = host.install_cuda()
        deploy_hooks(hooks, settings,
                     slurm_hooks_budget_s=60, slurm_hooks_prolog_epilog_timeout=120)
        prolog = os.path.join(directory, 'prolog')
        with open(prolog, 'w') as handle:
            handle.write(DISPATCH.format(dir=directory, hooks=hooks))
        os.chmod(prolog, 0o755)
        bench = SlurmBench(os.path.join(directory, 'slurm'), prolog=prolog, prolog_epilog_timeout=120)
        bench.start()
        times = dict((variant, []) for variant in variants)
        # One warm-up job per variant (caches, first imports), not counted.
        for round_ in range(args.jobs + 1):
            for variant in variants:
                with open(os.path.join(directory, 'variant'), 'w') as handle:
                    handle.write(variant + '\n')
                if variant != 'empty':
                    set_runner(os.path.join(hooks, 'gpu-reset-hook.conf'), variant)
                took = one_job(bench)
                bench.wait_idle(60)
                if round_:
                    times[variant].append(took)
        with open(os.path.join(hooks, 'hook.log')) as handle:
            log = handle.readlines()
        failed = [line for line in log if re.match(r'=== prolog job \S+: exit [1-9]', line)]
        if failed:
            raise RuntimeError('a hook failed on the clean node:\n%s' % ''.join(failed))
        print('Slurm %s, node %s (%s), load average %.1f at the end, %d jobs per variant,'
              ' srun --gres=gpu:8 true, submission to return:' % (
                  bench.command('sinfo', '-V').stdout.split()[-1], bench.node, bench.topology, os.getloadavg()[0],
                  args.jobs))
        medians = {}
        for variant in variants:
            medians[variant] = statistics.median(times[variant])
            print('  %-8s median %.2f s  (min %.2f, max %.2f)' % (
                variant, medians[variant], min(times[variant]), max(times[variant])))
        if 'empty' in medians:
            for variant in variants:
                if variant != 'empty':
                    print('  the %s hook adds %.2f s per job (median against the empty Prolog)' % (
                        variant, medians[variant] - medians['empty']))
        with open(os.path.join(directory, 'prolog-seconds')) as handle:
            prolog = [float(end) - float(start) for start, end in (line.split() for line in handle)]
        print('  the hook\'s Prolog itself (prolog.sh, from its start to its exit), median %.2f s (min %.2f, max %.2f, '
              '%d runs, the warm-ups included)' % (statistics.median(prolog), min(prolog), max(prolog), len(prolog)))
        own = runner_seconds(log)
        if own:
            print('  the module runner\'s own time (its report\'s duration_s, from its start to its report), median '
                  '%.2f s (min %.2f, max %.2f, %d runs, the warm-up included); the rest of what a hook adds is the '
                  "shell hook, Python's start and Slurm noticing the Prolog's end, which moves the figures above in "
                  'steps (compare each variant\'s min and median)' % (statistics.median(own), min(own), max(own), len(own)))
    finally:
        if bench is not None:
            bench.stop()
        host.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == '__main__':
    main()
