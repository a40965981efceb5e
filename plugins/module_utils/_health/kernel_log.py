# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The driver's messages in the kernel log (Xid errors, GPUs fallen off the bus or that failed to
initialise), summarised per GPU and message, and read incrementally.

Only what the kernel wrote counts: journald's kernel transport (journalctl -k), dmesg restricted
to the kernel's facility, or /dev/kmsg's records of facility 0 (the kernel files what userspace
writes there as user facility). A syslog file (/var/log/kern.log) is refused: any local user can
`logger -t kernel -p kern.err` a line that rsyslog writes exactly as the kernel's.

An Xid storm (hundreds of thousands of the same line in one boot) must cost nothing: each GPU's
messages are kept as one entry per code (count, first and last time, the last few texts), and
what was read is remembered in the state directory (_state), with where the reading ended:
journald's cursor, /dev/kmsg's sequence number, a record file's offset. The next read starts
there. Every read is bounded in bytes, time and memory (READ_MAX_BYTES, CHUNK_BYTES,
JOURNAL_MAX_BYTES): what is beyond the bound is skipped from the oldest part, and said.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import collections
import errno
import hashlib
import os
import re
import stat
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import bus_key
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Runner

# NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
# Some drivers print the function (.0) or leave out "PCI:". With MIG, the driver names the GPU
# instance (and compute instance) after the bus id: "Xid (PCI:0000:01:00 GPU-I:05): 94, ..."
# (open-gpu-kernel-modules kernel_rc.c: "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u").
XID_RE = re.compile(r'NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})'
                    r'(?:\.[0-7])?(?: GPU-I:(\d+))?(?: GPU-CI:\d+)?\): (\d+),\s*(.*)$')
# A GPU that falls off the bus while the driver probes it is reported with no Xid, over three
# lines ("NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI ID: 10de:26b5) installed in this
# system has" / "NVRM: fallen off the bus and is not responding to commands."), on one line
# ("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus."), or in the older wording "NVRM: GPU at
# 0000:01:00.0 has fallen off the bus." (Bumblebee-Project/Bumblebee#554).
GPU_MESSAGE_RE = re.compile(r'NVRM: (?:The NVIDIA GPU|GPU at|GPU) (?:PCI:)?'
                            r'([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})(?:\.[0-7])?:?\s*(.*)$')
FALLEN_TEXT = 'fallen off the bus'
# The same two, found in a whole log at once (a storm is a million lines: no Python per line).
XID_IN_TEXT_RE = re.compile(r'NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})'
                            r'(?:\.[0-7])?(?: GPU-I:\d+)?(?: GPU-CI:\d+)?\): (\d+),')
GPU_MESSAGE_IN_TEXT_RE = re.compile(r'NVRM: (?:The NVIDIA GPU|GPU at|GPU) (?:PCI:)?[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:')
# How many lines after a message's first one may still carry its words.
MESSAGE_LINES = 20
# The driver could not initialise the GPU ("NVRM: GPU 0000:98:00.0: RmInitAdapter failed!
# (0x62:0x65:1792)", then "... rm_init_adapter failed, device minor number 0":
# NVIDIA/open-gpu-kernel-modules#789, NVIDIA/gpu-operator#1146): nothing can use it.
INIT_FAILED_RE = re.compile(r'RmInitAdapter failed|rm_init_adapter failed')
# The driver hung in a full-chip reset, or stuck behind a GPU that no longer answers: its resource
# server asserts on each call that the status is NV_OK or NV_ERR_GPU_IN_FULLCHIP_RESET and prints
# each failure, a storm of lines ("NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status ==
# NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844", some without the "GPU0":
# NVIDIA/open-gpu-kernel-modules#1045, after Xid 119 and 154; the same after an Xid 79). The
# driver's calls hang or fail until a reboot (driver_hung). A line that names a PCI bus id ("NVRM:
# GPU 0000:01:00.0: ...", the driver's per-GPU prefix) is that GPU's; "GPU0" is the driver's own
# instance number, neither an index nor a minor, so such a line, or one naming no GPU, is the
# host's (HOST_BUS): it counts for every GPU, as the reboot it calls for does.
HUNG_TEXT = 'NV_ERR_GPU_IN_FULLCHIP_RESET'
HUNG_TEXT_RE = re.compile(HUNG_TEXT)
HUNG_BUS_RE = re.compile(r'NVRM: GPU (?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2})(?:\.[0-7])?:')
HOST_BUS = 'host'
# What each message is: an Xid (with its code), or one of the driver's messages without one.
XID, FALLEN, INIT_FAILED, DRIVER_HUNG = 'xid', 'fallen_off_bus', 'init_failed', 'driver_hung'

