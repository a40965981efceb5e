# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Slurm's HealthCheckProgram (health_check): on a node this collection drained that runs no job,
the whole sequence; clean: the node is resumed; not clean: it stays drained with the new reason.
Anything else is only read, and left as it is.

The same check is the cure the hook starts at once when it drains a node (--cure-within S, outside
the Prolog's or Epilog's time): it waits while a job still runs or ends on the node, and runs the
sequence again while the GPUs are not clean yet and a later read may find them so, for S seconds
in all; what is left then is the next health check's."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re
import sys
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import NOT_REBOOTED, reboot_command, reboot_stamp, reset
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import NODE_NAME_RE, REASON_CHARS, REBOOT_PREFIX
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.slurm import (
    SLURM_CALL_S,
    SlurmUnreadable,
    slurm_call,
    slurm_command,
)
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.status import (
    HEALTH_RESUME_FAILED,
    HEALTH_UNREADABLE,
    RUNNER_DRAINED,
    RUNNER_NOT_DRAINED,
)
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.vars import hook_vars, load_settings


# The one state the health check acts in (scontrol show node's State=): idle and drained, no other
# flag. A job that still ends there (COMPLETING), one that runs (ALLOCATED, MIXED: a draining node),
# a reboot, a maintenance or a node that does not answer leaves the node to Slurm and to people.
RESUMABLE_STATE = 'IDLE+DRAIN'
# Seconds kept for the last read and the resume.
RESUME_RESERVE_S = 8
# The cure started at once: how often it reads the node while a job still ends there, and how
# long it waits before running the sequence again on GPUs that are not clean yet.
CURE_POLL_S = 2.0
CURE_RETRY_S = 10.0
# A node drained by gpu_reset in these states only is still emptying: it may become IDLE+DRAIN.
EMPTYING_FLAGS = frozenset(('IDLE', 'ALLOCATED', 'MIXED', 'COMPLETING', 'DRAIN'))
# What no later run of the sequence changes: a GPU that needs a reboot or a person.
NOT_CURED_BY_WAITING = ('reboot', 'inspect')
# scontrol show node's Reason= line ends with who set it and when: ' [root@2026-12-01T12:00:00]'.
REASON_STAMP_RE = re.compile(r' \[[^\[\]\s@]*@[^\[\]\s]*\]$')


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
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import HOLD_PREFIX, REBOOT_PREFIX, PREFIX as DRAIN_PREFIX

    if 'DRAIN' not in state.split('+'):
        return '%s is not drained (State=%s): nothing to do' % (printable(node), printable(state, 100))
    if reason.startswith(HOLD_PREFIX):
        # Held for a person (a fault that what the hook tried did not cure): clean GPUs now (an
        # intermittent GPU that fell off the bus) prove nothing. scontrol update ... state=resume.
        return ('%s is held by gpu_reset for a person (%s): left drained until an operator resumes it'
                % (printable(node), printable(reason, 200)))
    if reason.startswith(REBOOT_PREFIX):
        # Drained for a reboot that waits for its evidence (_hook/reset.py, evidence_then_reboot).
        return ('%s waits for the reboot gpu_reset asks for once its evidence is collected (%s): left as it is'
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


def read_node(scontrol, node, seconds):
    """parse_node of `scontrol show node NODE`."""
    rc, stdout, stderr = slurm_call([scontrol, 'show', 'node', node], seconds)
    if rc != 0:
        raise SlurmUnreadable('scontrol show node %s failed (rc %d): %s'
                              % (printable(node), rc, printable(stderr.strip(), 300)))
    return parse_node(stdout, node)


def evidence_then_reboot(args):
    """--evidence-then-reboot DIR: nvidia-bug-report.sh into DIR within --evidence-timeout, then
    scontrol reboot ASAP nextstate=resume, the report's path in the reason; only while the node is
    still drained for this reboot (_drain.REBOOT_PREFIX): one resumed or drained for another reason
    meanwhile is left as it is. 0, or 14 when Slurm's answers could not be read."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.bug_report import collect

    report = collect(args.evidence_then_reboot, args.evidence_timeout, args.evidence_program)
    say('before the reboot of %s: %s' % (printable(args.node), report['message']))
    try:
        state, reason, dummy = read_node(args.scontrol, args.node, SLURM_CALL_S)
    except SlurmUnreadable as exc:
        say('no reboot asked: %s' % exc)
        return HEALTH_UNREADABLE
    if 'DRAIN' not in state.split('+') or not reason.startswith(REBOOT_PREFIX):
        say('no reboot asked: %s is no longer drained for it (State=%s, Reason=%s)' % (
            printable(args.node), printable(state, 100), printable(reason or 'none', 200)))
        return 0
    said = ('; evidence: %s' % (report['path'] if report['ok'] else 'none (%s)' % report['message']))[:REASON_CHARS - 40]
    # The reason is cut to its length for sinfo -R (drain_reason): the evidence is kept whole.
    kept = reason[len(REBOOT_PREFIX):][:REASON_CHARS - len(said)]
    argv = reboot_command(args.scontrol, args.node, kept + said)
    try:
        rc, dummy, stderr = Runner(argv[0]).run(argv[1:], timeout=SLURM_CALL_S)
    except GpuopsError as exc:
        rc, stderr = None, str(exc)
    say('reboot of %s asked for%s' % (printable(args.node), '' if rc == 0 else ' and refused: %s' % printable(stderr.strip(), 300)))
    return 0 if rc == 0 else HEALTH_UNREADABLE


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
    """(why the health check leaves the node alone, or None; the node as read; whether that may
    change by waiting: a node drained by gpu_reset where a job still runs or ends)."""
    state, reason, line = read_node(args.scontrol, args.node, seconds)
    why = why_not_heal(args.node, state, reason)
    emptying = why_not_heal(args.node, RESUMABLE_STATE, reason) is None and set(state.split('+')) <= EMPTYING_FLAGS
    if why is None:
        jobs = jobs_on(args.scontrol, args.node, seconds)
        if jobs:
            why = '%s runs jobs (%s): nothing done' % (printable(args.node), ', '.join(jobs[:5]))
    return why, (state, line), bool(why) and emptying


def changed_since(args, read, seconds):
    """Why the node may no longer be acted on (its state or reason changed since read, a job
    came), or None."""
    try:
        why, now, dummy = why_not_now(args, seconds)
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
    only read. With --cure-within S, again while that may change (cure_again), for S seconds."""
    if not NODE_NAME_RE.match(args.node):
        say('%s is not a node name the health check acts on: nothing done' % printable(args.node, 100))
        return HEALTH_UNREADABLE
    until = time.monotonic() + (args.cure_within or 0)
    if args.cure_within:
        say('the cure of %s, started at once by the hook that drained it, for at most %g s'
            % (printable(args.node), args.cure_within))
    while True:
        status, again = heal(args)
        pause = CURE_POLL_S if again == 'emptying' else CURE_RETRY_S
        if not again:
            return status
        if time.monotonic() + pause >= until:
            left = 'a job still runs or ends there' if again == 'emptying' else 'its GPUs are still not clean'
            say('%s: left to the next health check' % left)
            return status
        time.sleep(pause)


def heal(args):
    """One health check: (its status; None, or why another may do what this one did not:
    'emptying' while a job still ends on the node, 'not_clean' while its GPUs may be clean later)."""
    ends = time.monotonic() + args.deadline
    try:
        why, read, emptying = why_not_now(args, min(SLURM_CALL_S, args.deadline / 4.0))
    except SlurmUnreadable as exc:
        say('nothing done: %s' % exc)
        return HEALTH_UNREADABLE, None
    if why:
        if not (emptying and args.cure_within):
            say(why)  # a cure waiting for the node to empty says so once, at its end
        return 0, 'emptying' if emptying else None
    say('%s is drained by gpu_reset (%s) and runs no job: putting its GPUs back'
        % (printable(args.node), printable(read[1], 200)))
    settings = load_settings(args.vars_file, hook_vars(args))
    recheck = min(SLURM_CALL_S, RESUME_RESERVE_S / 2.0)
    result = reset(settings, args.node, args.scontrol, ends - time.monotonic() - RESUME_RESERVE_S,
                   why_not_drain=lambda: changed_since(args, read, recheck), reboot_stamp=reboot_stamp(args),
                   budget=(ends - args.deadline, args.deadline), observe=args.observe)
    sys.stdout.write(json.dumps(result) + '\n')
    status = health_verdict(args, result, read, max(ends - time.monotonic(), 1))
    return status, 'not_clean' if status == RUNNER_DRAINED and cure_again(result) else None


def cure_again(result):
    """Whether a later run of the sequence may find clean what this one left drained: not a node
    held for a person, nor one whose GPUs need a reboot or a person."""
    gpus = result.get('gpus') or []
    return not result.get('held_for_person') and not result.get('reboot_requested') and \
        not any(gpu.get('recovery_action') in NOT_CURED_BY_WAITING for gpu in gpus)


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
