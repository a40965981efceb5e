# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The kernel log under load: a simulated 8-GPU host whose kernel log holds a storm of a million
Xid 95 records of one GPU (NVIDIA/NVSentinel#1120 saw about 800,000 in one boot), then a flood of
lines the kernel did not write (300 MiB of "NVRM: Xid ..." that root's userspace wrote to
/dev/kmsg, user facility) and one more Xid of the kernel's.

The log is gpusim's kernel_log: a file of /dev/kmsg records. Each read of it runs in a process of
its own, as a module reads it (KernelLog, with the state directory that keeps where the last read
ended), and prints its time and its peak memory (VmHWM): the storm's first read and the next, the
flood's first read (the new text since the storm) and the next. The facts as nvidia_gpu_facts
gathers them (nvidia-smi, the log, the holders) are timed after the storm and after the flood. On a checkout whose gpusim
writes a syslog-form kern.log (before the kernel log took /dev/kmsg records only), the flood is
written as a user's syslog lines instead, which that checkout read.

    . scripts/lib.sh && link_collection && .venv/bin/python benchmarks/kernel_log_storm.py [--lines N] [--flood-mib M]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))
sys.path.insert(0, os.path.join(REPO, '.build', 'collections'))

from gpusim.api import Host  # noqa: E402

MIB = 1024 * 1024
USER_XID = "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
KERNEL_XID = 'NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics SM Warp Exception'
RECORD_RE = re.compile(r'^[0-9]+,([0-9]+),([0-9]+),')

# One read of the kernel log in a process of its own: seconds, peak memory, what it found.
READ = r'''
import json, sys, time
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import KernelLog
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir
started = time.perf_counter()
log = KernelLog(sys.argv[1], StateDir(sys.argv[2]), 'bench')
summary = log.read(60)
seconds = time.perf_counter() - started
peak = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]
print(json.dumps({'seconds': seconds, 'peak_mib': int(peak) / 1024.0, 'skipped': getattr(log, 'skipped_bytes', None),
                  'entries': [[e['bus'], e['code'], e['count']] for e in summary.dump()] if summary else None}))
'''


def read_once(path, state_dir):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, '.build', 'collections'))
    return json.loads(subprocess.check_output([sys.executable, '-c', READ, path, state_dir], env=env))


def show(label, read):
    entries = ', '.join('%s Xid %s x %d' % tuple(entry) for entry in read['entries'] or [])
    print('%-30s %6.2f s  peak %6.0f MiB  skipped %s  [%s]' % (
        label + ':', read['seconds'], read['peak_mib'],
        'n/a' if read['skipped'] is None else '%d MiB' % (read['skipped'] // MIB), entries))


def last_record(path):
    """(seq, usec) of the last record of a /dev/kmsg record file."""
    with open(path, 'rb') as handle:
        handle.seek(max(0, os.path.getsize(path) - 65536))
        for line in reversed(handle.read().decode('latin-1').splitlines()):
            match = RECORD_RE.match(line)
            if match:
                return int(match.group(1)), int(match.group(2))
    return -1, 0


def write_flood(path, mib):
    """mib MiB of lines the kernel did not write, then one Xid of the kernel's; in the log's own form."""
    kmsg = not path.endswith('kern.log')
    seq, usec = last_record(path) if kmsg else (0, 0)
    with open(path, 'a') as handle:
        written = 0
        while written < mib * MIB:
            if kmsg:  # root's userspace: the user facility (1 << 3 | err)
                block = ''.join('11,%d,%d,-;%s\n' % (seq + n, usec + n, USER_XID) for n in range(1, 10001))
                seq += 10000
            else:  # a user's logger line in a syslog file
                block = ('Dec  4 10:00:00 node07 alice: %s\n' % USER_XID) * 10000
            handle.write(block)
            written += len(block)
        if kmsg:
            handle.write('3,%d,%d,-;%s\n' % (seq + 1, usec + 10001, KERNEL_XID))
        else:
            handle.write('%s node07 kernel: %s\n' % (time.strftime('%Y-%m-%dT%H:%M:%S+0000', time.gmtime()), KERNEL_XID))


def facts_once(host, state_dir):
    from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gather_facts
    from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir

    started = time.perf_counter()
    facts, warnings = gather_facts(SmiReader(SmiRunner(host.smi_path)), [host.dev_glob], [],
                                   kernel_log=host.kernel_log, state=StateDir(state_dir))
    seconds = time.perf_counter() - started
    return seconds, len(json.dumps({'ansible_facts': facts, 'warnings': warnings})), facts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--lines', type=int, default=1000000)
    parser.add_argument('--flood-mib', type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(os.path.join(tmp, 'host')).init(gpus=8)
        try:
            started = time.perf_counter()
            host.fault('xid', gpu=3, code=95, count=args.lines)
            print('kernel log %s: %d Xid 95 records on GPU 3, %.0f MB (written in %.1f s)' % (
                os.path.basename(host.kernel_log), args.lines, os.path.getsize(host.kernel_log) / 1e6,
                time.perf_counter() - started))
            state, facts_state = os.path.join(tmp, 'state'), os.path.join(host.root, 'run', 'gpuops')
            show('storm, first read', read_once(host.kernel_log, state))
            show('storm, next read', read_once(host.kernel_log, state))
            for label in ('first read', 'later read, nothing new'):
                seconds, size, facts = facts_once(host, facts_state)
                print('%-30s %6.2f s  facts %7.1f KB' % ('facts, ' + label + ':', seconds, size / 1000.0))
            started = time.perf_counter()
            write_flood(host.kernel_log, args.flood_mib)
            print('flood: %d MiB of user lines, then one kernel Xid 13 on GPU 0 (written in %.1f s)' % (
                args.flood_mib, time.perf_counter() - started))
            show('flood, first read', read_once(host.kernel_log, state))
            show('flood, next read', read_once(host.kernel_log, state))
            seconds, size, facts = facts_once(host, facts_state)
            print('%-30s %6.2f s  facts %7.1f KB' % ('facts, after the flood:', seconds, size / 1000.0))
            for index in (0, 2, 3):
                health = facts['nvidia_gpus'][index]['health']
                print('GPU %d: %s, recovery_action %s' % (index, ', '.join(
                    'Xid %s x %d' % (entry['code'], entry['count']) for entry in health['xid_events'] or []) or 'no Xid',
                    health['recovery_action']))
        finally:
            host.stop()


if __name__ == '__main__':
    main()