ISO_TIME_RE = re.compile(r'(?:^|\s)(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s')
SYSLOG_TIME_RE = re.compile(r'^([A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2})\s')
UPTIME_RE = re.compile(r'\[\s*(\d+\.\d+)\]')
# dmesg -T / --ctime: [Wed Jul 31 23:14:18 2024]
CTIME_RE = re.compile(r'\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\]')
UPTIME_ONLY_RE = re.compile(r'^\d+\.\d+$')
ISO_PARTS_RE = re.compile(r'^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,]\d+)?(Z|[+-]\d{2}:?\d{2})?$')

# The commands that print the kernel log, tried in order. journalctl -k is this boot only, and the
# kernel transport only; --show-cursor ends its output with "-- cursor: ...", where the next read
# starts (--after-cursor). dmesg only the kernel's facility: what root's userspace writes to
# /dev/kmsg is the user facility.
JOURNAL_COMMAND = ['journalctl', '-k', '-o', 'short-iso', '--no-pager', '-q', '--show-cursor']
KERNEL_LOG_COMMANDS = (JOURNAL_COMMAND, ['dmesg', '--facility=kern', '--time-format', 'iso'])
CURSOR_PREFIX = '-- cursor: '

# Bounds of one read. A record file is read in chunks of CHUNK_BYTES, the position saved after
# each, at most READ_MAX_BYTES of new records (more is skipped from the oldest). A command's
# output is kept to its newest JOURNAL_MAX_BYTES (journalctl's cursor is at its end). With these,
# a read stays well under 256 MiB of memory whatever the log holds.
CHUNK_BYTES = 16 * 1024 * 1024
READ_MAX_BYTES = 64 * 1024 * 1024
JOURNAL_MAX_BYTES = 32 * 1024 * 1024
MIB = 1024 * 1024

# /dev/kmsg (Documentation/ABI/testing/dev-kmsg): one record per read(), "PRIO,SEQ,USEC,FLAGS[,...];
# MESSAGE", then continuation lines " KEY=VALUE"; PRIO is facility << 3 | level, the kernel's
# own facility 0. A read needs a buffer as long as the longest record (CONSOLE_EXT_LOG_MAX, 8192).
KMSG_DEVICE = (1, 11)
KMSG_RECORD_MAX = 16384
KMSG_RECORD_RE = re.compile(r'([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),[^;\n]*;')
# The time of a record: microseconds since boot (line_time gives them as seconds).
KMSG_TIME_RE = re.compile(r'^[0-7],[0-9]{1,20},([0-9]{1,20}),[^;]*;')
# What is left of a text of records once every line that is not the kernel's (PRIO 0-7) with
# a driver message ("NVRM: ") is cut, in one pass; the text must begin with a newline.
NOT_KERNEL_DRIVER_LINE_RE = re.compile(r'\n(?![0-7],[^\n]*NVRM: )[^\n]*')
# The same for a command's output: every line without "NVRM: " is cut.
NOT_DRIVER_LINE_RE = re.compile(r'\n(?![^\n]*NVRM: )[^\n]*')
# How far after a driver message's first line its words may come (MESSAGE_LINES lines).
MESSAGE_SPAN = 65536
SAFE_SOURCES = ("The sources only the kernel writes are journald's kernel transport (leave kernel_log unset: "
                "journalctl -k, then dmesg --facility=kern) and /dev/kmsg")

# Texts kept per GPU and message, the newest; and how long each may be.
TEXTS_KEPT = 3
TEXT_MAX = 300
# Entries kept per state file: far more GPUs and codes than a host has.
MAX_ENTRIES = 4096
STATE_VERSION = 1


def line_time(prefix):
    """The time stamp in the part of a log line before "NVRM:", as the log prints it, or None; a
    /dev/kmsg record's as seconds since boot."""
    match = KMSG_TIME_RE.match(prefix)
    if match:
        return '%d.%06d' % divmod(int(match.group(1)), 1000000)
    match = SYSLOG_TIME_RE.match(prefix) or ISO_TIME_RE.search(prefix) or CTIME_RE.search(prefix)
    if match:
        return match.group(1)
    match = UPTIME_RE.search(prefix)
    return match.group(1) if match else None


def stamp(prefix, btime=None):
    """(time, epoch seconds or None) of a log line's prefix: the time as the log prints it, or,
    where it prints seconds since boot and btime is known, as ISO 8601 in UTC."""
    text = line_time(prefix)
    seconds = epoch(text, btime)
    if seconds is not None and UPTIME_ONLY_RE.match(text):
        text = _iso_utc(seconds)
    return text, seconds


