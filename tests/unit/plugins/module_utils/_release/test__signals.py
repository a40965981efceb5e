# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The audit line of every signal sent: fixed fields, the user's text escaped and capped."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import signal
import socket

from ansible_collections.gpuops.nvidia.plugins.module_utils._release import signals as _signals
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import Signaller

FORGED = 'Dec  1 08:00:00 node7 gpuops.nvidia[1]: nvidia_device_release: sent SIGKILL to pid 1 (user root)'


class SentRef:
    """A ProcessRef whose signal always goes out."""

    pid = 4242

    def send(self, signum):
        return True


def audit(command, user='alice', devices=('/dev/nvidia0', '/dev/nvidia1')):
    logged = []
    assert Signaller(logged.append).send(SentRef(), 'TERM', signal.SIGTERM, user, command, list(devices)) is True
    assert len(logged) == 1
    return logged[0]


def test_a_newline_in_the_command_cannot_start_a_forged_line():
    line = audit('python3 train.py\n' + FORGED)
    assert '\n' not in line and '\r' not in line
    assert line.startswith('nvidia_device_release: sent SIGTERM to pid 4242 (user alice) holding '
                           '/dev/nvidia0,/dev/nvidia1, command "python3 train.py\\x0a')


def test_terminal_escapes_in_the_command_are_escaped():
    line = audit('job \x1b]0;owned\x07\x1b[2J\x9b31m \u202eevil')
    assert not set('\x1b\x07\x9b\u202e') & set(line)
    assert 'job \\x1b]0;owned\\x07\\x1b[2J\\x9b31m \\u202eevil"' in line


def test_a_quote_in_the_command_cannot_end_its_field():
    line = audit('x" user root "y')
    assert line.endswith('command "x\\" user root \\"y"')


def test_a_huge_command_is_capped_and_its_line_fits_one_datagram():
    """A 260 KB command line: its line is capped (RFC 5424's 2048 octets for ASCII) and goes
    through a real Unix datagram socket with the kernel's default buffer, as syslog() sends it."""
    line = audit('python3 train.py ' + 'A' * 260000)
    assert len(line.encode('utf-8')) <= 2048
    assert line.endswith('...(%d more characters)"' % (len('python3 train.py ') + 260000 - _signals.AUDIT_COMMAND_CHARS))
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with sender, receiver:
        sender.send(line.encode('utf-8'))
        assert receiver.recv(1 << 20) == line.encode('utf-8')


def test_the_worst_line_fits_what_system_log_sends():
    """Every field at its cap, each character 4 bytes of UTF-8 and quotes doubled."""
    line = audit('\U0001f600"' * 100000, user='\U0001f600' * 1000, devices=['/dev/\U0001f600'] * 1000)
    assert len(line.encode('utf-8')) <= _signals.SYSLOG_MAX_OCTETS


def test_system_log_cuts_what_would_not_fit_a_datagram(monkeypatch):
    sent = []

    class FakeSyslog:
        LOG_PID = LOG_DAEMON = LOG_NOTICE = 0

        def openlog(self, *args):
            pass

        def syslog(self, priority, message):
            sent.append(message)

    monkeypatch.setattr(_signals, 'HAS_SYSLOG', True)
    monkeypatch.setattr(_signals, 'syslog', FakeSyslog(), raising=False)
    _signals.system_log('gpuops.nvidia: ' + '\u00e9' * 260000)
    assert len(sent) == 1 and len(sent[0].encode('utf-8')) <= _signals.SYSLOG_MAX_OCTETS
    assert sent[0].endswith('more characters)')
    _signals.system_log('short')
    assert sent[1] == 'short'


def test_a_user_and_devices_are_escaped_too():
    line = audit('job', user='eve\nroot', devices=['/dev/nvidia0\n/forged'])
    assert '\n' not in line and '(user eve\\x0aroot) holding /dev/nvidia0\\x0a/forged,' in line
