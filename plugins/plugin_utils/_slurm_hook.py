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
modules run as programs (run_module below), then its finishing steps (_finish.py):

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
        [--reboot [--reboot-stamp FILE]] [--max-drained N|N% [--max-drain-rate N/W]] [--observe] [--health-check]
        [--playbook-vars FILE]
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
file); a fault that comes back sooner is drained for a person.

With --health-check it is Slurm's HealthCheckProgram (health_check below).

A GPU whose fault comes back after gpu_reset_hold_after_cures cures (resets, reboots asked for)
within gpu_reset_hold_window_days (its history, module_utils/_history.py) is not reset or rebooted
again: the node is drained for a person (gpu_reset(hold): ...), which the health check never
resumes. An operator returns it with --clear-history GPU-UUID (or all), then scontrol update
nodename=NODE state=resume.

With --playbook-vars FILE it only writes the variables the hook fixes (on_failure, timeout, the
job's GPUs, parsed here as for the module runner) to FILE as JSON, for ansible-playbook -e @FILE.

Unlike the role in a fleet run, a misconfigured node is drained too, with the reason: a Prolog
or Epilog that fails drains the node anyway, only with a reason that says nothing.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import json
import os
import re
import sys
import tempfile
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import is_driver_hung
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _brake, _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._brake import (
    SINFO_ENV,
    BrakeUnreadable,
    drain_rate_problem,
    max_drained_problem,
    sinfo_argv,
)
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_command
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import HostError, finish, run_drain, write_file
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._sequence import ModuleError
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import DRAIN_COMMAND, PREFIX, defaults

# The runner's exit statuses (gpu-reset-hook.sh maps them to its own, see examples/slurm/README.md).
# Not 1: that is what a Python that crashes or cannot import the collection exits with, and it
# must never read as "drained with the reason".
RUNNER_SETTINGS_UNREADABLE = 2
RUNNER_NEEDS_PLAYBOOK = 3
RUNNER_DRAINED = 10
RUNNER_NOT_DRAINED = 11
# Not clean, and left in service: the fleet brake held (too many nodes drained by gpu_reset).
RUNNER_BRAKE_HELD = 12

MODULES = 'ansible_collections.gpuops.nvidia.plugins.modules.'
# plugins/plugin_utils/_slurm_hook.py -> the collection, and the directory that holds ansible_collections/
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION)))
# The role's metrics, one template for both.
# Seconds kept for the drain command at the end of the hook's time (at most a tenth of it).
DRAIN_RESERVE_S = 5
# A module still running at its deadline gets SIGTERM, then this long before SIGKILL (at most a
# tenth of the hook's time): the release turns SIGTERM into an exit through its finally blocks,
# which start again the units it stopped for a GPU reset. Asking systemd to start them takes a
# fraction of a second, and systemd finishes a start job even when the systemctl that asked is
# killed. The modules' own timeouts end this much before their deadline.
TERM_GRACE_S = 5
# The hook's own defaults over the spec's: the probe is on.


class NeedsPlaybook(Exception):
    """A setting that only the playbook can honour."""


def load_settings(vars_file=None, overrides=None):
    """The spec's defaults, the variables file, then overrides: {gpu_reset_name: value}."""
    import yaml

    settings = dict((PREFIX + name, value) for name, value in defaults().items())
    if vars_file:
        with open(vars_file) as handle:
            try:
                given = yaml.safe_load(handle) or {}
            except yaml.YAMLError as exc:
                raise ValueError('%s is not valid YAML: %s' % (vars_file, ' '.join(str(exc).split())))
        if not isinstance(given, dict):
            raise ValueError('%s must be a YAML mapping of gpu_reset_* variables' % vars_file)
        for name, value in given.items():
            if name == 'gpu_reset_drain_command' and value != DRAIN_COMMAND:
                raise NeedsPlaybook('a gpu_reset_drain_command of your own')
            if name == 'gpu_reset_clean_query' and value is not None:
                raise NeedsPlaybook('a gpu_reset_clean_query of your own')
            if '{{' in json.dumps(value) or '{%' in json.dumps(value):
                raise NeedsPlaybook('a templated value (%s)' % name)
            settings[name] = value
    settings.update(overrides or {})
    return settings


