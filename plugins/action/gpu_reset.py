# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import math
import os
import shlex

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.unsafe_proxy import wrap_var

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._brake import SINFO_ENV, BrakeUnreadable, brake_holds, sinfo_argv
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_command
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import HostError, finish, run_drain
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import plain
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import (
    DRAIN_COMMAND, PREFIX, SETTINGS_SPEC, nearest_variable, unknown_variables)

ROLE = 'gpu_reset'
# What a module's result holds for Ansible rather than for the sequence.
PASSED_ON = ('warnings', 'deprecations')
# Exit status of coreutils timeout for a command it stopped.
TIMED_OUT = 124
# The most text one write on the host carries: the whole command is one argument of the shell
# on the host (with become, of sudo's), which Linux caps at 128 KiB (MAX_ARG_STRLEN).
WRITE_AT_MOST = 96 * 1024
# The hosts of one playbook run drain in parallel worker processes, forked from ansible-playbook
# after it made its local temporary directory (one per run, removed when it ends): a lock there
# makes each host's count and drain one step, so that no two hosts count the same drained nodes.
BRAKE_LOCK = 'gpu_reset-brake.lock'
# Seconds sinfo may take for the brake.
SINFO_S = 10
# Set by the playbook reset_gpus.yml, which fails the hosts itself once every serial batch has
# run: here a host that is not clean (or misconfigured) is recorded in the result, not failed.
DEFER_FAILURE = PREFIX + '_defer_failure'


def typo_warning(name):
    """The warning for a gpu_reset_* variable that is no setting, naming the nearest one."""
    nearest = nearest_variable(name)
    return '%s is no setting of gpu_reset (%s); it is ignored' % (
        printable(name, 80), 'a typo of %s?' % nearest if nearest else 'a typo?')


def warning_text(warning):
    """A module's warning as text: ansible-core 2.19 passes it on as an object with its event."""
    return getattr(getattr(warning, 'event', None), 'msg', warning)


class ConnectionHost:
    """The finishing steps' seam (_finish.py) over the task's connection, with its become: what
    ansible.builtin.raw runs, so no Python is needed on the host (a host whose Python cannot run
    the modules is drained all the same)."""

    def __init__(self, execute):
        self._execute = execute

    def command(self, argv, seconds):
        """(rc, stderr) of argv, every word quoted, stopped after seconds (coreutils timeout)."""
        seconds = int(math.ceil(seconds))
        result = self._execute('timeout -k 5 %d %s' % (seconds, ' '.join(shlex.quote(word) for word in argv)))
        if result.get('rc') == TIMED_OUT:
            raise HostError('it did not finish within %d s and was stopped' % seconds)
        return result.get('rc'), result.get('stderr') or ''

    def write(self, path, text):
        """Replace path with text (mode 0644) in one step: a temporary file beside it, renamed."""
        if len(text.encode('utf-8')) > WRITE_AT_MOST:
            raise HostError('%d bytes are more than one write on the host carries (%d)' % (len(text.encode('utf-8')), WRITE_AT_MOST))
        template = shlex.quote(os.path.join(os.path.dirname(path), '.gpuops-XXXXXX'))
        script = ('umask 022 && tmp=$(mktemp %s) && { printf %%s %s > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" %s '
                  '|| { rm -f "$tmp"; exit 1; }; }' % (template, shlex.quote(text), shlex.quote(path)))
        result = self._execute(script)
        if result.get('rc') != 0:
            raise HostError(' '.join((result.get('stderr') or result.get('stdout') or 'rc %s' % result.get('rc')).split()))


