# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""tests/device/record.py and check.sh on a gpusim host, so that they are known to work before a
real GPU runs them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_SH = os.path.join(HERE, 'check.sh')
_spec = importlib.util.spec_from_file_location('gpuops_device_record', os.path.join(HERE, 'record.py'))
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import smi as _smi  # noqa: E402

needs_cc = pytest.mark.skipif(not (shutil.which('gcc') or shutil.which('cc')),
                              reason='no C compiler to build the simulated libnvidia-ml.so.1')


def saved(out_dir, name):
    """(rc, stdout, cmd) of a call record_smi saved."""
    def read(suffix):
        with open(os.path.join(str(out_dir), name + suffix)) as f:
            return f.read()
    return int(read('.rc')), read('.stdout'), read('.cmd')


def test_fields_are_the_readers_own():
    fields = record.smi_fields()
    assert fields['gpu'] == [field for field, dummy in _smi.GPU_FIELDS]
    assert fields['optional'] == [field for field, dummy in _smi.OPTIONAL_FIELDS]
    assert 'memory.reserved' in fields['optional'] and 'remapped_rows.pending' in fields['optional']
    assert fields['apps'] == _smi.APP_FIELDS
    assert fields['remapped'][0] == 'gpu_bus_id'


def test_record_smi_keeps_every_call_and_shows_a_refused_field(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=2)  # driver 550: remapped_rows.* refused in --query-gpu
    holder = host.hold(gpus='0', mib=300)
    rcs = record.record_smi(str(tmp_path), host.smi_path)

    with open(str(tmp_path / 'rc.json')) as f:
        assert json.load(f) == rcs
    rc, stdout, cmd = saved(tmp_path, 'query_gpu_base')
    assert rc == 0 and len(stdout.splitlines()) == 2
    assert cmd.split() == [host.smi_path, '--query-gpu=' + ','.join(f for f, d in _smi.GPU_FIELDS),
                           '--format=csv,noheader,nounits']
    # The whole query is refused for one field; the field by itself says which.
    assert rcs['query_gpu_all'] == 2
    rc, stdout, dummy = saved(tmp_path, 'query_gpu_field_remapped_rows_pending')
    assert rc == 2 and 'Field "remapped_rows.pending" is not a valid field to query.' in stdout
    rc, stdout, dummy = saved(tmp_path, 'query_gpu_field_memory_reserved')
    assert (rc, stdout.split()) == (0, ['515', '515'])
    for field, dummy in _smi.GPU_FIELDS:
        assert rcs['query_gpu_field_' + field.replace('.', '_')] == 0, field
    rc, stdout, dummy = saved(tmp_path, 'query_compute_apps')
    assert rc == 0 and stdout.startswith('%d, ' % holder['pid'])
    assert saved(tmp_path, 'query_remapped_rows')[0] == 0
    assert len(saved(tmp_path, 'L')[1].splitlines()) == 2
    for name in ('q', 'plain'):
        assert rcs[name] == 0 and saved(tmp_path, name)[1]


def test_record_smi_keeps_a_command_that_cannot_start(tmp_path):
    rcs = record.record_smi(str(tmp_path), str(tmp_path / 'no-nvidia-smi'))
    assert set(rcs.values()) == {127}
    assert 'No such file' in (tmp_path / 'L.stderr').read_text()


def nvml_child(host, out_dir):
    code = 'import importlib.util, sys; s = importlib.util.spec_from_file_location("r", sys.argv[1]); ' \
           'r = importlib.util.module_from_spec(s); s.loader.exec_module(r); r.record_nvml(sys.argv[2])'
    proc = subprocess.run([sys.executable, '-c', code, os.path.join(HERE, 'record.py'), str(out_dir)],
                          env=host.env(nvml=True), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(str(out_dir), 'nvml.json')) as f:
        return json.load(f)


@needs_cc
def test_record_nvml_v1_and_v2_memory_and_minor_numbers(gpuhost_factory, tmp_path):
    pytest.importorskip('pynvml')
    host = gpuhost_factory(gpus=2, minors=[1, 0])
    host.install_nvml()
    holder = host.hold(gpus='0', mib=300)
    out = nvml_child(host, tmp_path)

    assert (out['count'], out['driver_version']) == (2, '550.127.05')
    gpu0, gpu1 = out['gpus']
    assert (gpu0['minor_number'], gpu1['minor_number']) == (1, 0)
    # v2 leaves the reserved memory out of used; v1 counts it in (NVML's "Sum of Reserved and Allocated").
    assert gpu0['memory_v2_mib'] == {'total': 143771, 'reserved': 515, 'used': 301, 'free': 143771 - 515 - 301}
    assert gpu0['memory_v1_mib'] == {'total': 143771, 'used': 515 + 301, 'free': 143771 - 515 - 301}
    assert gpu1['memory_v2_mib']['used'] == 1
    assert [p['pid'] for p in gpu0['compute_processes']] == [holder['pid']]
    assert gpu0['pci']['bus_id'] == '00000000:18:00.0'


