# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The driver's messages in the kernel log (Xid errors, GPUs fallen off the bus or that failed to
initialise), summarised per GPU and message, and read incrementally.

An Xid storm (hundreds of thousands of the same line in one boot) must cost nothing: each GPU's
messages are kept as one entry per code (count, first and last time, the last few texts), and
what was read is remembered in the state directory (_state), with where the reading ended: a
file's offset, journald's cursor. The next read starts there.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import collections
import hashlib
import os
import re
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
# A file may hold lines that are not the kernel's: in a syslog file (/var/log/kern.log, syslog)
# any local user's `logger -p kern.err 'NVRM: Xid ...'` lands beside the driver's. A driver line
# read from a file counts only when what comes before "NVRM:" says the kernel wrote it: syslog's
# time and host, then the tag "kernel:" (the default templates of rsyslog and syslog-ng), or
# nothing but what dmesg itself prints (its stamp: seconds since boot, -T's time, --time-format
# iso; -x's facility and level). journalctl -k and dmesg, the default sources, are the kernel's.
FROM_KERNEL_RE = re.compile(
    r'^(?:(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}|\d{4}-\d{2}-\d{2}T\S+) \S+ )?kernel:\s*(?:\[\s*\d+\.\d+\]\s*)?$'
    r'|^\s*(?:[a-z]+\s*:\s*[a-z]+\s*:\s*)?(?:\[[^\]]*\]|\d{4}-\d{2}-\d{2}T[0-9:.,+-]+)?\s*$')
ISO_PARTS_RE = re.compile(r'^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,]\d+)?(Z|[+-]\d{2}:?\d{2})?$')

# The commands that print the kernel log, tried in order. journalctl -k is this boot only;
# --show-cursor ends its output with "-- cursor: ...", where the next read starts (--after-cursor).
JOURNAL_COMMAND = ['journalctl', '-k', '-o', 'short-iso', '--no-pager', '-q', '--show-cursor']
KERNEL_LOG_COMMANDS = (JOURNAL_COMMAND, ['dmesg', '--time-format', 'iso'])
CURSOR_PREFIX = '-- cursor: '

# Texts kept per GPU and message, the newest; and how long each may be.
TEXTS_KEPT = 3
TEXT_MAX = 300
# Entries kept per state file: far more GPUs and codes than a host has.
MAX_ENTRIES = 4096
STATE_VERSION = 1


def line_time(prefix):
    """The time stamp in the part of a log line before "NVRM:", as the log prints it, or None."""
    match = SYSLOG_TIME_RE.match(prefix) or ISO_TIME_RE.search(prefix) or CTIME_RE.search(prefix)
    if match:
        return match.group(1)
    match = UPTIME_RE.search(prefix)
    return match.group(1) if match else None


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
    if boot_time is not None and re.match(r'^\d+\.\d+$', stamp):
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
            entry['last_time'] = line_time(entry.pop('_prefix'))
            entry['last_epoch'] = epoch(entry['last_time'], btime)
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
        lines = text[start:].split('\n', MESSAGE_LINES)[:MESSAGE_LINES]
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
    first = line_time(prefix)
    return {'bus': key[0], 'kind': key[1], 'code': key[2], 'count': 0, 'first_time': first,
            'first_epoch': epoch(first, btime), 'last_time': first, 'last_epoch': None, 'texts': []}


def summarize(lines, btime=None):
    """The Summary of kernel log lines."""
    return Summary().add_text('\n'.join(line.rstrip('\r\n') for line in lines), btime)


# -- reading, incrementally ------------------------------------------------------------------

def _run(argv, timeout):
    """(text, None) of what argv printed, or (None, why not)."""
    runner = Runner(argv[0], timeout, env=dict(SYSTEMD_PAGER='', SYSTEMD_COLORS='0'))
    try:
        rc, stdout, stderr = runner.run(argv[1:])
    except CommandTimeout:
        return None, '%s did not finish within %s s' % (argv[0], timeout)
    except GpuopsError as exc:
        return None, str(exc)
    if rc != 0:
        said = stderr.strip().splitlines()
        return None, '%s exited with %d%s' % (argv[0], rc, (': ' + said[0]) if said else '')
    return stdout, None


