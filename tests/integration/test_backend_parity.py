# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The NVML backend (real nvidia-ml-py over gpusim's libnvidia-ml.so.1) against the nvidia-smi
backend on the same simulated host: the facts must be the same.

pynvml loads libnvidia-ml.so.1 by name, so every NVML read runs in a child process started
with LD_LIBRARY_PATH pointing at the simulated library.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip('pynvml')
if not (shutil.which('gcc') or shutil.which('cc')):
    pytest.skip('no C compiler to build the simulated libnvidia-ml.so.1', allow_module_level=True)

# Reads the host with both backends in one process; prints the facts of each as JSON.
PROBE = r'''
import json, sys
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gpu_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.kernel_log import read_xid_events
smi_path, kernel_log, backends = sys.argv[1], sys.argv[2], sys.argv[3].split(',')
light = sys.argv[4:] == ['light']
events, dummy = read_xid_events(kernel_log)
out = {}
for backend in backends:
    reader, dummy = select_reader(backend, smi_path, 10)
    try:
        snapshot = reader.read()
        if light:
            snapshot = reader.read(full=False)
            assert snapshot.full is False
    finally:
        reader.close()
    # The default memory threshold, as the modules use it.
    out[backend] = {'backend': reader.backend, 'gpus': gpu_facts(snapshot, xid_events=events),
                    'driver': snapshot.driver_version, 'count': len(snapshot.gpus),
                    'warnings': snapshot.warnings}
print(json.dumps(out))
'''


@pytest.fixture
def nvmlhost(gpuhost):
    gpuhost.install_nvml()
    return gpuhost


# The real samples' idle readings through nvidia-smi / NVML v2 (smi_query_gpu/Q08, Q09): every
# one must read free with the default threshold.
REAL_IDLE_MIB = (0, 1, 3, 7)


