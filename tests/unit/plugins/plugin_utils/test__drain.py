# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Slurm drain reason and command (plugin_utils/_drain.py): one argument, escaped and capped,
whatever the text users chose that it holds."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import HOLD_PREFIX, NODE_NAME_RE, PREFIX, drain_command


# A process named with a terminal escape and a newline (its comm, which the lock's "who holds
# it" names) that holds the release lock.
LOCK_HOLDER = r'''
import ctypes, fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
ctypes.CDLL(None).prctl(15, b'\x1b]0;pwn\x07\nfake', 0, 0, 0)
print('ready', flush=True)
time.sleep(60)
'''


@pytest.fixture
def escaped_lock_holder(tmp_path):
    proc = subprocess.Popen([sys.executable, '-c', LOCK_HOLDER, str(tmp_path / 'release.lock')], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'ready'
    yield proc
    proc.kill()
    proc.wait()


def test_control_characters_in_the_reason_are_escaped_in_the_drain(hook, escaped_lock_holder):
    """The reason names the process that holds the lock by its name, which its owner chose."""
    rc, report, drained = hook('--timeout', '2')
    assert report['outcome'] == 'failed' and '(\\x1b]0;pwn\\x07' in report['reason'], report['reason']
    assert len(drained) == 4 and drained[:3] == ['update', 'nodename=gpu07', 'state=drain']
    assert '(\\x1b]0;pwn\\x07' in drained[3], drained
    assert not re.search(r'[\x00-\x1f\x7f-\x9f]', drained[3])


@pytest.mark.parametrize('reason', [
    'GPU 1: held by pid 5 (x\n\x1b]0;t\x07\x9b2J\u202e)',
    'x state=resume nodename=gpu[00-99] reason=forged',
    '-h --help',
    'y' * 200000,
])
def test_the_drain_reason_is_one_escaped_capped_argument(reason):
    argv = drain_command('scontrol', 'gpu07', reason)
    assert argv[:4] == ['scontrol', 'update', 'nodename=gpu07', 'state=drain'] and len(argv) == 5
    assert argv[4].startswith('reason=gpu_reset: ') and not re.search(r'[\x00-\x1f\x7f-\x9f\u2028-\u202e]', argv[4])
    assert len(argv[4]) <= len('reason=gpu_reset: ') + 200 + len('...(199800 more characters)')


@pytest.mark.parametrize('hold, prefix', [(False, PREFIX), (True, HOLD_PREFIX)])
def test_a_drain_for_a_person_has_a_prefix_of_its_own_and_a_reason_always(hold, prefix):
    assert drain_command('/opt/slurm/bin/scontrol', 'gpu07', 'GPU 2 lost', hold) == [
        '/opt/slurm/bin/scontrol', 'update', 'nodename=gpu07', 'state=drain', 'reason=%sGPU 2 lost' % prefix]
    assert drain_command('scontrol', 'gpu07', None, hold)[-1] == 'reason=%sGPUs not clean' % prefix
    # The health check and the brake tell the two apart by their prefixes: neither starts the other.
    assert not HOLD_PREFIX.startswith(PREFIX) and not PREFIX.startswith(HOLD_PREFIX)


@pytest.mark.parametrize('node, one', [
    ('gpu07', True), ('gpu07.rack3.example.org', True), ('n-1_a', True), ('x' * 100, True),
    ('', False), ('x' * 101, False), ('gpu[01-04]', False), ('gpu07,gpu08', False), ('-gpu07', False),
    ('gpu07 gpu08', False), ('gpu07\n', False), ('gpu07\nALL', False),
])
def test_a_node_name_is_one_name_never_a_list_or_a_range(node, one):
    assert bool(NODE_NAME_RE.match(node)) is one