def _iso_utc(seconds):
    whole, micro = divmod(int(round(seconds * 1000000)), 1000000)
    return time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(whole)) + '.%06d+00:00' % micro


def epoch(stamp, boot_time=None, now=None):
    """Seconds since the epoch of a time stamp that line_time found, or None when it cannot tell:
    ISO 8601 (journalctl, dmesg --time-format iso), dmesg -T, syslog (the year taken to be the
    latest that is not in the future) and seconds since boot (with boot_time)."""
    if not stamp:
        return None
    match = ISO_PARTS_RE.match(stamp)
    if match:
        return _iso_epoch(match)
    for form in ('%a %b %d %H:%M:%S %Y', '%b %d %H:%M:%S'):
        try:
            parsed = time.strptime(' '.join(stamp.split()), form)
        except ValueError:
            continue
        if form.endswith('%Y'):
            return time.mktime(parsed)
        return _syslog_epoch(parsed, now)
    if boot_time is not None and UPTIME_ONLY_RE.match(stamp):
        return boot_time + float(stamp)
    return None


def _iso_epoch(match):
    fields = [int(part) for part in match.groups()[:6]]
    zone = match.group(7)
    if zone is None:
        return time.mktime(tuple(fields) + (0, 0, -1))
    seconds = calendar.timegm(tuple(fields) + (0, 0, 0))
    if zone != 'Z':
        sign = -1 if zone[0] == '-' else 1
        digits = zone[1:].replace(':', '')
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return float(seconds)


def _syslog_epoch(parsed, now):
    now = time.time() if now is None else now
    year = time.localtime(now).tm_year
    value = time.mktime((year,) + tuple(parsed)[1:6] + (0, 0, -1))
    return value if value <= now + 86400 else time.mktime((year - 1,) + tuple(parsed)[1:6] + (0, 0, -1))


def boot_time(stat_path='/proc/stat'):
    """When this boot began (epoch seconds), from the kernel's btime, or None."""
    try:
        with open(stat_path) as handle:
            for line in handle:
                if line.startswith('btime '):
                    return float(line.split()[1])
    except (IOError, OSError, ValueError, IndexError):
        pass
    return None


def scan(lines):
    """The driver's messages about a GPU in kernel log lines, in order: tuples (bus text, kind,
    code, the line before "NVRM:", text, MIG GPU instance)."""
    pending = None
    for line in lines:
        position = line.find('NVRM: ')
        if position < 0:
            continue
        if HUNG_TEXT in line:
            pending = None
            yield _hung_message(line, position)
            continue
        match = XID_RE.search(line, position)
        if match:
            pending = None
            bus, instance, code, text = match.groups()
            yield bus, XID, int(code), line[:position], text.strip(), instance
            continue
        message, pending = _gpu_message(line, position, pending)
        if message is not None:
            yield message


def _hung_message(line, position):
    """The scan() tuple of a line that says the driver hung: the GPU it names by bus id, else the host's."""
    match = HUNG_BUS_RE.match(line, position)
    return (match.group(1) if match else HOST_BUS), DRIVER_HUNG, None, line[:position], line[position + 6:].strip(), None


def _gpu_message(line, position, pending):
    """(message tuple or None, pending) for a line that is not an Xid: the start of a message
    about a GPU, or its continuation (the words may come within the next two lines)."""
    if HUNG_TEXT in line:
        return None, None  # scan() and _hung_groups() count it
    match = GPU_MESSAGE_RE.search(line, position)
    rest = line[position + 6:].strip()
    if match:
        pending = {'bus': match.group(1), 'prefix': line[:position], 'text': [rest], 'left': 2}
    elif pending is not None:
        pending['text'].append(rest)
        pending['left'] -= 1
    else:
        return None, None
    kind = FALLEN if FALLEN_TEXT in line else INIT_FAILED if match and INIT_FAILED_RE.search(line) else None
    if kind is not None:
        return (pending['bus'], kind, None, pending['prefix'], ' '.join(pending['text']), None), None
    return None, (pending if pending['left'] > 0 else None)


def parse_xid_events(lines):
    """The driver's messages in kernel log lines, one dict per message: bus (a bus_key; None for
    the host's), kind (xid, fallen_off_bus, init_failed, driver_hung), code (the Xid; None for the others), time, text,
    gpu_instance (the MIG GPU instance the driver names, or None)."""
    return [{'bus': bus_key(bus), 'kind': kind, 'code': code, 'time': line_time(prefix), 'text': text,
             'gpu_instance': None if instance is None else int(instance)}
            for bus, kind, code, prefix, text, instance in scan(line.rstrip('\r\n') for line in lines)]