@needs_cc
def test_record_nvml_records_a_driver_that_does_not_answer(gpuhost, tmp_path):
    pytest.importorskip('pynvml')
    gpuhost.install_nvml()
    gpuhost.fault('driver-not-loaded', True)
    out = nvml_child(gpuhost, tmp_path)
    assert out['error'].startswith('NVMLError_DriverNotLoaded')


def test_record_host_reads_bus_driver_and_device_nodes(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=3, minors=[2, 0], fallen=[1])
    out = record.record_host(str(tmp_path), root=host.root)

    # The fallen GPU is on the bus without a driver; the NVSwitch is NVIDIA's too; the host bridge is not.
    pci = out['pci_nvidia']
    assert sorted(pci) == ['0000:05:00.0', '0000:18:00.0', '0000:2a:00.0', '0000:3a:00.0']
    assert pci['0000:05:00.0']['device'] == '0x22a3'
    assert pci['0000:2a:00.0']['driver'] is None and pci['0000:18:00.0']['driver'] == 'nvidia'
    assert pci['0000:18:00.0']['class'] == '0x030200' and pci['0000:18:00.0']['device'] == '0x2335'
    assert sorted(out['proc_gpus']) == ['0000:18:00.0', '0000:3a:00.0']
    assert 'Device Minor: \t 2' in out['proc_gpus']['0000:18:00.0']
    assert (tmp_path / 'proc_gpus' / '0000:3a:00.0.information').read_text() == out['proc_gpus']['0000:3a:00.0']
    assert sorted(os.path.basename(d['path']) for d in out['dev']) == ['nvidia-uvm', 'nvidia0', 'nvidia2', 'nvidiactl']
    assert saved(tmp_path, 'uname')[0] == 0 and 'nvidia2' in saved(tmp_path, 'ls_dev_nvidia')[1]
    with open(str(tmp_path / 'host.json')) as f:
        assert json.load(f) == out


def write_run(run_dir, before_gpu, release, after_gpu, backend='nvidia-smi'):
    def facts(gpu):
        return {'changed': False, 'failed': False,
                'ansible_facts': {'nvidia_gpu_backend': backend, 'nvidia_gpus': [gpu]}}
    for name, data in (('facts_before', facts(before_gpu)), ('release', release), ('facts_after', facts(after_gpu))):
        (run_dir / (name + '.json')).write_text(json.dumps(data))


def test_checks_fail_when_the_holder_survives_and_memory_stays(gpuhost, tmp_path):
    holder = gpuhost.hold(gpus='0', mib=300)
    busy = {'index': 0, 'state': 'idle_holding', 'memory_used_mib': 301, 'processes': [{'pid': holder['pid']}]}
    write_run(tmp_path, busy, {'changed': True, 'released': False, 'failed': True, 'msg': 'GPU 0 not clean',
                               'signalled': []}, busy)
    results = record.checks(str(tmp_path), holder['pid'], smi_path=gpuhost.smi_path, backend='nvml')
    verdicts = dict((name, verdict) for verdict, name, dummy in results)
    assert verdicts == {
        'facts before: GPU 0 read': 'PASS',
        'facts before: read with backend nvml': 'FAIL',
        'facts before: GPU 0 not free, holder %d listed' % holder['pid']: 'PASS',
        'release: changed and released': 'FAIL',
        'release: holder %d signalled' % holder['pid']: 'FAIL',
        'holder %d gone' % holder['pid']: 'FAIL',
        'facts after: GPU 0 free': 'FAIL',
        'nvidia-smi: GPU 0 memory.used at or below 32 MiB': 'FAIL',
    }


