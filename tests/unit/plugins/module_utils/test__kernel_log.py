# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kernel log summarised per GPU and message, read on from where the last read ended."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._health import health_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._kernel_log import (
    KernelLog,
    epoch,
    parse_xid_events,
    read_xid_events,
    summarize,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import needs_cure
from ansible_collections.gpuops.nvidia.plugins.module_utils._state import StateDir

LINE = '2026-11-30T10:00:%02d+0000 gpu07 kernel: NVRM: Xid (PCI:0000:18:00): %d, pid=%d, name=python3, text %d'
H200_18 = {'pci_bus_id': '00000000:18:00.0', 'uuid': 'GPU-18'}


def storm(count, code=95, start=0):
    return ''.join(LINE % ((start + n) % 60, code, 1000 + n, start + n) + '\n' for n in range(count))


@pytest.fixture
def state(tmp_path):
    return StateDir(str(tmp_path / 'state'))


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


def test_a_line_a_user_wrote_into_a_syslog_file_is_not_the_drivers(tmp_path):
    # What rsyslog writes to /var/log/kern.log for `logger -p kern.err 'NVRM: Xid ...'`, run by
    # user alice (tag: her name), and for one that tries to look like the kernel inside the message.
    log = tmp_path / 'kern.log'
    log.write_text('\n'.join([
        'Dec  1 10:00:00 node07 kernel: [ 812.123456] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Ch 00000008',
        "Dec  1 10:00:01 node07 alice: NVRM: Xid (PCI:0000:2a:00): 119, pid='<unknown>', name=<unknown>, Timeout",
        "Dec  1 10:00:02 node07 alice: kernel: NVRM: Xid (PCI:0000:3a:00): 79, GPU has fallen off the bus.",
        "Dec  1 10:00:03 node07 alice: [ 812.2] NVRM: Xid (PCI:0000:5d:00): 48, An uncorrectable double bit error",
        '2026-12-01T10:00:04.000000+00:00 node07 alice: NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus.',
        '']))
    events, warnings = read_xid_events(str(log))
    assert warnings == [] and [(event['bus'], event['code']) for event in events] == [((0, 0x18, 0), 13)]


def test_a_file_is_read_on_from_its_offset(tmp_path, state):
    log = tmp_path / 'kern.log'
    log.write_text(storm(100))
    first = KernelLog(str(log), state, 'boot-1').read()
    assert first.dump()[0]['count'] == 100
    with open(str(log), 'a') as handle:
        handle.write(storm(10, start=100) + LINE % (1, 31, 7, 7))  # the last line is not finished
    second = KernelLog(str(log), state, 'boot-1').read()
    assert [(e['code'], e['count']) for e in second.dump()] == [(95, 110)]
    with open(str(log), 'a') as handle:
        handle.write('\n')
    third = KernelLog(str(log), state, 'boot-1').read()
    assert [(e['code'], e['count']) for e in third.dump()] == [(95, 110), (31, 1)]
    saved = [name for name in os.listdir(state.path) if name.startswith('kernel-log-')]
    assert len(saved) == 1


def test_a_rotated_or_truncated_file_and_another_boot_are_read_from_the_start(tmp_path, state):
    log = tmp_path / 'kern.log'
    log.write_text(storm(50))
    KernelLog(str(log), state, 'boot-1').read()
    log.write_text(storm(5))
    assert KernelLog(str(log), state, 'boot-1').read().dump()[0]['count'] == 5
    assert KernelLog(str(log), state, 'boot-2').read().dump()[0]['count'] == 5
    os.rename(str(log), str(tmp_path / 'kern.log.1'))
    log.write_text(storm(7))
    assert KernelLog(str(log), state, 'boot-2').read().dump()[0]['count'] == 7


def test_a_corrupt_or_foreign_state_file_is_ignored_with_a_warning(tmp_path, state):
    log = tmp_path / 'kern.log'
    log.write_text(storm(3))
    KernelLog(str(log), state, 'boot-1').read()
    [name] = [name for name in os.listdir(state.path) if name.startswith('kernel-log-')]
    path = os.path.join(state.path, name)
    data = json.load(open(path))
    data['entries'][0]['count'] = 'many'
    with open(path, 'w') as handle:
        json.dump(data, handle)
    assert KernelLog(str(log), state, 'boot-1').read().dump()[0]['count'] == 3
    with open(path, 'w') as handle:
        handle.write('{"version": 1, "entries": [')
    events, warnings = read_xid_events(str(log), state=state, boot='boot-1')
    assert [e['count'] for e in events] == [3] and any('is ignored' in warning for warning in warnings)


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