class ModuleRunner:
    """The sequence's seam on the node: a module of the collection run as a program, within the
    time left before ends (time.monotonic()); in check mode when check_mode (as Ansible runs it).
    A module still running grace seconds before ends gets SIGTERM, and SIGKILL at ends."""

    def __init__(self, ends, check_mode=False, grace=0.0):
        self.ends = ends
        self.check_mode = check_mode
        self.grace = grace

    def __call__(self, name, args):
        """The module's result (a dict; one that failed too, with failed and msg); ModuleError
        when it gives none (stopped at the deadline, with what it started, or a crash)."""
        from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
        from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Runner

        if self.check_mode:
            args = dict(args, _ansible_check_mode=True)
        with tempfile.NamedTemporaryFile('w', prefix='gpuops-args-', suffix='.json', delete=False) as handle:
            json.dump({'ANSIBLE_MODULE_ARGS': args}, handle)
        runner = Runner(sys.executable, name='gpuops.nvidia.%s' % name, term_grace=self.grace, env={
            'PYTHONPATH': COLLECTIONS_ROOT + (os.pathsep + os.environ['PYTHONPATH'] if os.environ.get('PYTHONPATH') else '')})
        try:
            rc, stdout, stderr = runner.run(['-m', MODULES + name, handle.name],
                                            timeout=max(self.ends - self.grace - time.monotonic(), 1))
        except CommandTimeout as exc:
            raise ModuleError('gpuops.nvidia.%s gave no result within %.1f s and was stopped%s' % (
                name, exc.timeout, ' (SIGTERM, then SIGKILL after %.1f s)' % self.grace if self.grace else ''))
        except GpuopsError as exc:
            raise ModuleError(str(exc))
        finally:
            os.unlink(handle.name)
        out = stdout.strip()
        try:
            result = json.loads(out[out.index('{'):])
        except ValueError:
            raise ModuleError('gpuops.nvidia.%s gave no result (rc %d): %s' % (name, rc, ' '.join((stderr or out).split())[-500:]))
        if not isinstance(result, dict):
            raise ModuleError('gpuops.nvidia.%s gave no result (rc %d)' % (name, rc))
        return result


class NodeHost:
    """The finishing steps' seam (_finish.py) on the node itself."""

    @staticmethod
    def command(argv, seconds):
        from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
        from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

        try:
            rc, dummy, stderr = Runner(argv[0]).run(argv[1:], timeout=seconds)
        except GpuopsError as exc:
            raise HostError(str(exc))
        return rc, stderr

    @staticmethod
    def write(path, text):
        write_file(path, text)


def drain(result, scontrol, node, seconds, argv=None, hold=False):
    """Run the drain command (or argv, a command that drains the node too) and note it in the
    report as the role does. hold: drained for a person (_drain.HOLD_PREFIX), which the health
    check never resumes; the report says so (held_for_person)."""
    if hold:
        result['held_for_person'] = True
    return run_drain(result, NodeHost, argv or drain_command(scontrol, node, result['reason'], hold), seconds)


# -- a reboot when only a reboot helps ---------------------------------------------------------

# A reboot-only fault that comes back within this many seconds of the last reboot the hook asked
# for is drained for a person: a GPU that a reboot does not cure would otherwise reboot the node
# after every job.
REBOOT_AT_MOST_EVERY_S = 24 * 3600
# How the reason of a node drained for a person starts (after the hold prefix, _drain.HOLD_PREFIX):
# a reboot was not asked for, or did not cure it. The health check leaves such a node drained, and
# one drained so by an older version (after the drain prefix) too.
NOT_REBOOTED = 'not rebooted ('


def reboot_cures(result):
    """Whether a GPU of the report needs a reboot (its recovery action: fallen off the bus, lost,
    the driver's own word, a reset the platform refused), or the host does (a driver hung where
    no GPU could be named: driver_hung); a reboot cures what a GPU reset would cure, too."""
    return any(gpu.get('recovery_action') == 'reboot' for gpu in result.get('gpus') or []) \
        or is_driver_hung(result.get('reason'))


def reboot_command(scontrol, node, reason):
    """scontrol reboot ASAP nextstate=resume: Slurm drains the node, runs its RebootProgram once
    the node's jobs have ended, and resumes it when it comes back."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_reason

    return [scontrol, 'reboot', 'ASAP', 'nextstate=resume', 'reason=' + drain_reason(reason), node]


def boot_time():
    """When this host booted (time.time(), /proc/stat's btime); None when it cannot be told."""
    try:
        with open('/proc/stat') as handle:
            for line in handle:
                if line.startswith('btime '):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def why_not_reboot(node, stamp, boot=None, now=None):
    """Why the hook drains the node instead of asking for a reboot, or None. A reboot asked for
    since this boot is still to come: asked for again. One asked for before this boot, less than
    REBOOT_AT_MOST_EVERY_S ago, did not cure the GPUs: a person looks."""
    if not NODE_NAME_RE.match(node) or node.upper() == 'ALL':
        return '%s is not one node name that scontrol reboot may be given' % printable(node, 100)
    try:
        asked = os.stat(stamp).st_mtime
    except OSError:
        return None
    boot = boot_time() if boot is None else boot
    now = time.time() if now is None else now
    if boot is not None and asked < boot and now - asked < REBOOT_AT_MOST_EVERY_S:
        return 'a reboot asked for at %s did not cure it' % time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(asked))
    return None


