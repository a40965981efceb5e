# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kernel log summarised per GPU and message, read on from where the last read ended, from
the sources only the kernel writes, within bounds."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import stat
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._health import kernel_log as _kernel_log
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import health_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import (
    KERNEL_LOG_COMMANDS,
    KernelLog,
    epoch,
    parse_xid_events,
    read_kernel_log,
    read_xid_events,
    summarize,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import needs_cure
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir

LINE = '2026-11-30T10:00:%02d+0000 gpu07 kernel: NVRM: Xid (PCI:0000:18:00): %d, pid=%d, name=python3, text %d'
XID = 'NVRM: Xid (PCI:0000:%s:00): %d, pid=%d, name=python3, text %d'
H200_18 = {'pci_bus_id': '00000000:18:00.0', 'uuid': 'GPU-18'}
# This boot began 1000 s before 2026-11-30T10:00:00Z: a record at 1000 s is at that time.
BTIME = 1796032800.0 - 1000


def storm(count, code=95, start=0):
    return ''.join(LINE % ((start + n) % 60, code, 1000 + n, start + n) + '\n' for n in range(count))


def record(message, seq, seconds=1000.0, facility=0, level=3):
    """A /dev/kmsg record: PRIO,SEQ,USEC,FLAGS;MESSAGE."""
    return '%d,%d,%d,-;%s\n' % (facility << 3 | level, seq, int(round(seconds * 1000000)), message)


def kmsg_storm(count, code=95, start=0, bus='18'):
    return ''.join(record(XID % (bus, code, 1000 + n, n), n, 1000.0 + n) for n in range(start, start + count))


def kmsg_file(path, text, mode=0o644):
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def log_of(path, state=None, boot='boot-1'):
    return KernelLog(str(path), state, boot, btime=BTIME)


@pytest.fixture
def state(tmp_path):
    return StateDir(str(tmp_path / 'state'))


def saved(state):
    [name] = [name for name in os.listdir(state.path) if name.startswith('kernel-log-')]
    return os.path.join(state.path, name)


# -- the summary ---------------------------------------------------------------------------------

def test_a_storm_is_one_entry_with_its_count_first_and_last_time_and_last_texts():
    # Before: every line was its own event in the facts (1,000,000 lines: 125 MB).
    summary = summarize(storm(5000).splitlines() + [LINE % (9, 13, 1, 1)])
    entries = summary.dump()
    assert [(e['bus'], e['code'], e['count']) for e in entries] == [('0000:18:00', 95, 5000), ('0000:18:00', 13, 1)]
    assert entries[0]['first_time'] == '2026-11-30T10:00:00+0000' and entries[0]['last_time'] == '2026-11-30T10:00:19+0000'
    assert entries[0]['texts'] == ['pid=%d, name=python3, text %d' % (1000 + n, n) for n in (4997, 4998, 4999)]
    assert len(json.dumps(entries)) < 2000


def test_the_summary_counts_what_parse_xid_events_finds(tmp_path):
    lines = ['NVRM: Xid (PCI:0000:18:00): 13, a', 'NVRM: GPU 0000:2a:00.0: GPU has fallen off the bus.',
             'NVRM: Xid (PCI:0000:18:00 GPU-I:02): 13, b', 'NVRM: The NVIDIA GPU 0000:3a:00.0',
             'NVRM: (PCI ID: 10de:2335) installed in this system has',
             'NVRM: fallen off the bus and is not responding to commands.',
             'NVRM: GPU 0000:5d:00.0: RmInitAdapter failed! (0x62:0x65:1792)']
    events = parse_xid_events(lines)
    entries = summarize(lines).dump()
    assert [(e['bus'], e['kind'], e['code'], e['count']) for e in entries] == [
        ('0000:18:00', 'xid', 13, 2), ('0000:2a:00', 'fallen_off_bus', None, 1), ('0000:3a:00', 'fallen_off_bus', None, 1),
        ('0000:5d:00', 'init_failed', None, 1)]
    assert [e['kind'] for e in events] == ['xid', 'fallen_off_bus', 'xid', 'fallen_off_bus', 'init_failed']


@pytest.mark.parametrize('stamp, seconds', [
    ('2026-11-30T10:00:00+0000', 1796032800.0), ('2026-11-30T10:00:00,123456+00:00', 1796032800.0),
    ('2026-11-30T11:00:00+01:00', 1796032800.0), ('2026-11-30T10:00:00Z', 1796032800.0),
    ('1234.5', 1000.0 + 1234.5), (None, None), ('yesterday', None)])
def test_time_stamps_in_epoch_seconds(stamp, seconds):
    assert epoch(stamp, boot_time=1000.0) == seconds


def test_health_counts_only_what_happened_since_the_last_cure(tmp_path):
    lines = [LINE % (1, 95, 1, 1), LINE % (2, 45, 2, 2)]
    events = summarize(lines).events()
    cured = epoch('2026-11-30T10:00:05+0000')
    # Before: every Xid of the boot counted until a reboot, so a GPU that a reset cured read
    # reset_gpu for good.
    assert health_facts(H200_18, events)['recovery_action'] == 'reset_gpu'
    health = health_facts(H200_18, events, cured)
    assert health['recovery_action'] == 'none' and health['last_cure'] == '2026-11-30T10:00:05Z'
    assert [(e['code'], e['count'], e['since_cure']) for e in health['xid_events']] == [(95, 1, False), (45, 1, False)]
    later = summarize(lines + [LINE % (9, 13, 3, 3)]).events()
    assert health_facts(H200_18, later, cured)['recovery_action'] == 'restart_app'


# -- sources: only what the kernel wrote ---------------------------------------------------------

SYSLOG_FILE = '\n'.join([
    # What rsyslog writes to /var/log/kern.log for the kernel's line and for `logger -t kernel -p
    # kern.err 'NVRM: Xid ...'` run by any user: the same words.
    'Dec  1 10:00:00 node07 kernel: [ 812.123456] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Ch 00000008',
    "Dec  1 10:00:01 node07 kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, fallen off the bus",
    'Dec  1 10:00:02 node07 kernel: NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
    '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844',
    ''])


@pytest.mark.parametrize('text', [SYSLOG_FILE, storm(3), 'boot\n' + kmsg_storm(2)])
def test_a_file_that_holds_no_kmsg_records_is_refused_and_names_the_safe_sources(tmp_path, state, text):
    # Before: a syslog file was read, and a user's `logger -t kernel` line reset GPUs and rebooted the node.
    path = kmsg_file(tmp_path / 'kern.log', text)
    events, warnings, report = read_kernel_log(path, state=state, boot='boot-1')
    assert events is None and report == {'skipped_bytes': 0, 'host_events': []}
    [warning] = warnings
    assert warning.startswith('kernel_log: %s is not read: it does not hold /dev/kmsg records' % path)
    assert 'any local user can `logger -t kernel -p kern.err`' in warning
    assert "exactly as the kernel's. The sources only the kernel writes are journald's kernel transport (leave " \
           'kernel_log unset: journalctl -k, then dmesg --facility=kern) and /dev/kmsg; xid_events are unknown' in warning
    assert health_facts(H200_18, events)['recovery_action'] == 'none'


def test_records_the_kernel_did_not_write_are_not_the_drivers(tmp_path):
    # Root's `echo '<3>NVRM: Xid ...' > /dev/kmsg` is filed as the user facility (1), whatever its
    # prefix asks; only facility 0 is the kernel's. A continuation line is no record.
    path = kmsg_file(tmp_path / 'kmsg', ''.join([
        record(XID % ('2a', 79, 1, 1), 0, facility=1),
        record(XID % ('3a', 119, 2, 2), 1, facility=3, level=6),
        record(XID % ('18', 13, 3, 3), 2),
        ' DEVICE=+pci:0000:5d:00.0 NVRM: Xid (PCI:0000:5d:00): 48, in a dictionary line\n',
        record('usb 1-1: new device', 3),
    ]))
    events, warnings = read_xid_events(path)
    assert warnings == [] and [(event['bus'], event['code']) for event in events] == [((0, 0x18, 0), 13)]


def test_a_records_time_is_its_boot_time_plus_microseconds(tmp_path):
    path = kmsg_file(tmp_path / 'kmsg', record(XID % ('18', 95, 1, 1), 7, 1000.25))
    [entry] = log_of(path).read().dump()
    assert entry['first_time'] == entry['last_time'] == '2026-11-30T10:00:00.250000+00:00'
    assert entry['first_epoch'] == entry['last_epoch'] == 1796032800.25


@pytest.mark.parametrize('change, why', [
    (lambda path: os.chown(path, 65534, 65534), 'is owned by uid 65534'),
    (lambda path: os.chmod(path, 0o664), 'can be written by its group or others (mode 0664)'),
    (lambda path: os.chmod(path, 0o646), 'can be written by its group or others (mode 0646)'),
])
def test_a_record_file_others_can_write_is_refused(tmp_path, change, why):
    path = kmsg_file(tmp_path / 'kmsg', record(XID % ('18', 79, 1, 1), 0))
    change(path)
    events, warnings = read_xid_events(path)
    assert events is None and len(warnings) == 1 and why in warnings[0] and 'xid_events are unknown' in warnings[0]


def test_what_is_neither_dev_kmsg_nor_a_record_file_is_refused(tmp_path):
    fifo = str(tmp_path / 'fifo')
    os.mkfifo(fifo)
    for path, why in (('/dev/null', 'is a character device but not /dev/kmsg'),
                      (fifo, 'is neither /dev/kmsg nor a file of its records'),
                      (str(tmp_path), 'is neither /dev/kmsg nor a file of its records'),
                      (str(tmp_path / 'missing'), 'cannot read')):
        events, warnings = read_xid_events(path)
        assert events is None and why in warnings[0], path


def test_the_default_sources_are_the_kernels_own():
    journal, dmesg = KERNEL_LOG_COMMANDS
    assert journal[:2] == ['journalctl', '-k']
    assert dmesg[:2] == ['dmesg', '--facility=kern']


# -- reading on from where the last read ended ---------------------------------------------------

def test_a_record_file_is_read_on_from_its_offset_and_sequence_number(tmp_path, state):
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(100))
    first = log_of(path, state).read()
    assert first.dump()[0]['count'] == 100
    with open(path, 'a') as handle:
        handle.write(kmsg_storm(10, start=100) + record(XID % ('18', 31, 7, 7), 110).rstrip('\n'))  # not finished
    second = log_of(path, state).read()
    assert [(e['code'], e['count']) for e in second.dump()] == [(95, 110)]
    with open(path, 'a') as handle:
        handle.write('\n')
    third = log_of(path, state).read()
    assert [(e['code'], e['count']) for e in third.dump()] == [(95, 110), (31, 1)]
    position = json.load(open(saved(state)))['position']
    assert position['offset'] == os.path.getsize(path) and position['seq'] == 110


