# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Real NVIDIA output (tests/unit/fixtures/real_samples, provenance in its SOURCES.md) read by
the collection's parsers: each sample gives specific values, or a clear error."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import csv
import glob
import os
import re
import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import read_xid_events
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import (
    XID_ACTIONS,
    fallen_off_bus,
    health_facts,
    parse_fallen_off_bus,
    parse_xid_events,
    recovery_action,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import (
    EXIT_CODES,
    GPU_FIELDS,
    HEALTH_FIELDS,
    INVALID_FIELD_RE,
    SmiReader,
    SmiRunner,
    describe_failure,
    is_handle_error,
    parse_apps_csv,
    parse_gpu_csv,
    parse_value,
)

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       'fixtures', 'real_samples')


def sample(*parts):
    with open(os.path.join(SAMPLES, *parts)) as f:
        return f.read()


def test_every_sample_is_read_by_a_test():
    # This file and the other unit tests of module_utils, in its packages' folders too (_cure/test__reset.py
    # reads a refused reset's words).
    here = ''
    for path in glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), '**', 'test_*.py'), recursive=True):
        with open(path) as f:
            here += f.read()
    for directory, dummy, names in os.walk(SAMPLES):
        for name in names:
            if name == 'SOURCES.md' or directory.endswith('captures'):
                continue
            # K01_..., Q01_... by their code; strings_535.261.03_... by what precedes the version.
            stem = re.match(r'([A-Z]\d+b?_|[a-z_]+?_(?=\d)|.*)', name).group(1)
            assert stem in here, '%s is not read by any test' % name


# ---------------------------------------------------------------- smi_errors: host-level failures

@pytest.mark.parametrize('name, rc, message', [
    ('E01_driver_not_loaded_real535', 9, "nvidia-smi exited with 9 (the NVIDIA driver is not loaded): NVIDIA-SMI has "
                                         "failed because it couldn't communicate with the NVIDIA driver."),
    ('E02_lib_not_found_real535', 12, "nvidia-smi exited with 12 (the NVML shared library could not be found or "
                                      "loaded): NVIDIA-SMI couldn't find libnvidia-ml.so library in your system."),
    ('E03_mismatch_gputil55', 18, 'nvidia-smi exited with 18 (the driver and the NVML library versions do not '
                                  'match (reload the driver or reboot)): Failed to initialize NVML: Driver/library version mismatch'),
    ('E04_mismatch_mozilla1167', 18, 'nvidia-smi exited with 18 (the driver and the NVML library versions do not '
                                     'match (reload the driver or reboot)): Failed to initialize NVML: Driver/library version mismatch'),
])
def test_host_failures_become_clear_errors(tmp_path, name, rc, message):
    stdout = sample('smi_errors', name + '.stdout')
    assert int(sample('smi_errors', name + '.rc')) == rc
    script = replay(tmp_path, {'': (rc, stdout)})
    with pytest.raises(GpuopsError) as info:
        SmiReader(SmiRunner(script)).read()
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------- smi_errors: a lost GPU

HANDLE_SAMPLES = [
    ('E05_handle_unknown_nospace_ctk69.txt', '00000000:65:00.0', 'inspect'),
    ('E06_handle_unknown_space_ogkm387.txt', '00000000:0B:00.0', 'inspect'),
    ('E07_handle_lost_marian251.txt', '00000000:03:00.0', 'reboot'),
    ('E08_handle_unknown_dcgmexp604.txt', '00000000:BA:80.0', 'inspect'),
    ('E09_handle_L_lowercase_gpustat125.txt', '00000000:08:00.0', 'inspect'),
]


@pytest.mark.parametrize('name, bus_id, action', HANDLE_SAMPLES)
def test_device_handle_errors_name_the_lost_gpu(name, bus_id, action):
    text = sample('smi_errors', name)
    line = text.strip()
    assert is_handle_error(line)
    gpus, warnings = parse_gpu_csv(text)
    assert warnings == []
    assert [(gpu['index'], gpu['pci_bus_id'], gpu['error']) for gpu in gpus] == [(None, bus_id, line)]
    assert all(gpu[fact] is None for gpu in gpus for dummy, fact in GPU_FIELDS + HEALTH_FIELDS if fact != 'pci_bus_id')
    assert health_facts(gpus[0], [])['recovery_action'] == action
    # The same line from --query-compute-apps is no process and no warning.
    assert parse_apps_csv(text) == ([], [])


