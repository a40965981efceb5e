# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia_gpu_probe run through the ansible CLI, its child loading gpusim's libcuda.so.1 (C, over
the simulated host's state) with the real ctypes code: every fault the probe must name."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from adhoc import run_module


@pytest.fixture
def cudahost(gpuhost):
    gpuhost.install_cuda()
    return gpuhost


def run_probe(host, *flags, **options):
    env = options.pop('env', None) or host.env(cuda=True)
    args = dict(nvidia_smi_path=host.smi_path, backend='nvidia-smi', host_root=host.root, timeout=20)
    args.update(options)
    return run_module('nvidia_gpu_probe', args, *flags, env=env)


def by_index(result):
    return dict((gpu['index'], gpu) for gpu in result['gpus'])


def records(host):
    return [rec for rec in host.ps() if os.path.basename(rec.get('process_name') or '').startswith('python')]


def test_clean_host_every_gpu_proven_and_released(cudahost):
    result, proc = run_probe(cudahost)
    assert proc.returncode == 0, proc.stdout
    assert result['probed'] is True and result['library_missing'] is False and result['changed'] is False
    assert [gpu['index'] for gpu in result['gpus']] == list(range(8))
    for gpu in result['gpus']:
        assert (gpu['ok'], gpu['mib'], gpu['released'], gpu['error_name']) == (True, 1024, True, None)
        assert gpu['pci_bus_id'] == cudahost.state['gpus'][gpu['index']]['pci_bus_id']
    # Each GPU's probe was a process of its own, a compute app on that GPU alone, and was freed there.
    probe = [rec for rec in records(cudahost) if rec.get('cuda')]
    assert sorted(rec['gpus'] for rec in probe) == [[index] for index in range(8)]
    assert all(list(rec['freed']) == [str(rec['gpus'][0])] for rec in probe)


def test_waits_until_the_probe_memory_is_released(gpuhost_factory):
    host = gpuhost_factory(release_delay=1.5)
    host.install_cuda()
    result, proc = run_probe(host, probe_mib=2048)
    assert proc.returncode == 0, proc.stdout
    assert all(gpu['released'] and gpu['mib'] == 2048 for gpu in result['gpus'])
    # Returned only once the driver (here gpusim's delay) let the memory go.
    assert set(host.memory_used().values()) == set([1])


def test_probe_memory_not_released_in_time_fails_the_gpu(gpuhost_factory):
    host = gpuhost_factory(release_delay=60)
    host.install_cuda()
    result, proc = run_probe(host, gpus=[0], timeout=6)
    assert result['failed']
    gpu = by_index(result)[0]
    assert (gpu['ok'], gpu['released'], gpu['error_name']) == (False, False, 'PROBE_MEMORY_HELD')
    assert 'GPU 0 (00000000:18:00.0): PROBE_MEMORY_HELD' in result['msg']


def test_exclusive_process_gpu_held_by_another_process_is_unavailable(cudahost):
    cudahost.fault('compute-mode', gpu=1, value='Exclusive_Process')
    cudahost.fault('compute-mode', gpu=2, value='Exclusive_Process')
    holder = cudahost.hold(gpus=[1], mib=500, name='python3')
    result, proc = run_probe(cudahost)
    assert result['failed'], proc.stdout
    gpus = by_index(result)
    assert (gpus[1]['ok'], gpus[1]['call']) == (False, 'cuCtxCreate_v2')
    assert gpus[1]['error_name'] == 'CUDA_ERROR_DEVICE_UNAVAILABLE'
    assert gpus[1]['error_code'] == 46
    assert gpus[1]['error_string'] == 'CUDA-capable device(s) is/are busy or unavailable'
    assert gpus[2]['ok'] is True  # exclusive, but nobody else there
    assert 'failed on 1 of 8 GPUs: GPU 1 (00000000:2A:00.0): CUDA_ERROR_DEVICE_UNAVAILABLE at cuCtxCreate_v2' \
        in result['msg']
    assert holder['pid']


def test_gpu_that_needs_a_reset_is_unavailable(cudahost):
    cudahost.fault('cuda', gpu=5, code='CUDA_ERROR_DEVICE_UNAVAILABLE')
    result, proc = run_probe(cudahost, gpus=[4, 5])
    assert result['failed'], proc.stdout
    assert [gpu['index'] for gpu in result['gpus']] == [4, 5]
    assert by_index(result)[4]['ok'] is True
    assert by_index(result)[5]['error_name'] == 'CUDA_ERROR_DEVICE_UNAVAILABLE'