def read_both(host, backends='nvml,nvidia-smi', light=False):
    proc = subprocess.run([sys.executable, '-c', PROBE, host.smi_path, host.kernel_log, backends]
                          + (['light'] if light else []),
                          env=host.env(nvml=True), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_parity(host, light=False):
    out = read_both(host, light=light)
    nvml, smi = out['nvml'], out['nvidia-smi']
    assert nvml['backend'] == 'nvml' and smi['backend'] == 'nvidia-smi'
    for a, b in zip(nvml['gpus'], smi['gpus']):
        assert a == b
    assert (nvml['count'], nvml['driver']) == (smi['count'], smi['driver'])
    return nvml['gpus']


def test_clean_host(nvmlhost):
    gpus = assert_parity(nvmlhost)
    assert len(gpus) == 8 and set(g['state'] for g in gpus) == set(['free'])
    # Idle as on real H200s: 1 MiB used, and the reserved memory apart (NVML v1 would say 516).
    assert set((g['memory_used_mib'], g['memory_reserved_mib']) for g in gpus) == set([(1, 515)])
    assert all(g['health']['recovery_action'] == 'none' and g['health']['xid_events'] == [] for g in gpus)


def test_hung_job(nvmlhost):
    nvmlhost.scenario('hung-job')
    gpus = assert_parity(nvmlhost)
    assert [g['state'] for g in gpus] == ['idle_holding'] * 8
    assert all(g['processes'][0]['used_memory_mib'] == 76113 for g in gpus)


def test_lost_gpus_and_unreported_fields(nvmlhost):
    nvmlhost.hold(gpus='0', mib=2048, util=87, name='trainer, v2')
    nvmlhost.fault('stuck', gpu=1, mib=512)
    nvmlhost.fault('lost', gpu=2, message='lost')
    nvmlhost.fault('lost', gpu=3, message='unknown')
    nvmlhost.fault('na', field='utilization.gpu', gpu=4)
    nvmlhost.fault('na', field='temperature.gpu', value='[Not Supported]')
    nvmlhost.fault('na', field='persistence_mode', gpu=5, value='[Insufficient Permissions]')
    nvmlhost.fault('na', field='compute_mode', gpu=5, value='[Not Supported]')
    for field in ('memory.total', 'memory.used', 'memory.free', 'memory.reserved'):
        nvmlhost.fault('na', field=field, gpu=6)
    nvmlhost.fault('na', field='used_memory', gpu=0)
    gpus = assert_parity(nvmlhost)
    # [Insufficient Permissions] is the driver's word that GPU 5 cannot be read from here: never clean.
    assert [g['state'] for g in gpus] == ['busy', 'orphaned_memory', 'lost', 'lost', 'free', 'lost', 'free', 'free']
    assert gpus[5]['error'].startswith('the driver says: Insufficient Permissions (')
    assert 'GPU is lost' in gpus[2]['error'] and gpus[2]['pci_bus_id'] == '00000000:3A:00.0'
    assert gpus[3]['error'].endswith('Unknown Error')
    assert gpus[2]['health']['recovery_action'] == 'reboot'
    assert gpus[0]['processes'][0]['name'] == 'trainer, v2' and gpus[0]['processes'][0]['used_memory_mib'] is None
    assert gpus[4]['utilization_gpu_pct'] is None and gpus[0]['temperature_c'] is None
    assert gpus[6]['memory_used_mib'] is None and gpus[6]['memory_reserved_mib'] is None


def test_xid_and_row_remapping_scenarios(nvmlhost):
    nvmlhost.fault('xid', gpu=0, code=13)
    nvmlhost.fault('xid', gpu=1, code=48)
    nvmlhost.fault('xid', gpu=2, code=79)
    nvmlhost.fault('lost', gpu=2, message='lost')
    nvmlhost.fault('remap', gpu=3, pending=True, uncorrectable=1)
    nvmlhost.fault('remap', gpu=4, failure=True)
    nvmlhost.fault('xid', gpu=5, code=154, text='GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)')
    nvmlhost.fault('xid', gpu=6, code=31)
    nvmlhost.fault('xid', gpu=6, code=63)
    nvmlhost.fault('retired', gpu=7, value=True)
    gpus = assert_parity(nvmlhost)
    actions = [g['health']['recovery_action'] for g in gpus]
    # NVIDIA's Xid catalogue: 48 is a workflow (inspect), 63 is IGNORE.
    assert actions == ['restart_app', 'inspect', 'reboot', 'reset_gpu', 'inspect', 'reboot', 'restart_app', 'reset_gpu']
    assert [e['code'] for e in gpus[6]['health']['xid_events']] == [31, 63]
    assert gpus[3]['health']['remapped_rows_pending'] is True and gpus[0]['health']['remapped_rows_pending'] is False
    assert gpus[7]['health']['retired_pages_pending'] is True and gpus[0]['health']['retired_pages_pending'] is None


def test_light_reads_agree_and_keep_the_drivers_word(nvmlhost):
    nvmlhost.hold(gpus='0', mib=2048, util=40, name='trainer')
    nvmlhost.fault('reset-required', gpu=2)
    nvmlhost.fault('remap', gpu=3, pending=True)
    nvmlhost.fault('stuck', gpu=4, mib=512)
    full = assert_parity(nvmlhost)
    light = assert_parity(nvmlhost, light=True)
    assert light == full
    assert [g['state'] for g in light] == ['busy', 'free', 'reset_required', 'free', 'orphaned_memory'] + ['free'] * 3
    assert light[3]['health']['remapped_rows_pending'] is True


def test_gpu_reset_applies_pending_remaps_on_both_backends(nvmlhost):
    nvmlhost.fault('remap', gpu=1, pending=True)
    nvmlhost.smi('-pm', '0', '-i', '1')
    assert nvmlhost.smi('-r', '-i', '1').returncode == 0
    gpus = assert_parity(nvmlhost)
    assert gpus[1]['health']['remapped_rows_pending'] is False


def test_memory_follows_release_delay_and_leaks(gpuhost_factory):
    # A delay long enough that the first reads land inside it on a loaded machine too.
    host = gpuhost_factory(release_delay=6)
    host.install_nvml()
    held = host.hold(gpus='0', mib=4096)
    host.hold(gpus='1', mib=1024, leak=True, name='leaky')
    import signal
    os.kill(held['pid'], signal.SIGKILL)
    for info in host.ps():
        if info.get('leak'):
            os.kill(info['pid'], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(r['alive'] for r in host.ps()) or any(r.get('died_at') is None for r in host.ps()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    out = read_both(host)['nvml']['gpus']
    assert (out[0]['memory_used_mib'], out[0]['state'], out[1]['memory_used_mib']) == (1 + 4096, 'orphaned_memory', 1 + 1024)
    died = max(record['died_at'] for record in host.ps())
    time.sleep(max(0.0, died + 6.1 - time.time()))
    gpus = assert_parity(host)
    assert (gpus[0]['memory_used_mib'], gpus[1]['memory_used_mib']) == (1, 1 + 1024)
    assert (gpus[0]['state'], gpus[1]['state']) == ('free', 'orphaned_memory')


def test_memory_on_idle_and_busy_gpus_is_the_same_through_both(nvmlhost):
    # NVML v1 `used` would be 515 MiB higher on every GPU (reserved + allocated); the NVML
    # backend reads v2, so both backends give nvidia-smi's memory.used.
    nvmlhost.hold(gpus='1', mib=76113, util=90)
    nvmlhost.hold(gpus='2', mib=300)
    nvmlhost.fault('stuck', gpu=3, mib=2048)
    out = read_both(nvmlhost)
    assert out['nvml']['warnings'] == [] and out['nvidia-smi']['warnings'] == []
    gpus = assert_parity(nvmlhost)
    memory = [(g['memory_used_mib'], g['memory_reserved_mib'], g['memory_free_mib']) for g in gpus[:4]]
    assert memory == [(1, 515, 143255), (76114, 515, 67142), (301, 515, 142955), (2049, 515, 141207)]
    assert [g['state'] for g in gpus[:4]] == ['free', 'busy', 'idle_holding', 'orphaned_memory']


@pytest.mark.parametrize('idle', REAL_IDLE_MIB)
def test_real_idle_readings_are_free_and_a_300_mib_holder_is_not(gpuhost_factory, idle):
    host = gpuhost_factory(gpus=2, idle_used_mib=idle)
    host.install_nvml()
    out = read_both(host)
    for backend in ('nvml', 'nvidia-smi'):
        assert [g['state'] for g in out[backend]['gpus']] == ['free', 'free'], backend
        assert [g['memory_used_mib'] for g in out[backend]['gpus']] == [idle, idle]
    info = host.hold(gpus='1', mib=300)
    out = read_both(host)
    for backend in ('nvml', 'nvidia-smi'):
        assert [g['state'] for g in out[backend]['gpus']] == ['free', 'idle_holding'], backend
    # The holder gone but its memory left (a leak): not free either.
    import signal
    host.hold(gpus='0', mib=300, leak=True)
    os.kill(info['pid'], signal.SIGKILL)
    for record in host.ps():
        if record.get('leak'):
            os.kill(record['pid'], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(r['alive'] for r in host.ps()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    out = read_both(host)
    for backend in ('nvml', 'nvidia-smi'):
        assert [g['state'] for g in out[backend]['gpus']] == ['orphaned_memory', 'free'], backend


@pytest.mark.parametrize('flavor', ['old', 'oldest'])
def test_an_older_nvml_library(gpuhost_factory, flavor):
    # No nvmlDeviceGetMemoryInfo_v2 and no _v3 process call ("oldest": no _v2 either): real
    # pynvml then raised NVMLLibraryMismatchError from the unversioned process call.
    host = gpuhost_factory(gpus=2)
    host.install_nvml(flavor=flavor)
    info = host.hold(gpus='1', mib=2048, name='job')
    out = read_both(host)
    nvml, smi = out['nvml'], out['nvidia-smi']
    assert nvml['backend'] == 'nvml'
    assert [p['pid'] for p in nvml['gpus'][1]['processes']] == [info['pid']]
    assert nvml['gpus'][1]['processes'] == smi['gpus'][1]['processes']
    assert [p['used_memory_mib'] for p in nvml['gpus'][1]['processes']] == [2048]
    # v1 memory: reserved inside used, said once; the idle GPU looks used, as it would on such a host.
    assert [(g['memory_used_mib'], g['memory_reserved_mib']) for g in nvml['gpus']] == [(516, None), (2564, None)]
    assert len(nvml['warnings']) == 1 and 'no nvmlDeviceGetMemoryInfo_v2' in nvml['warnings'][0]
    assert nvml['gpus'][0]['state'] == 'orphaned_memory'


def test_process_name_that_is_not_utf8(nvmlhost):
    nvmlhost.hold(gpus='0', mib=64, name='\udcffjob')
    gpus = assert_parity(nvmlhost)
    assert gpus[0]['processes'][0]['name'] == u'\ufffdjob'


def run_module(host, module='nvidia_gpu_facts', **options):
    env = host.env(nvml=True)
    env.update(ANSIBLE_STDOUT_CALLBACK='ansible.builtin.minimal', ANSIBLE_NOCOLOR='1',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    args = dict(nvidia_smi_path=host.smi_path, devices=[host.dev_glob])
    if module == 'nvidia_gpu_facts':
        args['kernel_log'] = host.kernel_log
    if 'host_root' not in options:
        # Found by its devices alone, the host keeps its state in its own directory, not the machine's.
        args['state_dir'] = host.state_dir
    args.update(options)
    ansible = os.path.join(os.path.dirname(sys.executable), 'ansible')
    proc = subprocess.run([ansible if os.path.exists(ansible) else 'ansible', 'localhost', '-c', 'local', '-i', 'localhost,', '-m',
                           'gpuops.nvidia.' + module, '-a', json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    # minimal: "localhost | SUCCESS => {...}" or "localhost | FAILED! => {...}"
    assert ' => ' in proc.stdout, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.split(' => ', 1)[1])
    result['failed'] = ' | SUCCESS => ' not in proc.stdout
    return result


def test_module_uses_nvml_and_times_out_on_a_hung_driver(nvmlhost):
    nvmlhost.scenario('hung-job')
    nvmlhost.install_nvml()
    nvmlhost.fault('xid', gpu=4, code=79)
    result = run_module(nvmlhost)
    facts = result['ansible_facts']
    assert facts['nvidia_gpu_backend'] == 'nvml' and facts['nvidia_gpu_count'] == 8
    assert facts['nvidia_gpus'][4]['health']['recovery_action'] == 'reboot'
    # Xid 79: "GPU has fallen off the bus"
    assert [g['state'] for g in facts['nvidia_gpus']] == ['idle_holding'] * 4 + ['lost'] + ['idle_holding'] * 3
    assert facts['nvidia_gpus'][4]['error'] == 'the kernel log says this GPU has fallen off the bus'

    nvmlhost.fault('hang', seconds=60)
    started = time.monotonic()
    result = run_module(nvmlhost, backend='nvml', timeout=1)
    assert result['failed'] and 'NVML did not answer within 1.0 s' in result['msg']
    assert time.monotonic() - started < 30


def test_module_auto_falls_back_when_nvml_cannot_start(nvmlhost):
    nvmlhost.fault('mismatch', value='on')
    result = run_module(nvmlhost)
    assert result['failed'] and 'nvidia-smi exited with 18' in result['msg']
    result = run_module(nvmlhost, backend='nvml')
    assert result['failed'] and 'NVML could not be initialised (error 18' in result['msg']


def test_nvml_gives_the_drivers_minor_numbers_and_misses_the_fallen_gpu(gpuhost_factory):
    host = gpuhost_factory(fallen=[0], minors=[3, 0, 6, 1, 5, 2, 4])
    host.install_nvml()
    for backend in ('nvml', 'nvidia-smi'):
        result = run_module(host, backend=backend, host_root=host.root)
        facts = result['ansible_facts']
        assert facts['nvidia_gpu_backend'] == backend
        assert [g['minor_number'] for g in facts['nvidia_gpus']] == [3, 0, 6, 1, 5, 2, 4, None]
        assert [g['pci_bus_id'] for g in facts['nvidia_gpus']][6:] == ['00000000:DB:00.0', '00000000:18:00.0']
        assert facts['nvidia_gpus'][7]['state'] == 'lost' and facts['nvidia_gpu_count'] == 8
    # The library's own answer: nvmlDeviceGetMinorNumber.
    probe = ('import pynvml; pynvml.nvmlInit(); print([pynvml.nvmlDeviceGetMinorNumber('
             'pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())])')
    proc = subprocess.run([sys.executable, '-c', probe], env=host.env(nvml=True), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.stdout.strip() == '[3, 0, 6, 1, 5, 2, 4]', proc.stderr


@pytest.mark.parametrize('backend', ['nvml', 'nvidia-smi'])
def test_an_idle_host_is_free_and_released_without_a_change(nvmlhost, tmp_path, backend):
    # gpusim's defaults, as real drivers read: 1 MiB used on every idle GPU, 515 MiB reserved.
    facts = run_module(nvmlhost, backend=backend)['ansible_facts']
    assert facts['nvidia_gpu_backend'] == backend
    assert [(g['memory_used_mib'], g['state']) for g in facts['nvidia_gpus']] == [(1, 'free')] * 8
    result = run_module(nvmlhost, 'nvidia_device_release', backend=backend, lock_file=str(tmp_path / 'lock'))
    assert result['failed'] is False and result['changed'] is False and result['released'] is True
    nvmlhost.hold(gpus=[3], mib=300)
    facts = run_module(nvmlhost, backend=backend)['ansible_facts']
    assert [g['state'] for g in facts['nvidia_gpus']] == ['free'] * 3 + ['idle_holding'] + ['free'] * 4


def test_the_drivers_verdicts_read_the_same_through_both_backends(gpuhost_factory):
    # Before: [GPU requires reset] and NVML_ERROR_RESET_REQUIRED became null (GPU free), and the
    # driver's recovery action was never read.
    host = gpuhost_factory(driver_version='570.172.08')
    host.install_nvml()
    host.fault('reset-required', gpu=1)
    host.fault('recovery', gpu=2, value='reset')
    host.fault('recovery', gpu=3, value='reboot')
    host.fault('na', field='utilization.gpu', gpu=4, value='[Unknown Error]')
    gpus = assert_parity(host)
    assert [g['state'] for g in gpus] == [
        'free', 'reset_required', 'reset_required', 'lost', 'lost', 'free', 'free', 'free']
    assert [g['health']['driver_recovery_action'] for g in gpus] == [
        'none', 'reset_gpu', 'reset_gpu', 'reboot', 'none', 'none', 'none', 'none']
    assert [g['health']['recovery_action'] for g in gpus[:5]] == ['none', 'reset_gpu', 'reset_gpu', 'reboot', 'inspect']
    assert gpus[1]['error'] == ("the driver says: GPU requires reset (for utilization.gpu, temperature.gpu, "
                                "retired_pages.pending); the driver's GPU recovery action is reset_gpu")


# Reads the host's GPUs and MIG devices with both backends, through the host's view (minor numbers,
# the caps tree); prints each backend's GPU facts, mig included, and its warnings.
MIG_PROBE = r'''
import json, sys
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.facts import gpu_facts, mig_facts
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
smi_path, root = sys.argv[1], sys.argv[2]
out = {}
for backend in ('nvml', 'nvidia-smi'):
    reader = HostReader(select_reader(backend, smi_path, 10)[0], root)
    try:
        gpus = gpu_facts(reader.read())
        warnings = mig_facts(reader, gpus, 10)
    finally:
        reader.close()
    out[backend] = {'gpus': gpus, 'warnings': warnings}
print(json.dumps(out))
'''


def read_mig_both(host):
    proc = subprocess.run([sys.executable, '-c', MIG_PROBE, host.smi_path, host.root],
                          env=host.env(nvml=True), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out['nvml'] == out['nvidia-smi']
    # Only the MIG mode changes that wait for a reset are named.
    assert [w for w in out['nvml']['warnings'] if 'pending; it takes effect at the next GPU reset' not in w] == []
    return out['nvml']['gpus']


def test_mig_off_is_disabled_on_both(nvmlhost):
    gpus = read_mig_both(nvmlhost)
    assert [g['mig'] for g in gpus] == [{'mode_current': 'disabled', 'mode_pending': 'disabled', 'instances': []}] * 8


def test_mig_instances_agree_and_name_their_jobs_and_nodes(nvmlhost):
    nvmlhost.mig(1, ['1g.18gb', '1g.18gb', '3g.71gb'])
    nvmlhost.mig(2, mode='disabled', pending='enabled')
    job = nvmlhost.hold(gpus='1', mib=4096, mig=8, name='tenant-b')
    whole = nvmlhost.hold(gpus='0', mib=1024, util=50)
    gpus = read_mig_both(nvmlhost)
    assert gpus[2]['mig'] == {'mode_current': 'disabled', 'mode_pending': 'enabled', 'instances': []}
    assert gpus[0]['mig']['instances'] == [] and gpus[0]['processes'][0]['pid'] == whole['pid']
    mig = gpus[1]['mig']
    assert (mig['mode_current'], mig['mode_pending']) == ('enabled', 'enabled')
    state = nvmlhost.state['gpus'][1]['mig']['instances']
    assert [(i['gpu_instance_id'], i['compute_instance_id'], i['profile'], i['uuid']) for i in mig['instances']] == [
        (d['gi'], d['ci'], d['profile'], d['uuid']) for d in state]
    held = [i for i in mig['instances'] if i['processes']]
    assert [(i['gpu_instance_id'], i['memory_used_mib'], i['memory_total_mib']) for i in held] == [(8, 4096, 16384)]
    assert held[0]['processes'] == [{'pid': job['pid'], 'name': 'tenant-b', 'used_memory_mib': 4096}]
    # The parent GPU: every instance's memory, no utilisation of its own (N/A with MIG).
    assert gpus[1]['memory_used_mib'] == 1 + 4096 and gpus[1]['utilization_gpu_pct'] is None
    assert held[0]['device_nodes'] == [os.path.join(nvmlhost.root, 'dev', name) for name in (
        'nvidia1', 'nvidia-caps/nvidia-cap%d' % (3 + 135 + 8 * 9), 'nvidia-caps/nvidia-cap%d' % (3 + 135 + 8 * 9 + 1))]
