# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A release scoped to MIG instances (gpus: N:G, N:G:C, MIG UUIDs) on gpusim: real processes that
hold an instance's caps nodes, beside siblings on other instances of the same GPU."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from adhoc import run_module
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from gpusim.cgroups import available, job_cgroup
from gpusim.state import is_alive as alive
from integration.test_release_adversarial import release
from processes import gone, in_private_pid_namespace


def mig_release(host, **options):
    options.setdefault('host_root', host.root)
    options.setdefault('devices', ['/dev/nvidia*'])
    return release(host, **options)


def two_tenants(host):
    """GPU 0 split in two 1g instances (GI 7 and 8), a tenant on each."""
    devices = host.mig(0, ['1g.18gb', '1g.18gb'])['instances']
    mine = host.hold(gpus='0', mib=3000, mig=devices[0]['gi'], name='tenant-a')
    sibling = host.hold(gpus='0', mib=5000, mig=devices[1]['gi'], name='tenant-b')
    return devices, mine, sibling


def pids(entries):
    return sorted(entry['pid'] for entry in entries)


@in_private_pid_namespace
@pytest.mark.parametrize('name', ['gi', 'gi_ci', 'uuid'])
def test_a_release_of_one_instance_leaves_its_sibling_alone(gpuhost, name):
    devices, mine, sibling = two_tenants(gpuhost)
    ref = {'gi': '0:%d' % devices[0]['gi'], 'gi_ci': '0:%d:0' % devices[0]['gi'], 'uuid': devices[0]['uuid']}[name]
    result = mig_release(gpuhost, gpus=[ref])
    assert result.released is True, result.failure
    assert gone(mine['pid']) and alive(sibling['pid'])
    assert pids(result.signalled) == [mine['pid']]
    # The report names the instance by GPU, GPU and compute instance, and MIG UUID, with its own memory.
    instance = {'gpu_instance_id': devices[0]['gi'], 'compute_instance_id': 0, 'uuid': devices[0]['uuid']}
    assert result.gpus_before == [{'index': 0, 'memory_used_mib': 3000, 'mig_instance': instance}]
    assert result.gpus_after == [{'index': 0, 'memory_used_mib': 0, 'mig_instance': instance}]
    assert [state['state'] for state in result.gpu_states] == ['free']
    assert result.orphaned_gpus == [] and result.escalation is None


@in_private_pid_namespace
def test_a_process_on_the_parent_node_alone_is_no_holder_of_an_instance(gpuhost, spawn):
    devices = gpuhost.mig(0, ['1g.18gb', '1g.18gb'])['instances']
    mine = gpuhost.hold(gpus='0', mib=1000, mig=devices[0]['gi'])
    # With MIG on every process of every instance holds /dev/nvidia0: this one holds nothing else.
    bystander = spawn([os.path.join(gpuhost.paths.dev, 'nvidia0')])
    result = mig_release(gpuhost, gpus=['0:%d' % devices[0]['gi']])
    assert result.released is True, result.failure
    assert gone(mine['pid']) and bystander.poll() is None
    assert pids(result.signalled) == [mine['pid']]


@in_private_pid_namespace
def test_a_whole_gpu_with_mig_on_means_every_instance(gpuhost):
    devices, mine, sibling = two_tenants(gpuhost)
    result = mig_release(gpuhost, gpus=[0])
    assert result.released is True, result.failure
    assert gone(mine['pid']) and gone(sibling['pid'])
    assert pids(result.signalled) == sorted([mine['pid'], sibling['pid']])
    assert result.gpus_after == [{'index': 0, 'memory_used_mib': 1}]