def test_checks_skip_the_compute_check_for_a_holder_of_device_files(gpuhost, tmp_path):
    # Root's process with the device files open and no CUDA context is left alone (a foreign holder),
    # and the GPU it holds is not released.
    free = {'index': 0, 'state': 'free', 'memory_used_mib': 1, 'processes': []}
    holder = os.getpid()
    write_run(tmp_path, free, {'changed': False, 'released': False, 'failed': True, 'signalled': [],
                               'msg': 'GPUs not released: GPU 0: 1 MiB used, held by pid %d (python3, ...)' % holder,
                               'foreign_holders': [{'pid': holder, 'reason': 'foreign_holder'}]}, free)
    results = record.checks(str(tmp_path), holder, smi_path=gpuhost.smi_path, compute_holder=False)
    assert [(verdict, name) for verdict, name, dummy in results] == [
        ('PASS', 'facts before: GPU 0 read'), ('SKIP', 'facts before: GPU 0 not free, holder %d listed' % holder),
        ('PASS', 'release: unchanged, and not released while holder %d holds GPU 0' % holder),
        ('PASS', 'release: holder %d left alone as a foreign holder' % holder),
        ('PASS', 'facts after: GPU 0 free'), ('PASS', 'nvidia-smi: GPU 0 memory.used at or below 32 MiB')]
    write_run(tmp_path, free, {'changed': True, 'released': True, 'signalled': [{'pid': holder}]}, free)
    results = record.checks(str(tmp_path), holder, smi_path=gpuhost.smi_path, compute_holder=False)
    assert [verdict for verdict, dummy, dummy in results][2:4] == ['FAIL', 'FAIL']


def test_adhoc_result_reads_the_status_line():
    assert record.adhoc_result('localhost | CHANGED => {\n "changed": true\n}\n') == {'changed': True, 'failed': False}
    assert record.adhoc_result('localhost | FAILED! => {"msg": "no"}')['failed'] is True
    assert record.adhoc_result('ERROR! the module could not be found') is None


def run_check(tmp_path, env_extra, timeout=120):
    env = dict(os.environ, OUT=str(tmp_path / 'out'), PYTHON=sys.executable, STEP_TIMEOUT='60', TOTAL_TIMEOUT='110')
    env.update(env_extra)
    return subprocess.run(['bash', CHECK_SH], env=env, capture_output=True, text=True, timeout=timeout, check=False)


