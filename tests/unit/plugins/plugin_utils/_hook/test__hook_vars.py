# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Slurm hook's settings (plugin_utils/_hook/vars.py): the spec's defaults, then the variables
file, then what the hook fixes; what only the playbook can do; the host root of the file."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _slurm_hook
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import status as _hook_status
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import vars as _hook_vars


def test_settings_are_the_spec_defaults_then_the_file_then_the_hook(tmp_path):
    path = tmp_path / 'vars.yml'
    path.write_text('gpu_reset_grace_period: 2\ngpu_reset_timeout: 99\n')
    settings = _hook_vars.load_settings(str(path), {'gpu_reset_timeout': 7})
    assert settings['gpu_reset_grace_period'] == 2
    assert settings['gpu_reset_timeout'] == 7
    assert settings['gpu_reset_signals'] == ['TERM', 'KILL']


@pytest.mark.parametrize('text', [
    "gpu_reset_clean_query: length(nvidia_gpus) == `8`\n",
    "gpu_reset_drain_command: [/bin/true]\n",
    "gpu_reset_grace_period: '{{ 3 }}'\n",
])
def test_what_only_the_playbook_can_do_sends_the_hook_to_it(tmp_path, text):
    path = tmp_path / 'vars.yml'
    path.write_text(text)
    with pytest.raises(_hook_vars.NeedsPlaybook):
        _hook_vars.load_settings(str(path))
    assert _slurm_hook.main(['--node', 'n1', '--vars-file', str(path)]) == _hook_status.RUNNER_NEEDS_PLAYBOOK


@pytest.mark.parametrize('text', ['- gpu_reset_timeout: 5\n', 'just words\n'])
def test_a_variables_file_that_is_no_mapping_is_refused_naming_it(tmp_path, text):
    path = tmp_path / 'vars.yml'
    path.write_text(text)
    with pytest.raises(ValueError, match='%s must be a YAML mapping of gpu_reset_\\* variables' % path):
        _hook_vars.load_settings(str(path))


def test_what_the_hook_fixes_is_drain_on_failure_and_only_what_it_was_given():
    args = _slurm_hook.parse_args(['--node', 'gpu07'])
    assert _hook_vars.hook_vars(args) == {'gpu_reset_on_failure': 'drain'}
    args = _slurm_hook.parse_args(['--node', 'gpu07', '--timeout', '7'])
    assert _hook_vars.hook_vars(args, [0, 5], {'id': '42'}) == {
        'gpu_reset_on_failure': 'drain', 'gpu_reset_gpus': [0, 5], 'gpu_reset_job': {'id': '42'}, 'gpu_reset_timeout': 7.0}


@pytest.mark.parametrize('text, root', [
    ('gpu_reset_host_root: /srv/node\n', '/srv/node'),
    ('gpu_reset_timeout: 5\n', '/'),
    # Templated: only the playbook can tell, and says why.
    ("gpu_reset_host_root: '{{ node_root }}'\n", '/'),
    ('gpu_reset_host_root: [/srv/node]\n', '/'),
    ('gpu_reset_host_root: [\n', '/'),
    (None, '/'),
])
def test_the_host_root_is_the_variables_files_or_slash(tmp_path, text, root):
    path = tmp_path / 'vars.yml'
    if text is not None:
        path.write_text(text)
    assert _hook_vars.host_root_of(str(path)) == root
    assert _hook_vars.host_root_of(None) == '/'
