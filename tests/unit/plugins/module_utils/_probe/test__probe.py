# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import signal
import socket
import sys
import threading
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import probe as _probe
from ansible_collections.gpuops.nvidia.plugins.module_utils._state import state as _state
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import ProbeChild, ProbeOptions, check_probe_level, check_probe_mib, probe
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import Snapshot
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import is_driver_hung
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, record_verified

BUS = ['00000000:18:00.0', '00000000:2A:00.0', '00000000:3A:00.0']


def gpu(index, used=1, pids=(), error=None, bus=None):
    return dict(index=index, pci_bus_id=bus or BUS[index], memory_used_mib=used, error=error,
                processes=[dict(pid=pid, name='python3', used_memory_mib=1024) for pid in pids])


class Reader:
    """Gives the snapshots it was made with, one per read, the last one for ever."""

    backend = 'nvidia-smi'

    def __init__(self, *readings):
        self.readings = list(readings)
        self.reads = 0

    def read(self, timeout=None, full=True):
        self.reads += 1
        gpus = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        return Snapshot([dict(g) for g in gpus], '550.127.05')

    def close(self):
        pass


class Child:
    """Answers as each GPU's child would (its result from answer, found by bus id), and remembers
    which GPUs it was asked for."""

    def __init__(self, answer=None, error=None):
        self.reply = answer
        self.error = error
        self.asked = []
        self.mib = None
        self.pids = set()

    def start(self, gpu, mib):
        self.asked.append(gpu)
        self.mib = mib
        return gpu

    def answer(self, gpu, timeout):
        if self.error:
            raise self.error
        self.pids.add(self.reply.get('pid'))
        if self.reply.get('init') or self.reply.get('library_error'):
            return self.reply
        mine = [found for found in self.reply['gpus'] if found['pci_bus_id'] == gpu['pci_bus_id']]
        return dict(self.reply, gpus=mine or self.reply['gpus'])


def passed(index, mib=1024):
    return dict(index=index, pci_bus_id=BUS[index], ok=True, ms=2.5, mib=mib, call=None, error_code=None,
                error_name=None, error_string=None)


def failed(index, call, code, name, text):
    return dict(passed(index, 0), ok=False, call=call, error_code=code, error_name=name, error_string=text)


def answer(*results, **extra):
    return dict(dict(pid=4242, library_error=None, init=None, gpus=list(results)), **extra)


@pytest.fixture
def probe_options(tmp_path):
    """ProbeOptions(**options) that keep the probe's state (its cures) in a directory of the test's own."""
    # A library every machine can load stands for libcuda.so.1, which the parent only loads to see that it is there.
    return lambda **options: ProbeOptions(**dict(dict(state_dir=str(tmp_path / 'state'), cuda_library='libc.so.6'),
                                                 **options))


def test_every_gpu_is_probed_by_bus_id_and_released(probe_options):
    child = Child(answer(passed(0), passed(1)))
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(), child=child)
    assert sorted(g['pci_bus_id'] for g in child.asked) == BUS[:2] and child.mib == 1024
    assert [(g['ok'], g['released'], g['mib']) for g in result.gpus] == [(True, True, 1024)] * 2
    assert result.failure is None and result.probed


def test_the_probe_waits_while_its_process_or_its_memory_shows(probe_options):
    reader = Reader([gpu(0)], [gpu(0, 1025, pids=[4242])], [gpu(0, 1025)], [gpu(0, 1)])
    result = probe(reader, probe_options(), child=Child(answer(passed(0))))
    assert result.gpus[0]['released'] is True
    assert reader.reads == 4  # before, the process listed, its memory still counted, released


def test_memory_still_held_at_the_deadline_fails_the_gpu(probe_options):
    reader = Reader([gpu(0)], [gpu(0, 1025)])
    result = probe(reader, probe_options(timeout=2), child=Child(answer(passed(0))))
    assert (result.gpus[0]['ok'], result.gpus[0]['released'], result.gpus[0]['error_name']) == (
        False, False, 'PROBE_MEMORY_HELD')
    assert result.failure.startswith('the allocation probe failed on 1 of 1 GPUs: GPU 0 (00000000:18:00.0): '
                                     'PROBE_MEMORY_HELD (')