H200 = ('{i}, GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b1{i}, NVIDIA H200, {bus}, 143771, 1, 143770, 0, 30, '
        'Enabled, Default, 550.127.05, No, No, [N/A]')


@pytest.mark.parametrize('name, bus_id, action', HANDLE_SAMPLES[:4])
def test_a_host_whose_full_query_prints_only_the_sample_lists_every_gpu(tmp_path, name, bus_id, action):
    """E06 is the whole output of a 4-GPU host: the healthy GPUs answer only to -i."""
    line = sample('smi_errors', name).strip()
    buses = sorted(set(['00000000:01:00.0', '00000000:02:00.0', '00000000:C1:00.0', bus_id]))
    lost = buses.index(bus_id)
    answers = {'': (255, line + '\n')}
    for i, bus in enumerate(buses):
        answers['-i %d --query-gpu' % i] = (255, line + '\n') if i == lost else (0, H200.format(i=i, bus=bus) + '\n')
        answers['-i %d --query-compute-apps' % i] = (0, '')
        answers['-i %d --query-remapped-rows' % i] = (0, '')
    answers['-i 4'] = (6, 'No devices were found\n')
    snapshot = SmiReader(SmiRunner(replay(tmp_path, answers))).read()
    assert [(gpu['index'], gpu['pci_bus_id'], gpu['error']) for gpu in snapshot.gpus] == [
        (i, bus, line if i == lost else None) for i, bus in enumerate(buses)]
    assert snapshot.driver_version == '550.127.05'
    assert [gpu['memory_used_mib'] for gpu in snapshot.gpus if not gpu['error']] == [1, 1, 1]


def replay(tmp_path, answers):
    """A stand-in nvidia-smi: the longest key that starts its arguments picks (rc, stdout)."""
    cases = []
    for key in sorted(answers, key=len, reverse=True):
        rc, out = answers[key]
        path = tmp_path / ('answer%d' % len(cases))
        path.write_text(out)
        cases.append('  "%s"*) cat %s; exit %d;;' % (key, path, rc))
    script = tmp_path / 'nvidia-smi'
    script.write_text('#!/bin/sh\ncase "$*" in\n%s\nesac\nexit 99\n' % '\n'.join(cases))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


# ---------------------------------------------------------------- smi_query_gpu: values

# The field lists each report queried, from the report or its header line.
QUERY_SAMPLES = {
    'Q01_gpustat5_titanx.csv': 'index,uuid,name,temperature.gpu,utilization.gpu,memory.used,memory.total',
    'Q05_akash91_h100nvl.csv': 'name,pci.device_id',
    'Q06_akash90_v100.csv': 'name,memory.total,pci.device_id',
}
FACTS = {'index': 'index', 'uuid': 'uuid', 'name': 'name', 'pci.bus_id': 'pci_bus_id',
         'memory.total': 'memory_total_mib', 'memory.used': 'memory_used_mib',
         'memory.free': 'memory_free_mib', 'utilization.gpu': 'utilization_gpu_pct',
         'temperature.gpu': 'temperature_c', 'driver_version': 'driver_version'}


def read_query_sample(name):
    """[{fact: value}] of a --query-gpu sample, through the collection's value parser."""
    lines = [line for line in sample('smi_query_gpu', name).splitlines() if line.strip()]
    if name in QUERY_SAMPLES:
        fields = QUERY_SAMPLES[name].split(',')
    else:
        fields = [cell.strip().split(' [')[0] for cell in lines.pop(0).split(',')]
    rows = []
    for line in lines:
        row = {}
        for field, raw in zip(fields, line.split(',')):
            if field in FACTS:
                value, problem = parse_value(FACTS[field], raw)
                assert problem is None, (field, raw, problem)
                row[FACTS[field]] = value
        rows.append(row)
    return rows


