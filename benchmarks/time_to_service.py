# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""From fault to back in service, per fault class, through real Slurm.

Starts the Slurm bench of tests/slurm (munged, slurmctld and slurmd from Debian's packages, as
children of this process) with the hooks the role gpuops.nvidia.slurm_hooks installs (Prolog,
Epilog, the cure started at once; no health check at all, so that nothing else resumes a node), on
a simulated 8-GPU host whose GPU resets the hook may do. Each run puts one fault on GPU 3 of the
idle node and submits a job for every GPU (sbatch --wrap true), then reads the node every 0.1 s:

  leftover       a process of no job holds GPU 3 and ignores SIGTERM (the Prolog kills it)
  orphaned       4 GiB held on GPU 3 by no process, only a GPU reset frees it (the Prolog resets it)
  xid_reset      an Xid 119 on GPU 3, whose action in NVIDIA's catalogue is a GPU reset
  late_release   4 GiB held by no process that the driver lets go of 5 s after the node drains
                 (GPU resets not allowed): the Prolog drains the node, its cure resumes it
  sick           GPU 3 lost ("Reboot the system to recover this GPU", no reboot allowed): drained,
                 never back by itself (each run ends after --sick-wait s, the node resumed by hand)
  xid_reboot     GPU 3 fallen off the bus (an Xid 79, whose action in NVIDIA's catalogue is a reboot,
                 and the GPU lost), the hook allowed to ask for a reboot (GPU_RESET_REBOOT=asap): it
                 drains the node, collects the bug report, asks Slurm for the reboot (scontrol reboot
                 ASAP nextstate=resume), and Slurm runs the bench's RebootProgram once the node is idle:
                 a simulated reboot of --reboot-s s (slurmd stopped; the host's processes, faults,
                 kernel log and /run gone; slurmd started again with an uptime of a second, so that
                 slurmctld takes it for the node back from its reboot and resumes it). A job is then
                 submitted: its Prolog proves the GPUs after the reboot

and prints, for each class, p50 and p95 of: fault to drained (when it was), to cured (the report
that found the GPUs clean), to proven (that report's probe done), to back in service (the node
idle and not drained, with the job run), and the node-seconds lost (drained to back, or to the
end of the wait). Times count from the job's submission; the fault is put in place just before.
For xid_reboot, Slurm returns the node to service when slurmd is back (nextstate=resume), before
anything checks the GPUs: cured and proven come after back in service, from the Prolog of a job
submitted then; it also prints back in service less the simulated reboot.

Each run clears the GPUs' history and the reboot stamp, so that no earlier run's cures or reboots
(the reboot budget) hold the node for a person.

