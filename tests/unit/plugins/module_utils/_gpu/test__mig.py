# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The MIG readers against real drivers' output (tests/gpusim/samples/mig) and against garbage."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import (
    add_device_nodes, caps_minor, parse_list, parse_modes, parse_tables, smi_instances, smi_read)

SAMPLES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'gpusim', 'samples', 'mig')


def sample(name):
    with open(os.path.join(SAMPLES, name)) as f:
        return ''.join(line for line in f if not line.startswith('#'))


def test_the_real_list_of_mig_devices_is_read_per_gpu():
    text = sample('list_gpus_L.txt').split('GPU 0: NVIDIA A100 80GB PCIe', maxsplit=1)[0]
    devices = parse_list(text)
    assert list(devices) == [0] and len(devices[0]) == 7
    assert devices[0][0] == (0, '1g.10gb', 'MIG-feb88891-0321-5fef-9c87-d4af3b54259e')
    head = 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-513536b6'
    last = parse_list(head + sample('list_gpus_L.txt').rsplit(head, maxsplit=1)[-1])
    assert [len(devices) for devices in last.values()] == [4] and 1 not in last


def test_the_real_mig_and_process_tables_are_read():
    table, processes = parse_tables(sample('summary_mig_510.txt'))
    assert table == {(1, 0): (3, 0, 14366, 19968), (1, 1): (5, 0, 9826, 19968), (1, 2): (6, 0, 13, 19968)}
    # GPU 0 has no MIG: its process (GI and CI N/A) is not an instance's.
    assert (1, 3, 0, 34965, 14195) in processes and not [p for p in processes if p[3] == 55111]
    listed = {1: [(0, '1g.20gb', 'MIG-a'), (1, '1g.20gb', 'MIG-b'), (2, '1g.20gb', 'MIG-c')]}
    instances = smi_instances(1, listed, table, processes, {34965: 'python'})
    assert [p['pid'] for p in instances[0]['processes']] == [34965, 56597]
    assert instances[0]['processes'][0] == {'pid': 34965, 'name': 'python', 'used_memory_mib': 14195}
    assert (instances[2]['gpu_instance_id'], instances[2]['memory_used_mib']) == (6, 13)
    assert [p['pid'] for p in instances[2]['processes']] == [42859] and instances[1]['processes'][0]['pid'] == 46505


def test_real_mig_modes_and_a_gpu_without_mig():
    modes, warnings = parse_modes('0, Enabled, Enabled\n1, Disabled, Disabled\n2, [N/A], [N/A]\n')
    assert modes == {0: ('enabled', 'enabled'), 1: ('disabled', 'disabled'), 2: (None, None)} and warnings == []


def test_garbage_mig_modes_are_named_not_raised():
    modes, warnings = parse_modes('0, Enabled\n1, Maybe, Enabled\n\x1b[31m\n')
    assert modes == {} and len(warnings) == 3 and all('unreadable MIG mode line' in w for w in warnings)


def test_a_failed_mode_query_is_a_warning():
    facts, warnings = smi_read(lambda args, timeout: (15, 'GPU is lost', ''), [])
    assert facts == {} and warnings == ['MIG mode unavailable: nvidia-smi exited 15: GPU is lost']


def test_an_instance_missing_from_the_table_is_a_warning():
    answers = {'--query-gpu=index,mig.mode.current,mig.mode.pending': '0, Enabled, Enabled\n',
               '-L': 'GPU 0: NVIDIA H200 (UUID: GPU-1)\n  MIG 1g.18gb      Device  0: (UUID: MIG-1)\n', '': 'garbage'}
    facts, warnings = smi_read(lambda args, timeout: (0, answers[(args or [''])[0]], ''), [])
    assert facts[0]['instances'][0]['uuid'] == 'MIG-1' and facts[0]['instances'][0]['gpu_instance_id'] is None
    assert warnings == ['GPU 0: nvidia-smi lists MIG device MIG-1 but its MIG table does not']


def test_device_nodes_come_from_the_access_files(tmp_path):
    gi = tmp_path / 'proc' / 'driver' / 'nvidia' / 'capabilities' / 'gpu3' / 'mig' / 'gi7'
    (gi / 'ci0').mkdir(parents=True)
    (gi / 'access').write_text('DeviceFileMinor: 471\nDeviceFileMode: 292\nDeviceFileModify: 1\n')
    (gi / 'ci0' / 'access').write_text('garbage\n')
    assert caps_minor(str(gi / 'access')) == 471 and caps_minor(str(gi / 'ci0' / 'access')) is None
    gpu = {'index': 1, 'minor_number': 3, 'mig': {'instances': [
        {'gpu_instance_id': 7, 'compute_instance_id': 0, 'uuid': 'MIG-x', 'device_nodes': []}]}}
    warnings = add_device_nodes(gpu, str(tmp_path))
    assert gpu['mig']['instances'][0]['device_nodes'] == [str(tmp_path / 'dev' / 'nvidia3'),
                                                          str(tmp_path / 'dev' / 'nvidia-caps' / 'nvidia-cap471')]
    assert len(warnings) == 1 and 'ci0/access' in warnings[0] and 'MIG-x' in warnings[0]


def test_a_failed_list_is_a_warning_and_no_instances():
    answers = {'--query-gpu=index,mig.mode.current,mig.mode.pending': (0, '0, Enabled, Disabled\n'),
               '-L': (15, 'Unable to determine the device handle for GPU0000:18:00.0: GPU is lost'), '': (0, '')}
    facts, warnings = smi_read(lambda args, timeout: answers[(args or [''])[0]] + ('',), [])
    assert facts == {0: {'mode_current': 'enabled', 'mode_pending': 'disabled', 'instances': []}}
    assert warnings == ['MIG devices: nvidia-smi -L exited 15: Unable to determine the device handle for GPU0000:18:00.0: '
                        'GPU is lost']
