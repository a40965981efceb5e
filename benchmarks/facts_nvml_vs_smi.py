# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU facts through NVML against facts through nvidia-smi, on one simulated 8-GPU host.

Both readers run in this process (reader.read()); with --module, nvidia_gpu_facts also runs
through the ansible CLI with each backend. The host runs the hung-job scenario (8 ranks, one
per GPU, plus nvidia-persistenced). Prints medians and the ratio.

    . scripts/lib.sh && link_collection && .venv/bin/python benchmarks/facts_nvml_vs_smi.py [--module]

pynvml loads libnvidia-ml.so.1 by name, so the script starts itself again with
LD_LIBRARY_PATH pointing at the simulated library.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))

from gpusim.api import Host  # noqa: E402


def timed(func, runs):
    times = []
    for dummy in range(runs):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return times


def bench_readers(host, runs):
    from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
    from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gpu_facts

    results = {}
    facts = {}
    for backend in ('nvml', 'nvidia-smi'):
        reader, dummy = select_reader(backend, host.smi_path, 10)
        try:
            reader.read()  # warm up (imports, first library call)
            results[backend] = timed(reader.read, runs)
            facts[backend] = gpu_facts(reader.read())
        finally:
            reader.close()
    assert facts['nvml'] == facts['nvidia-smi'], 'the backends disagree'
    return results


def bench_module(host, runs):
    ansible = os.path.join(os.path.dirname(sys.executable), 'ansible')
    env = dict(host.env(nvml=True), ANSIBLE_STDOUT_CALLBACK='ansible.builtin.minimal',
               ANSIBLE_NOCOLOR='1', ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    results = {}
    for backend in ('nvml', 'nvidia-smi'):
        # host_root: the module keeps its state (the kernel log's cursor) under the host's root,
        # not in the machine's own /run/gpuops.
        args = json.dumps(dict(backend=backend, nvidia_smi_path=host.smi_path, host_root=host.root,
                               kernel_log=host.kernel_log))

        def run():
            proc = subprocess.run([ansible, 'localhost', '-c', 'local', '-i', 'localhost,', '-m',
                                   'gpuops.nvidia.nvidia_gpu_facts', '-a', args],
                                  capture_output=True, text=True, env=env, timeout=120, check=False)
            if ' | SUCCESS => ' not in proc.stdout:
                raise SystemExit('module failed: %s %s' % (proc.stdout, proc.stderr))
        run()
        results[backend] = timed(run, runs)
    return results


def report(title, results):
    nvml = statistics.median(results['nvml'])
    smi = statistics.median(results['nvidia-smi'])
    print('%s (%d runs each)' % (title, len(results['nvml'])))
    print('  nvml        median %8.2f ms   min %8.2f ms' % (nvml * 1000, min(results['nvml']) * 1000))
    print('  nvidia-smi  median %8.2f ms   min %8.2f ms' % (smi * 1000, min(results['nvidia-smi']) * 1000))
    print('  nvidia-smi / nvml = %.1fx' % (smi / nvml))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--runs', type=int, default=30, help='reads per backend (default 30)')
    parser.add_argument('--module', action='store_true', help='also time the module through ansible')
    parser.add_argument('--module-runs', type=int, default=5)
    parser.add_argument('--root', help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.root is None:
        with tempfile.TemporaryDirectory(prefix='gpusim-bench-') as tmp:
            host = Host(tmp)
            host.scenario('hung-job')
            host.install_nvml()
            try:
                argv = [sys.executable, os.path.abspath(__file__), '--root', tmp] + sys.argv[1:]
                return subprocess.call(argv, env=host.env(nvml=True))
            finally:
                host.stop()

    host = Host(args.root)
    print('simulated host: %d x %s, hung-job scenario, python %s' % (
        len(host.state['gpus']), host.state['gpus'][0]['name'], sys.version.split()[0]))
    report('reader.read() in-process', bench_readers(host, args.runs))
    if args.module:
        report('nvidia_gpu_facts through ansible', bench_module(host, args.module_runs))
    return 0


if __name__ == '__main__':
    sys.exit(main())