def test_an_exclusive_gpu_is_said_to_block_a_job_and_its_busy_context_is_explained(probe_options):
    busy = failed(1, 'cuCtxCreate_v2', 46, 'CUDA_ERROR_DEVICE_UNAVAILABLE', 'CUDA-capable device(s) is/are busy or unavailable')
    result = probe(Reader([dict(gpu(0), compute_mode='Exclusive_Process'), dict(gpu(1), compute_mode='Exclusive_Process'),
                           dict(gpu(2), compute_mode='Default')]), probe_options(), child=Child(answer(passed(0), busy, passed(2))))
    assert result.warnings == ['GPUs 0, 1 in an exclusive compute mode: while the probe held its context, a job starting '
                               'there would have failed with CUDA_ERROR_DEVICE_UNAVAILABLE (probe before jobs start, as the '
                               'Slurm Prolog does)']
    assert result.failure.endswith('(CUDA-capable device(s) is/are busy or unavailable); the GPU is in Exclusive_Process '
                                   'compute mode and another process holds its one context')
    assert [g['compute_mode'] for g in result.gpus] == ['Exclusive_Process', 'Exclusive_Process', 'Default']


def test_a_failed_gpu_is_named_with_the_cuda_error_and_call(probe_options):
    child = Child(answer(passed(0), failed(1, 'cuMemAlloc_v2', 2, 'CUDA_ERROR_OUT_OF_MEMORY', 'out of memory')))
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(), child=child)
    assert result.failure == ('the allocation probe failed on 1 of 2 GPUs: GPU 1 (00000000:2A:00.0): '
                              'CUDA_ERROR_OUT_OF_MEMORY at cuMemAlloc_v2 (out of memory)')
    assert result.gpus[1]['released'] is True and result.gpus[1]['ok'] is False


def test_cuinit_failure_fails_every_gpu_it_was_asked_for(probe_options):
    init = dict(ok=False, call='cuInit', error_code=100, error_name='CUDA_ERROR_NO_DEVICE',
                error_string='no CUDA-capable device is detected')
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(), child=Child(answer(init=init)))
    assert [(g['ok'], g['call'], g['error_name']) for g in result.gpus] == [(False, 'cuInit', 'CUDA_ERROR_NO_DEVICE')] * 2


def test_a_lost_gpu_is_not_probed_and_not_clean(probe_options):
    child = Child(answer(passed(0)))
    result = probe(Reader([gpu(0), gpu(1, None, error='GPU is lost')]), probe_options(), child=child)
    assert [g['index'] for g in child.asked] == [0]
    assert (result.gpus[1]['ok'], result.gpus[1]['error_name'], result.gpus[1]['error_string']) == (
        False, 'GPU_LOST', 'GPU is lost')
    assert 'GPU 1 (00000000:2A:00.0): GPU_LOST (GPU is lost)' in result.failure


def test_gpus_picks_the_scope_and_an_unknown_index_is_an_error(probe_options):
    child = Child(answer(passed(2)))
    result = probe(Reader([gpu(0), gpu(1), gpu(2)]), probe_options(gpus=[2]), child=child)
    assert [g['index'] for g in result.gpus] == [2]
    with pytest.raises(GpuopsError, match=r'gpus: no GPU 5 on this host \(it has 0, 1, 2\)'):
        probe(Reader([gpu(0), gpu(1), gpu(2)]), probe_options(gpus=[5]), child=child)


def test_check_mode_asks_nothing_of_cuda(probe_options):
    child = Child(answer(passed(0)))
    result = probe(Reader([gpu(0)]), probe_options(), check_mode=True, child=child)
    assert child.asked == [] and result.probed is False
    assert result.gpus[0]['ok'] is None and result.failure is None


@pytest.mark.parametrize('setting, failure, skipped', [('fail', True, False), ('skip', False, True)])
def test_missing_library_fails_or_is_skipped_with_a_warning(setting, failure, skipped, probe_options):
    child = Child(answer(library_error='libcuda.so.1 cannot be loaded (nope)'))
    result = probe(Reader([gpu(0)]), probe_options(missing_library=setting), child=child)
    assert bool(result.failure) is failure and result.skipped is skipped and result.probed is False
    if failure:
        assert result.failure == 'libcuda.so.1 cannot be loaded (nope) (set missing_library=skip to go on without the probe)'
    else:
        assert result.warnings == ['libcuda.so.1 cannot be loaded (nope); nothing was probed (missing_library=skip)']


def test_a_child_that_fails_fails_each_gpu_in_words(probe_options):
    child = Child(error=GpuopsError('the CUDA probe was killed by SIGSEGV'))
    result = probe(Reader([gpu(0)]), probe_options(), child=child)
    assert (result.gpus[0]['error_name'], result.gpus[0]['error_string']) == (
        'PROBE_ERROR', 'the CUDA probe was killed by SIGSEGV')