class Summary:
    """The messages of a log, one entry per GPU, kind and code: count, first and last time (as
    the log prints them, and in epoch seconds where that can be told), the last few texts."""

    def __init__(self, entries=None):
        self.entries = collections.OrderedDict()
        for entry in entries or ():
            self.entries[(entry['bus'], entry['kind'], entry['code'])] = entry

    def add(self, messages, btime=None):
        """Add the messages of scan(); the times of the first and the last of each are computed
        once (a storm of one line costs a count). btime: when this boot began (see epoch)."""
        entries = self.entries
        last, names = {}, {}
        for bus, kind, code, prefix, text, dummy in messages:
            name = names.get(bus)
            if name is None:
                name = names[bus] = bus_name(bus)
            key = (name, kind, code)
            entry = entries.get(key)
            if entry is None:
                entry = entries[key] = _entry(key, prefix, btime)
                last[key] = collections.deque(entry['texts'], TEXTS_KEPT)
            elif key not in last:
                last[key] = collections.deque(entry['texts'], TEXTS_KEPT)
            entry['count'] += 1
            entry['_prefix'] = prefix
            last[key].append(text)
        for key, texts in last.items():
            entry = entries[key]
            entry['texts'] = [text[:TEXT_MAX] for text in texts]
            entry['last_time'], entry['last_epoch'] = stamp(entry.pop('_prefix'), btime)
        return self

    def add_text(self, text, btime=None):
        """Add the messages of a whole log text: as add(scan(lines)), but each Xid line costs
        one regular expression match and a count, and only the first and the last few of each
        GPU's code are looked at more closely."""
        found = []
        for key, group in _xid_groups(text).items():
            found.append((group[1].start(), key, group))
        for start, message in _gpu_messages(text):
            found.append((start, None, message))
        for group in _hung_groups(text).values():
            found.append((group[1][0], DRIVER_HUNG, group))
        for dummy, key, item in sorted(found, key=lambda entry: entry[0]):
            if key is None:
                self.add([item], btime)
            elif key == DRIVER_HUNG:
                count, first, recent = item
                self._add_counted(first[1], [message for dummy, message in recent], count, btime)
            else:
                self._add_group(key, item, text, btime)
        return self

    def _add_group(self, key, group, text, btime):
        count, first, recent = group
        bus, code = key[0], int(key[1])
        self._add_counted(_xid_message(text, first, bus, code), [_xid_message(text, match, bus, code) for match in recent],
                          count, btime)

    def _add_counted(self, first, recent, count, btime):
        """Add count messages of one GPU, kind and code, given by the first and the last few of them."""
        self.add([first], btime)
        entry = self.entries[(bus_name(first[0]), first[1], first[2])]
        entry['count'] += count - 1
        if recent:
            self.add(recent, btime)
            entry['count'] -= len(recent)

    def dump(self):
        """The entries as JSON-ready dicts, in order of first appearance; at most MAX_ENTRIES."""
        return list(self.entries.values())[-MAX_ENTRIES:]

    def events(self):
        """The entries as the facts and the health checks use them: bus as a bus_key, the last
        time and text as time and text."""
        return [dict(entry, bus=bus_key(entry['bus']), time=entry['last_time'],
                     text=entry['texts'][-1] if entry['texts'] else '') for entry in self.entries.values()]


def bus_name(bus):
    """How the summary names a GPU (0000:18:00), or the host (HOST_BUS)."""
    return HOST_BUS if bus == HOST_BUS else '%04x:%02x:%02x' % bus_key(bus)


def _hung_groups(text):
    """{bus text or HOST_BUS: [count, (position, first scan() tuple), the last few (position, tuple)]}
    of the driver's lines that say it hung (HUNG_TEXT)."""
    groups, last = {}, -1
    for match in HUNG_TEXT_RE.finditer(text):
        start = text.rfind('\n', 0, match.start()) + 1
        position = text.find('NVRM: ', start, match.start())
        if position < 0 or start == last:
            continue
        last = start
        end = text.find('\n', match.end())
        message = _hung_message(text[start:len(text) if end < 0 else end].rstrip('\r'), position - start)
        group = groups.get(message[0])
        if group is None:
            groups[message[0]] = [1, (start, message), collections.deque((), TEXTS_KEPT)]
            continue
        group[0] += 1
        group[2].append((start, message))
    return groups