def test_q01_eight_gpus_with_indexes_and_memory():
    rows = read_query_sample('Q01_gpustat5_titanx.csv')
    assert [row['index'] for row in rows] == list(range(8))
    assert rows[1] == {'index': 1, 'uuid': 'GPU-86fe97db-bf54-a056-4e8d-9b07e1a298e7', 'name': 'GeForce GTX TITAN X',
                       'temperature_c': 54, 'utilization_gpu_pct': 86, 'memory_used_mib': 10032, 'memory_total_mib': 12206}


Q02_FACTS = ('name', 'driver_version', 'temperature_c', 'utilization_gpu_pct', 'memory_utilization',
             'memory_total_mib', 'memory_free_mib', 'memory_used_mib')


def test_q02_insufficient_permissions_in_a_mig_pod_are_null():
    assert read_query_sample('Q02_stableswarm388_a100_mig_pod.csv') == [{
        'name': 'NVIDIA A100-SXM4-80GB', 'driver_version': '535.161.08', 'temperature_c': 47,
        'utilization_gpu_pct': None, 'memory_total_mib': None, 'memory_free_mib': None, 'memory_used_mib': None}]
    # ... and they are the driver's word that this GPU cannot be read from here: never clean.
    header, row = sample('smi_query_gpu', 'Q02_stableswarm388_a100_mig_pod.csv').splitlines()
    fields = [(name.split(' [')[0].strip(), fact) for name, fact in zip(header.split(','), Q02_FACTS)]
    [gpu], dummy = parse_gpu_csv(row, fields)
    assert gpu['error'] == ('the driver says: Insufficient Permissions (for memory.total, memory.free, '
                            'memory.used)') and gpu_state(gpu) == 'lost'


def test_q03_unknown_error_in_a_field_is_null():
    rows = read_query_sample('Q03_mindminer627_unknown_error.csv')
    assert rows == [{'name': 'GeForce RTX 2080 Ti', 'utilization_gpu_pct': 100, 'temperature_c': 56}]
    assert parse_value('memory_used_mib', ' [Unknown Error]') == (None, None)


# A real H100 that needed a reset, as nvidia-smi printed it (Q11):
# CUDA failed on it for hours while memory.used read 0 MiB.
Q11_FIELDS = [('index', 'index'), ('temperature.gpu', 'temperature_c'), ('utilization.gpu', 'utilization_gpu_pct'),
              ('memory.used', 'memory_used_mib')]


def test_gpu_requires_reset_is_the_drivers_verdict_not_a_missing_value():
    # Before: every bracketed cell became null and the GPU was free.
    header, row = sample('smi_query_gpu', 'Q11_h100_requires_reset.csv').splitlines()
    assert header.startswith('index, temperature.gpu')
    [gpu], warnings = parse_gpu_csv(row, Q11_FIELDS)
    assert warnings == [] and gpu['index'] == 0 and gpu['memory_used_mib'] == 0
    assert gpu['error'] == 'the driver says: GPU requires reset (for temperature.gpu, utilization.gpu)'
    assert gpu['reset_required'] is True
    assert gpu_state(dict(gpu, processes=[])) == 'reset_required'


def test_q12_the_drivers_recovery_action_reset_is_not_free():
    # Before: gpu_recovery_action was never read, and GPU 1 of this host read free.
    fields = [('index', 'index'), ('gpu_recovery_action', 'driver_recovery_action')]
    gpus, warnings = parse_gpu_csv(sample('smi_query_gpu', 'Q12_dcgm263_recovery_action.csv'), fields)
    assert warnings == [] and [gpu['driver_recovery_action'] for gpu in gpus] == ['none', 'reset_gpu'] + ['none'] * 6
    assert [gpu_state(dict(gpu, processes=[])) for gpu in gpus] == ['free', 'reset_required'] + ['free'] * 6
    assert gpus[1]['error'] == "the driver's GPU recovery action is reset_gpu"


def test_q04_bus_id_and_name():
    assert read_query_sample('Q04_mlengineering_h100.csv') == [
        {'name': 'NVIDIA H100 80GB HBM3', 'pci_bus_id': '00000000:04:00.0'}]


def test_q05_q06_names_and_memory_with_units():
    assert read_query_sample('Q05_akash91_h100nvl.csv') == [{'name': 'NVIDIA H100 NVL'}]
    assert read_query_sample('Q06_akash90_v100.csv') == [{'name': 'Tesla PG500-216', 'memory_total_mib': 32768}]


