# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The one way the collection runs a program (nvidia-smi, journalctl, dmesg): with a hard
deadline, in a session of its own, and leaving nothing running behind."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import contextlib
import errno
import io
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, PermanentReadError, check_time_left, printable


# A kernel symbol of NVIDIA's modules: a line of /proc/PID/stack tagged with one of them
# ("uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]", as hung-task reports print it), or a wchan
# named as the driver's functions are (os_acquire_mutex, _nv012345rm, nvidia_ioctl, uvm_ioctl).
NVIDIA_SYMBOL_RE = re.compile(r'\[nvidia[a-z_-]*\]|^(?:nvidia_|nv_|_nv[0-9]|os_|rm_|uvm_)', re.MULTILINE)
# The most a program's standard output may print (Runner.max_output): every program the collection
# runs prints kilobytes; one that prints more is stopped, or only its last this many are kept.
OUTPUT_MAX = 64 * 1024 * 1024
# The most of its standard error kept (the last of it: where it says why it failed).
STDERR_MAX = 1024 * 1024
# The most read of a small file of /proc (stat, wchan, stack).
PROC_FILE_MAX = 65536


class OutputTooLarge(GpuopsError):
    """The program printed more than Runner.max_output and was stopped."""


class CommandTimeout(GpuopsError):
    """The program did not exit in time and was killed, with everything it started.

    stuck: how the program was when its deadline passed, when it was in uninterruptible sleep
    (D state) then, or still alive after the kill (process_state's dict, with survived_kill);
    None otherwise."""

    def __init__(self, message, argv, timeout, stderr='', stuck=None):
        super(CommandTimeout, self).__init__(message)
        self.argv = argv
        self.timeout = timeout
        # What it wrote to stderr before it was killed: where it was stuck, when it says so.
        self.stderr = stderr
        self.stuck = stuck

    @property
    def in_driver(self):
        """Whether the program hung in the NVIDIA driver: in D state past its deadline, in the
        driver's code where the kernel says so, or not dying when killed."""
        return in_driver(self.stuck or {})

    def how_stuck(self):
        """What showed it hung in the driver: 'pid 4242 in D state, in mutex_lock, alive after SIGKILL'."""
        return how_stuck(self.stuck or {})


def in_driver(stuck):
    """Whether process_state's stuck (a process or a thread) hung in the NVIDIA driver: in D state,
    in the driver's code where the kernel says so, or not dying when killed."""
    return stuck.get('state') == 'D' and bool(stuck.get('nvidia') or stuck.get('survived_kill'))


def how_stuck(stuck, what='pid'):
    """'pid 4242 in D state, in mutex_lock, alive after SIGKILL' of process_state's stuck."""
    return '%s %s in D state%s%s' % (what, stuck.get('pid'), ', in %s' % printable(stuck['wchan'], 80) if stuck.get('wchan') else '',
                                     ', alive after SIGKILL' if stuck.get('survived_kill') else '')


def process_state(pid, proc='/proc'):
    """{'pid', 'state', 'wchan', 'nvidia'} of pid from proc (its /proc/PID/stat state letter, its
    wchan, and whether wchan or its kernel stack names NVIDIA's code; unreadable parts are
    empty), or None when it cannot be read."""
    try:
        with open('%s/%d/stat' % (proc, pid), 'rb') as handle:
            state = handle.read(PROC_FILE_MAX).rsplit(b')', 1)[1].split()[0].decode('ascii', 'replace')
    except (IOError, OSError, IndexError):
        return None
    found = {'pid': pid, 'state': state, 'wchan': '', 'nvidia': False}
    for name in ('wchan', 'stack'):  # the stack is root's only, and not on every kernel
        try:
            with open('%s/%d/%s' % (proc, pid, name), 'rb') as handle:
                text = handle.read(PROC_FILE_MAX).decode('utf-8', 'replace').strip()
        except (IOError, OSError):
            continue
        found['wchan'] = found['wchan'] or (text if name == 'wchan' and text != '0' else '')
        found['nvidia'] = found['nvidia'] or bool(NVIDIA_SYMBOL_RE.search(
            '\n'.join(line.split('] ', 1)[-1] for line in text.splitlines())))
    return found