def test_journald_is_read_on_from_its_cursor(tmp_path, state):
    log = tmp_path / 'journal'
    log.write_text(storm(20))
    journal = [script(tmp_path, 'journalctl', JOURNAL % log), '-k', '-o', 'short-iso', '--no-pager', '-q',
               '--show-cursor']
    first = KernelLog(None, state, 'boot-1', commands=[journal]).read(5)
    assert first.dump()[0]['count'] == 20
    with open(str(log), 'a') as handle:
        handle.write(storm(4, start=20))
    assert KernelLog(None, state, 'boot-1', commands=[journal]).read(5).dump()[0]['count'] == 24
    # Nothing new: the remembered summary as it is.
    assert KernelLog(None, state, 'boot-1', commands=[journal]).read(5).dump()[0]['count'] == 24
    [name] = [name for name in os.listdir(state.path) if name.startswith('kernel-log-')]
    data = json.load(open(os.path.join(state.path, name)))
    assert data['position'] == {'cursor': 'c24'}
    data['position'] = {'cursor': 'gone'}
    with open(os.path.join(state.path, name), 'w') as handle:
        json.dump(data, handle)
    assert KernelLog(None, state, 'boot-1', commands=[journal]).read(5).dump()[0]['count'] == 24


def test_without_a_state_directory_every_read_is_whole(tmp_path):
    log = tmp_path / 'kern.log'
    log.write_text(storm(3))
    for dummy in range(2):
        assert KernelLog(str(log), None, 'boot-1').read().dump()[0]['count'] == 3


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


def test_a_hung_full_chip_reset_that_names_no_bus_id_is_every_gpus_and_calls_for_a_reboot():
    events = summarize(HUNG * 500).events()
    assert [(e['bus'], e['kind'], e['count']) for e in events] == [(None, 'driver_hung', 1000)]
    for gpu in (H200_18, H200_2A):
        health = health_facts(gpu, events)
        assert health['recovery_action'] == 'reboot'
        assert [(e['kind'], e['code'], e['count']) for e in health['xid_events']] == [('driver_hung', None, 1000)]
        assert needs_cure(dict(gpu, index=0), health) == (
            'GPU 0 needs a reboot (driver_hung: the kernel log says the NVIDIA driver hung '
            '(NV_ERR_GPU_IN_FULLCHIP_RESET) since the last cure; only a reboot frees it)')
    assert parse_xid_events(HUNG)[0]['kind'] == 'driver_hung' and parse_xid_events(HUNG)[0]['bus'] is None


def test_a_hung_driver_line_that_names_a_bus_id_is_that_gpus_only():
    # The driver's per-GPU prefix (as on its RmInitAdapter lines) before the same assertion.
    line = HUNG[0].replace('NVRM: GPU0 ', 'NVRM: GPU 0000:2a:00.0: ')
    events = summarize([line, LINE % (1, 13, 1, 1)]).events()
    assert health_facts(H200_2A, events)['recovery_action'] == 'reboot'
    assert health_facts(H200_18, events)['recovery_action'] == 'restart_app'
    assert [(e['bus'], e['kind']) for e in parse_xid_events([line])] == [((0, 0x2a, 0), 'driver_hung')]


def test_a_users_hung_driver_line_in_a_syslog_file_is_not_the_drivers(tmp_path):
    # `logger -p kern.err 'NVRM: GPU0 nvAssertFailedNoLog: ... NV_ERR_GPU_IN_FULLCHIP_RESET ...'` as
    # user alice: rsyslog tags it with her name. It would have asked for a reboot of the node.
    log = tmp_path / 'kern.log'
    log.write_text('\n'.join([HUNG[0].replace(' kernel: ', ' alice: '), HUNG[1].replace(' kernel: ', ' alice: kernel: '),
                              '']))
    events, warnings = read_xid_events(str(log))
    assert warnings == [] and events == []
    assert health_facts(H200_18, events)['recovery_action'] == 'none'


def test_a_hung_driver_is_remembered_across_reads(tmp_path, state):
    log = tmp_path / 'kern.log'
    log.write_text('\n'.join(HUNG) + '\n')
    assert KernelLog(str(log), state, 'boot-1').read().dump()[0]['count'] == 2
    with open(str(log), 'a') as handle:
        handle.write(HUNG[0] + '\n')
    reader = KernelLog(str(log), state, 'boot-1')
    entries = reader.read().dump()
    assert reader.warnings == [] and [(e['bus'], e['kind'], e['count']) for e in entries] == [('host', 'driver_hung', 3)]
