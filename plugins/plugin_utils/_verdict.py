# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset role's verdict, on the controller: is a host clean, and its per-host report.

The role passes what its tasks registered (the release, with the GPU reset it did, and the GPUs
read before and after, an error) and gets the whole report back; the reason a host is not clean is
written here and nowhere else."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re
import time

from collections.abc import Mapping

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import NOT_CLEAN_ACTIONS
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import (
    blocks, gpu_node_number, gpus_in_scope, instance_parent, no_such_gpus, parse_gpu)
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import QueryError, plain, search

OUTCOMES = ('clean', 'released', 'would_release', 'failed')
# How the reason of a host whose settings are wrong starts (nothing was read or signalled there).
MISCONFIGURED = 'gpu_reset is misconfigured'


class VerdictError(QueryError):
    """Facts or a clean query the verdict cannot judge (also what the filters over it raise)."""


def _parent_index(gpu, all_gpus, gpus):
    """The index of a gpus entry: a GPU's, or a MIG instance's GPU (N:G, N:G:C, a MIG UUID among the mig facts)."""
    parsed = parse_gpu(gpu)
    if parsed is None:
        raise VerdictError('gpu_scope: gpus must be a list of GPU indexes or MIG instances, got %r' % (list(gpus),))
    if isinstance(parsed, int):
        return parsed
    parent = instance_parent(parsed)
    if parent is None:
        parent = next((item.get('index') for item in all_gpus for instance in (item.get('mig') or {}).get('instances') or []
                       if instance.get('uuid') == parsed), None)
    if parent is None:
        raise VerdictError('gpu_scope: no GPU with MIG instance %s in the facts (read with mig: true)' % parsed)
    return parent


def gpu_scope(facts, gpus=None):
    """facts (of nvidia_gpu_facts) narrowed to the GPUs gpus (None: all) and their holders."""
    if not isinstance(facts, Mapping):
        raise VerdictError('gpu_scope: expects the GPU facts (a dict), got %s' % type(facts).__name__)
    scoped = dict(facts)
    if gpus is None:
        return scoped
    if isinstance(gpus, (str, bytes)) or not hasattr(gpus, '__iter__'):
        raise VerdictError('gpu_scope: gpus must be a list of GPU indexes, got %r' % (gpus,))
    all_gpus = list(facts.get('nvidia_gpus') or [])
    wanted = set(_parent_index(gpu, all_gpus, gpus) for gpu in gpus)
    known = set(gpu.get('index') for gpu in all_gpus if gpu.get('index') is not None)
    unknown = sorted(wanted - known)
    if unknown:
        raise VerdictError('gpu_scope: %s' % no_such_gpus(unknown, known))
    kept = gpus_in_scope(all_gpus, wanted)
    nodes = set(gpu_node_number(gpu) for gpu in kept)
    scoped['nvidia_gpus'] = kept
    scoped['nvidia_device_holders'] = [holder for holder in facts.get('nvidia_device_holders') or []
                                       if blocks(holder.get('devices') or [], holder.get('pid'), nodes, kept)]
    return scoped


# The release module's own test of clean: every GPU in scope readable and at or below the
# threshold, its health calling for no reset, reboot or person (_health.NOT_CLEAN_ACTIONS), no
# holder that is not protected.
CLEAN_QUERY = ('length(nvidia_gpus[?error != null || memory_used_mib == null || memory_used_mib > `%%d`'
               ' || contains(`%s`, health.recovery_action)]) == `0`'
               ' && length(nvidia_device_holders[?!protected]) == `0`') % json.dumps(list(NOT_CLEAN_ACTIONS))


def clean_query(query=None, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB):
    """The query that decides clean: the user's own, or the release module's test."""
    if query is not None:
        return str(query)
    return CLEAN_QUERY % int(memory_threshold_mib)