def test_an_answer_for_another_gpu_is_not_believed(probe_options):
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(), child=Child(answer(passed(0))))
    assert [(g['ok'], g['error_name']) for g in result.gpus] == [(True, None), (False, 'PROBE_ERROR')]


@pytest.mark.parametrize('options, message', [
    (dict(timeout=0), 'timeout must be more than 0 seconds'),
    (dict(probe_mib=0), 'probe_mib must be 1 or more, got 0'),
    (dict(gpus=[]), 'gpus is an empty list'),
    (dict(memory_threshold_mib=-1), 'memory_threshold_mib must be zero or more'),
    (dict(missing_library='ignore'), 'missing_library must be fail or skip'),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(GpuopsError, match=message):
        ProbeOptions(**options)


# ------------------------------------------------------------------ the child, as a process

# What a child runs in place of the probe (_cuda.answer): each a real forked process.

def reply(**fields):
    """A program that answers with fields (and its pid)."""
    def program(request):
        print(json.dumps(dict(dict(pid=os.getpid(), gpus=[]), **fields)))
    return program


def said_then(calls, then):
    """A program that says it is making calls (as _cuda does, on stderr), then does then()."""
    def program(request):
        for call in calls:
            sys.stderr.write('calling %s\n' % call)
        sys.stderr.flush()
        return then()
    return program


def crash():
    os.kill(os.getpid(), signal.SIGSEGV)


def hang():
    time.sleep(60)


UUID = 'GPU-8932f937-d72c-4106-c12f-20bd9faed9f6'


@pytest.mark.parametrize('uuid, seen', [
    (UUID, UUID + 'unset'),  # that GPU alone: its cuInit brings up no other
    (None, 'unsetunset'),
    ('GPU-8932f937,0', 'unsetunset'),  # not a UUID the driver prints: never passed on
    ('0', 'unsetunset'),
])
def test_the_child_sees_its_own_gpu_only_and_nothing_of_the_callers(monkeypatch, uuid, seen):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    monkeypatch.setenv('CUDA_DEVICE_ORDER', 'FASTEST_FIRST')

    def program(request):
        reply(seen=''.join(os.environ.get(name, 'unset') for name in ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')))(request)
    found = ProbeChild(program).run(dict(gpu(0), uuid=uuid), 1024, 5)
    assert found['seen'] == seen
    assert os.environ['CUDA_DEVICE_ORDER'] == 'FASTEST_FIRST'  # the parent's own environment is untouched


def test_the_child_gets_the_request_and_nothing_open_of_the_parents(tmp_path):
    # A descriptor of the parent's (a lock file the release holds) must not outlive it in a child
    # stuck in the driver.
    with open(str(tmp_path / 'lock'), 'w'):
        found = ProbeChild(lambda request: reply(request=request, fds=sorted(os.listdir('/proc/self/fd')))(request)).run(
            gpu(1), 64, 5)
    assert found['request'] == dict(library='libcuda.so.1', mib=64, level='allocation',
                                    gpus=[dict(index=1, pci_bus_id=BUS[1])])
    assert [int(fd) for fd in found['fds']][:3] == [0, 1, 2] and len(found['fds']) <= 4  # and listdir's own
    assert found['pid'] != os.getpid()


def fatal(request):
    sys.stderr.write('Fatal Python error\n')
    return 3


def boom(request):
    raise ValueError('boom')


@pytest.mark.parametrize('program, message', [
    (fatal, 'the CUDA probe exited with status 3: Fatal Python error'),
    (boom, 'the CUDA probe exited with status 70: ValueError: boom'),
    (lambda request: print('not json'), "the CUDA probe gave no answer that can be read (it printed 'not json')"),
    (lambda request: print('[1, 2]'), "the CUDA probe gave no answer that can be read (it printed '[1, 2]')"),
    (lambda request: None, "the CUDA probe gave no answer that can be read (it printed '')"),
])
def test_a_child_that_dies_or_prints_garbage_is_said_in_words(program, message):
    with pytest.raises(GpuopsError) as info:
        ProbeChild(program).run(gpu(0), 64, 5)
    assert str(info.value) == message


def test_a_crashed_child_names_its_signal_and_the_call_it_was_in():
    with pytest.raises(_probe.ProbeCrashed) as info:
        ProbeChild(said_then(['cuInit', 'cuCtxCreate_v2'], crash)).run(gpu(0), 64, 5)
    assert (str(info.value), info.value.call) == ('the CUDA probe was killed by SIGSEGV', 'cuCtxCreate_v2')


# A child that hangs: after its CUDA calls so far (stderr), it sleeps until killed.
HANG = said_then(['cuInit', 'cuCtxCreate_v2'], hang)


def test_a_hung_child_is_killed_at_its_deadline_naming_the_call(probe_options):
    result = probe(Reader([gpu(0)]), probe_options(timeout=2), child=ProbeChild(HANG))
    assert (result.gpus[0]['error_name'], result.gpus[0]['call']) == ('PROBE_TIMEOUT', 'cuCtxCreate_v2')
    assert result.gpus[0]['error_string'] == ('no answer within 1.0 s; the probe of this GPU was killed (the call hung '
                                              'in the driver)')


def test_a_child_that_never_reached_cuda_is_not_blamed_on_the_driver(probe_options):
    result = probe(Reader([gpu(0)]), probe_options(timeout=2), child=ProbeChild(lambda request: hang()))
    assert (result.gpus[0]['error_name'], result.gpus[0]['call']) == ('PROBE_TIMEOUT', None)
    assert 'had made no CUDA call when it was killed at 1.0 s' in result.gpus[0]['error_string']
    assert 'hung in the driver' not in result.gpus[0]['error_string']


def test_a_child_hung_in_the_driver_is_driver_hung_and_asks_for_a_reboot(tmp_path, probe_options):
    # A real D state needs a kernel that blocks the task: what /proc shows of one is written under
    # a proc of the test's own (as gpusim's hang-d does for nvidia-smi), where the child's runner looks.
    proc = tmp_path / 'proc'

    def in_d_state():
        where = proc / str(os.getpid())
        where.mkdir(parents=True)
        (where / 'stat').write_text('%d (python3) D 1 1 1 0 -1\n' % os.getpid())
        (where / 'wchan').write_text('os_acquire_mutex')
        hang()
    child = ProbeChild(said_then(['cuInit', 'cuCtxCreate_v2'], in_d_state))
    child.proc = str(proc)
    result = probe(Reader([gpu(0)]), probe_options(timeout=2), child=child)
    assert (result.gpus[0]['error_name'], result.gpus[0]['call']) == ('PROBE_TIMEOUT', 'cuCtxCreate_v2')
    assert re.match(r'^driver_hung: the probe of this GPU \(cuCtxCreate_v2\) hung in the NVIDIA driver past its deadline '
                    r'\(pid \d+ in D state, in os_acquire_mutex\); only a reboot frees it$', result.gpus[0]['error_string'])
    assert is_driver_hung(result.failure)  # what the Slurm hook asks a reboot for


def test_one_child_per_gpu_a_hang_or_a_crash_is_that_gpus_result_alone(probe_options):
    # Three GPUs at once: the child of GPU 1 hangs, that of GPU 2 crashes; GPU 0's passes.
    def program(request):
        bus = request['gpus'][0]['pci_bus_id']
        if bus == BUS[1]:
            return HANG(request)
        if bus == BUS[2]:
            return said_then(['cuCtxCreate_v2'], crash)(request)
        return reply(gpus=[dict(index=0, pci_bus_id=bus, ok=True, mib=64)])(request)
    result = probe(Reader([gpu(0), gpu(1), gpu(2)]), probe_options(timeout=3), child=ProbeChild(program))
    assert [(g['index'], g['ok'], g['error_name'], g['call']) for g in result.gpus] == [
        (0, True, None, None), (1, False, 'PROBE_TIMEOUT', 'cuCtxCreate_v2'),
        (2, False, 'PROBE_CRASHED', 'cuCtxCreate_v2')]
    assert result.failure.startswith('the allocation probe failed on 2 of 3 GPUs: GPU 1 (00000000:2A:00.0): '
                                     'PROBE_TIMEOUT at cuCtxCreate_v2')
    assert 'GPU 0' not in result.failure


def test_every_child_is_started_before_any_is_waited_for(probe_options):
    # Forked from one thread only: a thread waiting for one child must not be alive at the next fork.
    starts = []

    class Counting(ProbeChild):
        def start(self, gpu, mib):
            starts.append(threading.active_count())
            return super(Counting, self).start(gpu, mib)

    def program(request):
        reply(gpus=[dict(pci_bus_id=request['gpus'][0]['pci_bus_id'], ok=True, mib=64)])(request)
    result = probe(Reader([gpu(0), gpu(1), gpu(2)]), probe_options(), child=Counting(program))
    assert [g['ok'] for g in result.gpus] == [True] * 3 and starts == [starts[0]] * 3


# ------------------------------------------------------------------ the record others can read

def test_a_passed_probe_is_recorded_by_uuid_and_said_in_one_syslog_line(tmp_path):
    host_root = tmp_path / 'host'
    (host_root / 'dev').mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(host_root / 'dev' / 'log'))
    listener.settimeout(5)
    uuids = ['GPU-%08x-0000-0000-0000-000000000000' % index for index in range(3)]
    busy = failed(2, 'cuCtxCreate_v2', 46, 'CUDA_ERROR_DEVICE_UNAVAILABLE', 'busy')
    kernel = dict(passed(0), level='allocation', kernel=True)
    options = ProbeOptions(state_dir=str(tmp_path / 'state'), host_root=str(host_root), cuda_library='libc.so.6')
    try:
        before = time.time()
        result = probe(Reader([dict(gpu(index), uuid=uuid) for index, uuid in enumerate(uuids)]), options,
                       child=Child(answer(kernel, passed(1), busy)))
        line = listener.recv(4096).decode()
    finally:
        listener.close()
    assert sorted(result.verified) == uuids[:2]
    assert result.verified[uuids[0]]['verified_at'] >= before - 0.001 and result.verified[uuids[0]]['kernel'] is True
    assert result.verified[uuids[1]]['kernel'] is False and result.verified[uuids[1]]['driver_version'] == '550.127.05'
    assert json.loads((tmp_path / 'state' / 'verified.json').read_text())['gpus'] == result.verified
    assert [g.get('verified_at') is not None for g in result.gpus] == [True, True, False]
    # Only the probe that ran the kernel over what it allocated cures its GPU.
    assert list(json.loads((tmp_path / 'state' / 'cures.json').read_text())['gpus']) == uuids[:1]
    assert re.match(r'<28>gpuops: event=probe outcome=failed gpus=3 verified=0,1 failed=2:CUDA_ERROR_DEVICE_UNAVAILABLE '
                    r'level=allocation mib=1024 kernel=no driver=550.127.05 duration_ms=\d+$', line), line


def test_verifications_are_kept_across_runs_and_bounded(tmp_path):
    state = StateDir(str(tmp_path / 'state'))
    record_verified(state, dict(('GPU-old-%d' % n, dict(verified_at=float(n))) for n in range(_state.MAX_VERIFIED)))
    kept = record_verified(state, {'GPU-new': dict(verified_at=1e9)})
    assert len(kept) == _state.MAX_VERIFIED and 'GPU-new' in kept and 'GPU-old-0' not in kept
    # A record another program wrote in a shape of its own is dropped, not believed.
    (tmp_path / 'state' / 'verified.json').write_text('{"gpus": {"GPU-x": {"verified_at": "yesterday"}}}')
    assert record_verified(state, {}) == {}


def test_the_syslog_line_carries_no_text_it_did_not_check():
    result = _probe.ProbeResult([dict(blank_result_of(0), ok=False, error_name='X Y\nforged=1')])
    line = _probe.log_line(result, '550 <b>\n')
    assert '\n' not in line and 'forged=1' not in line.replace('?forged=1', '') and 'driver=550??b??' in line


def blank_result_of(index):
    return _probe.blank_result(gpu(index))


def test_without_the_driver_library_no_child_is_started(probe_options):
    child = Child(answer(passed(0)))
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(missing_library='skip', cuda_library='libcuda-none.so.1'),
                   child=child)
    assert child.asked == [] and result.skipped and result.probed is False
    assert result.warnings == ['libcuda-none.so.1 cannot be loaded (libcuda-none.so.1: cannot open shared object file: '
                               'No such file or directory): no NVIDIA driver installed, or its library is not on the '
                               'loader path; nothing was probed (missing_library=skip)']


def test_the_probe_options_are_checked():
    check_probe_mib(1)
    check_probe_level('memory')
    with pytest.raises(GpuopsError, match='probe_mib must be 1 or more, got 0'):
        check_probe_mib(0)
    with pytest.raises(GpuopsError, match='probe_mib must be 1 or more, got None'):
        check_probe_mib(None)
    with pytest.raises(GpuopsError, match="probe_level must be allocation, memory or performance, got 'deep'"):
        check_probe_level('deep')
