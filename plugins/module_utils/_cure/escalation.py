# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The release's escalation, the module nvidia_device_reset's: the GPUs a release leaves needing
a reset (_reset_plan), reset.

What is decided at the reset, read again: the GPUs a job's other processes, a foreign holder or a
MIG instance in use keep are not reset. The protected holders are stopped around the reset
(_quiesce), the driver's modules reloaded when the platform refuses it (reset_reload_modules),
the NVLink fabric waited for; then the release reads everything again and judges it. Nothing of
the release imports it: the module hands Escalation to the release (Release(escalation=...)), so
that a host with no GPU to reset never loads it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _reason
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.bug_report import DEFAULT_TIMEOUT_S as BUG_REPORT_TIMEOUT_S
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.bug_report import collect as collect_bug_report, program_next_to
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, READ_MIN_S, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.fabric import wait_for_fabric
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import ancestors, supervisor
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import layout, pending_change, reset_changes
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.mig_restore import MigRestore, described, proof_problems, restorable
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.modules import describe as describe_modules, module_holders
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.quiesce import DEFAULT_STOP_UNITS, Quiesce, quiesced_reset, stop_units_option
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import ORPHANED, mig_not_restored
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reset import GpuReset, would_reset
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.reset_plan import in_use, not_released, read_mig_before
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import system_log
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiRunner
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, boot_id, record_cure

# What helps when a foreign holder keeps a GPU that needs a reset open.
FOREIGN_RETRY = ('the driver refuses a reset while any process has the GPU\'s node open: a descriptor queued on D-Bus '
                 'is dropped after its pending_fd_timeout (150 s by default), so try again then, or restart that daemon')


def reset_argument_spec():
    """The options of nvidia_device_reset besides the release's (release_argument_spec)."""
    return dict(
        reset_due=dict(type='list', elements='dict', options=dict(
            index=dict(type='int', required=True),
            reasons=dict(type='list', elements='str', required=True),
        )),
        reset_reload_modules=dict(type='bool', default=False),
        bug_report_dir=dict(type='path'),
        bug_report_timeout=dict(type='float', default=BUG_REPORT_TIMEOUT_S),
        reset_stop_units=stop_units_option(),
    )