def test_records_at_or_below_the_last_sequence_number_are_not_counted_again(tmp_path, state):
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(5))
    log_of(path, state).read()
    # The same records again after the offset (a ring written out twice): they were counted.
    with open(path, 'a') as handle:
        handle.write(kmsg_storm(5) + kmsg_storm(2, start=5))
    assert log_of(path, state).read().dump()[0]['count'] == 7


def test_a_rotated_or_truncated_file_and_another_boot_are_read_from_the_start(tmp_path, state):
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(50))
    log_of(path, state).read()
    kmsg_file(tmp_path / 'kmsg', kmsg_storm(5))
    assert log_of(path, state).read().dump()[0]['count'] == 5
    assert log_of(path, state, 'boot-2').read().dump()[0]['count'] == 5
    os.rename(path, str(tmp_path / 'kmsg.1'))
    kmsg_file(tmp_path / 'kmsg', kmsg_storm(7))
    assert log_of(path, state, 'boot-2').read().dump()[0]['count'] == 7


def test_a_corrupt_or_foreign_state_file_is_ignored_with_a_warning(tmp_path, state):
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(3))
    log_of(path, state).read()
    data = json.load(open(saved(state)))
    data['entries'][0]['count'] = 'many'
    with open(saved(state), 'w') as handle:
        json.dump(data, handle)
    assert log_of(path, state).read().dump()[0]['count'] == 3
    with open(saved(state), 'w') as handle:
        handle.write('{"version": 1, "entries": [')
    events, warnings = read_xid_events(path, state=state, boot='boot-1')
    assert [e['count'] for e in events] == [3] and any('is ignored' in warning for warning in warnings)


