# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An Xid storm: the facts of a simulated 8-GPU host whose kernel log holds a million Xid 95
lines of one GPU (NVIDIA/NVSentinel#1120 saw about 800,000 in one boot).

Reads the facts as nvidia_gpu_facts does (gather_facts: the GPUs through nvidia-smi, the kernel
log, the holders) three times: the first read of the log, a later read with nothing new (from the
offset kept in the state directory), and a read after 1,000 more lines. Prints the seconds each
took and the size of the facts as JSON, the module's result.

    . scripts/lib.sh && link_collection && .venv/bin/python benchmarks/kernel_log_storm.py [--lines N]
"""

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))
sys.path.insert(0, os.path.join(REPO, '.build', 'collections'))

from gpusim.api import Host  # noqa: E402


def facts_once(host, state_dir):
    from ansible_collections.gpuops.nvidia.plugins.module_utils._facts import gather_facts
    from ansible_collections.gpuops.nvidia.plugins.module_utils._smi import SmiReader, SmiRunner
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state import StateDir

    started = time.perf_counter()
    facts, warnings = gather_facts(SmiReader(SmiRunner(host.smi_path)), [host.dev_glob], [],
                                   kernel_log=host.kernel_log, state=StateDir(state_dir))
    seconds = time.perf_counter() - started
    return seconds, len(json.dumps({'ansible_facts': facts, 'warnings': warnings})), facts


def log_only(host, state_dir):
    from ansible_collections.gpuops.nvidia.plugins.module_utils._kernel_log import KernelLog
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state import StateDir

    started = time.perf_counter()
    KernelLog(host.kernel_log, StateDir(state_dir), 'bench').read()
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--lines', type=int, default=1000000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(os.path.join(tmp, 'host')).init(gpus=8)
        try:
            started = time.perf_counter()
            host.fault('xid', gpu=3, code=95, count=args.lines)
            print('kernel log: %d Xid 95 lines on GPU 3, %.0f MB (written in %.1f s)' % (
                args.lines, os.path.getsize(host.kernel_log) / 1e6, time.perf_counter() - started))
            state_dir = os.path.join(host.root, 'run', 'gpuops')
            for label in ('first read', 'later read, nothing new'):
                seconds, size, facts = facts_once(host, state_dir)
                print('%-34s %6.2f s  facts %7.1f KB' % ('facts, ' + label + ':', seconds, size / 1000.0))
            host.fault('xid', gpu=3, code=95, count=1000)
            seconds, size, facts = facts_once(host, state_dir)
            print('%-34s %6.2f s  facts %7.1f KB' % ('facts, after 1,000 more lines:', seconds, size / 1000.0))
            [entry] = facts['nvidia_gpus'][3]['health']['xid_events']
            print('GPU 3: Xid %s x %d, %s .. %s, recovery_action %s' % (
                entry['code'], entry['count'], entry['first_time'], entry['time'],
                facts['nvidia_gpus'][3]['health']['recovery_action']))
            fresh = os.path.join(tmp, 'fresh-state')
            print('%-34s %6.2f s' % ('kernel log alone, first read:', log_only(host, fresh)))
            print('%-34s %6.2f s' % ('kernel log alone, later read:', log_only(host, fresh)))
        finally:
            host.stop()


if __name__ == '__main__':
    main()
