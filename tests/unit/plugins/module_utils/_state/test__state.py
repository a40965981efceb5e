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

from ansible_collections.gpuops.nvidia.plugins.module_utils._state import dirfd as _dirfd
from ansible_collections.gpuops.nvidia.plugins.module_utils._state import state as _state
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import (
    StateDir,
    default_state_dir,
    load_cures,
    record_cure,
)

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason='plants links of another user: needs root')


def plant_link(link, target, uid=NOBODY):
    """A symbolic link at link to target, owned by uid: planted by another user."""
    os.symlink(str(target), str(link))
    os.lchown(str(link), uid, uid)


def swap_when_checked(monkeypatch, directory, swap):
    """Run swap() right after the walk has opened and checked directory, before it opens what is
    in it: another user's move in the window between a check and the next step."""
    check = _dirfd._check_above

    def checking(fd, here, euid):
        check(fd, here, euid)
        if here == str(directory):
            swap()
    monkeypatch.setattr(_dirfd, '_check_above', checking)


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


def test_a_state_dir_below_a_directory_every_user_can_write_is_refused(tmp_path):
    shared, elsewhere = tmp_path / 'shared', tmp_path / 'elsewhere'
    shared.mkdir()
    shared.chmod(0o777)
    elsewhere.mkdir()
    os.symlink(str(elsewhere), str(shared / 'gpuops'))  # the name another user may point anywhere
    state = StateDir(str(shared / 'gpuops'))
    assert not state.usable and state.problem == 'is below %s, which every user can write (mode 0777)' % shared
    assert state.save(_state.CURES, {'a': 1}) is False and os.listdir(str(elsewhere)) == []
    warning = state.unusable_warning('no cure is remembered')
    assert warning.startswith('state directory %s is below %s' % (shared / 'gpuops', shared)), warning


def test_nothing_is_created_below_a_directory_every_user_can_write(tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    shared.chmod(0o777)
    assert not StateDir(str(shared / 'gpuops')).usable and os.listdir(str(shared)) == []


def test_a_sticky_directory_every_user_can_write_may_hold_it(tmp_path):
    shared = tmp_path / 'tmp'
    shared.mkdir()
    shared.chmod(0o1777)
    state = StateDir(str(shared / 'gpuops'))
    assert state.usable and state.save('x.json', {'a': 1}) and state.load('x.json') == {'a': 1}


@root_only
def test_a_link_planted_in_a_sticky_directory_right_after_its_check_is_never_followed(tmp_path, monkeypatch):
    shared, elsewhere = tmp_path / 'tmp', tmp_path / 'elsewhere'
    shared.mkdir()
    shared.chmod(0o1777)
    elsewhere.mkdir(mode=0o700)
    swap_when_checked(monkeypatch, shared, lambda: plant_link(shared / 'gpuops', elsewhere))
    state = StateDir(str(shared / 'gpuops'))
    assert os.path.islink(str(shared / 'gpuops'))  # planted indeed, between the check and the open
    assert not state.usable and state.problem == 'is not a directory (a symbolic link is not followed)'
    assert state.save(_state.CURES, {'a': 1}) is False and os.listdir(str(elsewhere)) == []


@root_only
def test_a_middle_directory_swapped_for_a_link_right_after_its_parent_is_checked_is_not_followed(tmp_path, monkeypatch):
    middle, elsewhere = tmp_path / 'middle', tmp_path / 'elsewhere'
    (middle / 'gpuops').mkdir(parents=True, mode=0o700)
    (elsewhere / 'gpuops').mkdir(parents=True, mode=0o700)

    def swap():
        os.rename(str(middle), str(tmp_path / 'middle-checked'))
        plant_link(middle, elsewhere)
    swap_when_checked(monkeypatch, tmp_path, swap)
    state = StateDir(str(middle / 'gpuops'))
    assert not state.usable, 'the walk went through the link'
    assert state.problem == ('is below %s, a symbolic link owned by nobody (uid %d) (only links of root or root (uid 0) '
                             'are followed)' % (middle, NOBODY)), state.problem
    assert state.save(_state.CURES, {'a': 1}) is False and os.listdir(str(elsewhere / 'gpuops')) == []


def test_the_state_dir_swapped_for_a_link_after_its_check_is_not_written_through(tmp_path):
    path, elsewhere = tmp_path / 'gpuops', tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    state = StateDir(str(path))
    assert state.usable
    os.rename(str(path), str(tmp_path / 'gpuops-checked'))
    os.symlink(str(elsewhere), str(path))
    assert record_cure(state, ['GPU-a'], 1000.0, 'reset', 'boot-1') is False
    assert load_cures(state, 'boot-1') == {} and os.listdir(str(elsewhere)) == []
    assert state.warnings == ['state directory %s is not a directory (a symbolic link is not followed); it is not '
                              'used (set state_dir to a directory only root can write)' % path]


def test_the_state_dir_swapped_while_a_file_is_written_keeps_the_file_in_the_directory_checked(tmp_path, monkeypatch):
    path, elsewhere = tmp_path / 'gpuops', tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    state = StateDir(str(path))
    opened = _state.open_private_dir

    def open_then_swap(*args, **kwargs):
        fd = opened(*args, **kwargs)
        os.rename(str(path), str(tmp_path / 'gpuops-checked'))
        os.symlink(str(elsewhere), str(path))
        return fd
    monkeypatch.setattr(_state, 'open_private_dir', open_then_swap)
    assert state.save(_state.VERIFIED, {'gpus': {}})
    assert os.listdir(str(elsewhere)) == [] and os.listdir(str(tmp_path / 'gpuops-checked')) == [_state.VERIFIED]


def test_a_link_of_root_on_the_way_is_followed(tmp_path):
    # As /var/run is a link to /run: only root (or the caller) can have made it.
    real = tmp_path / 'real'
    real.mkdir()
    os.symlink('real', str(tmp_path / 'run'))
    state = StateDir(str(tmp_path / 'run' / 'gpuops'))
    assert state.usable and state.save('x.json', {'a': 1})
    assert os.listdir(str(real / 'gpuops')) == ['x.json']


def test_a_parent_created_for_a_simulated_host(tmp_path):
    state = StateDir(str(tmp_path / 'host' / 'var' / 'lib' / 'gpuops'), parents=True)
    assert state.usable and stat.S_IMODE(os.stat(state.path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(str(tmp_path / 'host' / 'var')).st_mode) & 0o022 == 0


@root_only
def test_a_state_file_of_another_user_is_ignored(tmp_path):
    state = StateDir(str(tmp_path / 'gpuops'))
    path = os.path.join(state.path, 'x.json')
    with open(path, 'w') as handle:
        handle.write('{"a": 1}')
    os.chown(path, NOBODY, NOBODY)
    assert state.load('x.json') is None and 'is not a regular file of this user' in state.warnings[0]


def test_a_state_file_larger_than_the_bound_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(_state, 'MAX_BYTES', 16)
    state = StateDir(str(tmp_path / 'gpuops'))
    assert state.save('x.json', {'a': 'b' * 20}) and state.load('x.json') is None
    assert 'at most 16 bytes' in state.warnings[0]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    state = StateDir(str(tmp_path / 'gpuops'))
    assert state.save('x.json', {'a': 1})

    def failing(*args, **kwargs):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(_state.os, 'fsync', failing)
    assert state.save('x.json', {'a': 2}) is False and 'No space left on device' in state.warnings[0]
    monkeypatch.undo()
    assert state.load('x.json') == {'a': 1} and os.listdir(state.path) == ['x.json']
