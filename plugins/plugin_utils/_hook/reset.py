# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset sequence on the node itself, then its finishing steps (reset): the modules run in
children forked from the hook (ModuleRunner), the drain command, a reboot asked of Slurm when only a reboot cures the
GPUs, and the fleet brake (plugin_utils/_brake.py decides)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import is_driver_hung
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Forked, Runner
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _brake, _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._brake import SINFO_ENV, BrakeUnreadable, sinfo_argv
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import REBOOT_PREFIX, drain_command
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import HostError, finish, run_drain, write_file
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import NODE_NAME_RE
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.slurm import SLURM_CALL_S, slurm_command
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._sequence import ModuleError
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX


MODULES = 'ansible_collections.gpuops.nvidia.plugins.modules.'
# plugins/plugin_utils/_hook/reset.py -> the collection, and the directory that holds ansible_collections/
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
COLLECTIONS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION)))
# Seconds kept for the drain command at the end of the hook's time (at most a tenth of it).
DRAIN_RESERVE_S = 5
# A module still running at its deadline gets SIGTERM, then this long before SIGKILL (at most a
# tenth of the hook's time): the release turns SIGTERM into an exit through its finally blocks,
# which start again the units it stopped for a GPU reset. Asking systemd to start them takes a
# fraction of a second, and systemd finishes a start job even when the systemctl that asked is
# killed. The modules' own timeouts end this much before their deadline.
TERM_GRACE_S = 5
# What a process that has loaded ansible-core's controller code (ansible.errors and the like) holds.
CONTROLLER_CODE = 'ansible._internal'


class ModuleRunner:
    """The sequence's seam on the node: a module of the collection run in a process of its own,
    within the time left before ends (time.monotonic()); in check mode when check_mode (as Ansible
    runs it). A module still running grace seconds before ends gets SIGTERM, and SIGKILL at ends.

    The module runs in a child forked from this process (Forked: a session of its own, its output
    piped here, nothing of this process's but its imports), as AnsiballZ runs it: a Python started
    anew with ansible-core's imports would be most of what the hook costs a clean node. Where this
    process has loaded ansible-core's controller code (a test's), whose module_utils then behave
    as the controller's (a warning displayed, not returned), the module runs as a program."""

    def __init__(self, ends, check_mode=False, grace=0.0):
        self.ends = ends
        self.check_mode = check_mode
        self.grace = grace

    def __call__(self, name, args):
        """The module's result (a dict; one that failed too, with failed and msg); ModuleError
        when it gives none (stopped at the deadline, with what it started, or a crash)."""
        if self.check_mode:
            args = dict(args, _ansible_check_mode=True)
        params = json.dumps({'ANSIBLE_MODULE_ARGS': args})
        words = 'gpuops.nvidia.%s' % name
        timeout = max(self.ends - self.grace - time.monotonic(), 1)
        try:
            if CONTROLLER_CODE in sys.modules:
                rc, stdout, stderr = self._program(words, name, params, timeout)
            else:
                child = Forked(run_module, (name, params.encode('utf-8')), env={'LC_ALL': 'C', 'LANG': 'C'})
                rc, stdout, stderr = Runner(sys.executable, name=words, term_grace=self.grace).finish(
                    child, timeout, [words], started=child.started)
        except CommandTimeout as exc:
            raise ModuleError('%s gave no result within %.1f s and was stopped%s' % (
                words, exc.timeout, ' (SIGTERM, then SIGKILL after %.1f s)' % self.grace if self.grace else ''))
        except OSError as exc:
            raise ModuleError('%s could not be started: %s' % (words, exc.strerror or exc))
        except GpuopsError as exc:
            raise ModuleError(str(exc))
        out = stdout.strip()
        try:
            result = json.loads(out[out.index('{'):])
        except ValueError:
            raise ModuleError('%s gave no result (rc %d): %s' % (words, rc, ' '.join((stderr or out).split())[-500:]))
        if not isinstance(result, dict):
            raise ModuleError('%s gave no result (rc %d)' % (words, rc))
        return result

    def _program(self, words, name, params, timeout):
        """(rc, stdout, stderr) of the module run as a program. Its arguments are in a file without
        a name (O_TMPFILE), read as /proc/self/fd/N: a hook killed meanwhile (SIGKILL runs no
        finally) leaves no file behind."""
        path = COLLECTIONS_ROOT + (os.pathsep + os.environ['PYTHONPATH'] if os.environ.get('PYTHONPATH') else '')
        with tempfile.TemporaryFile('w+') as handle:
            handle.write(params)
            handle.flush()
            runner = Runner(sys.executable, name=words, term_grace=self.grace, pass_fds=(handle.fileno(),),
                            env={'PYTHONPATH': path})
            return runner.run(['-m', MODULES + name, '/proc/self/fd/%d' % handle.fileno()], timeout=timeout)