def is_clean(facts, query=None, gpus=None, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB):
    """Whether facts (of nvidia_gpu_facts, narrowed to gpus) pass the clean query."""
    verdict = search(gpu_scope(facts, gpus), clean_query(query, memory_threshold_mib))
    if not isinstance(verdict, bool):
        raise VerdictError('gpu_reset_clean_query must give true or false, it gave %s for these GPUs'
                           % json.dumps(verdict))
    return verdict


def facts_of(result):
    """The facts in a registered result of nvidia_gpu_facts, or None when it has none."""
    if isinstance(result, Mapping):
        if isinstance(result.get('ansible_facts'), Mapping):
            return result['ansible_facts']
        if 'nvidia_gpus' in result:
            return result
    return None


def _scoped(facts, gpus):
    """facts narrowed to gpus, or as they are when that is not possible (the error is reported already)."""
    if facts is None:
        return None
    try:
        return gpu_scope(facts, gpus)
    except QueryError:
        return facts


def _memory(facts):
    return [{'index': gpu.get('index'), 'memory_used_mib': gpu.get('memory_used_mib')}
            for gpu in facts.get('nvidia_gpus') or []]


def report_escalation(escalation, allow_gpu_reset=False):
    """The report's escalation made from the release module's: gpus, reasons (why each was
    reset), persistence_mode_off, reset_ok, output (what nvidia-smi said, as the module quotes
    it), persistence_mode_restored, fabric, problems (what the readings do not show),
    flr_refused (the GPUs whose reset the platform refused), module_reload (the driver's modules
    reloaded instead, reset_reload_modules), mig (what the reset changed of each GPU's MIG) and
    bug_report; None when no reset was allowed or attempted (check mode). A reset that the
    release could not attempt (a daemon it may not stop holds the GPU) is reported as failed, its
    output saying why."""
    if not allow_gpu_reset or not isinstance(escalation, Mapping):
        return None
    if not escalation.get('attempted') and escalation.get('ok') is not False:
        return None
    report = {
        'gpus': list(escalation.get('gpus') or []),
        'reasons': list(escalation.get('reasons') or []),
        'persistence_mode_off': list(escalation.get('persistence_mode_off') or []),
        'reset_ok': bool(escalation.get('ok')),
        'output': escalation.get('message') or '',
        'persistence_mode_restored': escalation.get('persistence_mode_restored'),
        'problems': list(escalation.get('problems') or []),
    }
    if escalation.get('flr_refused'):
        report['flr_refused'] = list(escalation['flr_refused'])
    for key in ('fabric', 'bug_report', 'quiesced', 'module_reload', 'mig'):
        if escalation.get(key) is not None:
            report[key] = escalation[key]
    return report


def orphaned_gpus(release, escalation, final=None):
    """The GPUs the release found with orphaned memory: those it left so, those its GPU reset
    was tried on (the release reads the GPUs again after it; a GPU the reset freed is no longer
    among its own orphaned_gpus), and those the last read (final, facts) finds so, which the
    reason names."""
    found = set(release.get('orphaned_gpus') or [])
    found.update(gpu.get('index') for gpu in (final or {}).get('nvidia_gpus') or []
                 if gpu.get('state') == 'orphaned_memory' and gpu.get('index') is not None)
    if isinstance(escalation, Mapping):
        found.update(escalation.get('gpus') or [])
    return sorted(found)


def _escalation(escalation):
    """(attempted, ok, output) of the report's escalation."""
    if not isinstance(escalation, Mapping):
        return False, None, ''
    return True, bool(escalation.get('reset_ok')), escalation.get('output') or ''


def _remedy(attempted, reset_ok, output, allow_gpu_reset, separator):
    """What the reason of a GPU only a reset can help adds: the failed reset, or how to allow one."""
    if attempted and not reset_ok:
        return _reason.reset_failed(output)
    if not allow_gpu_reset:
        return '%s set gpu_reset_allow_gpu_reset to allow it' % separator
    return ''