def test_without_a_state_directory_every_read_is_whole(tmp_path):
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(3))
    for dummy in range(2):
        assert log_of(path).read().dump()[0]['count'] == 3


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text('#!/bin/sh\n' + body + '\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# journalctl -k -o short-iso --show-cursor [--after-cursor C]: the entries after C, then the cursor.
JOURNAL = r'''log=%s
if [ "$7" = "--after-cursor" ]; then
  if [ "$8" = "gone" ]; then echo "Failed to seek to cursor: Invalid argument" >&2; exit 1; fi
  tail -n +$(( ${8#c} + 1 )) "$log"
else
  cat "$log"
fi
echo "-- cursor: c$(wc -l < "$log")"
'''


def journal_command(tmp_path, log):
    return [script(tmp_path, 'journalctl', JOURNAL % log), '-k', '-o', 'short-iso', '--no-pager', '-q', '--show-cursor']


def test_journald_is_read_on_from_its_cursor(tmp_path, state):
    log = tmp_path / 'journal'
    log.write_text(storm(20))
    journal = journal_command(tmp_path, log)
    first = KernelLog(None, state, 'boot-1', commands=[journal]).read(5)
    assert first.dump()[0]['count'] == 20
    with open(str(log), 'a') as handle:
        handle.write(storm(4, start=20))
    assert KernelLog(None, state, 'boot-1', commands=[journal]).read(5).dump()[0]['count'] == 24
    # Nothing new: the remembered summary as it is.
    assert KernelLog(None, state, 'boot-1', commands=[journal]).read(5).dump()[0]['count'] == 24
    data = json.load(open(saved(state)))
    assert data['position'] == {'cursor': 'c24'}
    data['position'] = {'cursor': 'gone'}
    with open(saved(state), 'w') as handle:
        json.dump(data, handle)
    assert KernelLog(None, state, 'boot-1', commands=[journal]).read(5).dump()[0]['count'] == 24


def test_journald_output_beyond_the_bound_is_skipped_from_the_oldest_and_said(tmp_path, state, monkeypatch):
    monkeypatch.setattr(_kernel_log, 'JOURNAL_MAX_BYTES', 4096)
    log = tmp_path / 'journal'
    log.write_text(storm(200) + LINE % (59, 13, 1, 1) + '\n')
    reader = KernelLog(None, state, 'boot-1', commands=[journal_command(tmp_path, log)])
    entries = reader.read(5).dump()
    # The newest lines and the cursor are kept; what came before is counted as skipped.
    assert [e['code'] for e in entries] == [95, 13] and entries[0]['count'] < 200
    assert reader.skipped_bytes > len(storm(150))
    assert 'the oldest %d bytes were skipped' % reader.skipped_bytes in reader.warnings[0]
    assert json.load(open(saved(state)))['position'] == {'cursor': 'c201'}


# -- bounds: bytes, time, memory -----------------------------------------------------------------

def test_a_record_file_is_read_in_chunks_and_its_position_saved_after_each(tmp_path, state, monkeypatch):
    monkeypatch.setattr(_kernel_log, 'CHUNK_BYTES', 1000)
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(100))
    saves = []
    real_save = KernelLog._save
    monkeypatch.setattr(KernelLog, '_save', lambda self, *args: (saves.append(args[2]['offset']), real_save(self, *args)))
    assert log_of(path, state).read().dump()[0]['count'] == 100
    assert len(saves) >= 10 and saves == sorted(saves) and saves[-1] == os.path.getsize(path)