@in_private_pid_namespace
def test_memory_left_on_an_instance_fails_it_and_resets_nothing(gpuhost):
    devices = gpuhost.mig(0, ['1g.18gb', '1g.18gb'])['instances']
    stray = gpuhost.hold(gpus='0', mib=700, mig=devices[0]['gi'], ignore_term=True)
    result = mig_release(gpuhost, gpus=['0:%d' % devices[0]['gi']], signals=['TERM'], grace_period=0, timeout=4,
                         reset_orphaned=True)
    assert alive(stray['pid'])
    assert result.released is False
    assert 'GPU 0 MIG GI %d CI 0 (%s): 700 MiB used' % (devices[0]['gi'], devices[0]['uuid']) in result.failure, result.failure
    assert result.escalation is None


@pytest.mark.parametrize('ref, problem', [
    ('0:9', 'no MIG instance 0:9 on this host'),
    ('MIG-00000000-0000-0000-0000-000000000000', 'no MIG instance MIG-00000000-0000-0000-0000-000000000000'),
    ('1:7', 'no MIG instance 1:7'),
])
def test_an_instance_the_host_does_not_have_is_a_clear_error_before_any_signal(gpuhost, ref, problem):
    two_tenants(gpuhost)
    with pytest.raises(GpuopsError) as error:
        mig_release(gpuhost, gpus=[ref])
    assert problem in str(error.value) and '\n' not in str(error.value)


@pytest.mark.parametrize('ref', ['0:', ':1', '0:1:2:3', 'MIG', 'GPU-1234', '0:x', '-1', True, '0;1', 'MIG-a\nb'])
def test_garbage_in_gpus_is_a_one_line_error(gpuhost, ref):
    with pytest.raises(GpuopsError) as error:
        mig_release(gpuhost, gpus=[ref])
    assert str(error.value).startswith('gpus: ') and 'MIG UUID' in str(error.value)


def cgroups(version):
    why = available(version)
    return pytest.mark.skipif(why is not None, reason='job cgroups v%d: %s' % (version, why))


@in_private_pid_namespace
@cgroups(1)
def test_another_live_job_on_the_instance_is_never_signalled(gpuhost):
    devices = gpuhost.mig(0, ['1g.18gb', '1g.18gb'])['instances']
    mine = gpuhost.hold(gpus='0', mib=1000, mig=devices[0]['gi'], cgroup=job_cgroup(5))
    intruder = gpuhost.hold(gpus='0', mib=2000, mig=devices[0]['gi'], cgroup=job_cgroup(6))
    result = mig_release(gpuhost, gpus=['0:%d' % devices[0]['gi']], job={'id': '5', 'shared_gpus': []}, timeout=10)
    assert gone(mine['pid']) and alive(intruder['pid'])
    assert pids(result.signalled) == [mine['pid']]
    assert [(entry['pid'], entry['job_id']) for entry in result.other_jobs] == [(intruder['pid'], '6')]
    assert result.released is False and 'job 6' in result.failure


@pytest.mark.parametrize('backend', ['nvml', 'nvidia-smi'])
def test_the_module_takes_instances_beside_indexes_through_ansible_with_either_backend(gpuhost, tmp_path, backend):
    if backend == 'nvml':
        pytest.importorskip('pynvml')
        gpuhost.install_nvml()
    devices, mine, sibling = two_tenants(gpuhost)
    stray = gpuhost.hold(gpus=[3], mib=700)
    result, proc = run_module('nvidia_device_release', dict(
        nvidia_smi_path=gpuhost.smi_path, host_root=gpuhost.root, backend=backend, grace_period=1, timeout=20,
        lock_file=str(tmp_path / 'release.lock'), gpus=['3', devices[0]['uuid']]), env=gpuhost.env(nvml=backend == 'nvml'))
    assert proc.returncode == 0 and result['released'] is True, proc.stdout
    assert pids(result['signalled']) == sorted([mine['pid'], stray['pid']])
    assert gone(mine['pid']) and gone(stray['pid']) and alive(sibling['pid'])
    assert [(gpu['index'], (gpu.get('mig_instance') or {}).get('uuid')) for gpu in result['gpu_states']] == \
        [(3, None), (0, devices[0]['uuid'])]