def _name(process):
    """A process's name in a report: its whole name where the kernel cut its comm (the modules'
    name), else its comm."""
    return process.get('name') or process.get('comm')


def reason(final, survivors, memory_threshold_mib, error=None, check_mode=False, signalled=(),
           escalation=None, allow_gpu_reset=False):
    """Why a host is not clean: each dirty GPU and each stray holder, '; '-joined."""
    lines = []
    if error:
        lines.extend(printable(line) for line in str(error).splitlines())
    if check_mode and not error and signalled:
        lines.append('check mode: would signal %d process(es): %s' % (
            len(signalled), ', '.join('pid %s (%s)' % (p.get('pid'), printable(_name(p))) for p in signalled)))
    attempted, reset_ok, output = _escalation(escalation)
    problems = list((escalation or {}).get('problems') or [])
    lines.extend(problems)
    count = len(problems)
    final = final or {}
    for gpu in final.get('nvidia_gpus') or []:
        index = gpu.get('index')
        used = gpu.get('memory_used_mib')
        held = [s for s in survivors if index in (s.get('gpus') or [])]
        held_pids = [s.get('pid') for s in held]
        reported = [p for p in gpu.get('processes') or [] if p.get('pid') not in held_pids]
        over = used is not None and used > memory_threshold_mib
        health = gpu.get('health') if (gpu.get('health') or {}).get('recovery_action') in NOT_CLEAN_ACTIONS else None
        if gpu.get('error') or used is None or over or held or reported or health:
            count += 1
        why = ['pid %s (%s, %s)' % (s.get('pid'), printable(_name(s)), s.get('reason')) for s in held]
        why += [_reason.reported(p) for p in reported]
        problem = _reason.gpu_problem(
            gpu, gpu.get('state') == 'reset_required', over and gpu.get('state') == 'orphaned_memory' and not held,
            bool(used is None or over or held or reported), why,
            reset_remedy=_remedy(attempted, reset_ok, output, allow_gpu_reset, ';'),
            orphan_remedy=_remedy(attempted, reset_ok, output, allow_gpu_reset, ','), health=health)
        if problem and (gpu.get('error') or health):
            problem += _reason.parent_of_instances(gpu)
        if problem:
            lines.append(problem)
    blocking = set(s.get('pid') for s in survivors if s.get('gpus'))
    for holder in final.get('nvidia_device_holders') or []:
        if not holder.get('protected') and holder.get('pid') not in blocking:
            count += 1
            lines.append(_reason.still_holds('pid %s (%s, user %s)' % (
                holder.get('pid'), printable(_name(holder)), holder.get('user')), holder.get('devices')))
    if not check_mode and not error and count == 0:
        lines.append('the GPUs do not pass gpu_reset_clean_query')
    return '; '.join(line.strip() for line in lines if line.strip())


# What Ansible says when a module gave no result at all: the host's Python did not run it.
NO_RESULT = ('Module result deserialization failed', 'The module interpreter', 'MODULE FAILURE')


def task_error(failure):
    """Why a task of the role failed, in one line. failure: {task, result, python} (the task's
    name, its result and the host's ansible_python_interpreter). A module that gave no result
    because the host's Python could not run it is said to be so, with how to pin another."""
    result = failure.get('result') if isinstance(failure.get('result'), Mapping) else {}
    text = ' '.join(str(result.get('msg') or 'failed').split())
    output = str(result.get('module_stderr') or result.get('module_stdout') or '')
    said = ' '.join(output.split())
    if text.startswith(NO_RESULT) and 'Traceback' in said:
        text += ': ' + output.strip().splitlines()[-1].strip()
    elif text.startswith(NO_RESULT):
        python = failure.get('python') or "the Python Ansible found"
        # The remedy first: a drain reason keeps only the start of the text.
        text = ('%s could not run the module; set ansible_python_interpreter for this host to a Python 3 that can, '
                'for example /usr/bin/python3 (it printed: %s)' % (python, _what_it_said(output) or 'nothing'))
    return '%s: %s' % (failure.get('task') or 'the role', text)


