# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A private directory opened by descriptor: walked from / one component at a time, never through
the directory itself as a link nor through another user's link, refused below a directory others
can write, and what goes through its descriptor stays in the directory checked. (The state
directory built on it: test__state.py.)"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import os
import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._state.dirfd import MAX_LINKS, DirRefused, open_private_dir

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason='plants files of another user: needs root')


def opened(path, **kwargs):
    """The (device, inode) of the directory open_private_dir opens at path; the fd closed."""
    fd = open_private_dir(str(path), **kwargs)
    try:
        st = os.fstat(fd)
        assert stat.S_ISDIR(st.st_mode)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def identity(path):
    st = os.stat(str(path))
    return st.st_dev, st.st_ino


def refused(path, **kwargs):
    with pytest.raises(DirRefused) as caught:
        os.close(open_private_dir(str(path), **kwargs))
    return str(caught.value)


def test_a_missing_directory_is_created_0700_and_opened_close_on_exec(tmp_path):
    fd = open_private_dir(str(tmp_path / 'gpuops'))
    try:
        assert os.fstat(fd).st_ino == os.stat(str(tmp_path / 'gpuops')).st_ino
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o700
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(fd)
    assert opened(tmp_path / 'gpuops') == identity(tmp_path / 'gpuops')  # opened again as it is


def test_a_relative_path_is_refused():
    assert refused('run/gpuops') == 'is not an absolute path'


def test_missing_parents_are_created_only_when_a_mode_for_them_is_given(tmp_path):
    path = tmp_path / 'host' / 'var' / 'lib' / 'gpuops'
    assert refused(path) == 'cannot be created: %s does not exist' % (tmp_path / 'host')
    assert not os.path.exists(str(tmp_path / 'host'))
    umask = os.umask(0o022)
    try:
        assert opened(path, parents_mode=0o750) == identity(path)
    finally:
        os.umask(umask)
    assert [stat.S_IMODE(os.stat(str(tmp_path / name)).st_mode) for name in ('host', 'host/var', 'host/var/lib')] == [0o750] * 3
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o700


@pytest.mark.parametrize('mode', [0o777, 0o770, 0o720, 0o702, 0o1777])
def test_a_directory_others_can_write_is_refused(tmp_path, mode):
    path = tmp_path / 'gpuops'
    path.mkdir()
    path.chmod(mode)
    assert refused(path) == 'can be written by others (mode %04o)' % mode


def test_a_directory_of_another_user_is_refused(tmp_path):
    path = tmp_path / 'gpuops'
    path.mkdir(mode=0o700)
    assert refused(path, euid=NOBODY) == 'is owned by root (uid 0), not by nobody (uid %d)' % NOBODY


@pytest.mark.parametrize('owner', ['root', 'another user'])
def test_the_directory_itself_as_a_symbolic_link_is_never_followed(tmp_path, owner):
    target = tmp_path / 'elsewhere'
    target.mkdir(mode=0o700)
    os.symlink(str(target), str(tmp_path / 'gpuops'))
    if owner != 'root':
        os.lchown(str(tmp_path / 'gpuops'), NOBODY, NOBODY)
    assert refused(tmp_path / 'gpuops') == 'is not a directory (a symbolic link is not followed)'


def test_a_link_of_the_caller_on_the_way_is_followed_from_the_directory_that_holds_it(tmp_path):
    # As /var/run -> ../run: a relative target is read from the link's own directory.
    (tmp_path / 'run').mkdir()
    (tmp_path / 'var').mkdir()
    os.symlink('../run', str(tmp_path / 'var' / 'run'))
    assert opened(tmp_path / 'var' / 'run' / 'gpuops') == identity(tmp_path / 'run' / 'gpuops')


@root_only
def test_a_link_of_another_user_on_the_way_is_refused_and_nothing_is_made_where_it_points(tmp_path):
    target = tmp_path / 'elsewhere'
    target.mkdir(mode=0o700)
    os.symlink(str(target), str(tmp_path / 'run'))
    os.lchown(str(tmp_path / 'run'), NOBODY, NOBODY)
    assert refused(tmp_path / 'run' / 'gpuops') == (
        'is below %s, a symbolic link owned by nobody (uid %d) (only links of root or root (uid 0) are followed)'
        % (tmp_path / 'run', NOBODY))
    assert os.listdir(str(target)) == []


@root_only
def test_for_another_caller_its_own_links_and_directories_are_used_and_no_one_elses(tmp_path):
    mine, theirs = tmp_path / 'mine', tmp_path / 'theirs'
    for directory in (mine, mine / 'gpuops'):
        directory.mkdir(mode=0o700)
        os.chown(str(directory), NOBODY, NOBODY)
    for link, uid in ((theirs, NOBODY - 1), (tmp_path / 'own', NOBODY)):
        os.symlink(str(mine), str(link))
        os.lchown(str(link), uid, uid)
    assert opened(tmp_path / 'own' / 'gpuops', euid=NOBODY) == identity(mine / 'gpuops')
    assert 'a symbolic link owned by uid %d' % (NOBODY - 1) in refused(theirs / 'gpuops', euid=NOBODY)