def test_a_read_out_of_time_keeps_what_it_read_and_goes_on_next_time(tmp_path, state, monkeypatch):
    monkeypatch.setattr(_kernel_log, 'CHUNK_BYTES', 1000)
    path = kmsg_file(tmp_path / 'kmsg', kmsg_storm(100))
    calls = []
    real_late = KernelLog._late
    monkeypatch.setattr(KernelLog, '_late', lambda self, deadline, *args: (
        calls.append(1), real_late(self, deadline - (1e9 if len(calls) > 2 else 0), *args))[1])
    reader = log_of(path, state)
    first = reader.read().dump()[0]['count']
    assert 0 < first < 100 and 'was read up to byte' in reader.warnings[0] and 'the rest is read next time' in reader.warnings[0]
    monkeypatch.setattr(KernelLog, '_late', real_late)
    assert log_of(path, state).read().dump()[0]['count'] == 100


def test_more_new_records_than_the_bound_are_skipped_from_the_oldest(tmp_path, state, monkeypatch):
    monkeypatch.setattr(_kernel_log, 'READ_MAX_BYTES', 2000)
    old = record(XID % ('2a', 79, 1, 1), 0)
    path = kmsg_file(tmp_path / 'kmsg', old + kmsg_storm(100, start=1))
    reader = log_of(path, state)
    entries = reader.read().dump()
    assert [e['bus'] for e in entries] == ['0000:18:00'] and entries[0]['count'] < 100
    assert os.path.getsize(path) - reader.skipped_bytes <= 2000 and reader.skipped_bytes > len(old)
    assert 'the oldest %d bytes were skipped' % reader.skipped_bytes in reader.warnings[0]
    again = log_of(path, state)
    assert again.read().dump() == entries and again.skipped_bytes == 0 and again.warnings == []