def test_q07_raw_values():
    raw = dict(re.findall(r'query_field_name=(\S+) raw_value=(.*)', sample('smi_query_gpu', 'Q07_gpuexporter115_a10_rawvalues.txt')))
    assert parse_value('pci_bus_id', raw['pci.bus_id']) == ('00000000:00:0C.0', None)
    assert parse_value('driver_version', raw['driver_version']) == ('535.54.03', None)
    assert parse_value('uuid', raw['uuid']) == ('GPU-5e10b7bc-91f1-640a-e927-963f7f82de44', None)
    assert parse_value('name', raw['vgpu_driver_capability.heterogenous_multivGPU']) == (None, None)


def test_q10_remapped_rows_format_is_what_gpusim_prints_and_we_read(gpuhost_factory):
    text = sample('smi_query_gpu', 'Q10_azhpc_remapped_rows_format.txt')
    pattern = re.search(r'each line must match: (\S+)', text).group(1)
    host = gpuhost_factory(gpus=2, driver_version='535.261.03')
    host.fault('remap', gpu=1, failure=True)
    out = host.smi('--query-remapped-rows=remapped_rows.failure,gpu_bus_id', '--format=csv,noheader').stdout
    assert all(re.match(pattern, line) for line in out.splitlines()), out
    assert [parse_value('remapped_rows_failure', line.split(',')[0])[0] for line in out.splitlines()] == [False, True]
    snapshot = SmiReader(SmiRunner(host.smi_path)).read()
    assert [gpu['remapped_rows_failure'] for gpu in snapshot.gpus] == [False, True]


# ---------------------------------------------------------------- smi_compute_apps

def test_a01_a02_other_field_lists_give_a_warning_not_wrong_values():
    # These reports queried other fields than the collection does: nothing is misread.
    apps, warnings = parse_apps_csv(sample('smi_compute_apps', 'A01_nvdocker1483_host.csv'))
    assert apps == [] and len(warnings) == 2
    assert "unreadable process line: '40170, /opt/rh/rh-python38/root/usr/bin/python3, 185 MiB'" in warnings[1]
    apps, warnings = parse_apps_csv(sample('smi_compute_apps', 'A02_wddm_container_notfound.csv'))
    assert apps == [] and len(warnings) == 2


def test_a02_fields_in_the_collections_order_are_read():
    # The same values in the collection's field order (pid, process_name, used_memory, gpu_uuid, gpu_bus_id).
    lines = []
    for line in sample('smi_compute_apps', 'A02_wddm_container_notfound.csv').splitlines():
        pid, name, uuid, used = [cell.strip() for cell in line.split(',')]
        lines.append(', '.join([pid, name, used, uuid, '00000000:01:00.0']))
    apps, warnings = parse_apps_csv('\n'.join(lines))
    assert warnings == []
    assert [(app['pid'], app['name'], app['used_memory_mib']) for app in apps] == [
        (4, None, None), (50983, None, None)]


# ---------------------------------------------------------------- kernel_xid