def ask_reboot(result, scontrol, node, seconds, stamp, history=None):
    """Ask Slurm to reboot the node (reboot_command), noting it in stamp and in the GPUs'
    history; drain it for a person instead (a hold) when a GPU's fault is back after its cures
    (reboot_held), when why_not_reboot says so or the reboot command fails."""
    history, settings = history or (None, {})
    held = reboot_held(result, history, settings)
    if held:
        result['held'] = held
        result['reason'] = '; '.join([entry['reason'] for entry in held] + [result['reason']])
        history.record([(entry['uuid'], entry['index'], entry['reason']) for entry in held], 'cure_failed')
        return drain(result, scontrol, node, seconds, hold=True)
    why = why_not_reboot(node, stamp)
    if why is None:
        drain(result, scontrol, node, seconds / 2.0, argv=reboot_command(scontrol, node, result['reason']))
        if result['drained']:
            result['reboot_requested'] = True
            if history is not None:
                history.record([(uuid, gpu.get('index'), result['reason'], gpu.get('pci_bus_id'))
                                for gpu, uuid in reboot_gpus(result, history)], 'reboot_asked')
            return note_reboot(result, stamp)
        why = 'the reboot command failed'
    # First, where a reason cut to its length for sinfo -R keeps it.
    result['reason'] = '%s%s): %s' % (NOT_REBOOTED, why, result['reason'])
    return drain(result, scontrol, node, seconds / 2.0, hold=True)


