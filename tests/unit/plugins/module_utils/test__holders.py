# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import re
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._holders import (
    ancestors,
    expand_devices,
    find_holders,
    start_time,
)


@pytest.fixture
def devroot(tmp_path):
    dev = tmp_path / 'dev'
    dev.mkdir()
    for name in ['nvidia0', 'nvidia1', 'nvidiactl', 'nvidia-uvm']:
        (dev / name).write_bytes(b'\0' * 4096)
    (dev / 'nvidia-caps').mkdir()
    return dev


def test_expand_devices_skips_directories_and_sorts(devroot):
    paths = expand_devices([str(devroot / 'nvidia*')])
    assert paths == sorted(str(devroot / n) for n in ['nvidia-uvm', 'nvidia0', 'nvidia1', 'nvidiactl'])


def test_expand_devices_matching_nothing_is_empty(devroot):
    assert expand_devices([str(devroot / 'nope*')]) == []


@pytest.mark.parametrize('bad', ['dev/nvidia*', '', 'nvidia0'])
def test_expand_devices_rejects_relative_patterns(bad):
    with pytest.raises(GpuopsError, match='not an absolute path'):
        expand_devices([bad])


def test_finds_open_and_mapped_holders_with_their_devices(devroot, spawn):
    opener = spawn([devroot / 'nvidia0', devroot / 'nvidiactl'])
    mapper = spawn([devroot / 'nvidia1'], mode='map')
    bystander = spawn([devroot / '..' / 'dev' / 'nvidia-caps' / '..' / 'nvidia-uvm'])
    holders, dummy = find_holders(expand_devices([str(devroot / 'nvidia[0-9]*')]))
    found = dict((h.pid, h) for h in holders)
    assert set(found) == set([opener.pid, mapper.pid])
    assert found[opener.pid].devices == [str(devroot / 'nvidia0')]
    assert found[mapper.pid].devices == [str(devroot / 'nvidia1')]
    assert bystander.pid not in found
    holder = found[opener.pid].to_dict()
    assert holder['user'] == pwd.getpwuid(os.getuid()).pw_name
    assert holder['cmdline'].split(' ')[:2] == [sys.executable, '-c']
    assert holder['protected'] is False


def test_protects_nvidia_daemons_by_comm_and_by_argv0(devroot, spawn):
    by_comm = spawn([devroot / 'nvidia0'], name='nvidia-persistenced')
    by_argv0 = spawn([devroot / 'nvidia0'], argv0='/usr/bin/nv-hostengine')
    worker = spawn([devroot / 'nvidia0'], name='python3')
    holders, dummy = find_holders([str(devroot / 'nvidia0')], DEFAULT_PROTECT)
    protected = dict((h.pid, h.protected) for h in holders)
    assert protected == {by_comm.pid: True, by_argv0.pid: True, worker.pid: False}
    comms = dict((h.pid, h.comm) for h in holders)
    assert comms[by_comm.pid] == 'nvidia-persiste'


def test_own_ancestors_are_protected(devroot):
    # This test process (and pytest's parents) hold the file: never a candidate to signal.
    with open(str(devroot / 'nvidia0'), 'rb'):
        holders, dummy = find_holders([str(devroot / 'nvidia0')])
    assert [(h.pid, h.protected) for h in holders] == [(os.getpid(), True)]
    assert os.getppid() in ancestors(os.getpid())


def test_start_time_identifies_a_process(spawn, devroot):
    proc = spawn([devroot / 'nvidia0'])
    first = start_time(proc.pid)
    assert isinstance(first, int) and first == start_time(proc.pid)
    proc.kill()
    proc.wait()
    assert start_time(proc.pid) is None


def fuser_pids(paths):
    """PIDs that psmisc fuser -v lists for paths (PIDs on stdout, the rest of its table on stderr)."""
    result = subprocess.run(['fuser', '-v'] + list(paths), capture_output=True, text=True, check=False)
    assert 'USER' in result.stderr or result.returncode == 1, result.stderr
    return set(int(pid) for pid in re.findall(r'\d+', result.stdout))


def test_discovery_agrees_with_fuser(devroot, spawn):
    spawn([devroot / 'nvidia0', devroot / 'nvidiactl'])
    spawn([devroot / 'nvidia1'], mode='map')
    spawn([devroot / 'nvidia-uvm'], name='nvidia-persistenced')
    spawn([devroot / 'nvidia0', devroot / 'nvidia1', devroot / 'nvidia-uvm'], mode='map')
    paths = expand_devices([str(devroot / 'nvidia*')])
    holders, dummy = find_holders(paths)
    assert len(holders) == 4
    assert set(h.pid for h in holders) == fuser_pids(paths)
    for path in paths:
        assert set(h.pid for h in holders if path in h.devices) == fuser_pids([path]), path