KERNEL_SAMPLES = {
    # name: ([(bus, code, time, gpu_instance)], recovery action of every event together, fallen off the bus)
    'K01_akash244_dmesg_T.log': ([
        ((0, 0, 5), 43, 'Wed Jul 31 23:14:18 2024', None), ((0, 0, 5), 43, 'Wed Jul 31 23:15:26 2024', None),
        ((0, 0, 7), 31, 'Mon Aug  5 03:54:13 2024', None), ((0, 0, 8), 94, 'Fri Aug  9 13:32:56 2024', None)],
        'restart_app', {}),
    'K02_gpud46_dmesg_ctime.log': ([((0, 0xcb, 0), 13, 'Fri Aug 30 11:43:09 2024', None)] * 3
                                   + [((0, 0xcb, 0), 109, 'Fri Aug 30 11:43:14 2024', None)], 'reset_gpu', {}),
    'K03_dcgm144_raw_dmesg.log': ([((0, 7, 0), 119, '349507.500659', None)], 'reset_gpu', {}),
    'K04_ogkm1150_journal.log': ([((0, 0xdc, 0), 45, None, None), ((0, 0xed, 0), 45, None, None),
                                  ((0, 0xba, 0), 45, None, None), ((0, 0x97, 0), 45, None, None)], 'inspect', {}),
    'K05_gpud1174_1160_kmsg.log': ([((0x19, 1, 0), 149, None, None), ((0, 0, 0), 149, None, None),
                                    ((0x18, 1, 0), 145, None, None), ((0, 1, 0), 144, None, None)], 'inspect', {}),
    'K06_nvsentinel155_fallen_no_xid.log': ([((0, 0xb3, 0), None, '1843.308145', None)], 'reboot', {
        (0, 0xb3, 0): 'The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off '
                      'the bus and is not responding to commands.'}),
    'K06b_nvsentinel155_comment.log': ([((0, 0x44, 0), 79, None, None)], 'reboot',
                                       {(0, 0x44, 0): 'GPU has fallen off the bus'}),
    'K07_h100_probe_fallen_syslog.log': ([((0, 0x5d, 0), None, 'Jan  3 07:39:45', None)], 'reboot', {
        (0, 0x5d, 0): 'The NVIDIA GPU 0000:5d:00.0 (PCI ID: 10de:2330) installed in this system has fallen off '
                      'the bus and is not responding to commands.'}),
    'K08_xid120_154_dmesgT_and_journal.log': ([
        ((0, 0x2a, 0), 120, 'Sat Jul 11 05:52:47 2026', None), ((0, 0x2a, 0), 154, 'Sat Jul 11 05:52:47 2026', None),
        ((0, 0x2a, 0), 120, 'Jul 11 05:51:26', None), ((0, 0x2a, 0), 154, 'Jul 11 05:51:26', None)], 'reset_gpu', {}),
    'K09_xid79_154_variants.log': ([
        ((0, 1, 0), 79, None, None), ((0, 1, 0), None, None, None), ((0, 1, 0), 154, None, None),
        ((0, 2, 0), 79, 'Mon Sep 14 04:48:45 2026', None), ((0, 2, 0), 154, 'Mon Sep 14 04:48:45 2026', None),
        ((0, 0xd, 0), 51, None, None), ((0, 0xd, 0), 154, None, None)], 'inspect', {
        (0, 1, 0): 'GPU 0000:01:00.0: GPU has fallen off the bus.',
        (0, 2, 0): 'pid=9962, name=python, GPU has fallen off the bus.'}),
    'K10_old_formats.log': ([((0, 1, 0), 32, '1399.140323', None), ((0, 3, 0), 14, None, None)], 'inspect', {}),
    'K11_mig_attributed.log': ([((0, 1, 0), 94, None, 5), ((0, 1, 0), 94, None, None)], 'restart_app', {}),
    # Before: no event for these; now the older wording is fallen off the bus, and a failed
    # initialisation is init_failed (code None).
    'K13_bumblebee554_gpu_at_fallen.log': ([((0, 1, 0), None, '49.261458', None), ((0, 1, 0), None, '49.261472', None)],
                                           'reboot', {(0, 1, 0): 'GPU at 0000:01:00.0 has fallen off the bus.'}),
    'K14_ogkm789_rminitadapter.log': ([((0, 0x98, 0), None, '903.610907', None), ((0, 0x98, 0), None, '903.611884', None)],
                                      'reset_gpu', {}),
    'K15_gpuop1146_rminitadapter_syslog.log': ([((0, 0xa, 0), None, 'Dec  2 11:49:53', None)] * 2
                                               + [((0, 0xa, 0), None, 'Dec  2 11:50:34', None)] * 2, 'reset_gpu', {}),
    'K12_gpud870_dmesg_iso.log': ([((0, 4, 0), 79, '2025-05-27T04:18:56,089671+00:00', None)] * 2, 'reboot',
                                  {(0, 4, 0): 'GPU has fallen off the bus'}),
}


