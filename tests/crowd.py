# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Crowds that the scan of /proc must get through in time: many small processes, or a few
with very many descriptors each. Every crowd ends when its stdin closes (its starter's end
of the pipe, closed by stop() or by the starter's own exit), reaping what it started."""

import os
import resource
import shutil
import subprocess
import sys

# Starts N sleep processes (3 descriptors, /dev/null), says ready; at EOF on stdin kills and reaps them.
SLEEPERS = '''
import os, signal, sys
null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
pids = [os.posix_spawn('/bin/sleep', ['sleep', '3600'], {}, file_actions=null) for _ in range(int(sys.argv[1]))]
print('ready', flush=True)
os.read(0, 1)
for pid in pids:
    os.kill(pid, signal.SIGKILL)
for pid in pids:
    os.waitpid(pid, 0)
'''

# Holds N descriptors, 0 to N - 1 (/dev/null dup'ed: one open file), says ready, exits at EOF on stdin.
TENANT = '''
import os, sys
first = os.open(os.devnull, os.O_RDONLY)
for fd in range(first + 1, int(sys.argv[1])):
    os.dup2(first, fd)
print('ready', flush=True)
os.read(0, 1)
'''


class Crowd:
    """Processes started by start_sleepers and start_tenants, as uid (None: this user)."""

    def __init__(self, uid=None):
        self.uid = uid
        self.starters = []

    def _python(self):
        # Another user may not reach this interpreter (a home directory of mode 0700): the system's then.
        if self.uid is None:
            return sys.executable
        return shutil.which('python3', path='/usr/bin:/bin') or sys.executable

    def _start(self, code, count, nofile):
        def limits_then_user():
            # Set while still root: past the soft limit that the user could raise it to.
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            if self.uid is not None:
                os.setgid(self.uid)
                os.setuid(self.uid)
        proc = subprocess.Popen([self._python(), '-I', '-c', code, str(count)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, preexec_fn=limits_then_user, cwd='/')
        self.starters.append(proc)
        return proc

    def _ready(self, procs):
        for proc in procs:
            if proc.stdout.readline().strip() != b'ready':
                raise RuntimeError('a process of the crowd did not start (exit status %s)' % proc.wait())

    def start_sleepers(self, count):
        """count sleep processes."""
        self._ready([self._start(SLEEPERS, count, 1024)])

    def start_tenants(self, count, descriptors):
        """count processes with descriptors open descriptors each (at most the hard limit of open
        files: raising that takes CAP_SYS_RESOURCE, which a container may not have)."""
        self._ready([self._start(TENANT, descriptors, descriptors) for dummy in range(count)])

    def stop(self, timeout=60):
        for proc in self.starters:
            proc.stdin.close()
        for proc in self.starters:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        self.starters = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