def test_orphaned_memory_leaving_less_than_the_request_is_out_of_memory(cudahost):
    # 143771 total, 515 reserved: 1000 MiB free is less than the 1024 the probe asks for.
    cudahost.fault('stuck', gpu=3, mib=143771 - 515 - 1 - 1000)
    result, proc = run_probe(cudahost)
    assert result['failed'], proc.stdout
    gpu = by_index(result)[3]
    assert (gpu['call'], gpu['error_name'], gpu['error_string'], gpu['mib']) == (
        'cuMemAlloc_v2', 'CUDA_ERROR_OUT_OF_MEMORY', 'out of memory', 0)
    # A smaller probe fits in what is left.
    result, proc = run_probe(cudahost, gpus=[3], probe_mib=512, memory_threshold_mib=200000)
    assert proc.returncode == 0, proc.stdout


def test_uncorrectable_ecc_is_met_reading_back(cudahost):
    cudahost.fault('cuda', gpu=6, code='ECC_UNCORRECTABLE')
    result, proc = run_probe(cudahost)
    assert result['failed'], proc.stdout
    gpu = by_index(result)[6]
    assert (gpu['call'], gpu['error_name'], gpu['error_code']) == ('cuMemcpyDtoH_v2', 'CUDA_ERROR_ECC_UNCORRECTABLE', 214)
    assert gpu['released'] is True  # the failed probe's memory was freed and waited for too
    assert 'uncorrectable ECC error encountered' in result['msg']


@pytest.mark.parametrize('code, name', [
    ('CUDA_ERROR_NO_DEVICE', 'CUDA_ERROR_NO_DEVICE'),
    ('803', 'CUDA_ERROR_SYSTEM_DRIVER_MISMATCH'),
])
def test_cuinit_failure_fails_every_gpu(cudahost, code, name):
    cudahost.fault('cuda-init', code=code)
    result, proc = run_probe(cudahost, gpus=[0, 7])
    assert result['failed'], proc.stdout
    assert [(gpu['call'], gpu['error_name']) for gpu in result['gpus']] == [('cuInit', name)] * 2
    assert 'failed on 2 of 2 GPUs' in result['msg']


def test_no_device_where_cuda_sees_none(cudahost):
    cudahost.fault('cuda', gpu=2, code='CUDA_ERROR_NO_DEVICE')
    result, proc = run_probe(cudahost, gpus=[2])
    assert result['failed'], proc.stdout
    assert by_index(result)[2]['error_name'] == 'CUDA_ERROR_NO_DEVICE'
    assert 'no CUDA-capable device is detected' in result['msg']


def test_hung_cuinit_is_killed_at_the_deadline(cudahost):
    cudahost.fault('cuda-hang', seconds=300)
    result, proc = run_probe(cudahost, timeout=4)
    assert result['failed'], proc.stdout
    assert set((gpu['error_name'], gpu['call']) for gpu in result['gpus']) == set([('PROBE_TIMEOUT', 'cuInit')])
    assert 'PROBE_TIMEOUT at cuInit (no answer within' in result['msg']
    # Nothing of the child is left: no process runs the probe's program.
    left = [pid for pid in os.listdir('/proc') if pid.isdigit() and _runs_probe(pid)]
    assert left == []


@pytest.mark.parametrize('fault, name, words', [
    (dict(kind='cuda-hang', seconds=300), 'PROBE_TIMEOUT', 'no answer within'),
    (dict(kind='cuda-crash', value='SEGV'), 'PROBE_CRASHED', 'was killed by SIGSEGV'),
])
def test_one_sick_gpu_of_eight_fails_alone(cudahost, fault, name, words):
    cudahost.fault(fault.pop('kind'), gpu=3, **fault)
    result, proc = run_probe(cudahost, timeout=10)
    assert result['failed'], proc.stdout
    gpus = by_index(result)
    assert (gpus[3]['ok'], gpus[3]['error_name'], gpus[3]['call']) == (False, name, 'cuCtxCreate_v2')
    assert words in gpus[3]['error_string']
    assert all(gpus[index]['ok'] and gpus[index]['released'] for index in range(8) if index != 3)
    assert result['msg'].startswith('the allocation probe failed on 1 of 8 GPUs: GPU 3 (')


def _runs_probe(pid):
    try:
        with open('/proc/%s/cmdline' % pid, 'rb') as handle:
            return b'GpuProbe' in handle.read()
    except OSError:
        return False


