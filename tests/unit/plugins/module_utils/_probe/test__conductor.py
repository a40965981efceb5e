# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How the performance level's conductor and its children talk: one-byte words through a pipe each
way, the child's end (Control) and the conductor's (Channel), waiting for a word with a deadline and
a grace, and a child started with its pipes by fork_conducted, here a real process. (The children of
the performance level and the pair check: test__performance.py, test__peers.py.)"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.conductor import (
    COPIED,
    COPY,
    DONE,
    LOAD,
    LOADED,
    READY,
    SIGNATURES,
    Channel,
    Control,
    await_word,
    close_all,
    fork_conducted,
    slow,
)

# A child that says READY, then answers each word the conductor says (COPIED to COPY, LOADED to
# LOAD) until DONE or the end of its pipe, and prints what it heard; 'mute': it says nothing and
# waits for the conductor's first word, printing it and how long it waited.
CHILD = r'''
import json, sys, time
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.conductor import (
    COPIED, COPY, DONE, LOAD, LOADED, READY, Control)
request = json.loads(sys.argv[1])
control = Control(*request['control'])
if request.get('mute'):
    started = time.monotonic()
    word = control.next(30)
    print(json.dumps(dict(word=word.decode(), waited=time.monotonic() - started)))
    sys.exit(0)
control.say(READY)
heard = []
while True:
    word = control.next(10)
    if not word or word == DONE:
        break
    heard.append(word.decode())
    control.say({COPY: COPIED, LOAD: LOADED}.get(word, b'?'))
control.close()
print(json.dumps(dict(heard=heard)))
'''


class Forks:
    """fork(request, keep) for fork_conducted: a real child process that keeps only the descriptors
    keep (their numbers unchanged), running CHILD, or exiting at once with 'exit'."""

    def __init__(self):
        self.calls = []
        self.procs = []

    def __call__(self, request, keep):
        self.calls.append((request, keep))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        program = 'pass' if request.get('exit') else CHILD
        proc = subprocess.Popen([sys.executable, '-c', program, json.dumps(request)], pass_fds=keep,
                                stdout=subprocess.PIPE, env=env)
        self.procs.append(proc)
        return proc


@pytest.fixture
def forks():
    forks = Forks()
    yield forks
    for proc in forks.procs:
        proc.kill()
        proc.communicate()


def pipes():
    """(Control, Channel) of two fresh pipes, both ends in this process."""
    commands, answers = os.pipe(), os.pipe()
    return Control(commands[0], answers[1]), Channel(commands[1], answers[0])


def open_fds():
    return sorted(os.listdir('/proc/self/fd'))


# -- a real child, conducted --------------------------------------------------------------------

def test_a_conducted_child_hears_each_word_and_each_answer_reaches_the_conductor(forks):
    request = dict(gpus=[dict(index=3)])
    proc, channel = fork_conducted(forks, request)
    assert await_word([channel], READY, time.monotonic() + 10) == [channel]
    assert channel.say(COPY) and await_word([channel], COPIED, time.monotonic() + 10) == [channel]
    assert channel.say(LOAD) and await_word([channel], LOADED, time.monotonic() + 10) == [channel]
    assert channel.say(DONE)
    channel.close()
    assert json.loads(proc.communicate(timeout=10)[0]) == dict(heard=['C', 'L'])
    assert proc.returncode == 0 and request == dict(gpus=[dict(index=3)])  # the caller's request untouched


def test_the_child_is_given_its_ends_and_the_conductor_keeps_none_of_them(forks):
    proc, channel = fork_conducted(forks, dict(gpus=[]))
    [(request, keep)] = forks.calls
    assert request['control'] == list(keep) and len(set(keep) | set([channel.commands, channel.answers])) == 4
    for fd in keep:  # closed here right after the fork: only the child has them
        with pytest.raises(OSError) as caught:
            os.fstat(fd)
        assert caught.value.errno == errno.EBADF
    channel.close()


def test_a_child_that_ends_without_a_word_is_not_waited_for_until_the_deadline(forks):
    proc, channel = fork_conducted(forks, dict(exit=True))
    started = time.monotonic()
    assert await_word([channel], READY, started + 30) == []
    assert time.monotonic() - started < 10 and proc.wait(10) == 0
    assert channel.say(COPY) is False  # and saying more to it says so
    channel.close()


def test_a_child_hears_the_end_as_soon_as_its_conductor_closes_the_channel(forks):
    proc, channel = fork_conducted(forks, dict(mute=True))
    time.sleep(0.2)
    channel.close()
    answer = json.loads(proc.communicate(timeout=20)[0])
    assert answer['word'] == '' and answer['waited'] < 10


def test_a_fork_that_fails_leaves_no_pipe_open_and_says_why():
    def failing(request, keep):
        raise OSError(errno.EAGAIN, 'Resource temporarily unavailable')
    before = open_fds()
    with pytest.raises(OSError, match='Resource temporarily unavailable'):
        fork_conducted(failing, dict(gpus=[]))
    assert open_fds() == before


# -- the child's end ----------------------------------------------------------------------------

def test_words_said_together_are_heard_one_at_a_time_in_order():
    control, channel = pipes()
    os.write(channel.commands, COPY + LOAD + DONE)
    assert [control.next(1) for dummy in range(3)] == [COPY, LOAD, DONE]
    assert control.waiting() is False
    control.close()
    channel.close()