class Escalation:
    """The escalation of one release, on a narrow seam. seen: the release's _release.observation.Observer
    (what it read, its scope, options, budget and deadlines, where warnings go); reread(result):
    read everything again and report it in result, returning the snapshot; smi_runner: how
    nvidia-smi is run (tests); sleep: how to wait."""

    def __init__(self, seen, reread, smi_runner=None, sleep=time.sleep):
        self.seen = seen
        self.reread = reread
        self.smi_runner = smi_runner
        self.sleep = sleep
        self.options = seen.options
        self.clock = seen.clock
        self.budget = seen.budget
        # {index: mig fact} of the GPUs in scope before a reset, and the resets a MIG instance in use kept from.
        self.mig_before = {}
        self.mig_blocked = []
        # The layouts a reset ended that were not made again and proven (_reason.mig_not_restored),
        # and their GPUs, held for a person.
        self.mig_not_restored = []
        self.mig_held = []

    def run(self, result, snapshot, todo):
        """Reset the GPUs todo ({index: [why]}, _reset_plan) that still need it now, wait for their
        NVLink fabric, then read everything again; evidence (nvidia-bug-report.sh) when that fails."""
        todo = self._still_free(result, snapshot, todo)
        if not todo:
            return
        foreign = [holder for holder in self.seen.foreign_seen.values()
                   if any(self.seen.blocks(holder, gpu) for gpu in self.seen.scope(snapshot) if gpu.get('index') in todo)]
        if self._other_jobs_block_reset(result, snapshot, todo):
            self._record_not_attempted(snapshot, todo, 'another job uses the GPU')
            return
        if result.survivors or foreign:
            blocking = ['pid %d' % survivor['pid'] for survivor in result.survivors]
            blocking.extend(_reason.foreign_why(holder, supervisor(holder, self.seen.proc)['unit']) for holder in foreign)
            self.seen.warn('reset_orphaned: GPU %s not reset: processes still hold the devices (%s)' % (
                ', '.join(str(index) for index in sorted(todo)), ', '.join(blocking)))
            if foreign:
                self._foreign_blocks_reset(result, todo, foreign)
            self._record_not_attempted(snapshot, todo, 'processes still hold the devices (%s)' % ', '.join(blocking))
            return
        runner = self.smi_runner or SmiRunner(self.options.nvidia_smi_path)
        bus_ids = dict((gpu.get('index'), gpu.get('pci_bus_id')) for gpu in snapshot.gpus if gpu.get('index') is not None)
        # The reset ends when the signalling would (the read after it has the time left), less the
        # reserve for starting again the units stopped for it (Quiesce.restore_reserve).
        quiesce = self._quiesce(snapshot, todo)
        reset = GpuReset(runner, bus_ids, todo, quiesce.work_deadline(), self.clock, reasons=todo)
        started = reset_started = self.clock()
        escalation = result.escalation = quiesced_reset(quiesce, reset, sorted(todo))
        self.budget.spend('the GPU reset', started)
        if escalation.get('flr_refused') and self.options.reset_reload_modules:
            self._reload_modules(escalation, snapshot, runner)
        self.seen.reboot_only.update(escalation.get('flr_refused') or ())
        if escalation['attempted'] and not escalation['ok']:
            self._name_module_holders(escalation)
        for problem in escalation['quiesced']['problems']:
            self.seen.warn('reset_stop_units: %s' % problem)
        if not escalation['attempted']:
            self._record_not_attempted(snapshot, todo, escalation['message'])
        if escalation['gpus_reset']:
            started = self.clock()
            reloaded = (escalation.get('module_reload') or {}).get('ok')
            escalation['fabric'] = wait_for_fabric(runner, escalation['module_reload']['gpus'] if reloaded else escalation['gpus_reset'],
                                                   self.seen.signal_deadline, self.clock, self.sleep)
            self.budget.spend('waiting for the NVLink fabric', started)
        self._record_cures(escalation, snapshot)
        self._mig_after_reset(escalation, snapshot, runner)
        before, found, problems = snapshot, None, None
        try:
            snapshot = self.reread(result)
            result.changed = result.changed or escalation['attempted'] or bool(escalation['quiesced']['stopped'])
            found = self._after_reset(escalation, snapshot, todo)
            problems = escalation['problems'] = [problem for dummy, problem in found]
        finally:
            # Also when the read after it failed: a reset tried spends its budget.
            self._record_history(escalation, before, todo, found, self.clock() - reset_started)
        if problems:
            result.released = False
            result.failure = '%s; %s' % (result.failure, '; '.join(problems)) if result.failure else \
                'GPUs not released: %s' % '; '.join(problems)
        result.held = list(result.held or []) + self.mig_held
        if result.failure and not escalation['ok']:
            result.failure += '; the GPU reset failed: %s' % escalation['message']
        if result.failure and self.options.bug_report_dir and escalation['attempted']:
            # Evidence of what the driver did; a reset not tried has none.
            escalation['bug_report'] = self._bug_report()

    def preview(self, result, snapshot, todo):
        """Check mode: what run would do (result.escalation), nothing done."""
        todo = self._still_free(result, snapshot, todo)
        if todo:
            result.escalation = would_reset(todo)
            result.escalation['quiesced'] = self._quiesce(snapshot, todo).report()
            result.changed = True
            self._would_reload(result.escalation, snapshot)

    def _still_free(self, result, snapshot, todo):
        """todo as it stands at the reset, read again now: only GPUs in scope that the driver places
        no process on, whose memory is still held when that was the only reason, and on which no MIG
        instance is in use (mig_blocked; each GPU's MIG layout is kept in mig_before for the report)."""
        gpus = dict((gpu.get('index'), gpu) for gpu in self.seen.scope(snapshot)
                    if gpu.get('index') in todo and 'mig_instance' not in gpu)
        busy = sorted(index for index, gpu in gpus.items() if gpu.get('processes'))
        if busy:
            self.seen.warn('reset_due: GPU %s not reset: the driver places a process on it now' % ', '.join(str(index) for index in busy))
        freed = [index for index, gpu in gpus.items() if todo[index] == [ORPHANED] and self.seen.gpu_clean(gpu)]
        todo = dict((index, todo[index]) for index in gpus if index not in busy and index not in freed)
        if not todo:
            return todo
        self.mig_before, warnings = read_mig_before(self.seen, [gpus[index] for index in sorted(todo)])
        for warning in warnings:
            self.seen.warn('MIG before the reset: %s' % warning)
        for index in sorted(todo):
            used = in_use(self.mig_before.get(index), self.options.memory_threshold_mib)
            if used and index not in self.seen.job_scoped:
                self.mig_blocked.append(_reason.reset_not_attempted(index, todo.pop(index), used))
        if self.mig_blocked:
            not_released(result, '; '.join(self.mig_blocked))
        return todo

    def _reload_modules(self, escalation, snapshot, runner):
        """reset_reload_modules: the platform refused the reset of some GPUs; reload the driver's
        kernel modules instead, with the NVML clients stopped around it (_reload). A reload that
        worked reset every GPU: no reboot is asked for those refused."""
        from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reload import ModuleReload, complete_entry

        every = dict((gpu.get('index'), ['a reload of the driver']) for gpu in snapshot.gpus if gpu.get('index') is not None)
        quiesce = self._quiesce(snapshot, every)
        reload = ModuleReload(runner, snapshot.gpus, escalation['flr_refused'], quiesce.work_deadline(),
                              self.options.host_root, self.options.nvidia_smi_path, self.clock, proc=self.seen.proc)
        started = self.clock()
        refusal = reload.refusal()
        entry = reload.run(every) if refusal else quiesced_reset(quiesce, reload, sorted(every))
        entry = escalation['module_reload'] = complete_entry(entry, quiesce.report())
        self.budget.spend('the kernel module reload', started)
        for problem in entry['quiesced']['problems']:
            self.seen.warn('reset_stop_units: %s' % problem)
        escalation['message'] += '; ' + entry['message']
        if entry['ok']:
            escalation['ok'], escalation['flr_refused'], escalation['gpus_reset'] = True, [], list(escalation['gpus'])

    def _would_reload(self, escalation, snapshot):
        """Check mode with reset_reload_modules: what a refused reset would make the release do."""
        if not self.options.reset_reload_modules:
            return
        from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reload import would_reload

        escalation['module_reload'] = would_reload(snapshot.gpus, 'the platform refuses the GPU reset (FLR)',
                                                   self.options.host_root)

    def _name_module_holders(self, escalation):
        """A reset that failed names the kernel modules that hold the driver: some keep it from
        resetting a GPU that no process holds (an idle nvidia_drm)."""
        holders = escalation['module_holders'] = module_holders(self.options.host_root)
        if holders:
            escalation['message'] += '; kernel modules that hold nvidia: %s' % describe_modules(holders)

    def _other_jobs_block_reset(self, result, snapshot, todo):
        """True when a process the job's release leaves alone holds a GPU to reset: a reset would
        end that job, so it is not tried, and the GPU is not released. Whose each process is, is
        read again now (slurmd's list too): a job may have started since the signals."""
        gpus = [gpu for gpu in self.seen.scope(snapshot) if gpu.get('index') in todo]
        problem = self.seen.jobs.refresh() if self.seen.jobs is not None else None
        if problem:
            self.seen.warn('scontrol listpids could not be read again before the reset (%s)' % problem)
        spared = [holder for holder in self.seen.discover(snapshot) if holder.spared
                  if any(self.seen.blocks(holder, gpu) for gpu in gpus)]
        if not spared:
            return False
        why = 'GPU %s needs a reset, not attempted: %s would lose the GPU' % (
            ', '.join(str(index) for index in sorted(todo)), ', '.join(_reason.spared_why(holder) for holder in spared))
        not_released(result, why)
        return True

    def _foreign_blocks_reset(self, result, todo, foreign):
        """A GPU that needs a reset is not released while a foreign holder keeps its node open."""
        why = '%s, not attempted: held by %s; %s' % (
            '; '.join('GPU %s needs a reset (%s)' % (index, ', '.join(reasons)) for index, reasons in sorted(todo.items())),
            ', '.join(_reason.foreign_why(holder, supervisor(holder, self.seen.proc)['unit']) for holder in foreign), FOREIGN_RETRY)
        not_released(result, why)

    def _after_reset(self, escalation, snapshot, todo):
        """What is still wrong after the reset that the GPUs' readings do not show, as (index,
        problem): a fabric not back, a reset the platform refused (a reboot is needed), and a reset
        that failed on a GPU its health (not its memory) said needs one. A MIG instance in use that
        kept a GPU from its reset has no index: that GPU was not reset."""
        problems = [(entry.get('index'), _reason.fabric_not_back(entry)) for entry in escalation.get('fabric') or () if not entry['ok']]
        problems.extend((None, problem) for problem in self.mig_blocked)
        problems.extend(self.mig_not_restored)
        refused = escalation.get('flr_refused') or ()
        problems.extend((index, _reason.reset_refused({'index': index})) for index in refused)
        readable = dict((gpu.get('index'), gpu) for gpu in self.seen.scope(snapshot) if not gpu.get('error'))
        not_reset = set(todo) - set(refused) - set(escalation['gpus_reset'])
        problems.extend((index, _reason.needs_reset(readable[index], why='; '.join(why)))
                        for index, why in sorted(todo.items())
                        if index in readable and index in not_reset and ORPHANED not in why)
        return problems

    def _mig_after_reset(self, escalation, snapshot, runner):
        """The MIG layout of each reset GPU that had MIG, read again after the reset, and what the
        reset changed (escalation['mig']; said in its message too); the instances the reset ended
        made again and proven (_mig_restore), where the mode stayed enabled."""
        before = dict((index, fact) for index, fact in self.mig_before.items()
                      if index in escalation['gpus'] and (fact.get('mode_current') == 'enabled' or pending_change(fact)))
        if not before or not escalation.get('attempted'):
            return
        gpus = [gpu for gpu in snapshot.gpus if gpu.get('index') in before]
        after = self._read_mig(gpus, 'MIG after the reset')
        escalation['mig'] = []
        for gpu in gpus:
            index = gpu['index']
            changes = reset_changes(before[index], after.get(index)) or ['MIG unchanged']
            escalation['mig'].append({'index': index, 'uuid': gpu.get('uuid'), 'before': layout(before[index]),
                                      'after': layout(after.get(index)), 'changes': changes})
            escalation['message'] += '; GPU %s: %s' % (index, '; '.join(changes))
        self._restore_mig(escalation, gpus, before, after, runner)

    def _restore_mig(self, escalation, gpus, before, after, runner):
        """Make again the MIG instances the reset ended, then read them and prove each."""
        todo = [gpu for gpu in gpus if restorable(before[gpu['index']], after.get(gpu['index'])) is None]
        if not todo:
            return
        restore = MigRestore(runner.run, self.seen.deadline - READ_MIN_S, self.clock)
        made = dict((gpu['index'], restore.make(gpu['index'], before[gpu['index']])) for gpu in todo)
        now = self._read_mig(todo, 'MIG after it was made again')
        entries = dict((entry['index'], entry) for entry in escalation['mig'])
        for gpu in todo:
            index, entry = gpu['index'], entries[gpu['index']]
            names, problems = made[index]
            problems = problems + proof_problems(before[index], now.get(index), gpu,
                                                 self.options.memory_threshold_mib, self.options.host_root)
            entry['restored'] = {'ok': not problems, 'made': names, 'problems': problems, 'after': layout(now.get(index))}
            if problems:
                self.mig_not_restored.append((index, mig_not_restored(index, described(before[index]), problems)))
                entry['changes'].append('MIG instances not made again: %s' % '; '.join(problems))
                self._hold_without_layout(gpu)
            else:
                entry['changes'].append('MIG instances made again and proven: %s' % described(now.get(index)))
                self._warn_new_ids(index, before[index], now[index])
            escalation['message'] += '; GPU %s: %s' % (index, entry['changes'][-1])

    def _hold_without_layout(self, gpu):
        """A GPU whose MIG instances the reset ended and that were not made again reads clean: it is
        held for a person (result.held, and its history), so that no later run finds it clean and
        puts it back in service without them."""
        reason = 'GPU %s (%s): its MIG instances were not made again after its reset, held for a person' % (
            gpu['index'], gpu.get('uuid'))
        self.mig_held.append({'index': gpu['index'], 'uuid': gpu.get('uuid'), 'reason': reason})
        history = History.for_host(self.options.host_root, self.options.state_dir)
        history.record([(gpu.get('uuid'), gpu['index'], reason, gpu.get('pci_bus_id'))], 'cure_failed', outcome='held')
        for warning in history.warnings:
            self.seen.warn(warning)

    def _warn_new_ids(self, index, before, after):
        """The driver chose other GPU instance ids: the caps nodes' minors follow them."""
        ids = [sorted(set(instance['gpu_instance_id'] for instance in fact['instances'])) for fact in (before, after)]
        if ids[0] != ids[1]:
            self.seen.warn('GPU %s: MIG instances made again with other GPU instance ids (%s before, %s now): '
                           'gres.conf lines that name their caps nodes must follow' % (
                               index, ', '.join(str(i) for i in ids[0]), ', '.join(str(i) for i in ids[1])))

    def _read_mig(self, gpus, what):
        """{index: mig fact} of gpus read now, within the reset's time (the read after it keeps its own)."""
        left = self.seen.deadline - READ_MIN_S - self.clock()
        facts, warnings = self.seen.reader.read_mig(gpus, timeout=left) if left > CALL_FLOOR_S else ({}, ['no time left'])
        for warning in warnings:
            self.seen.warn('%s: %s' % (what, warning))
        return facts

    def _bug_report(self):
        """nvidia-bug-report.sh into bug_report_dir, within bug_report_timeout."""
        timeout = BUG_REPORT_TIMEOUT_S if self.options.bug_report_timeout is None else self.options.bug_report_timeout
        report = collect_bug_report(self.options.bug_report_dir, timeout,
                                    program_next_to(self.options.nvidia_smi_path))
        system_log('gpuops.nvidia: %s' % report['message'])
        if not report['ok']:
            self.seen.warn('bug_report_dir: %s' % report['message'])
        return report

    def _quiesce(self, snapshot, todo):
        """The stops around a reset of the GPUs todo: of the protected processes that hold them."""
        gpus = [gpu for gpu in self.seen.scope(snapshot) if gpu.get('index') in todo]
        blocking = [(holder, [gpu.get('index') for gpu in gpus if self.seen.blocks(holder, gpu)])
                    for holder in self.seen.discover(snapshot) if holder.protected]
        units = DEFAULT_STOP_UNITS if self.options.reset_stop_units is None else self.options.reset_stop_units
        return Quiesce([(holder, held) for holder, held in blocking if held], units,
                       self.seen.signal_deadline, self.clock, self.seen.proc, own=ancestors(os.getpid(), self.seen.proc))

    def _record_cures(self, escalation, snapshot):
        """Record on the host that the GPUs whose reset worked are cured: their older Xid errors no
        longer count in their health."""
        if not escalation['gpus_reset']:
            return
        uuids = [gpu.get('uuid') for gpu in snapshot.gpus if gpu.get('index') in escalation['gpus_reset']]
        state = StateDir.for_host(self.options.state_dir, self.options.host_root)
        record_cure(state, uuids, time.time(), 'reset', boot_id())
        for warning in state.warnings:
            self.seen.warn(warning)

    def _record_history(self, escalation, snapshot, todo, found, duration):
        """Each GPU reset in its history, with its outcome (_history.OUTCOMES), as its own reset
        went: reset (and a cure) where it worked, cured when the GPU read clean again after it
        (proof: that read; found: the (index, problem) pairs of _after_reset, None when the read
        failed) and cure_failed when not; reset_failed where it did not work, escalated to what
        comes next when the platform refused it (a reload of the driver that worked, else a reboot)."""
        if not escalation.get('attempted'):
            return
        history = History.for_host(self.options.host_root, self.options.state_dir)
        attempt = dict(duration_s=round(duration, 3))

        def gpus(indexes):
            return [(gpu.get('uuid'), gpu.get('index'), '; '.join(todo.get(gpu.get('index')) or []), gpu.get('pci_bus_id'))
                    for gpu in snapshot.gpus if gpu.get('index') in indexes]

        done = set(escalation['gpus_reset'])
        for index in sorted(done):
            problems = [problem for at, problem in found or () if at == index]
            if found is None:
                outcome = dict(outcome='cure_failed', why='the GPUs could not be read again after the reset')
            elif problems:
                outcome = dict(outcome='cure_failed', why=printable('; '.join(problems), 200))
            else:
                outcome = dict(outcome='cured', proof='read clean after the reset')
            history.record(gpus([index]), 'reset', **dict(attempt, **outcome))
        history.record(gpus(done), 'cure', how='reset')
        error = printable(escalation.get('message') or '', 200)
        refused = set(escalation.get('flr_refused') or ())
        reloaded = (escalation.get('module_reload') or {}).get('ok')
        history.record(gpus(refused - done), 'reset_failed', error=error, outcome='escalated',
                       to='module_reload' if reloaded else 'reboot', **attempt)
        history.record(gpus(set(escalation['gpus']) - refused - done), 'reset_failed', error=error, outcome='cure_failed',
                       **attempt)
        for warning in history.warnings:
            self.seen.warn(warning)

    def _record_not_attempted(self, snapshot, todo, why):
        """Each GPU that needs a reset not tried now in its history: not_attempted, with why (a
        repeat is counted on the last such event)."""
        history = History.for_host(self.options.host_root, self.options.state_dir)
        history.record([(gpu.get('uuid'), gpu.get('index'), '; '.join(todo[gpu.get('index')]), gpu.get('pci_bus_id'))
                        for gpu in snapshot.gpus if gpu.get('index') in todo], 'not_attempted', outcome='not_attempted',
                       why=printable(why, 200))
        for warning in history.warnings:
            self.seen.warn(warning)