def run_module(name, params):
    """In the forked child: the module run as AnsiballZ runs it, its arguments (JSON, bytes) where
    AnsibleModule reads them and the module as __main__; its exit status."""
    from ansible.module_utils import basic

    basic._ANSIBLE_ARGS = params
    basic._ANSIBLE_PROFILE = 'legacy'
    try:
        runpy.run_module(MODULES + name, run_name='__main__', alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except Exception:  # what a Python started anew would print before exiting 1
        traceback.print_exc()
        return 1
    return 0


class NodeHost:
    """The finishing steps' seam (_finish.py) on the node itself."""

    @staticmethod
    def command(argv, seconds):
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
    directory = stamp_dir(stamp)
    if not directory.usable:
        return 'a reboot could not be remembered: the directory of %s %s' % (printable(stamp, 200), directory.problem)
    asked = directory.mtime(os.path.basename(stamp))
    if asked is None:
        return None
    boot = boot_time() if boot is None else boot
    now = time.time() if now is None else now
    if boot is not None and asked < boot and now - asked < REBOOT_AT_MOST_EVERY_S:
        return 'a reboot asked for at %s did not cure it' % _stamp(asked)
    return None


def ask_reboot(result, scontrol, node, seconds, stamp, history, evidence):
    """Have Slurm reboot the node once the evidence is collected, noting it in stamp and in the
    history; drain it for a person instead (a hold) when a GPU's fault is back after its cures or
    the node's reboot budget is spent (reboot_held), when why_not_reboot says so or the drain fails.

    history: (History, its settings), hook_history's. evidence: (directory, seconds, program) of
    the host report to collect first (hook_evidence): the node is drained for its reboot
    (_drain.REBOOT_PREFIX), and a process of its own session, outside this run's time, collects
    the report and then asks Slurm for the reboot (_hook/health.py, evidence_then_reboot)."""
    history, settings = history
    held = reboot_held(result, history, settings)
    if held:
        result['held'] = held
        result['reason'] = '; '.join([entry['reason'] for entry in held] + [result['reason']])
        history.record([(entry['uuid'], entry['index'], entry['reason']) for entry in held], 'cure_failed', outcome='held')
        for entry in held:
            if entry['uuid'] is None:
                history.record_node('cure_failed', entry['reason'], outcome='held')
        return drain(result, scontrol, node, seconds, hold=True)
    why = why_not_reboot(node, stamp)
    if why is None and asked_since_boot(stamp):
        # The run that asked collects the evidence and then asks Slurm: asking again now would cut it.
        result.update(drained=True, reboot_requested=True)
        result['reason'] += '; the reboot asked for at %s follows its evidence' % _stamp(stamp_dir(stamp).mtime(
            os.path.basename(stamp)))
        return result
    if why is None:
        drain(result, scontrol, node, seconds / 2.0, argv=drain_command(scontrol, node, result['reason'], prefix=REBOOT_PREFIX))
        if result['drained']:
            result['evidence'] = start_evidence(scontrol, node, *evidence)
            result['reboot_requested'] = True
            history.record([(uuid, gpu.get('index'), result['reason'], gpu.get('pci_bus_id'))
                            for gpu, uuid in reboot_gpus(result, history)], 'reboot_asked', outcome='escalated', to='reboot')
            history.record_node('reboot_asked', result['reason'], outcome='escalated', to='reboot')
            return note_reboot(result, stamp)
        why = 'the drain for the reboot failed'
    # First, where a reason cut to its length for sinfo -R keeps it.
    result['reason'] = '%s%s): %s' % (NOT_REBOOTED, why, result['reason'])
    return drain(result, scontrol, node, seconds / 2.0, hold=True)


def asked_since_boot(stamp, boot=None):
    """Whether stamp notes a reboot asked for since this host booted."""
    asked = stamp_dir(stamp).mtime(os.path.basename(stamp))
    boot = boot_time() if boot is None else boot
    return asked is not None and boot is not None and asked >= boot


def _stamp(when):
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(when or 0))