def test_waiting_says_a_word_is_there_without_taking_it_and_next_gives_up_at_its_timeout():
    control, channel = pipes()
    assert control.waiting() is False
    started = time.monotonic()
    assert control.next(0.3) == b''
    assert 0.25 <= time.monotonic() - started < 5
    channel.say(COPY)
    assert control.waiting() is True and control.waiting() is True and control.next(0) == COPY
    channel.close()
    assert control.waiting() is True and control.next(5) == b''  # the conductor is gone
    control.close()


def test_a_child_whose_conductor_is_gone_goes_on_alone():
    control, channel = pipes()
    channel.close()
    control.say(READY)  # no BrokenPipeError: the child's probe goes on
    numbers = (control.commands, control.answers)
    control.close()
    control.say(COPIED)  # nor once its own end is closed
    for fd in numbers:
        with pytest.raises(OSError):
            os.fstat(fd)


# -- the conductor's wait -----------------------------------------------------------------------

def test_the_channels_that_said_the_word_are_returned_in_their_order_not_in_the_order_they_spoke():
    ends = [pipes() for dummy in range(3)]
    for index in (2, 0):
        ends[index][0].say(READY)
    channels = [channel for dummy, channel in ends]
    assert await_word(channels, READY, time.monotonic() + 0.3) == [channels[0], channels[2]]
    close_all([fd for control, channel in ends for fd in (control.commands, control.answers, channel.commands,
                                                          channel.answers)])


def test_a_word_heard_early_is_kept_for_a_later_wait():
    control, channel = pipes()
    control.say(READY + COPIED)  # both at once: read in one go
    assert await_word([channel], READY, time.monotonic() + 5) == [channel]
    control.close()  # nothing more can come: COPIED must be in what was heard
    assert await_word([channel], COPIED, time.monotonic() + 5) == [channel]
    assert await_word([channel], LOADED, time.monotonic() + 5) == []
    channel.close()


def test_once_one_child_has_spoken_the_others_have_the_grace_at_most():
    (quick, quick_channel), (slow_control, slow_channel) = pipes(), pipes()
    quick.say(READY)
    started = time.monotonic()
    assert await_word([quick_channel, slow_channel], READY, started + 30, grace=0.3) == [quick_channel]
    assert 0.25 <= time.monotonic() - started < 5
    started = time.monotonic()
    assert await_word([slow_channel], READY, started + 0.3, grace=30) == []  # the deadline still bounds it
    assert 0.25 <= time.monotonic() - started < 5
    close_all([quick.commands, quick.answers, slow_control.commands, slow_control.answers])
    quick_channel.close()
    slow_channel.close()


def test_a_control_closed_twice_leaves_a_descriptor_reused_meanwhile_open(tmp_path):
    """The performance child closes its control when its copies end and again on its way out; the
    CUDA library may have opened a file under the same number in between."""
    control, channel = pipes()
    numbers = (control.commands, control.answers)
    control.close()
    reused = [os.open(str(tmp_path / ('file%d' % number)), os.O_CREAT | os.O_RDWR) for number in range(2)]
    try:
        assert sorted(reused) == sorted(numbers)
        control.close()
        assert all(os.fstat(fd) for fd in reused)  # both still open
        # A closed control says nothing, and hears the end at once.
        control.say(READY)
        assert control.next(5) == b'' and control.waiting() is True
    finally:
        close_all(reused)
        channel.close()


def test_a_child_that_ends_without_a_word_starts_no_grace_for_the_others():
    """The grace follows a child that spoke: one that died says nothing of how long the others
    need, and they keep the deadline (here one speaks after longer than the grace)."""
    (dead, dead_channel), (late, late_channel) = pipes(), pipes()
    close_all([dead.answers])
    started = time.monotonic()
    speaker = threading.Timer(0.6, late.say, (READY,))
    speaker.start()
    try:
        assert await_word([dead_channel, late_channel], READY, started + 10, grace=0.2) == [late_channel]
    finally:
        speaker.join()
    assert 0.5 <= time.monotonic() - started < 5
    close_all([dead.commands, late.commands, late.answers])
    dead_channel.close()
    late_channel.close()


# -- what the children share --------------------------------------------------------------------

def test_close_all_closes_each_descriptor_and_minds_none_already_closed():
    first, second = os.pipe()
    os.close(second)
    close_all([first, second])
    for fd in (first, second):
        with pytest.raises(OSError):
            os.fstat(fd)
    close_all([first, second])


def test_the_copies_entry_points_add_to_the_allocation_levels_without_changing_them():
    copies = set(SIGNATURES) - set(_cuda.SIGNATURES)
    assert set(['cuMemcpyHtoDAsync_v2', 'cuMemcpyDtoHAsync_v2', 'cuEventElapsedTime', 'cuMemAllocHost_v2']) <= copies
    assert all(SIGNATURES[name] == argtypes for name, argtypes in _cuda.SIGNATURES.items())
    assert not copies & set(_cuda.SIGNATURES)


def test_a_slow_gpus_reason_leads_its_message():
    assert slow('pcie_link_degraded', 'Gen3 x8 under load') == dict(
        reason='pcie_link_degraded', message='pcie_link_degraded: Gen3 x8 under load')
