# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The host's state directory: root-only, never through a link, corrupt files ignored."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._state import (
    StateDir,
    default_state_dir,
    load_cures,
    record_cure,
)


def test_created_0700_and_used(tmp_path):
    path = tmp_path / 'gpuops'
    state = StateDir(str(path))
    assert state.usable and stat.S_IMODE(os.stat(str(path)).st_mode) == 0o700
    assert state.save('x.json', {'a': 1}) and state.load('x.json') == {'a': 1}
    assert sorted(os.listdir(str(path))) == ['x.json']
    assert state.load('missing.json') is None and state.warnings == []


def test_default_is_run_gpuops_under_the_host_root():
    assert default_state_dir('/') == '/run/gpuops'
    assert default_state_dir('/srv/sim') == '/srv/sim/run/gpuops'


@pytest.mark.parametrize('make, problem', [
    (lambda path, tmp: os.symlink(str(tmp), path), 'not a directory'),
    (lambda path, tmp: (os.mkdir(path), os.chmod(path, 0o777)), 'can be written by others'),
    (lambda path, tmp: (os.mkdir(path), os.chmod(path, 0o770)), 'can be written by others'),
    (lambda path, tmp: open(path, 'w').close(), 'not a directory'),
])
def test_a_directory_others_could_control_is_refused(tmp_path, make, problem):
    path = str(tmp_path / 'gpuops')
    target = tmp_path / 'elsewhere'
    target.mkdir()
    make(path, target)
    state = StateDir(path)
    assert not state.usable and problem in state.problem
    assert state.save('x.json', {'a': 1}) is False and state.load('x.json') is None
    assert os.listdir(str(target)) == []
    assert 'it is not used, so nothing' in state.unusable_warning('nothing is remembered')


def test_a_directory_of_another_user_is_refused(tmp_path):
    state = StateDir(str(tmp_path), euid=os.geteuid() + 1)
    assert not state.usable and 'is owned by' in state.problem


def test_a_missing_parent_is_a_problem_not_a_traceback(tmp_path):
    state = StateDir(str(tmp_path / 'no' / 'such'))
    assert not state.usable and 'cannot be created' in state.problem


@pytest.mark.parametrize('content', [b'', b'{', b'[1, 2]', b'\xff\xfe', b'null', b'"text"'])
def test_corrupt_state_files_are_ignored_with_a_warning(tmp_path, content):
    state = StateDir(str(tmp_path / 'gpuops'))
    with open(os.path.join(state.path, 'x.json'), 'wb') as handle:
        handle.write(content)
    assert state.load('x.json') is None
    assert len(state.warnings) == 1 and 'is ignored' in state.warnings[0]


def test_a_state_file_that_is_a_link_is_not_followed(tmp_path):
    state = StateDir(str(tmp_path / 'gpuops'))
    secret = tmp_path / 'secret.json'
    secret.write_text('{"a": 1}')
    os.symlink(str(secret), os.path.join(state.path, 'x.json'))
    assert state.load('x.json') is None and 'cannot be opened' in state.warnings[0]
    # Saving replaces the link with a file of its own; the target is untouched.
    assert state.save('x.json', {'b': 2})
    assert secret.read_text() == '{"a": 1}' and not os.path.islink(os.path.join(state.path, 'x.json'))


def test_cures_are_kept_by_gpu_uuid_and_boot(tmp_path):
    state = StateDir(str(tmp_path / 'gpuops'))
    assert record_cure(state, ['GPU-a', None], 1000.0, 'reset', 'boot-1')
    assert record_cure(state, ['GPU-b'], 2000.0, 'reset', 'boot-2')
    assert load_cures(state, 'boot-1') == {'GPU-a': 1000.0}
    assert load_cures(state, 'boot-2') == {'GPU-b': 2000.0}
    with open(os.path.join(state.path, 'cures.json'), 'w') as handle:
        handle.write('{"gpus": {"GPU-a": "yesterday", "GPU-c": {"boot_id": "boot-1", "time": "x"}}}')
    assert load_cures(state, 'boot-1') == {}