class KernelLog:
    """Reads the kernel log into a Summary, from where the last read on this host ended.

    kernel_log: a file to read instead of journalctl -k, then dmesg; state: a _state.StateDir (or
    None: every read starts from the beginning); boot: this boot's id, which the state is kept
    under (journalctl -k is this boot's log)."""

    def __init__(self, kernel_log=None, state=None, boot=None, commands=KERNEL_LOG_COMMANDS, btime=None):
        self.kernel_log = kernel_log
        self.state = state if state is not None and state.usable else None
        self.boot = boot
        self.commands = commands
        self.btime = boot_time() if btime is None else btime
        self.warnings = []

    def read(self, timeout=10.0):
        """The Summary, or None when no kernel log could be read (self.warnings says why)."""
        if self.kernel_log:
            return self._read_file(self.kernel_log)
        if timeout is not None and timeout < CALL_FLOOR_S:
            self.warnings.append('no time was left within the timeout to read the kernel log; xid_events are unknown')
            return None
        problems = []
        for argv in self.commands:
            summary, problem = self._read_command(argv, timeout)
            if summary is not None:
                return summary
            problems.append(problem)
        self.warnings.append('the kernel log could not be read (%s); xid_events are unknown. Run with '
                             'privilege escalation or set kernel_log' % '; '.join(problems))
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

    # -- a file ------------------------------------------------------------------------------
    def _read_file(self, path):
        source = 'file:' + os.path.realpath(path)
        summary, position = self._load(source)
        try:
            with open(path, 'rb') as handle:
                st = os.fstat(handle.fileno())
                offset = _resume_at(position, st)
                if offset == 0:
                    summary = Summary()
                handle.seek(offset)
                data = handle.read()
        except (IOError, OSError) as exc:
            self.warnings.append('kernel_log: cannot read %s (%s); xid_events are unknown'
                                 % (path, getattr(exc, 'strerror', None) or exc))
            return None
        # Up to the last whole line: a line being written is read next time.
        end = data.rfind(b'\n') + 1 if not data.endswith(b'\n') else len(data)
        summary.add_text(from_kernel(data[:end].decode('utf-8', 'replace')), self.btime)
        self._save(source, summary, {'dev': st.st_dev, 'ino': st.st_ino, 'offset': offset + end})
        return summary

    # -- a command -----------------------------------------------------------------------
    def _read_command(self, argv, timeout):
        """(Summary, None) or (None, why not). journalctl goes on from the cursor it gave last."""
        source = 'command:' + ' '.join(argv)
        summary, position = self._load(source)
        cursor = position.get('cursor') if isinstance(position, dict) and '--show-cursor' in argv else None
        text, problem = _run(argv + ['--after-cursor', cursor] if cursor else argv, timeout)
        if text is None and cursor:
            # The journal no longer has that entry (rotated, vacuumed): from the beginning.
            summary, cursor = Summary(), None
            text, problem = _run(argv, timeout)
        if text is None:
            return None, problem
        text, new_cursor = _split_cursor(text)
        if not cursor:
            if not text.strip():
                return None, '%s printed nothing' % argv[0]
            summary = Summary()
        summary.add_text(text, self.btime)
        self._save(source, summary, {'cursor': new_cursor or cursor} if '--show-cursor' in argv else None)
        return summary, None


def from_kernel(text):
    """text without the driver lines that something other than the kernel wrote (FROM_KERNEL_RE)."""
    lines = text.split('\n')
    kept = [line for line in lines if line.find('NVRM: ') < 0 or FROM_KERNEL_RE.match(line[:line.find('NVRM: ')])]
    return '\n'.join(kept) if len(kept) != len(lines) else text


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


def read_xid_events(kernel_log=None, timeout=10.0, commands=KERNEL_LOG_COMMANDS, state=None, boot=None):
    """(events, warnings): the summarised messages (Summary.events()), or None when no kernel log
    could be read. kernel_log: a file to read instead of running journalctl -k, then dmesg; state:
    the state directory that remembers where the last read ended."""
    log = KernelLog(kernel_log, state, boot, commands)
    summary = log.read(timeout)
    warnings = log.warnings + (list(state.warnings) if state is not None else [])
    return (summary.events() if summary is not None else None), warnings