def hook_evidence(options):
    """(directory, seconds, program) of the report collected before a reboot: bug_report_dir, else
    bug-reports in the history's directory (root's own, kept across the reboot); within
    bug_report_timeout; NVIDIA's nvidia-bug-report.sh beside nvidia_smi_path."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.bug_report import DEFAULT_TIMEOUT_S, program_next_to
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import default_history_dir

    root = options.get('host_root') if isinstance(options.get('host_root'), str) and options.get('host_root') else '/'
    directory = options.get('bug_report_dir') or os.path.join(default_history_dir(root), 'bug-reports')
    seconds = options.get('bug_report_timeout') or DEFAULT_TIMEOUT_S
    return directory, float(seconds), program_next_to(options.get('nvidia_smi_path') or 'nvidia-smi')


def start_evidence(scontrol, node, directory, seconds, program):
    """Start evidence_then_reboot in a process of its own session (it outlives this run, and a
    Prolog's or Epilog's end), its output to this run's stderr (the hook's log): {pid, directory}."""
    argv = [sys.executable, '-m', 'ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook', '--node', node,
            '--scontrol', scontrol, '--evidence-then-reboot', directory, '--evidence-timeout', '%g' % seconds,
            '--evidence-program', program]
    env = dict(os.environ, PYTHONPATH=COLLECTIONS_ROOT + (os.pathsep + os.environ['PYTHONPATH'] if os.environ.get('PYTHONPATH') else ''))
    try:
        log = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        log = subprocess.DEVNULL  # a stderr of no file (run in-process, by a test)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                            start_new_session=True, close_fds=True, cwd='/')
    return {'pid': proc.pid, 'directory': directory}


def hook_history(options):
    """(the node's GPU history, under host_root; {hold_after_cures, hold_window_days}) of the
    run's options (checked and converted by the sequence)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History

    root = options.get('host_root')
    return History.for_host(root if isinstance(root, str) and root else '/'), dict(
        (name, options.get(name)) for name in ('hold_after_cures', 'hold_window_days', 'reboot_budget'))


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
    """What is not rebooted again, for a person: the GPUs only a reboot cures whose fault is back
    after their cures (_history.hold_reason), or the node, its reboot_budget spent
    (_history.budget_spent): [{index, uuid, reason}] (index and uuid None for the node)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import (
        HOLD_AFTER_CURES, HOLD_WINDOW_DAYS, REBOOT_BUDGET, budget_spent)

    window = settings.get('hold_window_days') or HOLD_WINDOW_DAYS
    held = []
    for gpu, uuid in reboot_gpus(result, history):
        why = history.hold_reason(uuid, gpu.get('index'), 'needs a reboot (%s)' % (gpu.get('state') or 'its health'),
                                  settings.get('hold_after_cures') or HOLD_AFTER_CURES, window)
        if why:
            held.append({'index': gpu.get('index'), 'uuid': uuid, 'reason': why})
    spent = None if held else budget_spent(history.node_events(), 'reboot', settings.get('reboot_budget') or REBOOT_BUDGET,
                                           window)
    if spent:
        held.append({'index': None, 'uuid': None, 'reason': 'the node needs a reboot, %s' % spent})
    return held


def stamp_dir(stamp):
    """The reboot stamp's directory as a StateDir: reached and checked by descriptor (no other user
    can swap it or a directory above it for a link), made when missing."""
    return StateDir(os.path.dirname(os.path.abspath(stamp)), parents=True)


def note_reboot(result, stamp):
    """Note the reboot asked for in stamp (its reason), written in its checked directory."""
    directory = stamp_dir(stamp)
    if not directory.usable:
        result['reason'] = '%s; the reboot could not be noted: the directory of %s %s' % (
            result['reason'], printable(stamp, 200), directory.problem)
    elif not directory.write(os.path.basename(stamp), ('%s\n' % result['reason']).encode('utf-8', 'replace')):
        result['reason'] = '%s; the reboot could not be noted in %s: %s' % (
            result['reason'], printable(stamp, 200), '; '.join(directory.warnings))
    return result


def reboot_stamp(args):
    """The reboot stamp when --reboot is given, else None (no reboot is asked for)."""
    return args.reboot_stamp if args.reboot else None


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
            ask_reboot(result, scontrol, node, seconds, reboot_stamp, hook_history(run.options or {}),
                       evidence=hook_evidence(run.options or {}))
        else:
            drain(result, scontrol, node, seconds)

    # A misconfigured node is drained too: its next job would run on it.
    result = finish(run, NodeHost, drain_node, drain_misconfigured=True,
                    hook=lambda: {'budget_s': budget_s, 'duration_s': round(time.monotonic() - started, 3)})
    if result.get('would_drain') and reboot_stamp and reboot_cures(result):
        result['would_reboot'] = True
    if run.warnings:
        # The modules' warnings (a slow GPU's among them), which the playbook would show: in the log.
        result['warnings'] = list(run.warnings)
    return result


# -- the fleet brake (plugin_utils/_brake.py decides) ---------------------------------------------

def read_listing(scontrol, seconds):
    """sinfo's listing for the brake (_brake.sinfo_argv), within seconds; BrakeUnreadable when
    sinfo cannot tell."""
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