@needs_cc
def test_check_sh_passes_on_a_gpusim_host(gpuhost_factory, tmp_path):
    pytest.importorskip('pynvml')
    host = gpuhost_factory(gpus=2)
    host.install_nvml()
    proc = run_check(tmp_path, {'GPUOPS_DEVICE_CHECK_SIM': host.root, 'ANSIBLE_PYTHON': sys.executable})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / 'out'
    lines = proc.stdout.splitlines()
    assert lines[0] == 'gpuops device check: writing everything under %s' % out
    assert lines[-1] == 'PASS all checks; everything is under %s' % out
    assert not [line for line in lines if line.startswith(('FAIL', 'ERROR', 'WARN'))]
    for backend in ('nvidia-smi', 'nvml'):
        passed = [line for line in lines if line.startswith('PASS %s: ' % backend)]
        assert len(passed) == 8, lines
        assert 'NOTE %s: MIG is not enabled on any GPU (mode disabled)' % backend in '\n'.join(lines)
        with open(str(out / 'ansible' / backend / 'release.json')) as f:
            release = json.load(f)
        assert release['changed'] is True and release['released'] is True
    for path in ('check.log', 'host/host.json', 'idle/nvml.json', 'idle/smi/query_gpu_all.stdout',
                 'idle/smi/query_gpu_field_memory_reserved.rc', 'holder/nvml.json', 'after/nvml.json',
                 'ansible/nvml/facts_before.json', 'ansible/nvml/facts_after.json', 'ansible/nvidia-smi/checks.txt'):
        assert (out / path).is_file(), path
    summary = json.loads((out / 'holder' / 'summary.json').read_text())
    assert summary == {'idle_used_mib': 1, 'held_used_mib': 2049, 'hold_mib': 2048, 'context_mib': 0,
                       'threshold_mib': 32}
    holder_pid = json.loads((out / 'ansible' / 'nvidia-smi' / 'holder.log').read_text())['pid']
    assert (out / 'holder' / 'smi' / 'query_compute_apps.stdout').read_text().startswith('%d, ' % holder_pid)
    assert (out / 'idle' / 'smi' / 'query_compute_apps.stdout').read_text() == ''
    # The probe at each level on the free GPUs, with its time.
    levels = [line for line in lines if line.startswith(('PASS probe allocation: ', 'PASS probe memory: '))]
    assert [line.split(' MiB in ')[0] for line in levels] == [
        'PASS probe allocation: GPU 0 1024', 'PASS probe allocation: GPU 1 1024',
        'PASS probe memory: GPU 0 %d' % (143771 - 515 - 1 - 1 - 256), 'PASS probe memory: GPU 1 %d' % (143771 - 515 - 1 - 1 - 256)]
    # The performance level, its figures beside the H200's published ones; the idle link and the
    # topology kept as fixtures.
    performance = [line for line in lines if line.startswith('PASS probe performance: ')]
    assert [line.split(' h2d ')[0] for line in performance] == [
        'PASS probe performance: GPU 0', 'PASS probe performance: GPU 1']
    assert all('(published 64 each way)' in line and 'link under load Gen5 x16 of Gen5 x16' in line
               for line in performance), performance
    # Read between two probes: Gen1 once idle, Gen5 while the last probe's copies still hold it up.
    assert (out / 'probe' / 'pcie_idle.csv').read_text().splitlines()[0] in ('0, 1, 5, 16, 16', '0, 5, 5, 16, 16')
    assert (out / 'probe' / 'topo_m.txt').read_text().startswith('\tGPU0\tGPU1\t')
    # The probe: proven on the free GPUs, and GPU 0's answer once a holder leaves it 512 MiB.
    assert [line.split(' (')[0] for line in lines if 'probe' in line and line.startswith(('PASS', 'FAIL'))
            and line not in levels + performance] == [
        'PASS probe, free GPUs: every GPU proven and its probe memory released',
        'PASS probe, GPU 0 nearly full: fails with a CUDA error',
        'PASS probe, GPU 0 nearly full: the other GPUs still proven']
    probe = json.loads((out / 'probe' / 'summary.json').read_text())
    assert [(gpu['index'], gpu['ok'], gpu['released']) for gpu in probe['free']['gpus']] == [(0, True, True), (1, True, True)]
    assert probe['free']['duration_ms'] > 0 and probe['free']['slowest_gpu_ms'] > 0
    assert [(gpu['ok'], gpu['call'], gpu['error_name']) for gpu in probe['full']['gpus']] == [
        (False, 'cuMemAlloc_v2', 'CUDA_ERROR_OUT_OF_MEMORY'), (True, None, None)]


@needs_cc
def test_check_sh_skips_the_compute_check_for_a_holder_of_device_files(gpuhost_factory, tmp_path):
    pytest.importorskip('pynvml')
    host = gpuhost_factory(gpus=1)
    proc = run_check(tmp_path, {'GPUOPS_DEVICE_CHECK_SIM': host.root, 'ANSIBLE_PYTHON': sys.executable, 'HOLD_MIB': '0'})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert 'NOTE HOLD_MIB=0: the holder only opens the device files (checks that need a CUDA context are skipped)' in lines
    assert [line.split(' (')[0] for line in lines if line.startswith('SKIP')] == [
        'SKIP %s: facts before: GPU 0 not free, holder %d listed' % (backend, json.loads(
            (tmp_path / 'out' / 'ansible' / backend / 'holder.log').read_text())['pid']) for backend in ('nvidia-smi', 'nvml')]
    assert json.loads((tmp_path / 'out' / 'holder' / 'summary.json').read_text())['context_mib'] is None
    assert lines[-1].startswith('PASS all checks')


def test_check_sh_says_when_there_is_no_nvidia_smi(tmp_path):
    if os.path.exists('/usr/bin/nvidia-smi'):
        pytest.skip('this host has nvidia-smi')
    proc = run_check(tmp_path, {'PATH': '/usr/bin:/bin', 'ANSIBLE_PYTHON': sys.executable})
    assert proc.returncode == 2
    assert 'ERROR nvidia-smi not found on PATH: is the NVIDIA driver installed?' in proc.stdout


def test_check_sh_says_when_the_wheels_do_not_hold_ansible_core(gpuhost, tmp_path):
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    proc = run_check(tmp_path, {'GPUOPS_DEVICE_CHECK_SIM': gpuhost.root, 'WHEELS': str(wheels)})
    assert proc.returncode == 2, proc.stdout
    assert 'ERROR pip could not install ansible-core from the wheels in %s' % wheels in proc.stdout
    assert (tmp_path / 'out' / 'venv' / 'pyvenv.cfg').read_text().count('include-system-site-packages = true') == 1