class Runner:
    """Runs one program with a hard deadline.

    The program runs in a session of its own, with LC_ALL=C. A run ends when the program itself
    exits, not when its pipes close (a process it left behind may keep them open): what it
    printed is its answer, and whatever is left in its process group is killed. When it does
    not exit in time, its process group and every process descended from it are killed, and
    CommandTimeout is raised. A program that cannot be run at all (missing, not executable, a
    bad #! line, built for another system) raises PermanentReadError, in words that name the
    cause, followed by hint.

    path: the program (a name looked up on PATH, or a path); name: how messages call it (the
    base name of path by default); env: variables added to the environment; unset: variables
    taken out of it; pass_fds: descriptors the program inherits (a verified open file run as
    /proc/self/fd/N, a directory it runs in); cwd: where it runs; term_grace: when the deadline
    passes, the program's process group gets SIGTERM first and this many seconds to exit (to
    undo what it changed, in its finally blocks) before everything left is killed;
    CommandTimeout all the same, saying so. max_output: the most bytes its standard output may
    print; past it the program is killed and OutputTooLarge raised, or, with keep_last, only the
    last max_output bytes are kept (skipped_bytes: how many were passed over in the last run).
    """

    POLL_S = 0.05
    KILL_WAIT_S = 1.0
    # Where the state of a program that does not exit in time is read (process_state).
    proc = '/proc'
    # Added to the message of a timeout: what it may mean.
    TIMEOUT_NOTE = ''

    def __init__(self, path, timeout=10.0, name=None, hint=None, env=None, unset=(), pass_fds=(), cwd=None,
                 term_grace=0.0, max_output=OUTPUT_MAX, keep_last=False):
        self.path = path
        self.timeout = timeout
        self.name = name or os.path.basename(path)
        self.hint = hint
        self.env = dict(env or {})
        self.unset = tuple(unset)
        self.pass_fds = tuple(pass_fds)
        self.cwd = cwd
        self.term_grace = term_grace
        self.max_output = max_output
        self.keep_last = keep_last
        self.skipped_bytes = 0  # the last run's standard output passed over (keep_last)
        self.overflowed = False  # the last run printed more than max_output and was killed
        self.stopped = False  # the last run got SIGTERM at its deadline (term_grace)
        self.stuck = None  # the last run's program past its deadline, in D state (CommandTimeout.stuck)

    def _hinted(self, text):
        return '%s: %s' % (text, self.hint) if self.hint else text

    def resolve(self):
        """The path of the program to run; PermanentReadError when there is none that runs."""
        found = shutil.which(self.path) if os.sep not in self.path else self.path
        if not found or not os.path.exists(found):
            raise PermanentReadError(self._hinted('%s not found or not executable at %r' % (self.name, self.path)))
        if not os.path.isfile(found) or not os.access(found, os.X_OK):
            raise PermanentReadError(self._hinted('%s at %r is not executable (%s)' % (
                self.name, found,
                'a directory' if os.path.isdir(found) else 'mode %04o' % stat.S_IMODE(os.stat(found).st_mode))))
        return found

    def run(self, args, timeout=None, input_text=None):
        """Run the program with args; return (rc, stdout, stderr) as text.

        input_text: a short text written to its standard input (none by default). Raise
        PermanentReadError when it cannot run, CommandTimeout when it does not exit within
        timeout seconds (the runner's timeout by default), and NoTimeLeft, running nothing, when
        timeout is less than a call is given at least.
        """
        timeout = self.timeout if timeout is None else timeout
        path = self.resolve()
        check_time_left('run %s' % self.name, timeout)
        env = dict(os.environ, LC_ALL='C', LANG='C', **self.env)
        for name in self.unset:
            env.pop(name, None)
        try:
            proc = subprocess.Popen([path] + list(args),
                                    stdin=subprocess.DEVNULL if input_text is None else subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                    close_fds=True, pass_fds=self.pass_fds, cwd=self.cwd, start_new_session=True)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # ours, not the program's: no hint about it
                raise GpuopsError('%s could not be started: out of file descriptors (%s); raise the open '
                                  'files limit (ulimit -n)' % (self.name, exc.strerror))
            raise PermanentReadError(self._hinted(_exec_failure(self.name, path, exc)))
        try:
            if input_text is not None:
                _write_input(proc, input_text)
        except BaseException:  # interrupted: leave nothing running behind
            self._abandon(proc)
            proc.stdout.close()
            proc.stderr.close()
            raise
        return self.finish(proc, timeout, [self.name] + list(args), [path] + list(args))

    def finish(self, proc, timeout, words, argv=None, started=None):
        """(rc, stdout, stderr) of a started program (a subprocess.Popen or a Forked), once it has
        exited; CommandTimeout, saying words (its name and arguments), when it has not within
        timeout seconds of started (now by default)."""
        try:
            stdout, stderr, finished = self._collect(proc, (time.monotonic() if started is None else started) + timeout)
        except BaseException:  # interrupted: leave nothing running behind
            self._abandon(proc)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
        stdout, stderr = (data.decode('utf-8', 'replace') for data in (stdout, stderr))
        if self.overflowed:
            raise OutputTooLarge('%s printed more than %d bytes and was stopped' % (' '.join(words), self.max_output))
        if not finished or self.stopped:
            how = 'was stopped (SIGTERM; it exited within %.1f s)' % self.term_grace if finished else 'was killed'
            raise CommandTimeout('%s did not answer within %.1f s and %s%s' % (
                ' '.join(words), timeout, how, self.TIMEOUT_NOTE), argv or words, timeout, stderr, stuck=self.stuck)
        return proc.returncode, stdout, stderr

    def _collect(self, proc, deadline):
        """(stdout, stderr, True): its output in bytes, once the program has exited and is reaped;
        (what it wrote so far, False) after killing it when deadline passes first, or when it
        prints more than max_output (self.overflowed) unless keep_last. With term_grace, SIGTERM
        comes first (self.stopped), and the kill that much later."""
        out = _Output(self.max_output, self.keep_last)
        err = _Output(min(self.max_output, STDERR_MAX), True)
        outputs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        self.stopped, self.stuck, self.overflowed, self.skipped_bytes = False, None, False, 0
        selector = selectors.DefaultSelector()
        try:
            for pipe in (proc.stdout, proc.stderr):
                selector.register(pipe, selectors.EVENT_READ)
            delay, drain_until, reaped = 0.001, None, False
            while True:
                state = _exited(proc.pid)
                exited, reaped = state is not False, state is None
                if exited and drain_until is None:
                    drain_until = time.monotonic() + self.POLL_S
                if exited and (not selector.get_map() or time.monotonic() > drain_until):
                    break
                left = deadline - time.monotonic()
                if not exited and left <= 0 and self.term_grace > 0 and not self.stopped:
                    # Asked first: a program that restores what it changed does so in its finally.
                    _signal_group(proc.pid, signal.SIGTERM)
                    self.stopped, deadline, left = True, deadline + self.term_grace, self.term_grace
                if out.overflowed or (not exited and left <= 0):
                    self.overflowed = out.overflowed
                    self._abandon(proc)
                    return out.data(), err.data(), False
                if selector.get_map():
                    # Once it has exited, all it wrote is in the pipes: take what is there and
                    # stop; a process it left behind may keep the pipes open (and busy) for ever.
                    ready = selector.select(0 if exited else min(left, self.POLL_S))
                    if exited and not ready:
                        # What keeps the pipes open is a process it left, maybe in a session of its own.
                        _kill_all(_holders_of([key.fd for key in selector.get_map().values()]))
                        break
                    for key, dummy in ready:
                        data = os.read(key.fd, 65536)
                        if data:
                            outputs[key.fd].add(data)
                        else:
                            selector.unregister(key.fileobj)
                else:  # both pipes closed: it is about to exit
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, self.POLL_S)
        finally:
            selector.close()
            self.skipped_bytes = out.skipped
        if not reaped:  # unreaped, its pid still names its group: kill what it left there
            _kill_group(proc.pid)
        proc.wait()
        return out.data(), err.data(), True

    def _abandon(self, proc):
        # Its descendants are found first (one may have left the group with setsid), then the
        # group and they are killed. A process stuck in the driver (D state) cannot die until
        # the driver lets it go: give it a moment, and never wait on it longer than that.
        if proc.returncode is not None or _exited(proc.pid) is None:
            return  # reaped: its pid may be another process's by now
        state = process_state(proc.pid, self.proc)
        descendants = _stopped_descendants(proc.pid)
        _kill_group(proc.pid)
        _kill_all(descendants)
        try:
            proc.wait(timeout=self.KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            # Alive after SIGKILL and a moment: stuck in the kernel; how it is now says where.
            state = process_state(proc.pid, self.proc) or state
            if state is not None:
                state['survived_kill'] = True
        if state is not None and (state['state'] == 'D' or state.get('survived_kill')):
            self.stuck = state


class _Output:
    """What a program printed on one pipe, at most limit bytes: past it, overflowed; or, with
    keep_last, the oldest bytes are dropped (skipped: how many)."""

    def __init__(self, limit, keep_last):
        self.limit = limit
        self.keep_last = keep_last
        self.chunks = collections.deque()
        self.size = 0
        self.skipped = 0
        self.overflowed = False

    def add(self, data):
        self.chunks.append(data)
        self.size += len(data)
        while self.keep_last and self.size > self.limit:
            cut = min(len(self.chunks[0]), self.size - self.limit)
            if cut == len(self.chunks[0]):
                self.chunks.popleft()
            else:
                self.chunks[0] = self.chunks[0][cut:]
            self.size -= cut
            self.skipped += cut
        self.overflowed = self.size > self.limit

    def data(self):
        data = b''.join(self.chunks)
        self.chunks.clear()
        return data


class Forked:
    """func(*args) run in a child forked from this process, without exec: no interpreter starts,
    so the child is at work at once. As Runner runs a program: in a session of its own, stdin
    /dev/null, stdout and stderr piped to this process, no other descriptor of this process's
    (a lock held here stays this process's), env added to its environment and unset taken out
    of it, signals at their defaults. Its exit status is what func returns (0 for None), or 70
    with the error said on stderr when func raises. Runner.finish collects it, as it does a
    subprocess.Popen. Fork from one thread only, before any other starts (a lock another thread
    held at the fork would never be released in the child)."""

    FAILED = 70  # EX_SOFTWARE

    def __init__(self, func, args=(), env=None, unset=(), keep=()):
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)  # else what this process buffered would be written by the child too
        self.started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(func, args, dict(env or {}), unset, out_write, err_write, keep)
        os.close(out_write)
        os.close(err_write)
        self.pid = pid
        self.stdout = os.fdopen(out_read, 'rb', 0)
        self.stderr = os.fdopen(err_read, 'rb', 0)
        self.returncode = None

    def wait(self, timeout=None):
        """Its exit status (negative: the signal that killed it) once reaped; subprocess.TimeoutExpired
        when it has not exited within timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            elif deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired('forked child %d' % self.pid, timeout)
            else:
                time.sleep(delay)
                delay = min(delay * 2, Runner.POLL_S)
        return self.returncode


def _flush(stream):
    try:
        stream.flush()
    except (AttributeError, ValueError, OSError):
        pass


def _child(func, args, env, unset, out_write, err_write, keep=()):
    """The forked child: set up as Forked says, run func, exit; never returns."""
    code = Forked.FAILED
    try:
        os.setsid()
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((null, 0), (out_write, 1), (err_write, 2)):
            os.dup2(source, target)
        # Python's own streams too, whatever this process had made of them (a test's capture).
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, 'w', closefd=False), encoding='utf-8', errors='replace',
                                                   line_buffering=True) for fd in (1, 2))
        _close_from(3, keep)
        for name in unset:
            os.environ.pop(name, None)
        os.environ.update(env)  # putenv: what a library the child loads reads with getenv
        code = func(*args) or 0
    except BaseException as exc:  # said where the parent reads it, whatever it was
        try:
            os.write(2, ('%s: %s\n' % (type(exc).__name__, exc)).encode('utf-8', 'replace'))
        except OSError:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        os._exit(code if isinstance(code, int) else Forked.FAILED)


def _close_from(lowest, keep=()):
    """Close every descriptor from lowest up but those in keep (those /proc lists; all up to the
    limit without it)."""
    try:
        fds = [int(name) for name in os.listdir('/proc/self/fd')]
    except (OSError, ValueError):
        start = lowest
        for fd in sorted(set(keep)) + [os.sysconf('SC_OPEN_MAX')]:
            os.closerange(start, fd)
            start = fd + 1
        return
    for fd in fds:
        if fd >= lowest and fd not in keep:
            try:
                os.close(fd)
            except OSError:  # the directory listing's own descriptor, closed already
                pass


def _write_input(proc, text):
    """Write a short text (well within a pipe's buffer, so it cannot block) and close the pipe."""
    try:
        proc.stdin.write(text.encode('utf-8'))
    except (IOError, OSError):
        pass  # it exited before reading: its exit status and output say why
    finally:
        try:
            proc.stdin.close()
        except (IOError, OSError):
            pass


def _exec_failure(name, path, exc):
    """Why exec of path failed, in words: the errno alone names the wrong culprit."""
    if exc.errno == errno.ENOENT:  # the file exists: what it needs to start does not
        interpreter = _interpreter(path)
        if interpreter:
            return '%s at %r cannot be run: bad interpreter %r in its #! line (%s)' % (
                name, path, interpreter, 'not executable' if os.path.exists(interpreter) else 'no such file')
        return ('%s at %r cannot be run: its program loader is missing (No such file or directory; '
                'built for another system?)' % (name, path))
    if exc.errno == errno.ENOEXEC:
        return ('%s at %r is not an executable this host can run (exec format error: wrong '
                'format or architecture, or a damaged file)' % (name, path))
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ('%s at %r cannot be run: permission denied (not executable, or on a file system '
                'mounted noexec)' % (name, path))
    return '%s at %r cannot be run: %s' % (name, path, exc.strerror)


def _interpreter(path):
    try:
        with open(path, 'rb') as handle:
            head = handle.read(256)
    except (IOError, OSError):
        return None
    if not head.startswith(b'#!'):
        return None
    words = head[2:].split(b'\n', 1)[0].split()
    return words[0].decode('utf-8', 'replace') if words else None


def _exited(pid):
    """False while the child pid runs, True once it has exited (a zombie, unreaped until waited
    for, so its pid and process group id cannot be reused), None when it was reaped elsewhere."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return None


def _kill_group(pgid):
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid, number):
    try:
        os.killpg(pgid, number)
    except OSError:  # the group is empty, or gone
        pass


def _stat_fields(pid, proc='/proc'):
    """(ppid, starttime) of pid from /proc, or None."""
    try:
        with open('%s/%d/stat' % (proc, pid), 'rb') as handle:
            fields = handle.read(PROC_FILE_MAX).rsplit(b')', 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (IOError, OSError, IndexError, ValueError):
        return None


def _descendants(root, proc='/proc'):
    """[(pid, starttime)] of every process descended from root, read from /proc."""
    children = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            fields = _stat_fields(int(name), proc)
            if fields is not None:
                children.setdefault(fields[0], []).append((int(name), fields[1]))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _holders_of(fds):
    """[(pid, starttime)] of the other processes that hold the pipes behind fds (ours): found
    by the pipes' inodes, through every process's descriptors."""
    wanted = set()
    for fd in fds:
        info = os.fstat(fd)
        wanted.add((info.st_dev, info.st_ino))
    found = []
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        fd_dir = '/proc/%s/fd' % name
        try:
            links = os.listdir(fd_dir)
        except OSError:
            continue
        for link in links:
            try:
                info = os.stat(os.path.join(fd_dir, link))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in wanted:
                fields = _stat_fields(int(name))
                if fields is not None:
                    found.append((int(name), fields[1]))
                break
    return found


# Rounds of listing the descendants of a program being stopped: each stops those forked since the
# last (a stopped process forks no more).
STOP_ROUNDS = 5


def _stopped_descendants(root):
    """[(pid, starttime)] of root's descendants, stopped with root's group (SIGSTOP) round by round
    until a listing finds none new: one that forked and left the group (setsid) between the listing
    and the kill cannot outrun it."""
    _signal_group(root, signal.SIGSTOP)
    found = []
    for dummy in range(STOP_ROUNDS):
        new = [process for process in _descendants(root) if process not in found]
        if not new:
            break
        for pid, starttime in new:
            _kill_same(pid, starttime, signal.SIGSTOP)
        found.extend(new)
    return found


def _kill_all(processes):
    for pid, starttime in processes:
        _kill_same(pid, starttime)


def _kill_same(pid, starttime, number=signal.SIGKILL):
    """Send number (SIGKILL) to pid if it is still the process that started at starttime (a pidfd
    where there is one)."""
    pidfd = None
    try:
        if hasattr(os, 'pidfd_open'):
            pidfd = os.pidfd_open(pid)
        fields = _stat_fields(pid)
        if fields is None or fields[1] != starttime:
            return
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, number)
        else:
            os.kill(pid, number)
    except OSError:  # gone already
        pass
    finally:
        if pidfd is not None:
            os.close(pidfd)


# -- SIGTERM, turned into a clean exit ----------------------------------------------------------

class Terminated(BaseException):
    """SIGTERM arrived (a hook stopping the module at its deadline): raised once in the main
    thread, so that the finally blocks run (the units stopped for a reset are started again)
    before the program exits; Python's default for SIGTERM ends the process with no finally run.
    A BaseException, as KeyboardInterrupt is: no ``except Exception`` takes it for a failed call."""


_TERM = {'deferred': 0, 'pending': False, 'raised': False}


def _on_sigterm(signum, frame):
    if _TERM['raised']:
        return  # once only: the restore it set off is not cut short by a second one
    if _TERM['deferred']:
        _TERM['pending'] = True
        return
    _TERM['raised'] = True
    raise Terminated('stopped by SIGTERM')


@contextlib.contextmanager
def sigterm_raises():
    """Within it, SIGTERM raises Terminated (once); the handler before it is put back after."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _TERM.update(pending=False, raised=False)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigterm_deferred():
    """Within it, SIGTERM waits: a restore runs to its end, and Terminated is raised after it."""
    _TERM['deferred'] += 1
    try:
        yield
    finally:
        _TERM['deferred'] -= 1
        if not _TERM['deferred'] and _TERM['pending'] and not _TERM['raised']:
            _TERM.update(pending=False, raised=True)
            raise Terminated('stopped by SIGTERM')
