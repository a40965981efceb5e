# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset sequence without ansible-playbook, for Slurm's Prolog and Epilog.

A Prolog runs before every job, so its start-up counts: ansible-playbook alone takes longer to
start than the release takes on a clean node. This program runs the one sequence
(plugin_utils/_sequence.py, the action gpuops.nvidia.gpu_reset's) on the node itself, its
modules in children forked from it (_hook/reset.py), then its finishing steps (_finish.py):

1. the settings: the spec's defaults (plugin_utils/_spec.py), then the hook's
   variables file, then what the hook fixes (the job's GPUs, the release's time, drain on
   failure), checked by the sequence as the action checks them;
2. the sequence: release, read again when the release did not leave the GPUs clean, judge, and
   prove the GPUs judged clean by allocation (gpu_reset_probe, on by default, in the release's own
   module call; gpu_reset_probe_mib). A host without libcuda.so.1 is probed with a note in the report, not
   drained (gpu_reset_probe_missing_library: fail drains it);
3. on failure, the role's default drain command (scontrol ... state=drain reason="gpu_reset: <why>");
   then the node_exporter metrics and the JSON report, when asked for.

    python -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook \\
        --node NODE [--vars-file FILE] [--gpus 0,1 [--gres-conf FILE]] [--timeout S] [--deadline S] [--scontrol PATH]
        [--reboot [--reboot-stamp FILE]] [--max-drained N|N% [--max-drain-rate N/W]] [--observe]
        [--health-check [--cure-within S]] [--playbook-vars FILE]
    python -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook \\
        --node NODE --evidence-then-reboot DIR [--evidence-timeout S] [--evidence-program PATH] [--scontrol PATH]
    python -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook \\
        --clear-history GPU-UUID|all [--vars-file FILE]

Exit status: 0 clean or released (or anything, with --observe); 10 failed, the node drained with
the reason; 11 failed and the drain command failed too (the report says why); 12 failed, and left
in service by the fleet brake (--max-drained, --max-drain-rate: _brake.py); the reason on stderr and the report on
stdout; 2 the settings or the arguments could not be read (nothing done); 3 the settings need
the playbook (a clean query of the user's own, a drain command of the user's own, or a templated
value): the hook then runs ansible-playbook instead. Never 1, which is what Python itself exits
with when it crashes or cannot import the collection.

With --reboot, a node whose GPUs only a reboot cures (a GPU whose recovery action is reboot: lost,
fallen off the bus, the driver's word) is not drained but rebooted by Slurm once its jobs have ended
(scontrol reboot ASAP nextstate=resume, which needs RebootProgram), at most once a day (the stamp
file); a fault that comes back sooner is drained for a person. The node is drained for the reboot
first, and a process of its own session (--evidence-then-reboot DIR) collects nvidia-bug-report.sh
outside the hook's time, then asks Slurm for the reboot, the report's path in the reason.

With --health-check it is Slurm's HealthCheckProgram (_hook/health.py); with --cure-within S too, the
cure the hook starts at once when it drains a node (gpu-reset-hook.sh cure).

A GPU whose fault comes back after gpu_reset_hold_after_cures cures (resets, reboots asked for)
within gpu_reset_hold_window_days (its history, module_utils/_state/history.py) is not reset or rebooted
again: the node is drained for a person (gpu_reset(hold): ...), which the health check never
resumes. An operator returns it with --clear-history GPU-UUID (or all), then scontrol update
nodename=NODE state=resume.

With --playbook-vars FILE it only writes the variables the hook fixes (on_failure, timeout, the
job's GPUs, parsed here as for the module runner) to FILE as JSON, for ansible-playbook -e @FILE.

Unlike the role in a fleet run, a misconfigured node is drained too, with the reason: a Prolog
or Epilog that fails drains the node anyway, only with a reason that says nothing.

This file reads the arguments; main() imports only the mode it runs: a job's Prolog or Epilog
(_hook/job.py, through the sequence of _hook/reset.py), the health check (_hook/health.py), the
playbook runner's variables (_hook/playbook.py) or --clear-history (_hook/history.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import sys
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._brake import drain_rate_problem, max_drained_problem
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.status import RUNNER_NEEDS_PLAYBOOK, RUNNER_SETTINGS_UNREADABLE

REBOOT_STAMP = '/var/lib/gpuops/reboot-requested'
# The longest a cure started at once may wait and try (an hour: a node drained longer is the
# health check's).
MAX_CURE_WITHIN_S = 3600


def max_drained_argument(text):
    """--max-drained: a number of nodes, or a percentage of the cluster's (N%)."""
    problem = max_drained_problem(text)
    if problem:
        raise argparse.ArgumentTypeError('GPU_RESET_MAX_DRAINED: %s' % problem)
    return text


def drain_rate_argument(text):
    """--max-drain-rate: at most N nodes drained by gpu_reset within a window (5/10m)."""
    problem = drain_rate_problem(text)
    if problem:
        raise argparse.ArgumentTypeError('GPU_RESET_MAX_DRAIN_RATE: %s' % problem)
    return text


def cure_within_argument(text):
    """--cure-within: seconds, more than 0, at most MAX_CURE_WITHIN_S."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= MAX_CURE_WITHIN_S:
        raise argparse.ArgumentTypeError('GPU_RESET_CURE_WITHIN_S: %s is not a number of seconds above 0 and at most %d'
                                         % (printable(text, 40), MAX_CURE_WITHIN_S))
    return seconds


def gpus_argument(text):
    """gpu_list for argparse: its message as the error, no traceback (imported here: _hook_job
    brings the whole sequence, which only a job's run needs)."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.job import gpu_list

    try:
        return gpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='gpu-reset-hook', description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--node', help='the Slurm node name (SLURMD_NODENAME); required but with --clear-history')
    parser.add_argument('--vars-file', help='YAML file of gpu_reset_* variables')
    parser.add_argument('--gpus', type=gpus_argument,
                        help="the job's GPUs as Slurm numbers them (SLURM_JOB_GPUS: their places in gres.conf), "
                             'mapped through gres.conf to nvidia-smi indexes; every GPU when not given')
    parser.add_argument('--gres-conf', help="the node's gres.conf (default: gres.conf beside $SLURM_CONF, "
                                            'or /etc/slurm/gres.conf)')
    parser.add_argument('--timeout', type=float, help='gpu_reset_timeout, the seconds the release may take')
    parser.add_argument('--deadline', type=float, default=60, help='seconds the whole run may take')
    parser.add_argument('--scontrol', default='scontrol', help='the scontrol command')
    parser.add_argument('--reboot', action='store_true',
                        help='when only a reboot cures the GPUs, ask Slurm for one (scontrol reboot ASAP '
                             'nextstate=resume) instead of a drain')
    parser.add_argument('--reboot-stamp', default=REBOOT_STAMP,
                        help='the file that notes the last reboot asked for (default %(default)s)')
    parser.add_argument('--health-check', action='store_true',
                        help="Slurm's HealthCheckProgram: return the node to service when this collection "
                             'drained it, it runs no job and its GPUs are clean again')
    parser.add_argument('--cure-within', type=cure_within_argument, metavar='S',
                        help='with --health-check: the cure the hook starts at once when it drains the node, outside '
                             'the job\'s time: wait while a job still ends there, and check again while the GPUs may '
                             'yet be found clean, for at most S seconds')
    parser.add_argument('--evidence-then-reboot', metavar='DIR',
                        help='collect nvidia-bug-report.sh into DIR, then ask Slurm for the reboot of a node still '
                             'drained for it (what the hook starts, outside its own time, before a reboot)')
    parser.add_argument('--evidence-timeout', type=float, default=120.0, help='seconds the report may take')
    parser.add_argument('--evidence-program', default='nvidia-bug-report.sh', help='the report program')
    parser.add_argument('--max-drained', type=max_drained_argument,
                        help='the fleet brake (GPU_RESET_MAX_DRAINED): past this many nodes, or this percentage of '
                             "the cluster's (N%%), out of service for gpu_reset, a node that is not clean but can run "
                             "jobs is left in service and reported (default: gpu_reset_max_drained's)")
    parser.add_argument('--max-drain-rate', type=drain_rate_argument,
                        help='the fleet brake\'s rate (GPU_RESET_MAX_DRAIN_RATE, with --max-drained): past N nodes '
                             'drained by gpu_reset within a window (N/W, W in s, m or h, such as 5/10m), as past the cap')
    parser.add_argument('--observe', action='store_true',
                        help='GPU_RESET_MODE=observe: read, decide and report what would be signalled, reset, '
                             'drained or resumed; change nothing')
    parser.add_argument('--playbook-vars', metavar='FILE',
                        help="only write the hook's variables to FILE as JSON, for ansible-playbook -e @FILE")
    parser.add_argument('--clear-history', metavar='UUID|all',
                        help="forget a GPU's history (all: every GPU's), under the variables file's gpu_reset_host_root: "
                             'with scontrol update nodename=NODE state=resume, what returns a GPU held for a person to service')
    args = parser.parse_args(argv)
    if not args.node and not args.clear_history:
        parser.error('the following arguments are required: --node')
    if args.cure_within and not args.health_check:
        parser.error('--cure-within is a mode of --health-check')
    return args


def main(argv=None):
    started = time.monotonic()
    args = parse_args(argv)
    if args.clear_history:
        from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.history import clear_history
        return clear_history(args)
    if args.evidence_then_reboot:
        from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.health import evidence_then_reboot
        return evidence_then_reboot(args)
    if args.playbook_vars:
        from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.playbook import playbook_vars
        return playbook_vars(args)
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.vars import NeedsPlaybook, hook_vars, load_settings
    try:
        if args.health_check:
            from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.health import health_check
            return health_check(args)
        settings = load_settings(args.vars_file, hook_vars(args))
    except NeedsPlaybook as exc:
        sys.stderr.write('gpu_reset: %s needs the playbook\n' % exc)
        return RUNNER_NEEDS_PLAYBOOK
    except (OSError, ValueError) as exc:
        sys.stderr.write('gpu_reset: cannot read the settings: %s\n' % printable(str(exc)))
        return RUNNER_SETTINGS_UNREADABLE
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.job import reset_for_job
    return reset_for_job(args, settings, started)


if __name__ == '__main__':
    sys.exit(main())