class ActionModule(ActionBase):
    """gpuops.nvidia.gpu_reset: the per-host sequence (plugin_utils/_sequence.py), its modules run
    on the host with _execute_module, its finishing commands with _low_level_execute_command;
    documented in plugins/modules/gpu_reset.py."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(SETTINGS_SPEC)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        self._passed_on = {}
        settings = self._variables(task_vars)
        settings.update(self._task.args)
        run = _sequence.Run(
            host=task_vars.get('inventory_hostname'), settings=settings, run_module=self._module_runner(task_vars),
            check_mode=bool(self._task.check_mode), name=self._setting_name(),
            python=task_vars.get('ansible_python_interpreter'))
        try:
            report = _sequence.run(run)
            finish(run, ConnectionHost(self._low_level_execute_command),
                   lambda report, seconds: self._brake_then_drain(report, seconds, task_vars, run.options['max_drained']))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(report)
        result['changed'] = bool(run.release and run.release.get('changed')) or bool(report.get('drained'))
        if self._task.diff and run.release and run.release.get('diff'):
            result['diff'] = run.release['diff']
        self._passed_on.setdefault('warnings', []).extend(typo_warning(name) for name in unknown_variables(task_vars))
        host = printable(str(task_vars.get('inventory_hostname')), 80)
        self._passed_on['warnings'] = ['%s: %s' % (host, warning_text(warning)) for warning in self._passed_on['warnings']]
        result.update((key, values) for key, values in self._passed_on.items() if values)
        if not boolean(task_vars.get(DEFER_FAILURE, False), strict=False):
            self._fail(result, run, report)
        return result

    @staticmethod
    def _fail(result, run, report):
        """Fail the task of a misconfigured host, or of one that is not clean unless assert_clean
        is off."""
        if run.misconfigured:
            # Wrong settings fail the task whatever assert_clean says: nothing was read, so there is
            # nothing to judge. Ansible names the host; the same words on many hosts are said once.
            result['failed'] = True
            result['msg'] = report['reason']
        elif report['outcome'] == 'failed' and (run.options or {}).get('assert_clean', True):
            result['failed'] = True
            result['msg'] = '%s%s%s' % (printable(report['host']), ' is not clean: ' if report['gpus_after'] else ': ',
                                        report['reason'])

    def _setting_name(self):
        """How the settings are named in messages: by the role's variables in the role."""
        role = getattr(self._task, '_role', None)
        if role is not None and role.get_name().split('.')[-1] == ROLE:
            return lambda option: PREFIX + option
        return None

    def _variables(self, task_vars):
        """The settings given as gpu_reset_* variables (the role's defaults among them), templated;
        the task's arguments override them. The drain command is templated when it runs, with
        gpu_reset_result, the report, among the variables."""
        found = {}
        for option in SETTINGS_SPEC:
            if PREFIX + option not in task_vars:
                continue
            value = task_vars[PREFIX + option]
            if option != 'drain_command':
                try:
                    value = self._templar.template(value)
                except AnsibleError:
                    pass  # left as it is: the check names it
            found[option] = value
        return found

    def _brake_then_drain(self, report, seconds, task_vars, max_drained):
        """The drain, unless the fleet brake (_brake.py) holds: counted from Slurm on the host,
        the count and the drain one step among the hosts of this run (BRAKE_LOCK)."""
        node = task_vars.get('inventory_hostname_short')
        with open(os.path.join(C.DEFAULT_LOCAL_TMP, BRAKE_LOCK), 'a') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if brake_holds(report, node, self._sinfo_listing, max_drained):
                report['drained'] = False
                return
            self._drain(report, seconds, task_vars)

    def _sinfo_listing(self):
        """The brake's sinfo listing, read on the host (with the task's become), as the default
        drain command runs scontrol there."""
        argv = ['env'] + ['%s=%s' % item for item in SINFO_ENV.items()] + ['timeout', '-k', '5', str(SINFO_S)]
        result = self._low_level_execute_command(' '.join(shlex.quote(word) for word in argv + sinfo_argv('sinfo')))
        if result.get('rc') != 0:
            raise BrakeUnreadable('sinfo on the host failed (rc %s): %s' % (
                result.get('rc'), printable(' '.join((result.get('stderr') or '').split()), 300)))
        return result.get('stdout') or ''

    def _drain(self, report, seconds, task_vars):
        """The drain command run on the host: the default one built here (as the Slurm hook builds
        it), one of your own templated with the report as gpu_reset_result."""
        argv = self._task.args.get('drain_command', task_vars.get(PREFIX + 'drain_command', DRAIN_COMMAND))
        if argv == DRAIN_COMMAND:
            argv = drain_command('scontrol', task_vars.get('inventory_hostname_short'), report['reason'])
        else:
            templar = self._templar.copy_with_new_env()
            templar.available_variables = dict(task_vars, gpu_reset_result=wrap_var(report))
            try:
                argv = [str(word) for word in templar.template(argv)]
            except AnsibleError as exc:
                report['drained'] = False
                report['reason'] = '%s; the drain command could not be made: %s' % (
                    report['reason'], ' '.join(str(exc).split()))
                return
        run_drain(report, ConnectionHost(self._low_level_execute_command), argv, seconds)

    def _module_runner(self, task_vars):
        """The sequence's seam: run a module of the collection on the host."""
        def run_module(name, args):
            result = self._execute_module(module_name='gpuops.nvidia.' + name, module_args=args, task_vars=task_vars)
            # Ansible's own objects (ansible-core 2.19 makes warnings and errors such): passed on
            # to Ansible as they are, kept out of what the sequence reads.
            for key in PASSED_ON:
                self._passed_on.setdefault(key, []).extend(result.pop(key, None) or [])
            # A failed module's message is in msg; this is the same, as Ansible's object.
            result.pop('exception', None)
            return plain(result)
        return run_module