def _xid_groups(text):
    """{(bus text, code text): [count, first match, the last few matches]} of the Xid lines."""
    groups = {}
    for match in XID_IN_TEXT_RE.finditer(text):
        key = match.group(1, 2)
        group = groups.get(key)
        if group is None:
            groups[key] = [1, match, collections.deque((), TEXTS_KEPT)]
            continue
        group[0] += 1
        group[2].append(match)
    return groups


def _xid_message(text, match, bus, code):
    """The scan() tuple of the Xid line a match is in."""
    start = text.rfind('\n', 0, match.start()) + 1
    end = text.find('\n', match.end())
    rest = text[match.end():len(text) if end < 0 else end]
    return bus, XID, code, text[start:match.start()].rstrip('\r'), rest.strip(), None


def _gpu_messages(text):
    """(position, scan() tuple) of the driver's messages about a GPU without an Xid number."""
    for match in GPU_MESSAGE_IN_TEXT_RE.finditer(text):
        start = text.rfind('\n', 0, match.start()) + 1
        lines = text[start:start + MESSAGE_SPAN].split('\n', MESSAGE_LINES)[:MESSAGE_LINES]
        message = _one_message(lines)
        if message is not None:
            yield start, message


def _one_message(lines):
    """The message that starts on the first of lines, if its words come within the next two."""
    pending = None
    for number, line in enumerate(line.rstrip('\r') for line in lines):
        position = line.find('NVRM: ')
        if position < 0:
            continue
        if number and (XID_RE.search(line, position) or GPU_MESSAGE_RE.search(line, position)):
            return None  # another message begins
        message, pending = _gpu_message(line, position, pending)
        if message is not None or pending is None:
            return message
    return None


def _entry(key, prefix, btime):
    first, seconds = stamp(prefix, btime)
    return {'bus': key[0], 'kind': key[1], 'code': key[2], 'count': 0, 'first_time': first,
            'first_epoch': seconds, 'last_time': first, 'last_epoch': None, 'texts': []}


def summarize(lines, btime=None):
    """The Summary of kernel log lines."""
    return Summary().add_text('\n'.join(line.rstrip('\r\n') for line in lines), btime)


# -- reading, incrementally ------------------------------------------------------------------

def _run(argv, timeout):
    """(text, bytes of its oldest output passed over, None) of what argv printed, or (None, 0, why not)."""
    runner = Runner(argv[0], timeout, env=dict(SYSTEMD_PAGER='', SYSTEMD_COLORS='0'), max_output=JOURNAL_MAX_BYTES,
                    keep_last=True)
    try:
        rc, stdout, stderr = runner.run(argv[1:])
    except CommandTimeout:
        return None, 0, '%s did not finish within %s s' % (argv[0], timeout)
    except GpuopsError as exc:
        return None, 0, str(exc)
    if rc != 0:
        said = stderr.strip().splitlines()
        return None, 0, '%s exited with %d%s' % (argv[0], rc, (': ' + said[0]) if said else '')
    if runner.skipped_bytes:
        stdout = stdout.partition('\n')[2]  # the first line is cut
    return stdout, runner.skipped_bytes, None


def driver_lines(text):
    """The lines of text that carry a driver message ("NVRM: "), found in one pass."""
    return NOT_DRIVER_LINE_RE.sub('', '\n' + text)


def kernel_driver_records(text):
    """The records of a text of /dev/kmsg records (whole lines) that the kernel wrote (facility 0)
    and that carry a driver message, found in one pass; every other line is cut."""
    return NOT_KERNEL_DRIVER_LINE_RE.sub('', '\n' + text)


def last_sequence(text):
    """The sequence number of the last record in a text of /dev/kmsg records, or None."""
    for line in reversed(text[-2 * KMSG_RECORD_MAX:].split('\n')):
        match = KMSG_RECORD_RE.match(line)
        if match:
            return int(match.group(2))
    return None


def _unseen(text, after):
    """text from its first record whose sequence number is above after (records come in order)."""
    if after is None:
        return text
    start = 0
    while start < len(text):
        end = text.find('\n', start)
        end = len(text) if end < 0 else end + 1
        match = KMSG_RECORD_RE.match(text, start, end)
        if match and int(match.group(2)) > after:
            return text[start:]
        start = end
    return ''


