# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""What the performance level's children and their conductor share: the words they say through a
pipe each way (one byte each), both ends of those pipes, the copies' size and entry points, and a
slow GPU's reason. performance.py (each GPU's child, the copies) and peers.py (the pair check)
both conduct their children with them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes
import os
import select
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import cuda as _cuda

# MiB each timed copy moves: enough that the copy, not its launch, is what is timed (5 ms at the
# 55 GB/s of a Gen5 x16 link), and what NVIDIA's bandwidthTest and nvbandwidth copy.
COPY_MIB = 256
GB = 1e9

# The conductor's words to a child, and the child's answers: one byte each.
COPY, LOAD, DONE = b'C', b'L', b'D'
READY, COPIED, LOADED = b'R', b'T', b'l'

# The entry points the copies add to the allocation level's (cuda.h of CUDA 12.4).
SIGNATURES = dict(_cuda.SIGNATURES, **{
    'cuMemAllocHost_v2': (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t),
    'cuMemFreeHost': (ctypes.c_void_p,),
    'cuEventCreate': (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint),
    'cuEventRecord': (ctypes.c_void_p, ctypes.c_void_p),
    'cuEventSynchronize': (ctypes.c_void_p,),
    'cuEventElapsedTime': (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p),
    'cuEventDestroy_v2': (ctypes.c_void_p,),
    'cuMemcpyHtoDAsync_v2': (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p),
    'cuMemcpyDtoHAsync_v2': (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p),
})


def close_all(fds):
    """Close fds, those already closed too."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Control:
    """The child's end of its pipes to the conductor. Once closed, it says nothing and hears the end:
    a descriptor closed twice could be another's by then (the CUDA library's)."""

    def __init__(self, commands, answers):
        self.commands, self.answers = commands, answers

    def say(self, word):
        if self.answers is None:
            return
        try:
            os.write(self.answers, word)
        except OSError:  # the conductor is gone: the child goes on alone
            pass

    def next(self, timeout):
        """The conductor's next word; b'' when it closed the pipe or said nothing within timeout."""
        if self.commands is None or not select.select([self.commands], [], [], timeout)[0]:
            return b''
        try:
            return os.read(self.commands, 1)
        except OSError:
            return b''

    def waiting(self):
        """Whether the conductor has said something (or closed the pipe) since."""
        return self.commands is None or bool(select.select([self.commands], [], [], 0)[0])

    def close(self):
        """The conductor hears no more from this GPU, and stops waiting for it."""
        if self.commands is not None:
            close_all((self.commands, self.answers))
        self.commands = self.answers = None


class Channel:
    """The conductor's end of one child's pipes."""

    def __init__(self, commands, answers):
        self.commands, self.answers = commands, answers
        self.heard = b''

    def say(self, word):
        try:
            os.write(self.commands, word)
            return True
        except OSError:  # the child is gone
            return False

    def close(self):
        close_all((self.commands, self.answers))


def await_word(channels, word, deadline, grace=None):
    """Those of channels that said word before deadline (a channel whose child closed its pipe
    never does). grace: once one has said it, the others have that many seconds more at most."""
    waiting = dict((channel.answers, channel) for channel in channels if word not in channel.heard)
    while waiting and time.monotonic() < deadline:
        if grace is not None and any(word in channel.heard for channel in channels):
            deadline = min(deadline, time.monotonic() + grace)
            grace = None
        readable = select.select(list(waiting), [], [], max(0.0, deadline - time.monotonic()))[0]
        for fd in readable:
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b''
            channel = waiting[fd]
            if not data:
                waiting.pop(fd)
                continue
            channel.heard += data
            if word in channel.heard:
                waiting.pop(fd)
    return [channel for channel in channels if word in channel.heard]


def slow(reason, text):
    return dict(reason=reason, message='%s: %s' % (reason, text))


def fork_conducted(fork, request):
    """(the child, its Channel): fork(request, keep) run with request's control pipes (the child's
    ends, which it keeps), the parent's ends kept here."""
    commands, answers = os.pipe(), os.pipe()
    try:
        child = fork(dict(request, control=[commands[0], answers[1]]), (commands[0], answers[1]))
    except Exception:
        close_all(commands + answers)
        raise
    os.close(commands[0])
    os.close(answers[1])
    return child, Channel(commands[1], answers[0])
