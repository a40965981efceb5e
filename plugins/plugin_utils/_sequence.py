# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset sequence on one host, the only one: for the action gpuops.nvidia.gpu_reset
(the role's one task) and for the Slurm hook.

check the settings -> read first (only with a clean query of your own) -> release -> reset
(only the GPUs the release names in reset_due, with allow_gpu_reset) -> verify (a bounded loop,
only when needed) -> judge -> prove by allocation (only when asked, and only GPUs judged clean)
-> finish (_finish.py: drain, metrics, report).

Each step is a function over one Run. The modules run through one seam, run_module(name, args):
in the action it is Ansible's _execute_module on the host; in the hook a subprocess on the node
itself. A seam that gets no result from a module raises ModuleError.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import MIN_TIMEOUT_S, Budget
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.performance import PCIE_LINK_DEGRADED
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import PERFORMANCE
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import failed
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._settings import settings_problems
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import QueryError
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import MISCONFIGURED, facts_of, is_clean, task_error, verdict

READ_FIRST = 'Read the GPUs and who holds them'
RELEASE = 'Release the GPUs'
RESET = 'Reset the GPUs that need it'
VERIFY = 'Read the GPUs and check that they are clean'
PROVE = 'Prove the GPUs by allocation'

# With a clean query of your own that does not hold yet after a release that freed the GPUs:
# reads one second apart, at most this many (the driver frees memory within a second or two).
VERIFY_READS = 4
VERIFY_DELAY_S = 1.0

RELEASE_OPTIONS = ('backend', 'nvidia_smi_path', 'host_root', 'expected_gpus', 'devices', 'gpus', 'signals',
                   'grace_period', 'timeout', 'memory_threshold_mib', 'extra_protect', 'lock_file', 'kernel_log',
                   'job', 'hold_after_cures', 'hold_window_days', 'reset_budget')
# The reset's own, besides the release's.
RESET_OPTIONS = ('bug_report_dir', 'bug_report_timeout')
# The modules whose failed result that judged the GPUs (released false) is no error: the verdict says why.
RELEASING = ('nvidia_device_release', 'nvidia_device_reset')
# kernel_log: the facts judge the GPUs' health from the same kernel log as the release.
FACTS_OPTIONS = ('backend', 'nvidia_smi_path', 'host_root', 'expected_gpus', 'devices', 'extra_protect',
                 'memory_threshold_mib', 'timeout', 'kernel_log')
PROBE_OPTIONS = ('backend', 'nvidia_smi_path', 'host_root', 'gpus', 'memory_threshold_mib')


def warning_text(warning):
    """A module's warning as text: ansible-core 2.19 gives it as an object (or its dict) with its event."""
    event = warning.get('event') if isinstance(warning, dict) else getattr(warning, 'event', None)
    message = event.get('msg') if isinstance(event, dict) else getattr(event, 'msg', None)
    return str(message if message is not None else warning)


class ModuleError(Exception):
    """A module gave no result at all (stopped at the deadline, or it crashed)."""


class Run:
    """One host's run. settings: the gpu_reset settings without their prefix, as given (the
    steps check and convert them); name(option): how a setting is named in messages (the role
    names its variables); deadline: time.monotonic() by which the modules must be done (None:
    Ansible's own task timeout bounds them); python: the host's interpreter, for the message
    when it cannot run the modules."""

    def __init__(self, host, settings, run_module, check_mode=False, name=None, deadline=None, python=None,
                 sleep=time.sleep):
        self.host = host
        self.settings = settings
        self.run_module = run_module
        self.check_mode = check_mode
        self.name = name or (lambda option: option)
        self.deadline = deadline
        self.python = python
        self.sleep = sleep
        self.started = time.time()
        self.options = None
        self.misconfigured = False
        self.facts_before = self.release = self.verify = None
        self.clean_before = False
        self.error = None
        self.report = None
        self.warnings = []
        # The steps that ran a module, in order (each one module call on the host).
        self.steps = []
        self.budget = None if deadline is None else Budget('the run', deadline - time.monotonic())

    def left(self):
        """Seconds left before the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def call(self, step, module, args):
        """Run module; its result, or None with run.error set when it gave none or failed."""
        try:
            result = self.module(step, module, args)
        except ModuleError as exc:
            self.error = '%s: %s' % (step, exc)
            return None
        if result.get('failed') and not (module in RELEASING and 'released' in result):
            # A release that judged the GPUs (released false) is no error: the verdict says why.
            self.error = task_error({'task': step, 'result': result, 'python': self.python})
            return None
        return result

    def module(self, step, module, args):
        """run_module, noted as the step's."""
        self.steps.append(step)
        started = time.monotonic()
        try:
            result = self.run_module(module, args)
        finally:
            if self.budget is not None:
                self.budget.spend(step, started)
        self.warnings.extend(text for text in map(warning_text, result.get('warnings') or []) if text not in self.warnings)
        return result

    def facts_args(self):
        args = self._pick(FACTS_OPTIONS)
        left = self.left()
        if left is not None:
            # Within the time left, so that a hung nvidia-smi is named by the module, not cut off here.
            args['timeout'] = max(1, min(float(args['timeout']), left - 1))
        return args

    def release_args(self):
        args = self._pick(RELEASE_OPTIONS)
        args['reset_orphaned'] = self.options['allow_gpu_reset']
        return self._finished(args)

    def reset_args(self, release):
        """The reset's: the release's options, the GPUs it named, and what is left of its timeout
        (None when too little is left of the run)."""
        args = self._pick(RELEASE_OPTIONS + RESET_OPTIONS)
        args.update(reset_due=release['reset_due'], reset_stop_units=self.options['stop_units'],
                    reset_reload_modules=self.options['reload_modules'])
        timeout = max(MIN_TIMEOUT_S, float(args['timeout']) - float(release.get('elapsed_s') or 0))
        left = self.left()
        if left is not None:
            if left - 1 < MIN_TIMEOUT_S:
                return None
            timeout = min(timeout, left - 1)
        args['timeout'] = round(timeout, 3)
        if left is not None and 'bug_report_timeout' in args:
            # After the reset's own timeout, within what is left of the run.
            args['bug_report_timeout'] = max(1, min(float(args['bug_report_timeout']), left - timeout - 1))
        return self._finished(args)

    def _finished(self, args):
        """args of a release (or its reset) with what both take: facts_after (for a query of your
        own, and for check mode's reason) and the probe, within args' timeout."""
        args['facts_after'] = self.options['clean_query'] is not None or self.check_mode
        probe = self.release_probe(float(args['timeout']))
        if probe is not None:
            args['probe'] = probe
        return args

    def release_probe(self, release_timeout):
        """The release's option probe: it proves the GPUs it releases itself, in the same module
        call (None: the prove step calls the probe module, if at all). With a deadline, the probe
        gets what is left after the release's own timeout, when that is enough for it."""
        if not self.options['probe'] or self.check_mode or self.options['probe_level'] == PERFORMANCE:
            return None
        probe = dict(mib=self.options['probe_mib'], missing_library=self.options['probe_missing_library'],
                     cuda_library=self.options['probe_cuda_library'], level=self.options['probe_level'])
        left = self.left()
        if left is not None:
            probe['timeout'] = left - release_timeout - 1
            if probe['timeout'] < MIN_TIMEOUT_S:
                return None
        return probe

    def shared_gpus(self):
        """The GPUs Slurm shares with other jobs, of the job the run is for."""
        return set((self.options.get('job') or {}).get('shared_gpus') or [])

    def instances(self):
        """The MIG instances in scope (gpus: N:G, N:G:C, MIG UUIDs)."""
        return [gpu for gpu in self.options.get('gpus') or [] if not isinstance(gpu, int)]

    def probe_gpus(self):
        """The GPUs to probe: those in scope but the shared ones, which other jobs may be using, and
        the MIG instances (None: every GPU)."""
        # A MIG instance is proven by the release's reading of it, not by a probe of its whole GPU.
        shared = self.shared_gpus() | set(self.instances())
        if not shared:
            return self.options['gpus']
        scope = self.options['gpus']
        if scope is None:
            scope = [gpu.get('index') for gpu in self.report.get('gpus_after') or []]
        return [index for index in scope if index not in shared]

    def probe_args(self):
        args = self._pick(PROBE_OPTIONS)
        args['gpus'] = self.probe_gpus()
        if args['gpus'] is None:
            del args['gpus']
        args.update(probe_mib=self.options['probe_mib'], missing_library=self.options['probe_missing_library'],
                    cuda_library=self.options['probe_cuda_library'], probe_level=self.options['probe_level'],
                    slow_fraction=self.options['probe_slow_fraction'])
        left = self.left()
        if left is not None:
            args['timeout'] = left - 1
        return args

    def _pick(self, names):
        """The options of names that are set (a module's own default stands for the others)."""
        return dict((name, self.options[name]) for name in names if self.options[name] is not None)

    def is_clean(self, result):
        """Whether the facts in result (a module's result, or facts) pass the clean query; a query
        that fails or gives no true or false is an error."""
        try:
            return is_clean(facts_of(result) or {}, self.options['clean_query'], self.options['gpus'],
                            self.options['memory_threshold_mib'])
        except QueryError as exc:
            self.error = str(exc).replace('gpu_reset_clean_query', self.name('clean_query'), 1)
            return False


def check_settings(run):
    """The settings against the spec and the release's own rules, before anything is read."""
    options, found = settings_problems(run.settings, run.name)
    if found:
        run.misconfigured = True
        run.error = '%s: %s' % (MISCONFIGURED, '; '.join(found))
    run.options = options


def read_first(run):
    """With a clean query of your own: the GPUs judged by it before anything is signalled."""
    if run.options['clean_query'] is None:
        return
    run.facts_before = run.call(READ_FIRST, 'nvidia_gpu_facts', run.facts_args())
    if run.facts_before is not None:
        run.clean_before = run.is_clean(run.facts_before)


def release(run):
    """The release: reads first itself, signals nothing on a clean host, resets when allowed."""
    if run.clean_before:
        return
    run.release = run.call(RELEASE, 'nvidia_device_release', run.release_args())


def reset(run):
    """Only where the release named GPUs that need a reset (allow_gpu_reset): their reset, by a
    module of its own that reads them again first (so that a clean host never loads its code)."""
    release = run.release
    if release is None or not release.get('reset_due'):
        return
    args = run.reset_args(release)
    if args is None:
        run.error = '%s: not started, %s; %s' % (RESET, run.budget.used(), release.get('msg') or 'failed')
        return
    result = run.call(RESET, 'nvidia_device_reset', args)
    if result is not None:
        run.release = after_reset(release, result)


def after_reset(release, reset):
    """The release's result as the reset leaves it: the reset's reading and verdict, with what the
    release signalled and found before it (its GPUs held for a person stay not released)."""
    merged = dict(reset)
    merged['signalled'] = list(release.get('signalled') or []) + list(reset.get('signalled') or [])
    merged['gpus_before'] = release.get('gpus_before')
    merged['changed'] = bool(release.get('changed') or reset.get('changed'))
    merged['held'] = list(release.get('held') or []) + list(reset.get('held') or [])
    merged['reset_due'] = release.get('reset_due')
    merged['elapsed_s'] = round(float(release.get('elapsed_s') or 0) + float(reset.get('elapsed_s') or 0), 3)
    if 'diff' in release and 'diff' in reset:
        merged['diff'] = dict(reset['diff'], before=release['diff'].get('before'))
    if release.get('held'):
        merged['released'] = False
        merged['failed'] = True
        merged['msg'] = '; '.join([held['reason'] for held in release['held']] + ([reset['msg']] if reset.get('msg') else []))
    return merged


def verify(run):
    """Read again only when the release did not leave the GPUs clean (once: waiting cannot help),
    or when your clean query does not hold yet on what it read last (a few reads)."""
    release = run.release
    if run.check_mode or release is None:
        return
    query = run.options['clean_query']
    if release['released'] and (query is None or run.is_clean(release.get('facts_after'))):
        return
    if run.error:
        return
    if not release['released'] and (run.shared_gpus() or run.instances()):
        # A GPU other jobs use is judged for the job by the release alone: the GPU's own readings
        # count the other jobs' processes and memory (a MIG instance's, its siblings').
        run.error = '%s: %s' % (RELEASE, release.get('msg') or 'failed')
        return
    reads = VERIFY_READS if release['released'] else 1
    for attempt in range(reads):
        if attempt:
            run.sleep(VERIFY_DELAY_S)
        try:
            facts = run.module(VERIFY, 'nvidia_gpu_facts', run.facts_args())
        except ModuleError:
            # No time left to read again: the release's own account of why stands.
            run.error = '%s: %s' % (RELEASE, release.get('msg') or 'failed')
            return
        if facts.get('failed'):
            run.error = task_error({'task': VERIFY, 'result': facts, 'python': run.python})
            return
        run.verify = facts
        if run.is_clean(facts) or run.error:
            return


def judge(run):
    """The verdict and the report (gpu_reset_result)."""
    options = run.options or {}
    run.report = verdict(run.host, release=run.release, facts_before=run.facts_before, facts=run.verify,
                         error=run.error, gpus=options.get('gpus'), query=options.get('clean_query'),
                         memory_threshold_mib=options.get('memory_threshold_mib', 32),
                         allow_gpu_reset=bool(options.get('allow_gpu_reset')), check_mode=run.check_mode,
                         started=run.started, misconfigured=run.misconfigured)


# What the report keeps of a probe (verified: every GPU's last verification on the host, by UUID).
PROBE_REPORT = ('probed', 'library_missing', 'gpus', 'duration_ms', 'verified')


def prove(run):
    """After a clean verdict, the proof by allocation: a failed probe fails the host, naming the
    GPU and the CUDA error; a probe that found no library is noted in the report."""
    report = run.report
    if run.misconfigured or run.check_mode or not run.options['probe'] or report['outcome'] == 'failed':
        return
    if run.probe_gpus() == []:
        return  # every GPU in scope is shared with other jobs
    if run.release is not None and 'probe' in run.release:
        # The release proved the GPUs it released itself, in its own module call.
        probe = run.release['probe']
        report['probe'] = dict((key, probe.get(key)) for key in PROBE_REPORT)
        if probe.get('failure'):
            failed(report, PROVE, probe['failure'])
        return
    args = run.probe_args()
    if args.get('timeout', MIN_TIMEOUT_S) < MIN_TIMEOUT_S:
        failed(report, PROVE, 'not started: %s, and the probe needs at least %.1f s' % (run.budget.used(), MIN_TIMEOUT_S))
        return
    try:
        probe = run.module(PROVE, 'nvidia_gpu_probe', args)
    except ModuleError as exc:
        failed(report, PROVE, exc)
        return
    if not probe.get('failed') and slow_gpus(probe) and run.options['slow_gpu_policy'] == 'hold':
        probe = hold_slow(run, probe)
    report['probe'] = dict((key, probe.get(key)) for key in PROBE_REPORT)
    if probe.get('failed'):
        failed(report, PROVE, probe.get('msg', 'failed'))


def retrained(run, probe, retrain):
    """The probe after the reset of the GPUs of retrain (their links), or probe with why not."""
    args = run.reset_args(dict(reset_due=[dict(index=gpu['index'], reasons=[why['message'] for why in gpu['slow']])
                                          for gpu in retrain]))
    why = None if args is not None else 'not started, %s' % (run.budget.used() if run.budget else 'no time left')
    if why is None and run.call(RESET, 'nvidia_device_reset', args) is None:
        why, run.error = run.error, None
    if why is None:
        try:
            return run.module(PROVE, 'nvidia_gpu_probe', run.probe_args())
        except ModuleError as exc:
            why = 'the probe after it gave no result: %s' % exc
    run.warnings.append('the reset of the slow links of GPU %s: %s' % (
        ', '.join(str(gpu['index']) for gpu in retrain), why))
    return probe


def slow_gpus(probe):
    return [gpu for gpu in probe.get('gpus') or [] if gpu.get('slow')]


def hold_slow(run, probe):
    """slow_gpu_policy hold: a GPU whose link is the fault is reset once, where allow_gpu_reset
    allows it (a reset retrains the link), and the GPUs probed again; a GPU still slow fails the
    host, held for a person with its figures (the report's held). Returns the last probe."""
    retrain = [gpu for gpu in slow_gpus(probe) if any(why['reason'] == PCIE_LINK_DEGRADED for why in gpu['slow'])]
    if retrain and run.options['allow_gpu_reset']:
        probe = retrained(run, probe, retrain)
    held = [dict(index=gpu['index'], uuid=gpu.get('uuid'), reason='held for a person, slow: %s' % '; '.join(
        why['message'] for why in gpu['slow'])) for gpu in slow_gpus(probe)]
    if held:
        run.report['held'] = list(run.report.get('held') or []) + held
        failed(run.report, PROVE, '; '.join(entry['reason'] for entry in held))
    return probe


STEPS = (check_settings, read_first, release, reset, verify)


def run(host_run):
    """Run the steps on host_run (a Run) in order, stopping at the first error; then judge and
    prove. Returns the report."""
    for step in STEPS:
        step(host_run)
        if host_run.error:
            break
    judge(host_run)
    prove(host_run)
    host_run.report['steps'] = host_run.steps
    return host_run.report