class KernelLog:
    """Reads the kernel log into a Summary, from where the last read on this host ended.

    kernel_log: a /dev/kmsg record source to read instead of journalctl -k, then dmesg: /dev/kmsg
    itself, or a file of its records (a simulated host's) that only root (or this user) can write;
    state: a _state.StateDir (or None: every read starts from the beginning); boot: this boot's id,
    which the state is kept under (journalctl -k is this boot's log). After read(), skipped_bytes
    says how much new text was passed over, the oldest, to keep within the bounds."""

    def __init__(self, kernel_log=None, state=None, boot=None, commands=KERNEL_LOG_COMMANDS, btime=None):
        self.kernel_log = kernel_log
        self.state = state if state is not None and state.usable else None
        self.boot = boot
        self.commands = commands
        self.btime = boot_time() if btime is None else btime
        self.warnings = []
        self.skipped_bytes = 0

    def read(self, timeout=10.0):
        """The Summary, or None when no kernel log could be read (self.warnings says why)."""
        if timeout is not None and timeout < CALL_FLOOR_S:
            self.warnings.append('no time was left within the timeout to read the kernel log; xid_events are unknown')
            return None
        deadline = time.monotonic() + (10.0 if timeout is None else timeout)
        if self.kernel_log:
            return self._read_kmsg(self.kernel_log, deadline)
        problems = []
        for argv in self.commands:
            summary, problem = self._read_command(argv, timeout)
            if summary is not None:
                return summary
            problems.append(problem)
        self.warnings.append('the kernel log could not be read (%s); xid_events are unknown. Run with '
                             'privilege escalation or set kernel_log to /dev/kmsg' % '; '.join(problems))
        return None

    # -- what was read before ------------------------------------------------------------
    def _name(self, source):
        return 'kernel-log-%s.json' % hashlib.sha1(source.encode('utf-8', 'replace')).hexdigest()[:16]

    def _load(self, source):
        """(Summary, position) remembered for source in this boot; (empty, None) when none is."""
        data = self.state.load(self._name(source)) if self.state is not None else None
        if not data or data.get('version') != STATE_VERSION or data.get('source') != source \
                or data.get('boot_id') != self.boot or not isinstance(data.get('entries'), list):
            return Summary(), None
        try:
            return Summary(_valid_entries(data['entries'])), data.get('position')
        except (KeyError, TypeError, ValueError):
            return Summary(), None

    def _save(self, source, summary, position):
        if self.state is not None:
            self.state.save(self._name(source), {'version': STATE_VERSION, 'source': source, 'boot_id': self.boot,
                                                 'position': position, 'entries': summary.dump()})

    def _skipped(self, count, where, bound):
        self.skipped_bytes += count
        self.warnings.append('the kernel log (%s) had more new text than the %d MiB read at most per run: the oldest %d '
                             'bytes were skipped and their messages are not counted' % (where, bound // MIB, count))

    # -- /dev/kmsg, or a file of its records -----------------------------------------------
    def _read_kmsg(self, path, deadline):
        try:
            before = os.stat(path)
            problem = refused(path, before)
            if problem is None:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, 'O_CLOEXEC', 0))
        except (IOError, OSError) as exc:
            problem = 'kernel_log: cannot read %s (%s)' % (path, getattr(exc, 'strerror', None) or exc)
        if problem is not None:
            self.warnings.append(problem + '; xid_events are unknown')
            return None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
                self.warnings.append('kernel_log: %s changed while it was opened; xid_events are unknown' % path)
                return None
            if stat.S_ISCHR(st.st_mode):
                return self._read_device(fd, path, deadline)
            return self._read_records(fd, path, st, deadline)
        except (IOError, OSError) as exc:
            self.warnings.append('kernel_log: cannot read %s (%s); xid_events are unknown'
                                 % (path, getattr(exc, 'strerror', None) or exc))
            return None
        finally:
            os.close(fd)

    def _read_records(self, fd, path, st, deadline):
        """A file of /dev/kmsg records, read on from the offset and sequence number of the last read."""
        if not _starts_as_records(fd):
            self.warnings.append(not_records_warning(path))
            return None
        source = 'kmsg-file:' + os.path.realpath(path)
        summary, position = self._load(source)
        offset = _resume_at(position, st)
        seen = position.get('seq') if offset and isinstance(position.get('seq'), int) else None
        if not offset:
            summary = Summary()
        if st.st_size - offset > READ_MAX_BYTES:
            start = _line_start(fd, st.st_size - READ_MAX_BYTES)
            self._skipped(start - offset, path, READ_MAX_BYTES)
            offset = start
        while offset < st.st_size and not self._late(deadline, path, 'byte %d of %d' % (offset, st.st_size)):
            data = os.pread(fd, min(CHUNK_BYTES, st.st_size - offset), offset)
            # Whole lines: a record being written is read next time; a line longer than a chunk is no record.
            end = data.rfind(b'\n') + 1 or (len(data) if len(data) == CHUNK_BYTES else 0)
            if not end:
                break
            text = data[:end].decode('latin-1')
            del data
            summary.add_text(kernel_driver_records(_unseen(text, seen)), self.btime)
            newest = last_sequence(text)
            seen = seen if newest is None else newest
            offset += end
            del text
            self._save(source, summary, {'dev': st.st_dev, 'ino': st.st_ino, 'offset': offset, 'seq': seen})
        self._save(source, summary, {'dev': st.st_dev, 'ino': st.st_ino, 'offset': offset, 'seq': seen})
        return summary

    def _read_device(self, fd, path, deadline):
        """/dev/kmsg itself: every record in the ring after the sequence number of the last read."""
        source = 'kmsg:' + os.path.realpath(path)
        summary, position = self._load(source)
        seen = position.get('seq') if isinstance(position, dict) and isinstance(position.get('seq'), int) else None
        os.lseek(fd, 0, os.SEEK_SET)  # from the oldest record in the ring
        kept, size = [], 0
        for count, record in enumerate(_kmsg_records(fd), 1):
            if count % 1024 == 0 and self._late(deadline, path, 'record %s' % seen):
                break
            match = KMSG_RECORD_RE.match(record)
            if match is None or (seen is not None and int(match.group(2)) <= seen):
                continue
            seen = int(match.group(2))
            if record[0] in '01234567' and record[1] == ',' and 'NVRM: ' in record:
                kept.append(record.partition('\n')[0])
                size += len(kept[-1])
            if size > CHUNK_BYTES:
                summary.add_text('\n'.join(kept), self.btime)
                kept, size = [], 0
        summary.add_text('\n'.join(kept), self.btime)
        self._save(source, summary, {'seq': seen})
        return summary

    def _late(self, deadline, path, where):
        """Whether the deadline has passed (said once, with where the read got to)."""
        if time.monotonic() <= deadline:
            return False
        self.warnings.append('kernel_log: %s was read up to %s within the time left; the rest is read next time'
                             % (path, where))
        return True

    # -- a command -----------------------------------------------------------------------
    def _read_command(self, argv, timeout):
        """(Summary, None) or (None, why not). journalctl goes on from the cursor it gave last."""
        source = 'command:' + ' '.join(argv)
        summary, position = self._load(source)
        cursor = position.get('cursor') if isinstance(position, dict) and '--show-cursor' in argv else None
        text, skipped, problem = _run(argv + ['--after-cursor', cursor] if cursor else argv, timeout)
        if text is None and cursor:
            # The journal no longer has that entry (rotated, vacuumed): from the beginning.
            summary, cursor = Summary(), None
            text, skipped, problem = _run(argv, timeout)
        if text is None:
            return None, problem
        if skipped:
            self._skipped(skipped, argv[0], JOURNAL_MAX_BYTES)
        text, new_cursor = _split_cursor(text)
        if not cursor:
            if not text.strip():
                return None, '%s printed nothing' % argv[0]
            summary = Summary()
        summary.add_text(driver_lines(text), self.btime)
        self._save(source, summary, {'cursor': new_cursor or cursor} if '--show-cursor' in argv else None)
        return summary, None


