# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import read_xid_events
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import (
    fallen_off_bus,
    health_facts,
    parse_fallen_off_bus,
    parse_xid_events,
    recovery_action,
)

JOURNAL = ("2025-03-05T12:34:56+0000 gpu07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', "
           "name=<unknown>, GPU has fallen off the bus.")
DMESG_ISO = "2025-03-05T12:34:56,123456+00:00 NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"
SYSLOG = "Mar  5 12:34:56 gpu07 kernel: [ 1234.567890] NVRM: Xid (PCI:0000:5d:00): 31, pid=4242, Ch 00000008, MMU Fault"
DMESG_RAW = "[ 1234.567890] NVRM: Xid (0000:9a:00.0): 48, An uncorrectable double bit error"


def test_parses_the_log_formats():
    events = parse_xid_events([JOURNAL, DMESG_ISO, SYSLOG, DMESG_RAW, 'NVRM: GPU at PCI:0000:3b:00: GPU-x',
                               'NVRM: Xid garbage'])
    assert [(e['bus'], e['code'], e['time']) for e in events] == [
        ((0, 0x3b, 0), 79, '2025-03-05T12:34:56+0000'),
        ((0, 0x18, 0), 13, '2025-03-05T12:34:56,123456+00:00'),
        ((0, 0x5d, 0), 31, 'Mar  5 12:34:56'),
        ((0, 0x9a, 0), 48, '1234.567890'),
    ]
    assert events[0]['text'] == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.mark.parametrize('codes, expected', [
    ([], 'none'),
    ([13], 'restart_app'),
    ([31, 43], 'restart_app'),
    ([43], 'none'),
    ([13, 46], 'reset_gpu'),
    ([48], 'inspect'),
    ([45], 'restart_app'),
    ([45, 13], 'restart_app'),
    ([45, 46], 'reset_gpu'),
    ([151], 'reboot'),
    ([94], 'restart_app'),
    ([95], 'reset_gpu'),
    ([13, 79], 'reboot'),
    ([79, 12345], 'inspect'),
])
def test_recovery_action_from_xids(codes, expected):
    events = [{'code': code, 'text': ''} for code in codes]
    assert recovery_action(events) == expected


@pytest.mark.parametrize('text, expected', [
    ('GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)', 'reset_gpu'),
    ('GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)', 'reboot'),
    ('GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)', 'inspect'),
    ('GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)', 'none'),
    ('something else', 'inspect'),
])
def test_xid_154_carries_the_drivers_verdict(text, expected):
    assert recovery_action([{'code': 154, 'text': text}]) == expected


def test_recovery_action_from_memory_repair_and_errors():
    assert recovery_action([], remapped_rows_pending=True) == 'reset_gpu'
    assert recovery_action([], retired_pages_pending=True) == 'reset_gpu'
    assert recovery_action([{'code': 79, 'text': ''}], remapped_rows_failure=True) == 'inspect'
    assert recovery_action(None, None, None, None) == 'none'
    lost = 'Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost.  Reboot the system to recover this GPU'
    assert recovery_action([], error=lost) == 'reboot'
    assert recovery_action([], error='Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error') == 'inspect'


def test_health_facts_match_events_by_bus_and_keep_unknown_as_null():
    events = parse_xid_events([JOURNAL, DMESG_ISO])
    gpu = {'pci_bus_id': '00000000:3B:00.0', 'remapped_rows_pending': False, 'remapped_rows_failure': False}
    health = health_facts(gpu, events)
    text = "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert health == {
        'xid_events': [{'code': 79, 'kind': 'xid', 'count': 1, 'first_time': '2025-03-05T12:34:56+0000',
                        'time': '2025-03-05T12:34:56+0000', 'text': text, 'texts': [text], 'since_cure': True}],
        'remapped_rows_pending': False, 'remapped_rows_failure': False, 'retired_pages_pending': None,
        'driver_recovery_action': None, 'last_cure': None, 'recovery_action': 'reboot',
    }
    assert health_facts({'pci_bus_id': '00000000:AB:00.0'}, events)['xid_events'] == []
    unknown = health_facts({'pci_bus_id': '00000000:3B:00.0'}, None)
    assert unknown['xid_events'] is None and unknown['recovery_action'] == 'none'