# The line of an interpreter's output that says what went wrong: its error ("SyntaxError: ...").
ERROR_LINE_RE = re.compile(r'^\w*(Error|Exception)\b')


def _what_it_said(output):
    """One line of what a Python that could not run the module printed: its last error line, else
    its first line ("pyenv: python2: command not found", without the help text that follows)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE_RE.match(line)]
    return printable((errors or lines or [''])[-1 if errors else 0], 160)


def verdict(host, release=None, facts_before=None, facts=None, error=None, gpus=None,
            query=None, memory_threshold_mib=DEFAULT_MEMORY_THRESHOLD_MIB, allow_gpu_reset=False,
            check_mode=False, started=None, now=None, misconfigured=False):
    """The per-host report of the gpu_reset role.

    release: the registered result of nvidia_device_release (None when it did not run); its
    escalation (the GPU reset of reset_orphaned) is reported when allow_gpu_reset.
    facts_before: nvidia_gpu_facts read before the release (with a clean query of the user's own).
    facts: nvidia_gpu_facts read after the release (waiting for clean).
    error: why the role could not finish (a misconfiguration, a module that failed): a text, or
    {task, result, python} of the task that failed (see task_error).
    query: gpu_reset_clean_query (None: the release module's own test). misconfigured: the host
    failed on its settings (error says which), said in the report as such."""
    report = _verdict(host, release, facts_before, facts, error, gpus, query, memory_threshold_mib, allow_gpu_reset,
                      check_mode, started, now)
    report['misconfigured'] = bool(misconfigured)
    return report


def _verdict(host, release, facts_before, facts, error, gpus, query, memory_threshold_mib, allow_gpu_reset,
             check_mode, started, now):
    release = plain(release) if isinstance(release, Mapping) else {}
    if isinstance(error, Mapping):
        error = task_error(plain(error))
    threshold = int(memory_threshold_mib)
    escalation = report_escalation(plain(release.get('escalation')), allow_gpu_reset)
    before = facts_of(facts_before)
    after = facts_of(facts)
    if error is None:
        try:
            return _judged(host, release, before, after, escalation, gpus, query, threshold, allow_gpu_reset,
                           check_mode, started, now)
        except QueryError as exc:
            error = str(exc)
    return _report(host, 'failed', release, _scoped(before, gpus), _scoped(after, gpus), escalation,
                   threshold, error, allow_gpu_reset, check_mode, started, now)


def _judged(host, release, before, after, escalation, gpus, query, threshold, allow_gpu_reset, check_mode,
            started, now):
    """The report of a host that got through: judged by the clean query."""
    released = release.get('released')
    before = gpu_scope(before, gpus) if before is not None else None
    after = gpu_scope(after, gpus) if after is not None else None
    at_end = facts_of(release.get('facts_after'))
    final = after if after is not None else gpu_scope(at_end, gpus) if at_end is not None else before
    if query is None and released is True:
        # The release's own verdict on what it read at its end is the default query already.
        outcome = 'released' if release.get('changed') else 'clean'
    elif before is not None and is_clean(before, query, None, threshold):
        outcome = 'clean'
    elif check_mode:
        # A release cannot make a lost or unreadable GPU clean, nor one the driver says needs a
        # reset unless it may reset it: the host would fail.
        outcome = 'failed' if any(beyond_release(gpu, allow_gpu_reset)
                                  for gpu in (final or {}).get('nvidia_gpus') or []) else 'would_release'
    elif final is not None and (after is not None or query is not None) and is_clean(final, query, None, threshold):
        # Clean when read again: released by this run when it signalled or reset anything, else
        # it was clean and the release only could not prove it (a read cut short on a loaded host).
        outcome = 'released' if release.get('changed') else 'clean'
    else:
        outcome = 'failed'
    if outcome != 'would_release' and escalation and escalation['problems']:
        # The GPUs read clean, but the reset left what the readings do not show (a fabric not back).
        outcome = 'failed'
    return _report(host, outcome, release, before, after, escalation, threshold, None, allow_gpu_reset,
                   check_mode, started, now, final=final)


def beyond_release(gpu, allow_gpu_reset=False):
    """Whether a release cannot make a GPU (of the facts) clean: lost or unreadable, or its health
    calls for a reboot or a person; one that needs a reset, unless a reset is allowed."""
    action = (gpu.get('health') or {}).get('recovery_action')
    if allow_gpu_reset and (gpu.get('state') == 'reset_required' or (not gpu.get('error') and action == 'reset_gpu')):
        return False
    return bool(gpu.get('error')) or action in NOT_CLEAN_ACTIONS


def _report(host, outcome, release, before, after, escalation, threshold, error, allow_gpu_reset, check_mode,
            started, now, final=None):
    if final is None:
        final = after if after is not None else _scoped(facts_of(release.get('facts_after')), None) or before
    if before is not None:
        gpus_before = _memory(before)
    else:
        gpus_before = release.get('gpus_before') or []
    if after is not None:
        gpus_after = _memory(after)
    elif 'gpus_after' in release:
        gpus_after = release['gpus_after']
    elif before is not None:
        gpus_after = _memory(before)
    else:
        gpus_after = []
    signalled = release.get('signalled') or []
    survivors = release.get('survivors') or []
    # The GPUs as they are now: a clean host and check mode changed nothing.
    gpus_now = gpus_before if outcome in ('clean', 'would_release') else gpus_after
    free = [gpu for gpu in gpus_now if gpu.get('memory_used_mib') is not None and gpu['memory_used_mib'] <= threshold]
    text = None
    if outcome in ('failed', 'would_release'):
        text = reason(final, survivors, threshold, error=error, check_mode=check_mode, signalled=signalled,
                      escalation=escalation, allow_gpu_reset=allow_gpu_reset)
    held = [entry for entry in release.get('held') or [] if isinstance(entry, Mapping)]
    if held and outcome == 'failed':
        # First: a drain reason cut to its length for sinfo -R keeps it.
        text = '; '.join([printable(str(entry.get('reason'))) for entry in held] + ([text] if text else []))
    now = time.time() if now is None else float(now)
    return {
        'host': str(host),
        'outcome': outcome,
        'reason': text,
        'check_mode': bool(check_mode),
        'gpus_before': gpus_before,
        'gpus_after': gpus_after,
        'gpus_free': len(free),
        'gpus_held': len(gpus_now) - len(free),
        'signalled': signalled,
        'survivors': survivors,
        'other_jobs': release.get('other_jobs') or [],
        'foreign_holders': release.get('foreign_holders') or [],
        # The processes whose descriptors could not all be read (nvidia_device_release's unreadable).
        'unreadable': release.get('unreadable') or [],
        'orphaned_gpus': orphaned_gpus(release, escalation, final),
        'escalation': escalation or None,
        # GPUs held for a person: a fault back after its cures (nvidia_device_release's held).
        'held': held,
        # {GPU UUID: the newest events, counts per window} (nvidia_device_release's history).
        'history': release.get('history') or {},
        'gpus': gpu_metrics(release, final, gpus_before, threshold, reboot_only=(escalation or {}).get('flr_refused')),
        'release_s': release.get('elapsed_s'),
        'started': round(float(started), 3) if started is not None else None,
        'duration_s': round(now - float(started), 3) if started is not None else None,
        'drained': False,
    }


def _fact_rows(facts):
    """The per-GPU rows of gpu_metrics from nvidia_gpu_facts."""
    return [{'index': gpu.get('index'), 'pci_bus_id': gpu.get('pci_bus_id'), 'uuid': gpu.get('uuid'), 'state': gpu.get('state'),
             'recovery_action': (gpu.get('health') or {}).get('recovery_action'),
             'memory_used_mib': gpu.get('memory_used_mib')} for gpu in (facts or {}).get('nvidia_gpus') or []]


def _release_rows(release):
    """The per-GPU rows of gpu_metrics from the release's gpu_states (the driver's recovery action)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import DRIVER_ACTIONS

    rows = []
    for gpu in release.get('gpu_states') or []:
        if 'recovery_action' in gpu:
            # What its health calls for, as nvidia_gpu_facts decides it (the release reads the kernel log).
            rows.append(dict(gpu))
            continue
        action = gpu.get('driver_recovery_action')
        rows.append(dict(gpu, recovery_action=None if action is None else DRIVER_ACTIONS.get(action, 'inspect')))
    return rows


def gpu_metrics(release, final, gpus_before, threshold, reboot_only=None):
    """Per GPU, for the metrics: index, pci_bus_id, state, recovery_action, orphaned_mib (memory
    held with no process) and seconds_until_free (0 when it was free before the run, the
    release's time when the run freed it, None when it is not free). reboot_only: the indexes
    whose reset the platform refused (flr_refused): their recovery action is reboot, whatever
    a read says."""
    reboot_only = set(reboot_only or ())
    rows = _fact_rows(final) or _release_rows(release)
    before = dict((gpu.get('index'), gpu.get('memory_used_mib')) for gpu in gpus_before or [])
    out = []
    for row in rows:
        used = row.get('memory_used_mib')
        was = before.get(row['index'])
        free = row.get('state') == 'free'
        out.append({
            # A MIG instance in scope is a row of its own, by its MIG UUID.
            'index': row['index'], 'pci_bus_id': row.get('pci_bus_id'), 'state': row.get('state'),
            'uuid': (row.get('mig_instance') or {}).get('uuid') or row.get('uuid'),
            'recovery_action': 'reboot' if row['index'] in reboot_only else row.get('recovery_action'),
            'orphaned_mib': used if row.get('state') == 'orphaned_memory' and used is not None else 0,
            'seconds_until_free': None if not free else 0 if was is not None and was <= threshold
            else release.get('elapsed_s'),
        })
    return out


SUMMARY_ORDER = ('failed', 'released', 'would_release', 'clean')


def _gpu_count(report):
    text = '%d GPU(s) free' % report.get('gpus_free', 0)
    if report.get('gpus_held'):
        text += ', %d held' % report['gpus_held']
    return text


def _unique(values):
    kept = []
    for value in values:
        if value not in kept:
            kept.append(value)
    return kept


HOST_NUMBER_RE = re.compile(r'^(.*?)([0-9]+)([^0-9]*)$')


def _ranges(numbers, width):
    """'001-003,007' for [1, 2, 3, 7] at width 3."""
    runs = []
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ','.join(str(low).zfill(width) + ('-' + str(high).zfill(width) if high > low else '') for low, high in runs)


def host_list(names):
    """names as Slurm's hostlists write them: numbered names of one pattern in ranges
    (gpu[001-095,097]), the others as they are, sorted."""
    groups, others = {}, []
    for name in names:
        match = HOST_NUMBER_RE.match(name)
        if match is None:
            others.append(name)
            continue
        groups.setdefault((match.group(1), len(match.group(2)), match.group(3)), []).append(int(match.group(2)))
    parts = others + ['%s%s%s' % (prefix, ('[%s]' if len(numbers) > 1 else '%s') % _ranges(numbers, width), suffix)
                      for (prefix, width, suffix), numbers in groups.items()]
    return ','.join(sorted(parts))


def clean_line(found):
    """The one line for every clean host: how many, their GPUs, their names as a hostlist."""
    gpus = sum(report.get('gpus_free', 0) for report in found)
    return 'clean     %d host(s), nothing to do (%d GPU(s) free): %s' % (
        len(found), gpus, host_list(report['host'] for report in found))


def misconfigured(report):
    """Whether report is that of a host that failed on its settings, before anything was read."""
    return report.get('misconfigured') is True


def summary_line(report, width=0):
    """One line for a host's report that is not clean: what happened, in a few words."""
    host = str(report.get('host')).ljust(width)
    outcome = report.get('outcome')
    signalled = report.get('signalled') or []
    if outcome == 'released':
        text = '%d process(es) stopped' % len(signalled)
        if signalled:
            names = _unique(printable(_name(process)) for process in signalled)
            signals = _unique(name for process in signalled for name in process.get('signals_sent') or [])
            text += ' (%s; %s)' % (', '.join(names), '+'.join(signals))
        if report.get('escalation'):
            text += ', GPU(s) %s reset' % ', '.join(str(index) for index in report['escalation'].get('gpus') or [])
        seconds = report.get('release_s') if report.get('release_s') is not None else report.get('duration_s')
        return 'released  %s  %s, %s in %s s' % (host, text, _gpu_count(report), seconds)
    if outcome == 'would_release':
        text = 'would signal %d process(es)' % len(signalled)
        if signalled:
            text += ' (%s)' % ', '.join(_unique(printable(_name(process)) for process in signalled))
        return 'checked   %s  %s, %s' % (host, text, _gpu_count(report))
    # A misconfigured host ran nothing: how long it took says nothing.
    timed = report.get('duration_s') is not None and not misconfigured(report)
    took = 'after %s s: ' % round(report['duration_s'], 1) if timed else ''
    return 'FAILED    %s  %s%s' % (host, took, ' '.join(str(report.get('reason') or 'failed').split()))


# What Ansible adds to the action's result, which the role registers as its report.
TASK_RESULT_KEYS = frozenset(['changed', 'failed', 'msg', 'warnings', 'deprecations', 'diff', 'skipped',
                              'invocation', '_ansible_no_log', '_ansible_verbose_always'])


def reports(hosts, hostvars):
    """{host: its report} for the hosts whose variables hold the role's report (gpu_reset_result),
    without what Ansible adds to a task's result."""
    found = {}
    for host in hosts:
        report = plain(hostvars[host].get('gpu_reset_result'))
        if isinstance(report, Mapping) and report.get('outcome') in OUTCOMES:
            found[str(host)] = dict(((key, value) for key, value in report.items() if key not in TASK_RESULT_KEYS),
                                    host=str(host))
    return found


def summary(hosts, hostvars, sliced=False):
    """The playbook's summary: a count line, a line per host that is not clean (failed hosts
    first), then one line for all the clean hosts.

    hosts: the play's hosts; hostvars: their variables, where the role left gpu_reset_result;
    sliced: the inventory is one slice of a sliced job."""
    found = reports(hosts, hostvars)
    missing = [str(host) for host in hosts if str(host) not in found]
    counts = dict((outcome, sum(1 for report in found.values() if report['outcome'] == outcome)) for outcome in OUTCOMES)
    head = '%d of %d host(s)%s: %d clean, %d released, %d failed' % (
        len(found), len(hosts), ' in this slice' if sliced else '', counts['clean'], counts['released'], counts['failed'])
    if counts['would_release']:
        head += ', %d would be released (check mode)' % counts['would_release']
    ordered = sorted(found.values(), key=lambda report: (SUMMARY_ORDER.index(report['outcome']), report['host']))
    named = [report for report in ordered if report['outcome'] != 'clean']
    width = max([len(report['host']) for report in named] or [0])
    lines = [head] + [summary_line(report, width) for report in named]
    if counts['clean']:
        lines.append(clean_line([report for report in ordered if report['outcome'] == 'clean']))
    if missing:
        lines.append('no result from %s (unreachable, or in a later serial batch)' % ', '.join(missing))
    return lines