def refused(path, st):
    """Why kernel_log path (its os.stat) is no source to read, or None: it must be /dev/kmsg, or
    a regular file of its records that only root (or this user) can write."""
    if stat.S_ISCHR(st.st_mode):
        if (os.major(st.st_rdev), os.minor(st.st_rdev)) == KMSG_DEVICE:
            return None
        return 'kernel_log: %s is a character device but not /dev/kmsg (1:11)' % path
    if not stat.S_ISREG(st.st_mode):
        return 'kernel_log: %s is neither /dev/kmsg nor a file of its records' % path
    if st.st_uid not in (0, os.geteuid()):
        return ('kernel_log: %s is owned by uid %d: only a file of kernel records that root (or this user) owns is '
                'read. %s' % (path, st.st_uid, SAFE_SOURCES))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return ('kernel_log: %s can be written by its group or others (mode %04o): anyone could add a line that '
                'reads as the kernel\'s. %s' % (path, stat.S_IMODE(st.st_mode), SAFE_SOURCES))
    return None


def not_records_warning(path):
    return ("kernel_log: %s is not read: it does not hold /dev/kmsg records (PRIO,SEQ,USEC,FLAGS;MESSAGE). A syslog "
            "file such as /var/log/kern.log proves nothing: any local user can `logger -t kernel -p kern.err` a line "
            "that rsyslog writes exactly as the kernel's. %s; xid_events are unknown" % (path, SAFE_SOURCES))