# The flood, read in a process of its own: its peak memory, what it skipped, what it found. The
# peak is the process's own high-water mark (VmHWM): getrusage's ru_maxrss keeps, across exec,
# the peak of the process that forked it (here the test, which wrote the flood).
FLOOD_READ = r'''
import json, sys
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import KernelLog
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir
log = KernelLog(sys.argv[1], StateDir(sys.argv[2]), 'boot-1')
summary = log.read(120)
peak = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]
print(json.dumps({'rss_mib': int(peak) / 1024.0, 'skipped': log.skipped_bytes,
                  'entries': [[e['bus'], e['code'], e['count']] for e in summary.dump()], 'warnings': log.warnings}))
'''
MIB = 1024 * 1024


def write_flood(path, mib):
    """A record file of about mib MiB: an old kernel Xid 79, a hole (the bulk, written sparse), 80 MiB
    of user-facility records with the driver's words (root's echo > /dev/kmsg), then the kernel's Xid 13."""
    with open(path, 'w') as handle:
        handle.write(record(XID % ('2a', 79, 1, 1), 0))
        handle.seek((mib - 80) * MIB)
        handle.write('\n')
        user = XID % ('3a', 79, 4242, 0)
        count = 80 * MIB // len(record(user, 1000000, 2000.0, facility=1))
        for block in range(1, count, 10000):
            handle.write(''.join(['%d,%d,%d,-;%s\n' % (1 << 3 | 3, seq, 2000000000 + seq, user)
                                  for seq in range(block, min(block + 10000, count))]))
        handle.write(record(XID % ('18', 13, 1, 1), count, 3000.0))
    os.chmod(path, 0o644)