@pytest.mark.parametrize('name', sorted(KERNEL_SAMPLES))
def test_kernel_log_samples(name, tmp_path):
    expected, action, fallen = KERNEL_SAMPLES[name]
    lines = sample('kernel_xid', name).splitlines()
    events = parse_xid_events(lines)
    assert [(e['bus'], e['code'], e['time'], e['gpu_instance']) for e in events] == expected
    assert recovery_action(events) == action
    assert parse_fallen_off_bus(lines) == fallen == fallen_off_bus(events)
    # The same through a kernel_log file: the sample's driver messages as the kernel's records.
    path = tmp_path / name
    path.write_text(''.join('3,%d,%d,-;%s\n' % (seq, seq, line[line.find('NVRM: '):] if 'NVRM: ' in line else line)
                            for seq, line in enumerate(lines)))
    path.chmod(0o644)
    from_file, warnings = read_xid_events(str(path))
    # ... summarised: one entry per GPU and message, counted, in order of first appearance.
    kinds = [(e['bus'], e['kind'], e['code']) for e in events]
    unique = [key for number, key in enumerate(kinds) if key not in kinds[:number]]
    assert warnings == [] and [(e['bus'], e['kind'], e['code']) for e in from_file] == unique
    assert [e['count'] for e in from_file] == [kinds.count(key) for key in unique]
    assert recovery_action(from_file) == action and fallen_off_bus(from_file) == fallen


def test_k04_xid_45_follows_the_xid_that_caused_it():
    events = parse_xid_events(sample('kernel_xid', 'K04_ogkm1150_journal.log').splitlines())
    assert events[0]['text'] == 'pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149'
    assert recovery_action([{'code': 45, 'text': 'Ch 00000001 caused by previous Xid 13'}]) == 'restart_app'
    # Alone, the catalogue's XID_45 workflow restarts the application; beside another Xid of the
    # GPU it is IGNORE (before: inspect, which drained healthy nodes, NVIDIA/NVSentinel#1629).
    assert recovery_action([{'code': 45, 'text': 'Ch 00000001'}]) == 'restart_app'
    assert recovery_action([{'code': 45, 'text': 'Ch 00000001'}, {'code': 43, 'text': ''}]) == 'none'


def test_k11_mig_xid_belongs_to_its_gpu():
    events = parse_xid_events(sample('kernel_xid', 'K11_mig_attributed.log').splitlines())
    health = health_facts({'pci_bus_id': '00000000:01:00.0'}, events)
    assert [e['code'] for e in health['xid_events']] == [94, 94]
    assert health['xid_events'][0]['text'] == 'pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No'


def test_k06_fallen_gpu_health_says_reboot():
    events = parse_xid_events(sample('kernel_xid', 'K06_nvsentinel155_fallen_no_xid.log').splitlines())
    health = health_facts({'pci_bus_id': '00000000:B3:00.0'}, events)
    assert health['recovery_action'] == 'reboot'
    assert [(e['code'], e['kind'], e['time'], e['text'], e['count']) for e in health['xid_events']] == [
        (None, 'fallen_off_bus', '1843.308145', events[0]['text'], 1)]


# ---------------------------------------------------------------- xid_catalog

CATALOGUE_ACTIONS = {'RESTART_APP': 'restart_app', 'RESET_GPU': 'reset_gpu', 'RESTART_BM': 'reboot',
                     'RESTART_VM': 'reboot', 'IGNORE': 'none'}
# Where the collection's table deliberately differs from the catalogue: none. (Xid 154 carries
# the driver's own verdict and Xid 45 with a cause follows that Xid; recovery_action reads both.)
DELIBERATE = {45: 'restart_app'}  # WORKFLOW_XID_45, alone: see _health.XID_ACTIONS


def catalogue():
    return list(csv.DictReader(sample('xid_catalog', 'catalog_subset.csv').splitlines()))


@pytest.mark.parametrize('row', catalogue(), ids=lambda row: 'xid%s' % row['xid'])
def test_xid_table_follows_nvidias_catalogue(row):
    code = int(row['xid'])
    if row['immediate_action'] == 'XID_154':
        assert code not in XID_ACTIONS
        return
    expected = DELIBERATE.get(code, CATALOGUE_ACTIONS.get(row['immediate_action'], 'inspect'))
    assert recovery_action([{'code': code, 'text': ''}]) == expected, row


def test_xid_table_has_no_code_outside_the_catalogue():
    assert set(XID_ACTIONS) <= set(int(row['xid']) for row in catalogue())