def _starts_as_records(fd):
    """Whether the first line of a file that is not empty is a /dev/kmsg record (an empty file is)."""
    head = os.pread(fd, KMSG_RECORD_MAX, 0).decode('latin-1').lstrip('\n')
    return not head or KMSG_RECORD_RE.match(head) is not None


def _line_start(fd, offset):
    """The offset of the first line that begins at or after offset."""
    while offset > 0:
        data = os.pread(fd, KMSG_RECORD_MAX, offset - 1)
        newline = data.find(b'\n')
        if not data or newline >= 0:
            return offset + newline if data else offset
        offset += len(data)
    return offset


def _kmsg_records(fd):
    """The records /dev/kmsg gives from where fd is, as text, up to the newest."""
    while True:
        try:
            data = os.read(fd, KMSG_RECORD_MAX)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EINTR):
                continue  # EPIPE: overwritten before it was read; the next one follows
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return
            raise
        if not data:
            return
        yield data.decode('latin-1')


def _split_cursor(text):
    """(the log, the cursor journalctl --show-cursor printed at its end, or None)."""
    head, sep, tail = text.rstrip('\n').rpartition('\n')
    last = tail if sep else head
    if last.startswith(CURSOR_PREFIX):
        return (head + '\n' if sep else ''), last[len(CURSOR_PREFIX):].strip() or None
    return text, None


def _resume_at(position, st):
    """Where to go on reading a file: the remembered offset when it is the same file and has not
    shrunk (rotated or truncated files are read from the start)."""
    if not isinstance(position, dict):
        return 0
    offset = position.get('offset')
    if position.get('dev') != st.st_dev or position.get('ino') != st.st_ino or not isinstance(offset, int) \
            or offset < 0 or offset > st.st_size:
        return 0
    return offset


ENTRY_TYPES = (('bus', str), ('kind', str), ('count', int), ('texts', list))


def _valid_entries(entries):
    """The remembered entries, checked; ValueError when one is not what this module writes."""
    for entry in entries:
        if not isinstance(entry, dict) or any(not isinstance(entry.get(name), kind) for name, kind in ENTRY_TYPES):
            raise ValueError(entry)
        if entry['kind'] not in (XID, FALLEN, INIT_FAILED, DRIVER_HUNG) \
                or (bus_key(entry['bus']) is None and (entry['bus'], entry['kind']) != (HOST_BUS, DRIVER_HUNG)):
            raise ValueError(entry)
    return entries


def read_kernel_log(kernel_log=None, timeout=10.0, commands=KERNEL_LOG_COMMANDS, state=None, boot=None):
    """(events, warnings, report): the summarised messages (Summary.events()), or None when no
    kernel log could be read; report: what the read says of the host (the nvidia_kernel_log fact):
    skipped_bytes, the new text passed over to keep within the bounds, and host_events, the
    driver's messages that name no GPU. kernel_log: a /dev/kmsg record source to read instead of
    running journalctl -k, then dmesg; state: the state directory that remembers where the last
    read ended."""
    log = KernelLog(kernel_log, state, boot, commands)
    summary = log.read(timeout)
    events = summary.events() if summary is not None else None
    host_events = [dict((key, event[key]) for key in HOST_EVENT_KEYS) for event in events or () if event['bus'] is None]
    warnings = log.warnings + [host_warning(event) for event in host_events]
    warnings += list(state.warnings) if state is not None else []
    return events, warnings, {'skipped_bytes': log.skipped_bytes, 'host_events': host_events}


HOST_EVENT_KEYS = ('kind', 'count', 'first_time', 'time', 'text')


def host_warning(event):
    """The words for a driver message that names no GPU: reported, and held against no GPU."""
    return ('the kernel log says the NVIDIA driver hung (%s; %d lines this boot, the last at %s) without naming a GPU: '
            'no GPU is held at fault for it unless its own reads say so (a read that hangs in the driver, the '
            "driver's word that it requires a reset, its recovery action)" % (HUNG_TEXT, event['count'], event['time']))


def read_xid_events(kernel_log=None, timeout=10.0, commands=KERNEL_LOG_COMMANDS, state=None, boot=None):
    """(events, warnings) of read_kernel_log."""
    events, warnings, dummy = read_kernel_log(kernel_log, timeout, commands, state, boot)
    return events, warnings
