# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._jmespath import plain
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import FINISH_SPEC, PREFIX, SEQUENCE_SPEC, unknown_variables

ROLE = 'gpu_reset'
# What a module's result holds for Ansible rather than for the sequence.
PASSED_ON = ('warnings', 'deprecations')


class ActionModule(ActionBase):
    """gpuops.nvidia.gpu_reset: the per-host sequence (plugin_utils/_sequence.py), its modules run
    on the host with _execute_module; documented in plugins/modules/gpu_reset.py."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(SEQUENCE_SPEC)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        self._passed_on = {}
        settings = dict(self._task.args)
        settings.update(self._finishing_settings(task_vars))
        run = _sequence.Run(
            host=task_vars.get('inventory_hostname'), settings=settings, run_module=self._module_runner(task_vars),
            check_mode=bool(self._task.check_mode), name=self._setting_name(),
            python=task_vars.get('ansible_python_interpreter'))
        try:
            report = _sequence.run(run)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(report)
        result['changed'] = bool(run.release and run.release.get('changed'))
        if self._task.diff and run.release and run.release.get('diff'):
            result['diff'] = run.release['diff']
        self._passed_on.setdefault('warnings', []).extend(
            '%s is no setting of gpu_reset (a typo?); it is ignored' % printable(name, 80)
            for name in unknown_variables(task_vars))
        result.update((key, values) for key, values in self._passed_on.items() if values)
        if run.misconfigured:
            # Wrong settings fail the task whatever assert_clean says: nothing was read, so there is
            # nothing to judge. Ansible names the host; the same words on many hosts are said once.
            result['failed'] = True
            result['msg'] = report['reason']
        elif report['outcome'] == 'failed' and (run.options or {}).get('assert_clean', True):
            result['failed'] = True
            result['msg'] = '%s%s%s' % (printable(report['host']), ' is not clean: ' if report['gpus_after'] else ': ',
                                        report['reason'])
        return result

    def _setting_name(self):
        """How the settings are named in messages: by the role's variables in the role."""
        role = getattr(self._task, '_role', None)
        if role is not None and role.get_name().split('.')[-1] == ROLE:
            return lambda option: PREFIX + option
        return None

    def _finishing_settings(self, task_vars):
        """The role's finishing settings (gpu_reset_on_failure, ...) that are set, to check them
        with the others before anything is touched. Only a text that is a template is templated:
        a list keeps its type whatever its items say (gpu_reset_drain_command names
        gpu_reset_result, which the run makes)."""
        found = {}
        for option in FINISH_SPEC:
            value = task_vars.get(PREFIX + option)
            if isinstance(value, str) and ('{{' in value or '{%' in value):
                try:
                    value = self._templar.template(value)
                except AnsibleError:
                    pass  # left as it is: the check names it
            if PREFIX + option in task_vars:
                found[option] = value
        return found

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