def test_below_a_directory_every_user_can_write_only_a_sticky_one_is_used(tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    shared.chmod(0o777)
    assert refused(shared / 'gpuops') == 'is below %s, which every user can write (mode 0777)' % shared
    assert os.listdir(str(shared)) == []  # nothing made there
    shared.chmod(0o1777)
    assert opened(shared / 'gpuops') == identity(shared / 'gpuops')


@root_only
@pytest.mark.parametrize('gid, mode, problem', [
    (1000, 0o775, 'group 1000 can write (mode 0775)'),
    (1000, 0o1775, None),
    (0, 0o775, None),
])
def test_a_directory_above_that_a_group_can_write_is_refused_unless_root_s_or_sticky(tmp_path, gid, mode, problem):
    above = tmp_path / 'above'
    above.mkdir()
    os.chown(str(above), 0, gid)
    above.chmod(mode)
    if problem:
        assert refused(above / 'gpuops') == 'is below %s, which %s' % (above, problem)
    else:
        assert opened(above / 'gpuops') == identity(above / 'gpuops')


@root_only
def test_a_directory_above_owned_by_another_user_is_refused(tmp_path):
    above = tmp_path / 'above'
    (above / 'gpuops').mkdir(parents=True, mode=0o700)
    above.chmod(0o755)
    os.chown(str(above), NOBODY, NOBODY)
    assert refused(above / 'gpuops') == 'is below %s, which is owned by nobody (uid %d)' % (above, NOBODY)


def test_what_is_not_a_directory_is_named_for_what_it_is(tmp_path):
    (tmp_path / 'file').write_text('x')
    os.mkfifo(str(tmp_path / 'fifo'))
    assert refused(tmp_path / 'file') == 'is a regular file, not a directory'
    assert refused(tmp_path / 'fifo') == 'is a FIFO, not a directory'
    assert refused(tmp_path / 'file' / 'gpuops') == 'is below %s, which is a regular file, not a directory' % (
        tmp_path / 'file')


def test_up_to_the_kernels_limit_of_links_is_followed_and_one_more_is_refused(tmp_path):
    (tmp_path / 'real').mkdir()
    previous = 'real'
    for number in range(MAX_LINKS + 1):
        os.symlink(previous, str(tmp_path / ('link%d' % number)))
        previous = 'link%d' % number
    last = tmp_path / ('link%d' % (MAX_LINKS - 1))
    assert opened(last / 'gpuops') == identity(tmp_path / 'real' / 'gpuops')
    assert refused(tmp_path / ('link%d' % MAX_LINKS) / 'gpuops') == 'has more than %d symbolic links on the way' % MAX_LINKS


def test_a_loop_of_links_ends_in_a_refusal(tmp_path):
    os.symlink('b', str(tmp_path / 'a'))
    os.symlink('a', str(tmp_path / 'b'))
    assert refused(tmp_path / 'a' / 'gpuops') == 'has more than %d symbolic links on the way' % MAX_LINKS


def test_what_the_kernel_refuses_is_said_in_its_words(tmp_path):
    long_name = tmp_path / ('x' * 300)
    assert refused(long_name) == 'cannot be opened: %s: File name too long' % long_name
    name = '/proc/gpuops-dirfd-test-%d' % os.getpid()  # /proc: root's, and nothing can be made in it
    assert refused(name).startswith('cannot be created: %s: ' % name) and not os.path.exists(name)


def test_the_descriptor_stays_on_the_directory_checked_when_its_path_is_swapped_for_a_link(tmp_path):
    path, elsewhere = tmp_path / 'gpuops', tmp_path / 'elsewhere'
    elsewhere.mkdir(mode=0o700)
    fd = open_private_dir(str(path))
    try:
        os.rename(str(path), str(tmp_path / 'gpuops-checked'))
        os.symlink(str(elsewhere), str(path))
        os.close(os.open('state.json', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    assert os.listdir(str(elsewhere)) == [] and os.listdir(str(tmp_path / 'gpuops-checked')) == ['state.json']


def test_no_descriptor_is_left_open_by_a_refusal(tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / 'file').write_text('x')
    os.symlink('loop', str(tmp_path / 'loop'))
    before = sorted(os.listdir('/proc/self/fd'))
    for path in (shared / 'gpuops', tmp_path / 'file', tmp_path / 'file' / 'x', tmp_path / 'loop' / 'x',
                 tmp_path / 'no' / 'such', tmp_path / ('x' * 300), shared):
        with pytest.raises(DirRefused):
            open_private_dir(str(path))
    assert sorted(os.listdir('/proc/self/fd')) == before