def test_a_flood_is_read_within_the_bounds_and_not_read_again(tmp_path):
    # Before: 300 MiB of user lines took 9.6 s and 1.1 GiB; 800 MiB were killed at the hook's
    # deadline at 2.9 GiB, and read again by every later run.
    path = str(tmp_path / 'kmsg')
    write_flood(path, 300)
    size = os.path.getsize(path)
    command = [sys.executable, '-c', FLOOD_READ, path, str(tmp_path / 'state')]
    first = json.loads(subprocess.check_output(command))
    assert first['rss_mib'] < 256
    assert first['entries'] == [['0000:18:00', 13, 1]]
    assert first['skipped'] >= size - _kernel_log.READ_MAX_BYTES and first['skipped'] < size - 64 * MIB + 512
    assert 'the oldest %d bytes were skipped' % first['skipped'] in first['warnings'][0]
    second = json.loads(subprocess.check_output(command))
    assert second == dict(first, rss_mib=second['rss_mib'], skipped=0, warnings=[])


# -- /dev/kmsg itself -------------------------------------------------------------------------------

def kmsg_readable():
    try:
        os.close(os.open('/dev/kmsg', os.O_RDONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not kmsg_readable(), reason='/dev/kmsg cannot be read here')
def test_dev_kmsg_is_read_on_from_its_sequence_number(state):
    first = KernelLog('/dev/kmsg', state, 'boot-1')
    assert first.read(10) is not None and first.warnings == []
    seq = json.load(open(saved(state)))['position']['seq']
    assert isinstance(seq, int)
    second = KernelLog('/dev/kmsg', state, 'boot-1')
    assert second.read(10) is not None and second.warnings == []
    assert json.load(open(saved(state)))['position']['seq'] >= seq


def test_the_devices_records_are_taken_after_the_last_sequence_number_and_from_the_kernel_only(state, monkeypatch):
    rings = [[record(XID % ('18', 95, 1, 1), 5), record(XID % ('2a', 79, 2, 2), 6, facility=1),
              record(XID % ('18', 95, 3, 3), 7) + ' SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n'],
             # Later: the ring still holds 7; 8 was overwritten before it was read (EPIPE, skipped over).
             [record(XID % ('18', 95, 3, 3), 7), record(XID % ('18', 13, 4, 4), 9)]]
    for ring, expected in zip(rings, ([(95, 2)], [(95, 2), (13, 1)])):
        monkeypatch.setattr(_kernel_log, '_kmsg_records', lambda fd, ring=ring: iter(ring))
        fd = os.open('/dev/null', os.O_RDONLY)
        try:
            summary = KernelLog(None, state, 'boot-1', btime=BTIME)._read_device(fd, '/dev/kmsg', float('inf'))
        finally:
            os.close(fd)
        assert [(e['code'], e['count']) for e in summary.dump()] == expected
    assert json.load(open(saved(state)))['position'] == {'seq': 9}


def test_dev_kmsg_is_read_record_by_record_past_overwritten_ones_to_its_end(monkeypatch):
    answers = [b'6,1,5,-;one\n', OSError(errno.EPIPE, 'Broken pipe'), b'6,3,6,-;three\n SUBSYSTEM=pci\n',
               OSError(errno.EINTR, 'Interrupted'), OSError(errno.EAGAIN, 'Resource temporarily unavailable'),
               b'never read\n']

    def read(fd, size):
        assert size >= 8192
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with monkeypatch.context() as patch:
        patch.setattr(_kernel_log.os, 'read', read)
        found = list(_kernel_log._kmsg_records(-1))
    assert found == ['6,1,5,-;one\n', '6,3,6,-;three\n SUBSYSTEM=pci\n'] and answers == [b'never read\n']


# -- the driver hung (a full-chip reset that never ended) ----------------------------------------

# The driver's assertions after a full-chip reset hung, as an RTX 5080 host's journal shows them
# (NVIDIA/open-gpu-kernel-modules#1045): "GPU0" is the driver's instance number, not a bus id.
HUNG = [
    'Jun 12 16:30:43 fedora-box kernel: NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
    '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ mem.c:178',
    'Jun 12 16:30:43 fedora-box kernel: NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || '
    '(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_server.c:1375',
]
H200_2A = {'pci_bus_id': '00000000:2A:00.0', 'uuid': 'GPU-2A'}
CAUSE = ('driver_hung: the kernel log says the NVIDIA driver hung (NV_ERR_GPU_IN_FULLCHIP_RESET) since the last '
         'cure; only a reboot frees it')


def test_a_hung_full_chip_reset_that_names_no_bus_id_convicts_no_gpu_by_itself():
    # Before: every GPU was driver_hung and the node was asked to reboot, on one line anyone could write.
    events = summarize(HUNG * 500).events()
    assert [(e['bus'], e['kind'], e['count']) for e in events] == [(None, 'driver_hung', 1000)]
    for gpu in (H200_18, H200_2A):
        health = health_facts(gpu, events)
        assert health['recovery_action'] == 'none' and health['xid_events'] == []
    assert parse_xid_events(HUNG)[0]['kind'] == 'driver_hung' and parse_xid_events(HUNG)[0]['bus'] is None


@pytest.mark.parametrize('own', [
    dict(reset_required=True, error='GPU requires reset'),
    dict(error='driver_hung: nvidia-smi hung in the NVIDIA driver past its deadline (pid 7 in D state); only a reboot frees it'),
    dict(driver_recovery_action='reboot'),
])
def test_a_hung_full_chip_reset_that_names_no_bus_id_counts_where_the_gpus_own_reads_bear_it_out(own):
    events = summarize(HUNG).events()
    health = health_facts(dict(H200_18, **own), events)
    assert health['recovery_action'] == 'reboot'
    assert [(e['kind'], e['count']) for e in health['xid_events']] == [('driver_hung', 2)]
    assert health_facts(H200_2A, events)['recovery_action'] == 'none'
    assert needs_cure(dict(H200_18, index=0, **own), health).startswith('GPU 0 needs a reboot (')
    assert CAUSE in needs_cure(dict(H200_18, index=0, **own), health)


def test_a_hung_driver_line_that_names_a_bus_id_is_that_gpus_only():
    # The driver's per-GPU prefix (as on its RmInitAdapter lines) before the same assertion.
    line = HUNG[0].replace('NVRM: GPU0 ', 'NVRM: GPU 0000:2a:00.0: ')
    events = summarize([line, LINE % (1, 13, 1, 1)]).events()
    assert health_facts(H200_2A, events)['recovery_action'] == 'reboot'
    assert health_facts(H200_18, events)['recovery_action'] == 'restart_app'
    assert [(e['bus'], e['kind']) for e in parse_xid_events([line])] == [((0, 0x2a, 0), 'driver_hung')]


def test_a_host_wide_hung_line_is_reported_for_the_host(tmp_path):
    path = kmsg_file(tmp_path / 'kmsg', ''.join(record(line.split('kernel: ', 1)[1], seq) for seq, line in enumerate(HUNG)))
    events, warnings, report = read_kernel_log(path)
    assert [(e['bus'], e['kind'], e['count']) for e in events] == [(None, 'driver_hung', 2)]
    assert [(e['kind'], e['count']) for e in report['host_events']] == [('driver_hung', 2)]
    [warning] = warnings
    assert warning.startswith('the kernel log says the NVIDIA driver hung (NV_ERR_GPU_IN_FULLCHIP_RESET; 2 lines this boot')
    assert 'no GPU is held at fault for it unless its own reads say so' in warning


def test_a_hung_driver_is_remembered_across_reads(tmp_path, state):
    messages = [line.split('kernel: ', 1)[1] for line in HUNG]
    path = kmsg_file(tmp_path / 'kmsg', record(messages[0], 0) + record(messages[1], 1))
    assert log_of(path, state).read().dump()[0]['count'] == 2
    with open(path, 'a') as handle:
        handle.write(record(messages[0], 2))
    reader = log_of(path, state)
    entries = reader.read().dump()
    assert reader.warnings == [] and [(e['bus'], e['kind'], e['count']) for e in entries] == [('host', 'driver_hung', 3)]
