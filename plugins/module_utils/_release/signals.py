# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Signalling: the one place that sends signals to processes.

A process is addressed by (pid, start time), never by pid alone. Where the kernel offers
pidfds (Linux 5.3+, Python 3.9+) the process is pinned by a pidfd that is checked against
the start time once; a pidfd keeps naming that process after it exits, so a recycled pid
can never receive the signal. Elsewhere the start time is read again right before kill().
Every signal sent is written to the system log.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import select
import signal
import time

try:
    import syslog
    HAS_SYSLOG = True
except ImportError:  # not a POSIX host
    HAS_SYSLOG = False

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import is_gone, read_process

HAS_PIDFD = hasattr(os, 'pidfd_open') and hasattr(signal, 'pidfd_send_signal')

SYSLOG_IDENT = 'gpuops.nvidia'

# The audit line of a signal: fixed fields first, then the command, quoted and capped. Each
# user-chosen field goes through printable() (no newline can start a forged line, no escape
# reaches a terminal) and is capped, so that the line always fits one syslog datagram: glibc's
# syslog() sends it as one datagram on /dev/log, and one larger than the socket's send buffer
# (net.core.wmem_default, 212992 bytes by default) is dropped without a word, as is one past
# the receiver's own limit (rsyslog's default maxMessageSize is 8 KiB). With the caps below a
# line of ASCII stays under the 2048 octets RFC 5424 (section 6.1) asks every receiver to
# accept, and any line under SYSLOG_MAX_OCTETS (4 bytes per character at worst).
AUDIT_COMMAND_CHARS = 1024
AUDIT_USER_CHARS = 64
AUDIT_DEVICES_CHARS = 512
# What system_log hands to syslog at most, in UTF-8 octets: under rsyslog's 8 KiB with room
# for the header syslog() puts in front (time, ident, pid).
SYSLOG_MAX_OCTETS = 7680


class NotPermittedError(GpuopsError):
    """The kernel refused a signal (EPERM): the process belongs to someone we may not signal."""

    def __init__(self, message, uid=None):
        super(NotPermittedError, self).__init__(message)
        self.uid = uid


def system_log(message):
    """Write message to the system log (syslog, or the journal through its syslog socket), cut
    to SYSLOG_MAX_OCTETS so that it is never dropped for its size."""
    if not HAS_SYSLOG:
        return
    syslog.openlog(SYSLOG_IDENT, syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_NOTICE, fit_octets(message, SYSLOG_MAX_OCTETS))


def fit_octets(text, octets):
    """text cut (on a character boundary) to at most octets bytes of UTF-8, saying so."""
    if len(text.encode('utf-8')) <= octets:
        return text
    kept = text.encode('utf-8')[:octets - 40].decode('utf-8', 'ignore')
    return '%s...(%d more characters)' % (kept, len(text) - len(kept))


def audit_line(signame, pid, user, command, devices):
    """The system log's line for a signal sent: signal, pid, user, devices, then the command,
    each user-chosen field escaped and capped (see AUDIT_COMMAND_CHARS)."""
    held = printable(','.join(devices), AUDIT_DEVICES_CHARS) if devices else '(reported by the driver)'
    quoted = printable(command or '').replace('"', '\\"')
    if len(quoted) > AUDIT_COMMAND_CHARS:
        quoted = '%s...(%d more characters)' % (quoted[:AUDIT_COMMAND_CHARS], len(quoted) - AUDIT_COMMAND_CHARS)
    return ('nvidia_device_release: sent SIG%s to pid %d (user %s) holding %s, command "%s"'
            % (signame, pid, printable(str(user), AUDIT_USER_CHARS), held, quoted))


class ProcessRef:
    """One process, identified by pid and start time (clock ticks since boot)."""

    def __init__(self, pid, starttime, proc='/proc', use_pidfd=None):
        self.pid = pid
        self.starttime = starttime
        self.proc = proc
        self.pidfd = None
        self._gone = False
        if HAS_PIDFD if use_pidfd is None else use_pidfd:
            self._open_pidfd()
        elif not self._is_same():
            self._gone = True

    def _open_pidfd(self):
        try:
            fd = os.pidfd_open(self.pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                self._gone = True
            return  # other errors (ENOSYS in old kernels, EPERM): fall back to start times
        # The pidfd names whichever process had the pid a moment ago: keep it only if that
        # is still the process that was discovered.
        if self._is_same():
            self.pidfd = fd
        else:
            os.close(fd)
            self._gone = True

    def _is_same(self):
        info = read_process(self.pid, self.proc)
        return not is_gone(info) and info.starttime == self.starttime

    def exited(self):
        """True once the process has exited (a zombie counts) or its pid names another one."""
        if self._gone:
            return True
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            gone = bool(poller.poll(0))
        else:
            gone = not self._is_same()
        self._gone = gone
        return gone

    def send(self, signum):
        """Send signum if this is still the same process. True when it was sent."""
        if self._gone:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            else:
                if not self._is_same():
                    self._gone = True
                    return False
                os.kill(self.pid, signum)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                self._gone = True
                return False
            if exc.errno == errno.EPERM:
                info = read_process(self.pid, self.proc)
                uid = info.uid if info else None
                raise NotPermittedError('not permitted to signal pid %d (uid %s): run with become: true'
                                        % (self.pid, uid), uid)
            raise GpuopsError('cannot send signal %d to pid %d: %s' % (signum, self.pid, exc.strerror))
        return True

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Signaller:
    """Sends signals to ProcessRefs and logs each one sent."""

    def __init__(self, log=None):
        self.log = system_log if log is None else log

    def send(self, ref, signame, signum, user, command, devices):
        """Signal ref; log and return True when the signal went out, False when it is gone."""
        if not ref.send(signum):
            return False
        self.log(audit_line(signame, ref.pid, user, command, devices))
        return True


def wait_exited(refs, timeout, clock=time.monotonic):
    """Wait up to timeout seconds until every ref has exited; True when all have.

    With pidfds this sleeps in poll() and wakes the moment a process exits; otherwise it
    checks /proc on a short, growing interval.
    """
    deadline = clock() + timeout
    delay = 0.005
    while True:
        pending = [ref for ref in refs if not ref.exited()]
        if not pending:
            return True
        left = deadline - clock()
        if left <= 0:
            return False
        pidfds = [ref.pidfd for ref in pending if ref.pidfd is not None]
        if len(pidfds) == len(pending):
            poller = select.poll()
            for fd in pidfds:
                poller.register(fd, select.POLLIN)
            poller.poll(max(1, int(left * 1000)))
        else:
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.1)