def test_missing_library_fails_or_skips(gpuhost):
    env = gpuhost.env()  # no libcuda.so.1 on the loader path
    result, proc = run_probe(gpuhost, env=env, cuda_library='libcuda-absent.so.1')
    assert result['failed'] and 'Traceback' not in proc.stdout
    assert 'libcuda-absent.so.1 cannot be loaded' in result['msg']
    assert 'missing_library=skip' in result['msg']
    result, proc = run_probe(gpuhost, env=env, cuda_library='libcuda-absent.so.1', missing_library='skip')
    assert proc.returncode == 0, proc.stdout
    assert (result['library_missing'], result['probed']) == (True, False)
    assert set(gpu['ok'] for gpu in result['gpus']) == set([None])
    assert 'nothing was probed' in result['warning_text']


def test_library_without_the_entry_points_is_said(cudahost):
    nvml = cudahost.install_nvml()
    result, proc = run_probe(cudahost, cuda_library=nvml)
    assert result['failed'] and 'Traceback' not in proc.stdout
    assert 'has no cuInit' in result['msg']


def test_cuda_visible_devices_never_hides_a_gpu(cudahost):
    env = cudahost.env(cuda=True)
    env.update(CUDA_VISIBLE_DEVICES='', CUDA_DEVICE_ORDER='FASTEST_FIRST')
    result, proc = run_probe(cudahost, env=env, gpus=[1, 6])
    assert proc.returncode == 0, proc.stdout
    assert [gpu['ok'] for gpu in result['gpus']] == [True, True]


def test_gpus_by_bus_id_when_minors_differ(gpuhost_factory):
    host = gpuhost_factory(gpus=4, minors=[2, 0, 1], fallen=[1])
    host.install_cuda()
    result, proc = run_probe(host)
    assert result['failed'], proc.stdout  # the GPU that fell off the bus is never clean
    lost = [gpu for gpu in result['gpus'] if gpu['index'] is None]
    assert [gpu['error_name'] for gpu in lost] == ['GPU_LOST']
    probed = [gpu for gpu in result['gpus'] if gpu['index'] is not None]
    assert [(gpu['index'], gpu['pci_bus_id'], gpu['ok']) for gpu in probed] == [
        (0, '00000000:18:00.0', True), (1, '00000000:3A:00.0', True), (2, '00000000:5D:00.0', True)]


def test_lost_gpu_is_not_probed(cudahost):
    cudahost.fault('lost', gpu=4, message='lost')
    result, proc = run_probe(cudahost)
    assert result['failed'], proc.stdout
    lost = [gpu for gpu in result['gpus'] if gpu['error_name'] == 'GPU_LOST']
    assert len(lost) == 1 and lost[0]['pci_bus_id'] == '00000000:9A:00.0'
    assert sum(1 for gpu in result['gpus'] if gpu['ok']) == 7


def test_check_mode_probes_nothing(cudahost):
    result, proc = run_probe(cudahost, '--check')
    assert proc.returncode == 0, proc.stdout
    assert result['probed'] is False
    assert set(gpu['ok'] for gpu in result['gpus']) == set([None])
    assert [rec for rec in records(cudahost) if rec.get('cuda')] == []


def test_unknown_gpu_index_is_an_error(cudahost):
    result, proc = run_probe(cudahost, gpus=[9])
    assert result['failed']
    assert result['msg'] == 'gpus: no GPU 9 on this host (it has 0, 1, 2, 3, 4, 5, 6, 7)'


def test_nvml_backend_sees_the_probe_released(cudahost):
    cudahost.install_nvml()
    result, proc = run_probe(cudahost, backend='nvml', gpus=[0, 1])
    if 'nvidia-ml-py' in result.get('msg', ''):
        pytest.skip('nvidia-ml-py is not installed')
    assert proc.returncode == 0, proc.stdout
    assert [gpu['released'] for gpu in result['gpus']] == [True, True]


def test_a_gpu_proven_by_allocation_is_cured_of_its_older_xids(cudahost):
    cudahost.fault('xid', gpu=2, code=95, text='Uncontained: FBHUB. RST: No, D-RST: No')

    def health():
        facts, proc = run_module('nvidia_gpu_facts', dict(nvidia_smi_path=cudahost.smi_path, backend='nvidia-smi',
                                                          host_root=cudahost.root, kernel_log=cudahost.kernel_log))
        assert proc.returncode == 0, proc.stdout
        return [gpu for gpu in facts['ansible_facts']['nvidia_gpus'] if gpu['index'] == 2][0]['health']

    assert health()['recovery_action'] == 'reset_gpu'
    result, proc = run_probe(cudahost, gpus=[2])
    assert proc.returncode == 0 and by_index(result)[2]['ok'] is True, proc.stdout
    after = health()
    assert after['recovery_action'] == 'none' and after['last_cure'] is not None
    assert [(event['code'], event['since_cure']) for event in after['xid_events']] == [(95, False)]
