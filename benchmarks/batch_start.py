# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What real Slurm does to a batch job whose Prolog outlives BatchStartTimeout.

Starts the Slurm bench of tests/slurm (munged, slurmctld and slurmd, as children of this process)
with a Prolog that sleeps a given number of seconds and BatchStartTimeout at a given value, submits
one batch job (sbatch --wrap 'date'), and prints each change of its state (JobState, Reason,
Restarts) with the seconds since submission, until it ends or 60 s past the Prolog. With
--no-alloc, without PrologFlags=Alloc (the Prolog then runs when the batch step starts).

Usage (as root): python3 benchmarks/batch_start.py [--prolog-s 25,75] [--batch-start-timeout 10] [--no-alloc]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'tests'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'slurm'))

import bench  # noqa: E402

ENDED = ('COMPLETED', 'FAILED', 'NODE_FAIL', 'CANCELLED', 'TIMEOUT', 'BOOT_FAIL', 'OUT_OF_MEMORY')


def run(prolog_s, batch_start_timeout, alloc):
    directory = tempfile.mkdtemp(prefix='gpuops-batch-start-')
    os.chmod(directory, 0o711)
    prolog = os.path.join(directory, 'prolog.sh')
    with open(prolog, 'w') as handle:
        handle.write('#!/bin/sh\nsleep %d\nexit 0\n' % prolog_s)
    os.chmod(prolog, 0o755)
    conf = bench.SLURM_CONF
    if not alloc:
        bench.SLURM_CONF = conf.replace('PrologFlags=Alloc\n', '')
    slurm = bench.SlurmBench(os.path.join(directory, 'slurm'), prolog=prolog, prolog_epilog_timeout=prolog_s + 60,
                             extra=['BatchStartTimeout=%d' % batch_start_timeout])
    try:
        slurm.start()
        print('%s: Prolog %d s, BatchStartTimeout=%d, PrologFlags=%s' % (
            slurm.command('sinfo', '-V').stdout.strip(), prolog_s, batch_start_timeout, 'Alloc' if alloc else '(none)'))
        started = time.monotonic()
        job = slurm.sbatch('--output', os.path.join(directory, 'out'), '--wrap', 'date')
        last = None
        while time.monotonic() - started < prolog_s + 60:
            fields = slurm.job(job)
            state = (fields.get('JobState'), fields.get('Reason'), fields.get('Restarts'))
            if state != last:
                print('  %6.1f s  JobState=%s Reason=%s Restarts=%s' % ((time.monotonic() - started,) + state), flush=True)
                last = state
            if state[0] in ENDED:
                break
            time.sleep(0.5)
    finally:
        bench.SLURM_CONF = conf
        slurm.stop()
        shutil.rmtree(directory, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--prolog-s', default='25,75', help='Prolog durations, seconds, comma-separated')
    parser.add_argument('--batch-start-timeout', type=int, default=10, help="Slurm's BatchStartTimeout (its default: 10)")
    parser.add_argument('--no-alloc', action='store_true', help='without PrologFlags=Alloc')
    args = parser.parse_args()
    reason = bench.skip_reason()
    if reason:
        raise SystemExit('cannot run the Slurm bench: %s' % reason)
    for seconds in [int(value) for value in args.prolog_s.split(',')]:
        run(seconds, args.batch_start_timeout, not args.no_alloc)


if __name__ == '__main__':
    main()