# ---------------------------------------------------------------- smi_real_binary

def captures():
    directory = os.path.join(SAMPLES, 'smi_real_binary', 'captures')
    return sorted(name[:-4] for name in os.listdir(directory) if name.endswith('.cmd'))


@pytest.mark.parametrize('capture', captures())
def test_real_binary_captures_become_clear_errors(tmp_path, capture):
    rc = int(sample('smi_real_binary', 'captures', capture + '.rc'))
    stdout = sample('smi_real_binary', 'captures', capture + '.stdout')
    stderr = sample('smi_real_binary', 'captures', capture + '.stderr')
    meaning = {9: 'the NVIDIA driver is not loaded', 12: 'the NVML shared library could not be found or loaded'}[rc]
    assert describe_failure(rc, stdout, stderr).startswith('nvidia-smi exited with %d (%s): NVIDIA-SMI ' % (rc, meaning))
    if '--query-gpu=index,uuid' in sample('smi_real_binary', 'captures', capture + '.cmd'):
        with pytest.raises(GpuopsError, match=r'exited with %d \(%s\)' % (rc, meaning)):
            SmiReader(SmiRunner(replay(tmp_path, {'': (rc, stdout)}))).read()


@pytest.mark.parametrize('version', ['535.261.03', '550.163.01'])
def test_real_binary_strings_match_what_we_parse(version):
    strings = sample('smi_real_binary', 'strings_%s_selected.txt' % version)
    templates = [line.split(':', 1)[1] for line in strings.splitlines()]
    handle = [t for t in templates if t.startswith('Unable to determine the device handle for')]
    assert len(handle) == 3
    for template in handle:
        line = template.replace('%s', '0000:3B:00.0', 1).replace('%s', 'GPU is lost')
        assert is_handle_error(line)
        assert parse_gpu_csv(line)[0][0]['pci_bus_id'] == '00000000:3B:00.0'
    assert 'GPU is lost.  Reboot the system to recover this GPU' in templates
    invalid = [t for t in templates if t.startswith('Field "%s"')][0]
    assert INVALID_FIELD_RE.search(invalid.replace('%s', 'remapped_rows.pending')).group(1) == 'remapped_rows.pending'
    assert '--query-remapped-rows' in templates and 'remapped_rows.pending' in templates


@pytest.mark.parametrize('version', ['535.261.03', '550.163.01'])
def test_exit_codes_follow_the_man_page(version):
    text = sample('smi_real_binary', 'return_values_%s.txt' % version)
    codes = [int(code) for code in re.findall(r'Return\s+code\s+(\d+)', text)]
    assert codes and set(codes) - {0} <= set(EXIT_CODES)


def test_a_driver_that_prints_the_lost_gpus_line_for_every_index_lists_it_once(tmp_path):
    # Whether real drivers print the lost GPU's line again for -i of a healthy GPU is not in the
    # samples; if one does, the one-by-one read must not list that bus id twice, nor name the
    # healthy GPU after it (E05's line, ctk#69).
    line = sample('smi_errors', 'E05_handle_unknown_nospace_ctk69.txt').strip().splitlines()[0]
    buses = ['00000000:18:00.0', '00000000:65:00.0', '00000000:B3:00.0']
    answers = {'--query-gpu': (255, line + '\n'), '--query-compute-apps': (255, line + '\n')}
    for i, bus in enumerate(buses):
        row = H200.format(i=i, bus=bus)
        answers['-i %d --query-gpu' % i] = (255, line + '\n') if bus == '00000000:65:00.0' else (0, line + '\n' + row + '\n')
        answers['-i %d --query-compute-apps' % i] = (0, '')
        answers['-i %d --query-remapped-rows' % i] = (0, '')
    answers['-i 3'] = (6, 'No devices were found\n')
    snapshot = SmiReader(SmiRunner(replay(tmp_path, answers))).read()
    assert [(gpu['index'], gpu['pci_bus_id'], gpu['error'] is None) for gpu in snapshot.gpus] == [
        (0, '00000000:18:00.0', True), (1, '00000000:65:00.0', False), (2, '00000000:B3:00.0', True)]