def hook_history(options):
    """(the node's GPU history, under host_root; {hold_after_cures, hold_window_days}) of the
    run's options (checked and converted by the sequence)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._history import History

    root = options.get('host_root')
    return History.for_host(root if isinstance(root, str) and root else '/'), dict(
        (name, options.get(name)) for name in ('hold_after_cures', 'hold_window_days'))


def reboot_gpus(result, history):
    """[(GPU row of the report, its UUID)] of the GPUs only a reboot cures whose UUID is known (a
    lost GPU's, from its PCI bus id in its history)."""
    found = []
    for gpu in result.get('gpus') or []:
        if gpu.get('recovery_action') == 'reboot':
            uuid = gpu.get('uuid') or history.uuid_at(gpu.get('pci_bus_id'))
            if uuid:
                found.append((gpu, uuid))
    return found


def reboot_held(result, history, settings):
    """The GPUs only a reboot cures whose fault is back after their cures (_history.hold_reason):
    [{index, uuid, reason}], not rebooted again."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._history import HOLD_AFTER_CURES, HOLD_WINDOW_DAYS

    if history is None:
        return []
    held = []
    for gpu, uuid in reboot_gpus(result, history):
        why = history.hold_reason(uuid, gpu.get('index'), 'needs a reboot (%s)' % (gpu.get('state') or 'its health'),
                                  settings.get('hold_after_cures') or HOLD_AFTER_CURES,
                                  settings.get('hold_window_days') or HOLD_WINDOW_DAYS)
        if why:
            held.append({'index': gpu.get('index'), 'uuid': uuid, 'reason': why})
    return held


def note_reboot(result, stamp):
    try:
        os.makedirs(os.path.dirname(stamp), mode=0o700, exist_ok=True)
        write_file(stamp, '%s\n' % result['reason'])
    except OSError as exc:
        result['reason'] = '%s; the reboot could not be noted in %s: %s' % (result['reason'], stamp, exc)
    return result


def reset(settings, node, scontrol, deadline, why_not_drain=None, reboot_stamp=None, refused=None, budget=None,
          observe=False, max_drained=None, drain_rate=None):
    """The sequence on one node, then its finishing steps; returns its report (gpu_reset_result).

    why_not_drain: called before draining a node that is not clean; a reason (text) not to
    drain it after all is noted in the report (drain_skipped) instead. reboot_stamp: ask Slurm
    for a reboot instead of a drain when only a reboot cures the GPUs (ask_reboot). refused: why
    nothing may be released (the job's GPUs could not be told): the node is failed with it.
    budget: (time.monotonic() when the hook started, its seconds), for the metrics (default:
    this call's own). observe: decide and report, change nothing (the sequence in check mode:
    nothing signalled or reset, the node not drained: the report says would_drain). max_drained:
    the fleet brake's count (brake_holds), None for none; drain_rate: its rate (N/W), None for none."""
    started, budget_s = budget or (time.monotonic(), deadline)
    ends = time.monotonic() + deadline
    # The modules end that much before the hook's time does, for the drain command.
    modules_end = ends - min(DRAIN_RESERVE_S, deadline / 10.0)
    # A module still running grace seconds before that gets SIGTERM first (TERM_GRACE_S).
    grace = min(TERM_GRACE_S, deadline / 10.0)
    run = _sequence.Run(node, dict((name[len(PREFIX):], value) for name, value in settings.items()),
                        ModuleRunner(modules_end, check_mode=observe, grace=grace), check_mode=observe,
                        name=lambda option: PREFIX + option,
                        deadline=modules_end - grace)
    if refused is None:
        _sequence.run(run)
    else:
        refuse(run, refused)

    def drain_node(result, drain_timeout):
        skip = why_not_drain() if why_not_drain else None
        seconds = min(drain_timeout, max(ends - time.monotonic(), 1))
        if skip:
            result['drained'], result['drain_skipped'] = False, skip
        elif max_drained and brake_holds(result, scontrol, node, max_drained, min(SLURM_CALL_S, seconds / 2.0), drain_rate):
            result['drained'] = False
        elif result.get('held'):
            # A fault back after its cures (the release did not reset it): for a person.
            drain(result, scontrol, node, seconds, hold=True)
        elif reboot_stamp and reboot_cures(result):
            ask_reboot(result, scontrol, node, seconds, reboot_stamp, hook_history(run.options or {}))
        else:
            drain(result, scontrol, node, seconds)

    # A misconfigured node is drained too: its next job would run on it.
    result = finish(run, NodeHost, drain_node, drain_misconfigured=True,
                    hook=lambda: {'budget_s': budget_s, 'duration_s': round(time.monotonic() - started, 3)})
    if result.get('would_drain') and reboot_stamp and reboot_cures(result):
        result['would_reboot'] = True
    return result


# -- the fleet brake (plugin_utils/_brake.py decides) ---------------------------------------------

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


def read_listing(scontrol, seconds):
    """sinfo's listing for the brake (_brake.sinfo_argv), within seconds; BrakeUnreadable when
    sinfo cannot tell."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
    from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

    argv = sinfo_argv(slurm_command(scontrol, 'sinfo'))
    try:
        rc, stdout, stderr = Runner(argv[0], env=SINFO_ENV).run(argv[1:], timeout=max(seconds, 1))
    except GpuopsError as exc:
        raise BrakeUnreadable(printable(str(exc), 300))
    if rc != 0:
        raise BrakeUnreadable('sinfo failed (rc %d): %s' % (rc, printable(stderr.strip(), 300)))
    return stdout


def brake_holds(result, scontrol, node, max_drained, seconds, drain_rate=None):
    """_brake.brake_holds over this node's sinfo."""
    return _brake.brake_holds(result, node, lambda: read_listing(scontrol, seconds), max_drained, drain_rate)


def refuse(run, why):
    """The report of a run that releases nothing, failed with why; its settings checked, for the
    finishing steps."""
    _sequence.check_settings(run)
    run.error = '; '.join(part for part in (why, run.error) if part)
    run.misconfigured = True
    _sequence.judge(run)
    run.report['steps'] = []
    return run.report


# One part of SLURM_JOB_GPUS: an index or a range of them, ASCII digits only.
GPU_PART_RE = re.compile(r'^\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?$')


def gpu_list(text):
    """Slurm's SLURM_JOB_GPUS (0,1,5; ranges such as 0-3,6 too) as a list of its numbers, each once:
    the places of the job's GPUs in gres.conf (job_gpus makes them nvidia-smi indexes).

    For both runners. ValueError, naming the part, for anything else, and for a number past the
    MAX_GPUS (64) a node can have: checked before a range is expanded, so 0-2000000 costs nothing."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._smi import MAX_GPUS

    indexes = []
    for part in text.split(','):
        indexes.extend(index for index in _gpu_range(part, MAX_GPUS) if index not in indexes)
    return indexes


def _gpu_range(part, limit):
    """The indexes of one part of SLURM_JOB_GPUS (5, or 0-3), each below limit; ValueError if not."""
    match = GPU_PART_RE.match(part)
    if not match:
        raise ValueError("SLURM_JOB_GPUS: '%s' is not a GPU index or a range of them (such as 0,1,5 or 0-3,6)"
                         % printable(part, 40))
    first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if last < first:
        raise ValueError('SLURM_JOB_GPUS: the range %d-%d ends before it starts' % (first, last))
    if last >= limit:
        raise ValueError('SLURM_JOB_GPUS: GPU %d is past the %d GPUs a node can have (indexes 0-%d)'
                         % (last, limit, limit - 1))
    return range(first, last + 1)


def gpus_argument(text):
    """gpu_list for argparse: its message as the error, no traceback."""
    try:
        return gpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def hook_vars(args, gpus=None, job=None):
    """The variables the hook fixes, over the variables file: drain on failure, the release's
    time, the job's GPUs (nvidia-smi indexes, job_gpus) and the job itself (job_setting)."""
    found = {'gpu_reset_on_failure': 'drain'}
    if gpus is not None:
        found['gpu_reset_gpus'] = gpus
    if job is not None:
        found['gpu_reset_job'] = job
    if args.timeout is not None:
        found['gpu_reset_timeout'] = args.timeout
    return found


def job_gpus(args, host_root, environ=None):
    """(the nvidia-smi indexes of the job's GPUs and its MIG instances, None for every GPU; why they
    cannot be told, or None): SLURM_JOB_GPUS through the node's gres.conf (plugin_utils/_gres.py),
    or the MIG UUIDs of CUDA_VISIBLE_DEVICES when gres.conf cannot tell; the mapping said on
    stderr, for the hook's log."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._gres import GresError, gres_conf_path, job_gpu_indexes

    if args.gpus is None:
        return None, None
    try:
        indexes, note = job_gpu_indexes(args.gpus, args.node, args.gres_conf or gres_conf_path(),
                                        host_root if isinstance(host_root, str) and host_root else '/')
    except GresError as exc:
        problem = 'SLURM_JOB_GPUS=%s: %s' % (','.join(str(gpu) for gpu in args.gpus), exc)
        instances = mig_uuids(environ)
        if not instances:
            return None, problem
        indexes, note = instances, '%s; CUDA_VISIBLE_DEVICES names MIG instances %s, released as those' % (
            problem, ','.join(instances))
    sys.stderr.write('gpu_reset: %s\n' % note)
    return indexes, None


def mig_uuids(environ=None):
    """The MIG UUIDs of CUDA_VISIBLE_DEVICES when it names only MIG instances (as slurmd sets it for
    a MIG GRES), else []. The release finds them among the instances the driver lists, or fails."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._scope import MIG_UUID_RE

    environ = os.environ if environ is None else environ
    names = [name.strip() for name in environ.get('CUDA_VISIBLE_DEVICES', '').split(',')]
    return names if names != [''] and all(MIG_UUID_RE.match(name) for name in names) else []


# -- the job the hook runs for, and the other jobs on the node ----------------------------------

JOB_ID_RE = re.compile(r'^[0-9]{1,12}$')
# What scontrol listpids says (exit 1) on a node where no job runs a step.
NO_STEPS = 'No job steps exist on this node'


def job_setting(args, gpus, host_root, environ=None):
    """The release's job option (see nvidia_device_release) for the job slurmd runs the hook for
    (SLURM_JOB_ID, SLURM_JOB_UID), or None outside a job: which of its GPUs Slurm shares with other
    jobs (gres.conf's Name=shard and Name=mps lines), and the jobs still on the node with their
    pids (scontrol listpids, from the node's own slurmd). What cannot be read is said on stderr and
    taken the safe way: a GPU whose sharing cannot be told is shared, jobs that cannot be listed
    are all live."""
    environ = os.environ if environ is None else environ
    job_id = environ.get('SLURM_JOB_ID', '')
    if not JOB_ID_RE.match(job_id):
        if job_id:
            sys.stderr.write('gpu_reset: SLURM_JOB_ID %s is not a job id: released as for no job\n' % printable(job_id, 40))
        return None
    uid = environ.get('SLURM_JOB_UID', '')
    return {'id': job_id, 'uid': int(uid) if uid.isdigit() and len(uid) < 11 else None,
            'shared_gpus': shared_gpus(args, gpus, host_root),
            'live_jobs': live_jobs(args.scontrol, min(SLURM_CALL_S, (args.deadline or 60) / 10.0))}


def shared_gpus(args, gpus, host_root):
    """The GPUs of gpus (None: every GPU) that gres.conf shares between jobs."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._gres import GresError, gres_conf_path, shared_gpu_indexes

    path = args.gres_conf or gres_conf_path()
    if gpus is None and not os.path.exists(path):
        return []
    try:
        found = shared_gpu_indexes(args.node, path, host_root if isinstance(host_root, str) and host_root else '/')
    except GresError as exc:
        if gpus is None:
            sys.stderr.write('gpu_reset: which GPUs Slurm shares cannot be told (%s): taken as none\n' % exc)
            return []
        sys.stderr.write("gpu_reset: whether the job's GPUs are shared cannot be told (%s): taken as shared\n" % exc)
        return [gpu for gpu in gpus if isinstance(gpu, int)]
    shared = [index for index in found if gpus is None or index in gpus]
    if shared:
        sys.stderr.write('gpu_reset: GPU %s shared with other jobs (gres.conf): only the job\'s own processes are '
                         'released there\n' % ','.join(str(index) for index in shared))
    return shared


def live_jobs(scontrol, seconds):
    """{job id: [pids]} of the jobs slurmd runs on this node (scontrol listpids), or None when it
    cannot be asked."""
    try:
        rc, stdout, stderr = slurm_call([scontrol, 'listpids'], seconds)
    except SlurmUnreadable as exc:
        rc, stderr = None, str(exc)
    if rc != 0 and NO_STEPS in (stderr or ''):
        return {}
    if rc != 0:
        sys.stderr.write('gpu_reset: scontrol listpids failed (%s): every job a cgroup names counts as live\n'
                         % printable((stderr or '').strip() or 'rc %s' % rc, 200))
        return None
    return parse_listpids(stdout)


def parse_listpids(text):
    """{job id: [pids]} of scontrol listpids' table (PID JOBID STEPID LOCALID GLOBALID); lines
    that are not a pid and a job id are left out."""
    jobs = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit() and JOB_ID_RE.match(parts[1]) and int(parts[0]) > 1:
            jobs.setdefault(parts[1], []).append(int(parts[0]))
    return jobs


# The role's fleet brake in the hook's playbook runner: every node, which never holds (the node
# itself is not counted).
PLAYBOOK_RUNNER_MAX_DRAINED = '100%'


def playbook_vars(args):
    """--playbook-vars: the hook's variables for ansible-playbook; when the job's GPUs cannot be
    told, the node drained with why instead (RUNNER_DRAINED or RUNNER_NOT_DRAINED)."""
    host_root = host_root_of(args.vars_file)
    gpus, problem = job_gpus(args, host_root)
    if problem is None:
        variables = hook_vars(args, gpus, job_setting(args, gpus, host_root))
        # ansible-playbook exits 2 whether the role drained the node or its brake held it, and
        # Slurm drains a node whose Prolog fails, with a reason that says nothing: no brake here.
        variables[PREFIX + 'max_drained'] = PLAYBOOK_RUNNER_MAX_DRAINED
        return write_playbook_vars(args.playbook_vars, variables)
    result = drain({'host': args.node, 'outcome': 'failed', 'reason': problem}, args.scontrol, args.node, SLURM_CALL_S)
    sys.stdout.write(json.dumps(result) + '\n')
    sys.stderr.write('gpu_reset: %s is not clean: %s\n' % (printable(args.node), printable(result['reason'])))
    return RUNNER_DRAINED if result['drained'] else RUNNER_NOT_DRAINED


def host_root_of(vars_file):
    """gpu_reset_host_root as the variables file sets it ('/' when it does not, or cannot be read:
    the playbook then says why)."""
    import yaml

    if not vars_file:
        return '/'
    try:
        with open(vars_file) as handle:
            given = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        given = None
    root = given.get('gpu_reset_host_root') if isinstance(given, dict) else None
    return root if isinstance(root, str) and '{' not in root else '/'


def write_playbook_vars(path, variables):
    """The playbook runner's extra variables (-e @path), as JSON: never spliced into a shell word."""
    with open(path, 'w') as handle:
        json.dump(variables, handle)
        handle.write('\n')
    return 0


# -- the health check: a node this collection drained returns to service -------------------------

# The one state the health check acts in (scontrol show node's State=): idle and drained, no other
# flag. A job that still ends there (COMPLETING), one that runs (ALLOCATED, MIXED: a draining node),
# a reboot, a maintenance or a node that does not answer leaves the node to Slurm and to people.
RESUMABLE_STATE = 'IDLE+DRAIN'
# The health check's statuses besides 0 (nothing to do, or resumed) and RUNNER_DRAINED/NOT_DRAINED
# (not clean, kept drained with the new reason): Slurm's answers could not be read, or the resume failed.
HEALTH_UNREADABLE = 12
HEALTH_RESUME_FAILED = 13
# Seconds each scontrol or squeue call may take, and seconds kept for the last read and the resume.
SLURM_CALL_S = 10
RESUME_RESERVE_S = 8
# A Slurm node name as the health check accepts it: one name, never a list or a range (a,b; n[1-4]).
NODE_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$')
# scontrol show node's Reason= line ends with who set it and when: ' [root@2026-12-01T12:00:00]'.
REASON_STAMP_RE = re.compile(r' \[[^\[\]\s@]*@[^\[\]\s]*\]$')


class SlurmUnreadable(Exception):
    """What scontrol or squeue said cannot be read: the health check does nothing."""


def say(text):
    """One line of the health check's log (text already made printable)."""
    sys.stderr.write('gpu_reset health check: %s\n' % text)


def parse_node(text, node):
    """(State, Reason, Reason line) of node from `scontrol show node NODE`: State= as printed
    (IDLE+DRAIN, ...), the reason without its [user@time] stamp ('' when none), and the whole
    Reason= line, stamp included, to tell later whether anyone set a reason since.

    SlurmUnreadable unless the text describes that one node, with one State= and at most one
    Reason= line (a reason of several lines is continued on lines that are not Key=value)."""
    lines = text.splitlines()
    names = [line.split(None, 1)[0] for line in lines if line.startswith('NodeName=')]
    if names != ['NodeName=' + node]:
        raise SlurmUnreadable('scontrol show node %s describes %s, not that one node'
                              % (printable(node), printable(' '.join(names) or 'no node', 100)))
    states = [line.split()[0][len('State='):] for line in lines if line.startswith('   State=')]
    reasons = [line.strip() for line in lines if line.startswith('   Reason=')]
    if len(states) != 1 or not states[0] or len(reasons) > 1:
        raise SlurmUnreadable('scontrol show node %s gave %d State= and %d Reason= lines (one State= and at most one Reason= expected)'
                              % (printable(node), len(states), len(reasons)))
    line = reasons[0] if reasons else ''
    return states[0], REASON_STAMP_RE.sub('', line[len('Reason='):]), line


def why_not_heal(node, state, reason):
    """None when the health check may put the node's GPUs back: drained, idle, with a reason of
    this collection (the drain prefix) that is not for a person (the hold prefix); otherwise why
    not, as the log says it."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import HOLD_PREFIX, PREFIX as DRAIN_PREFIX

    if 'DRAIN' not in state.split('+'):
        return '%s is not drained (State=%s): nothing to do' % (printable(node), printable(state, 100))
    if reason.startswith(HOLD_PREFIX):
        # Held for a person (a fault that what the hook tried did not cure): clean GPUs now (an
        # intermittent GPU that fell off the bus) prove nothing. scontrol update ... state=resume.
        return ('%s is held by gpu_reset for a person (%s): left drained until an operator resumes it'
                % (printable(node), printable(reason, 200)))
    if not reason.startswith(DRAIN_PREFIX):
        return ("%s is drained for a reason that is not this collection's (%s): left to whoever drained it"
                % (printable(node), printable(reason or 'none', 200)))
    if reason.startswith(DRAIN_PREFIX + NOT_REBOOTED):
        # Drained for a person by an older version, before the hold prefix: the same.
        return ('%s is held by gpu_reset for a person (%s): left drained until an operator resumes it'
                % (printable(node), printable(reason, 200)))
    if state != RESUMABLE_STATE:
        return ('%s is drained by gpu_reset but State=%s, not %s (a job still runs or ends there, or Slurm '
                'has other business with it): nothing done' % (printable(node), printable(state, 100), RESUMABLE_STATE))
    return None


def slurm_call(argv, seconds):
    """(rc, stdout, stderr) of a Slurm command, argv never through a shell; SlurmUnreadable when
    it cannot run or does not answer within seconds."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
    from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

    try:
        return Runner(argv[0]).run(argv[1:], timeout=max(seconds, 1))
    except GpuopsError as exc:
        raise SlurmUnreadable(printable(str(exc), 300))


def read_node(scontrol, node, seconds):
    """parse_node of `scontrol show node NODE`."""
    rc, stdout, stderr = slurm_call([scontrol, 'show', 'node', node], seconds)
    if rc != 0:
        raise SlurmUnreadable('scontrol show node %s failed (rc %d): %s'
                              % (printable(node), rc, printable(stderr.strip(), 300)))
    return parse_node(stdout, node)


def slurm_command(scontrol, name):
    """Slurm's command name (squeue, sinfo), next to scontrol when that is a path."""
    return os.path.join(os.path.dirname(scontrol), name) if '/' in scontrol else name


def jobs_on(scontrol, node, seconds):
    """The jobs squeue places on node (any state but pending), as printable 'ID STATE' lines."""
    argv = [slurm_command(scontrol, 'squeue'), '-h', '-w', node, '-t', 'all', '-o', '%i %T']
    rc, stdout, stderr = slurm_call(argv, seconds)
    if rc != 0:
        raise SlurmUnreadable('squeue -w %s failed (rc %d): %s' % (printable(node), rc, printable(stderr.strip(), 300)))
    return [printable(line.strip(), 100) for line in stdout.splitlines()
            if line.strip() and line.split()[-1] not in FINISHED_JOB_STATES]


# squeue -t all also lists the jobs that ended there; these states hold nothing on the node.
FINISHED_JOB_STATES = frozenset(('PENDING', 'COMPLETED', 'CANCELLED', 'FAILED', 'TIMEOUT', 'NODE_FAIL', 'PREEMPTED',
                                 'BOOT_FAIL', 'DEADLINE', 'OUT_OF_MEMORY', 'REVOKED', 'SPECIAL_EXIT'))


def why_not_now(args, seconds):
    """(why the health check leaves the node alone, or None; the node as read)."""
    state, reason, line = read_node(args.scontrol, args.node, seconds)
    why = why_not_heal(args.node, state, reason)
    if why is None:
        jobs = jobs_on(args.scontrol, args.node, seconds)
        if jobs:
            why = '%s runs jobs (%s): nothing done' % (printable(args.node), ', '.join(jobs[:5]))
    return why, (state, line)


def changed_since(args, read, seconds):
    """Why the node may no longer be acted on (its state or reason changed since read, a job
    came), or None."""
    try:
        why, now = why_not_now(args, seconds)
    except SlurmUnreadable as exc:
        return str(exc)
    if why is None and now != read:
        why = '%s was drained again since the health check read it (%s)' % (printable(args.node), printable(now[1], 200))
    return why


def resume(args, seconds):
    """scontrol update nodename=NODE state=resume; 0, or HEALTH_RESUME_FAILED saying why."""
    try:
        rc, dummy, stderr = slurm_call([args.scontrol, 'update', 'nodename=' + args.node, 'state=resume'], seconds)
    except SlurmUnreadable as exc:
        rc, stderr = None, str(exc)
    if rc != 0:
        say('could not resume %s: %s' % (printable(args.node), printable(stderr.strip(), 300)))
        return HEALTH_RESUME_FAILED
    say('resumed %s: its GPUs are clean' % printable(args.node))
    return 0


def health_check(args):
    """--health-check: on a node this collection drained that runs no job, the whole sequence;
    clean: resume the node; not clean: keep it drained with the new reason. Anything else is
    only read."""
    ends = time.monotonic() + args.deadline
    if not NODE_NAME_RE.match(args.node):
        say('%s is not a node name the health check acts on: nothing done' % printable(args.node, 100))
        return HEALTH_UNREADABLE
    try:
        why, read = why_not_now(args, min(SLURM_CALL_S, args.deadline / 4.0))
    except SlurmUnreadable as exc:
        say('nothing done: %s' % exc)
        return HEALTH_UNREADABLE
    if why:
        say(why)
        return 0
    say('%s is drained by gpu_reset (%s) and runs no job: putting its GPUs back'
        % (printable(args.node), printable(read[1], 200)))
    settings = load_settings(args.vars_file, hook_vars(args))
    recheck = min(SLURM_CALL_S, RESUME_RESERVE_S / 2.0)
    result = reset(settings, args.node, args.scontrol, ends - time.monotonic() - RESUME_RESERVE_S,
                   why_not_drain=lambda: changed_since(args, read, recheck), reboot_stamp=reboot_stamp(args),
                   budget=(ends - args.deadline, args.deadline), observe=args.observe)
    sys.stdout.write(json.dumps(result) + '\n')
    return health_verdict(args, result, read, max(ends - time.monotonic(), 1))


def health_verdict(args, result, read, seconds):
    """Resume the node when its GPUs are clean and nothing changed since read; the status."""
    if result.get('drain_skipped'):
        say('not clean, left as it is: %s' % result['drain_skipped'])
        return 0
    if result['outcome'] == 'failed' and args.observe:
        say('observe mode: %s would stay drained: %s' % (printable(args.node), printable(result['reason'])))
        return 0
    if result['outcome'] == 'failed':
        say('%s stays drained: %s' % (printable(args.node), printable(result['reason'])))
        return RUNNER_DRAINED if result.get('drained') else RUNNER_NOT_DRAINED
    changed = changed_since(args, read, min(SLURM_CALL_S, seconds / 2.0))
    if changed:
        say('clean, not resumed: %s' % changed)
        return 0
    if args.observe:
        say('observe mode: would resume %s (its GPUs %s)' % (
            printable(args.node), 'would be released first' if result['outcome'] == 'would_release' else 'are clean'))
        return 0
    return resume(args, seconds / 2.0)


REBOOT_STAMP = '/var/lib/gpuops/reboot-requested'


def reboot_stamp(args):
    """The reboot stamp when --reboot is given, else None (no reboot is asked for)."""
    return args.reboot_stamp if args.reboot else None


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
    parser.add_argument('--max-drained', type=max_drained_argument,
                        help='the fleet brake (GPU_RESET_MAX_DRAINED): past this many nodes, or this percentage of '
                             "the cluster's (N%%), out of service for gpu_reset, a node that is not clean but can run "
                             'jobs is left in service and reported')
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
    return args


def clear_history(args):
    """--clear-history UUID|all: forget the GPU's history (each GPU's); 0, or 2 saying why not."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
    from ansible_collections.gpuops.nvidia.plugins.module_utils._history import History

    history = History.for_host(host_root_of(args.vars_file))
    try:
        if not history.state.usable:
            raise GpuopsError(history.warnings[0])
        gone = history.clear(args.clear_history)
    except GpuopsError as exc:
        sys.stderr.write('gpu_reset: the history was not cleared: %s\n' % printable(str(exc), 300))
        return RUNNER_SETTINGS_UNREADABLE
    sys.stderr.write('gpu_reset: history cleared in %s: %s\n' % (
        history.state.path, ', '.join(gone) if gone else 'no history of %s was kept' % printable(args.clear_history, 100)))
    return 0


def main(argv=None):
    started = time.monotonic()
    args = parse_args(argv)
    if args.clear_history:
        return clear_history(args)
    if args.playbook_vars:
        return playbook_vars(args)
    try:
        if args.health_check:
            return health_check(args)
        settings = load_settings(args.vars_file, hook_vars(args))
    except NeedsPlaybook as exc:
        sys.stderr.write('gpu_reset: %s needs the playbook\n' % exc)
        return RUNNER_NEEDS_PLAYBOOK
    except (OSError, ValueError) as exc:
        sys.stderr.write('gpu_reset: cannot read the settings: %s\n' % printable(str(exc)))
        return RUNNER_SETTINGS_UNREADABLE
    gpus, problem = job_gpus(args, settings.get(PREFIX + 'host_root'))
    if gpus is not None:
        settings[PREFIX + 'gpus'] = gpus
    if problem is None:
        settings[PREFIX + 'job'] = job_setting(args, gpus, settings.get(PREFIX + 'host_root'))
    result = reset(settings, args.node, args.scontrol, args.deadline - (time.monotonic() - started),
                   reboot_stamp=reboot_stamp(args), refused=problem, budget=(started, args.deadline),
                   observe=args.observe, max_drained=args.max_drained, drain_rate=args.max_drain_rate)
    sys.stdout.write(json.dumps(result) + '\n')
    if args.observe:
        # Slurm drains a node whose Prolog fails: observe mode leaves it in service whatever it found.
        if result['outcome'] in ('failed', 'would_release'):
            sys.stderr.write('gpu_reset: observe mode, nothing changed: %s %s: %s\n' % (
                printable(args.node), 'would be drained' if result.get('would_drain') else 'is not clean',
                printable(result['reason'])))
        return 0
    if result['outcome'] == 'failed':
        sys.stderr.write('gpu_reset: %s is not clean: %s\n' % (printable(args.node), printable(result['reason'])))
        if (result.get('brake') or {}).get('held'):
            return RUNNER_BRAKE_HELD
        return RUNNER_DRAINED if result.get('drained') else RUNNER_NOT_DRAINED
    return 0


if __name__ == '__main__':
    sys.exit(main())