Usage: python3 benchmarks/time_to_service.py [--runs 20] [--classes leftover,...] [--sick-wait 20] [--reboot-s 10]
Needs root (slurmd), and ansible-core (the repository's .venv is used when present).
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
sys.path.insert(0, os.path.join(REPO, 'tests', 'slurm'))

from bench import SlurmBench, deploy_hooks, skip_reason  # noqa: E402
from gpusim.api import Host  # noqa: E402
from slurm_hook import reexec_in_venv  # noqa: E402  (the same: run under the repository's .venv)

CLASSES = ('leftover', 'orphaned', 'xid_reset', 'late_release', 'sick', 'xid_reboot')
# The late release: the driver lets the memory go this long after the node drains.
LATE_RELEASE_S = 5.0
GPU = 3
GPUS = 8
POLL_S = 0.1
STEPS = ('drained', 'cured', 'proven', 'back')


def history_type():
    """The collection's History (the checkout, as deploy_hooks links it for the hooks)."""
    from bench import link_collection

    if link_collection() not in sys.path:
        sys.path.insert(0, link_collection())
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History

    return History


def put_fault(bench, host, kind):
    # An Xid's record time is the node's time since boot: after a simulated reboot, slurmd's (and so
    # the hook's) clock of boot is that of its time namespace.
    when = time.time() + bench.boottime_offset()
    if kind == 'leftover':
        host.hold(gpus=[GPU], mib=2048, name='leftover', ignore_term=True)
    elif kind in ('orphaned', 'late_release'):
        host.fault('stuck', gpu=GPU, mib=4096)
    elif kind == 'xid_reset':
        host.fault('xid', gpu=GPU, code=119, when=when)
    elif kind == 'sick':
        host.fault('lost', gpu=GPU, message='lost')
    elif kind == 'xid_reboot':
        host.fault('xid', gpu=GPU, code=79, when=when)
        host.fault('lost', gpu=GPU, message='lost')


def reboot_host(root, hooks):
    """What a reboot does to the simulated host, run by the bench's RebootProgram while slurmd is
    down: every process of the old boot gone (the GPUs' holders, the hook's cures), the GPUs as
    at boot (no fault, no memory held, a fresh kernel log), /run (a tmpfs) gone with the
    collection's state of that boot (the kernel log's last read, the GPUs' cures). The history
    and the reboot stamp, under /var/lib, are kept."""
    host = Host(root)
    kill_cures(hooks)
    host.stop()
    shutil.rmtree(host.paths.procs, ignore_errors=True)
    shutil.rmtree(os.path.join(host.root, 'run'), ignore_errors=True)
    host.init(gpus=GPUS, idle_used_mib=0)


def clear_fault(host):
    host.fault('clear')
    host.stop()


def reports_since(log, offset):
    """The module runner's reports (JSON lines) written to the hook's log after offset."""
    if not os.path.exists(log):
        return []
    with open(log) as handle:
        handle.seek(offset)
        lines = handle.read().splitlines()
    found = []
    for line in lines:
        if line.startswith('{"host"'):
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def one_run(bench, host, log, kind, sick_wait, reboot_s, stamp):
    """{step: seconds from submission} of one run, and the node-seconds lost."""
    offset = os.path.getsize(log) if os.path.exists(log) else 0
    reboots = len(bench.reboots())
    put_fault(bench, host, kind)
    started, wall = time.monotonic(), time.time()
    job = bench.sbatch('--gres=gpu:%d' % GPUS, '--output', '/dev/null', '--wrap', 'true')
    seen = {}
    released = False
    until = started + (sick_wait if kind == 'sick' else 120 + (reboot_s if kind == 'xid_reboot' else 0))
    while time.monotonic() < until:
        state = bench.node_state()
        now = time.monotonic() - started
        # Drained, or drained for a reboot (reboot, reboot^ while slurmd is down).
        if state.startswith(('drain', 'reboot')) and 'drained' not in seen:
            seen['drained'] = now
        if kind == 'late_release' and 'drained' in seen and not released and now - seen['drained'] >= LATE_RELEASE_S:
            host.fault('stuck', gpu=GPU, mib=0)
            released = True
        # Back: idle and not drained once the job ran, or once the node drained for it came back
        # (from its reboot: slurmd started again).
        if state == 'idle' and (kind != 'late_release' or released) and (
                kind != 'xid_reboot' or [what for what, dummy in bench.reboots()[reboots:] if what == 'up']) and (
                'drained' in seen or bench.job(job).get('JobState') in ('COMPLETED', None)):
            seen['back'] = now
            break
        time.sleep(POLL_S)
    if kind == 'xid_reboot' and 'back' in seen:
        # Slurm resumed the node without a look at its GPUs: the Prolog of the next job is the first
        # check after the reboot. Not the requeued one, which Slurm holds back for two minutes (its
        # BeginTime): a job submitted now.
        bench.command('scancel', '--quiet', job, check=False)
        bench.sbatch('--gres=gpu:%d' % GPUS, '--output', '/dev/null', '--wrap', 'true')
        prove_until = time.monotonic() + 60
        while time.monotonic() < prove_until and not [report for report in reports_since(log, offset)
                                                      if report.get('outcome') in ('clean', 'released')]:
            time.sleep(POLL_S)
        downs = [when for what, when in bench.reboots()[reboots:] if what == 'down']
        if downs:
            seen['reboot'] = downs[0] - wall
    for report in reports_since(log, offset):
        if report.get('outcome') in ('clean', 'released') and isinstance(report.get('started'), (int, float)):
            at = report['started'] - wall
            seen.setdefault('cured', at + float(report.get('release_s') or 0))
            seen.setdefault('proven', at + float(report.get('duration_s') or 0))
    end = seen.get('back', time.monotonic() - started)
    lost = end - seen['drained'] if 'drained' in seen else 0.0
    # Each run on its own: no job, no fault, no history (its cures would hold the next runs' GPU).
    bench.command('scancel', '--full', '--quiet', '-u', 'root', check=False)
    clear_fault(host)
    history_type().for_host(host.root).clear('all')
    if os.path.exists(stamp):
        os.unlink(stamp)
    if bench.node_state() != 'idle':
        bench.command('scontrol', 'update', 'nodename=%s' % bench.node, 'state=resume', check=False)
    bench.wait_idle(60)
    return seen, lost


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def figure(values, runs):
    if not values:
        return '-'
    text = '%.1f / %.1f' % (statistics.median(values), percentile(values, 0.95))
    return text if len(values) == runs else '%s (%d of %d)' % (text, len(values), runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--runs', type=int, default=20, help='runs per class (default 20)')
    parser.add_argument('--classes', default=','.join(CLASSES), help='comma-separated, of %s' % ', '.join(CLASSES))
    parser.add_argument('--sick-wait', type=float, default=20.0, help='seconds each run of sick waits (default 20)')
    parser.add_argument('--reboot-s', type=float, default=10.0,
                        help='seconds the simulated reboot of xid_reboot takes, slurmd down (default 10)')
    # What the RebootProgram runs while slurmd is down: ROOT HOOKS.
    parser.add_argument('--reboot-host', nargs=2, metavar=('ROOT', 'HOOKS'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reboot_host:
        return reboot_host(*args.reboot_host)
    classes = [name for name in args.classes.split(',') if name]
    unknown = set(classes) - set(CLASSES)
    if unknown or args.runs < 1 or args.reboot_s < 0:
        parser.error('unknown class(es): %s' % ', '.join(sorted(unknown)) if unknown else
                     '--runs must be at least 1' if args.runs < 1 else '--reboot-s must be 0 or more')
    reexec_in_venv()
    reason = skip_reason()
    if reason:
        sys.exit(reason)

    directory = tempfile.mkdtemp(prefix='gpuops-service-bench-')
    os.chmod(directory, 0o711)
    host = Host(os.path.join(directory, 'gpuhost')).init(gpus=GPUS, idle_used_mib=0)
    # Where the host keeps the reboot stamp (the hook's default, /var/lib/gpuops/reboot-requested).
    stamp = os.path.join(host.root, 'var', 'lib', 'gpuops', 'reboot-requested')
    hooks = os.path.join(directory, 'hooks')
    bench = None
    try:
        deploy_hooks(hooks, {'gpu_reset_nvidia_smi_path': host.smi_path, 'gpu_reset_host_root': host.root,
                             'gpu_reset_lock_file': os.path.join(directory, 'release.lock'),
                             'gpu_reset_probe_cuda_library': host.install_cuda(), 'gpu_reset_grace_period': 1.0,
                             'gpu_reset_kernel_log': host.kernel_log, 'gpu_reset_allow_gpu_reset': True},
                     slurm_hooks_budget_s=30, slurm_hooks_prolog_epilog_timeout=60, slurm_hooks_health_check=False,
                     slurm_hooks_cure=True, slurm_hooks_cure_within_s=120, slurm_hooks_check_running_clocks=False)
        reboot = {}
        if 'xid_reboot' in classes:
            reboot = dict(reboot_s=args.reboot_s, reboot_while_down=[
                sys.executable, os.path.abspath(__file__), '--reboot-host', host.root, hooks])
        bench = SlurmBench(os.path.join(directory, 'slurm'), include=os.path.join(hooks, 'slurm-hooks.conf'),
                           prolog_epilog_timeout=60, **reboot)
        bench.start()
        log = os.path.join(hooks, 'hook.log')
        results = {}
        for kind in classes:
            if kind == 'late_release':
                set_conf(hooks, 'gpu_reset_allow_gpu_reset', False)
            if kind == 'xid_reboot':
                set_hook_conf(hooks, REBOOT='asap', REBOOT_STAMP=stamp)
            results[kind] = [one_run(bench, host, log, kind, args.sick_wait, args.reboot_s, stamp)
                             for dummy in range(args.runs)]
            set_conf(hooks, 'gpu_reset_allow_gpu_reset', True)
            set_hook_conf(hooks, REBOOT='no')
        print('Slurm %s, node %s, %d runs per class, load average %.1f at the end; seconds from the job\'s '
              'submission (the fault put in place just before), p50 / p95:' % (
                  bench.command('sinfo', '-V').stdout.split()[-1], bench.node, args.runs, os.getloadavg()[0]))
        header = ('class', 'drained', 'cured', 'proven', 'back in service', 'node-seconds lost')
        print('  %-13s %-16s %-16s %-16s %-16s %s' % header)
        for kind in classes:
            runs = results[kind]
            cells = [figure([seen[step] for seen, dummy in runs if step in seen], args.runs) for step in STEPS]
            lost = [lost for dummy, lost in runs]
            print('  %-13s %-16s %-16s %-16s %-16s %.1f / %.1f' % ((kind,) + tuple(cells) + (
                statistics.median(lost), percentile(lost, 0.95))))
        if 'xid_reboot' in classes:
            runs = results['xid_reboot']
            print('  xid_reboot: simulated reboot %g s (slurmd down); back in service less the reboot %s; '
                  'reboot (slurmd stopped) %s' % (
                      args.reboot_s, figure([seen['back'] - args.reboot_s for seen, dummy in runs if 'back' in seen],
                                            args.runs),
                      figure([seen['reboot'] for seen, dummy in runs if 'reboot' in seen], args.runs)))
        print('(a step a run never reached is counted in none: "(N of RUNS)" says how many reached it; '
              'sick is never back by itself, its node-seconds lost run to the end of its %g s wait)' % args.sick_wait)
    finally:
        if bench is not None:
            bench.stop()
        host.stop()
        kill_cures(hooks)
        shutil.rmtree(directory, ignore_errors=True)


def set_conf(hooks, name, value):
    """A gpu_reset_* variable of the installed hook's gpu_reset.yml."""
    import yaml

    path = os.path.join(hooks, 'gpu_reset.yml')
    with open(path) as handle:
        values = yaml.safe_load(handle)
    values[name] = value
    with open(path, 'w') as handle:
        yaml.safe_dump(values, handle)


def set_hook_conf(hooks, **settings):
    """GPU_RESET_<NAME>=value settings of the installed hook's gpu-reset-hook.conf."""
    path = os.path.join(hooks, 'gpu-reset-hook.conf')
    with open(path) as handle:
        lines = handle.read().splitlines()
    for name, value in settings.items():
        key = 'GPU_RESET_%s=' % name
        lines = [line for line in lines if not line.startswith(key)] + [key + str(value)]
    with open(path, 'w') as handle:
        handle.write('\n'.join(lines) + '\n')


def kill_cures(hooks):
    """The cures the hooks started that still run (none should, once the node is idle)."""
    subprocess.run(['pkill', '-KILL', '-f', os.path.join(hooks, 'gpu-reset-hook.sh') + ' cure'], check=False)


if __name__ == '__main__':
    main()