def test_reads_a_file_of_kernel_records(tmp_path):
    log = tmp_path / 'kmsg'
    log.write_text(''.join('%d,%d,1000000,-;%s\n' % (prio, seq, text[text.find('NVRM: '):] if 'NVRM' in text else text)
                           for seq, (prio, text) in enumerate([(6, 'boot'), (3, JOURNAL), (6, 'noise'), (3, SYSLOG)])))
    log.chmod(0o644)
    events, warnings = read_xid_events(str(log))
    assert [e['code'] for e in events] == [79, 31] and warnings == []
    events, warnings = read_xid_events(str(tmp_path / 'missing.log'))
    assert events is None and 'cannot read' in warnings[0]


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text('#!/bin/sh\n' + body + '\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_falls_back_from_journalctl_to_dmesg(tmp_path):
    journal = script(tmp_path, 'journalctl', 'echo "No journal files were found." >&2; exit 1')
    dmesg = script(tmp_path, 'dmesg', 'echo "%s"' % DMESG_ISO)
    events, warnings = read_xid_events(None, 5, commands=([journal], [dmesg]))
    assert [e['code'] for e in events] == [13] and warnings == []


def test_unreadable_kernel_log_is_unknown_with_a_warning(tmp_path):
    empty = script(tmp_path, 'journalctl', 'exit 0')
    denied = script(tmp_path, 'dmesg', 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    hung = script(tmp_path, 'slow', 'sleep 30')
    events, warnings = read_xid_events(None, 0.5, commands=([empty], [denied], [hung], [str(tmp_path / 'none')]))
    assert events is None
    assert 'Operation not permitted' in warnings[0] and 'did not finish within 0.5 s' in warnings[0]


def test_mig_xids_name_the_gpu_and_compute_instance():
    events = parse_xid_events([
        'NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No',
        'NVRM: Xid (PCI:0000:01:00 GPU-I:02 GPU-CI:01): 31, pid=7195, Ch 00000008, MMU Fault',
    ])
    assert [(e['bus'], e['code'], e['gpu_instance']) for e in events] == [((0, 1, 0), 94, 5), ((0, 1, 0), 31, 2)]


def test_fallen_off_the_bus_needs_the_words_within_the_message():
    # "The NVIDIA GPU ..." also starts messages that are not about a GPU falling off the bus.
    lines = ['NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1db6)',
             'NVRM: installed in this system is not supported by the',
             'NVRM: NVIDIA 550.127.05 driver release.',
             'NVRM: fallen off the bus and is not responding to commands.']
    assert parse_xid_events(lines) == []
    assert parse_fallen_off_bus(lines) == {}


def test_gpusim_kernel_log_mig_and_fallen_lines(gpuhost):
    gpuhost.fault('xid', gpu=0, code=94, gpu_instance=3)
    gpuhost.fault('fallen', gpu=1)
    gpuhost.fault('fallen', gpu=2, form='line')
    events, warnings = read_xid_events(gpuhost.kernel_log)
    assert warnings == []
    assert [(e['bus'], e['code'], e['kind']) for e in events] == [
        ((0, 0x18, 0), 94, 'xid'), ((0, 0x2a, 0), None, 'fallen_off_bus'), ((0, 0x3a, 0), None, 'fallen_off_bus')]
    assert fallen_off_bus(events) == {
        (0, 0x2a, 0): 'The NVIDIA GPU 0000:2a:00.0 (PCI ID: 10de:2335) installed in this system has fallen off '
                      'the bus and is not responding to commands.',
        (0, 0x3a, 0): 'GPU 0000:3a:00.0: GPU has fallen off the bus.'}
    assert [health_facts({'pci_bus_id': bus}, events)['recovery_action']
            for bus in ('00000000:18:00.0', '00000000:2A:00.0', '00000000:3A:00.0')] == ['restart_app', 'reboot', 'reboot']


def test_a_gpu_whose_read_hung_in_the_driver_needs_a_reboot():
    from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import recovery_action
    from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import driver_hung

    hung = driver_hung('nvidia-smi -i 3 --query-gpu=index', 'pid 77 in D state, in mutex_lock')
    assert recovery_action([], error=hung) == 'reboot'
    assert recovery_action([], error='nvidia-smi -i 3 did not answer within 2.0 s and was killed') == 'inspect'
