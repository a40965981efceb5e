# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import stat

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils import _probe
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe import ProbeChild, ProbeOptions, probe
from ansible_collections.gpuops.nvidia.plugins.module_utils._reader import Snapshot

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
    """Answers as the child would, and remembers what it was asked."""

    def __init__(self, answer=None, error=None):
        self.answer = answer
        self.error = error
        self.asked = None
        self.pid = None

    def run(self, gpus, mib, timeout):
        self.asked = (gpus, mib)
        if self.error:
            raise self.error
        self.pid = self.answer.get('pid')
        return self.answer


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
    return lambda **options: ProbeOptions(**dict(dict(state_dir=str(tmp_path / 'state')), **options))


def test_every_gpu_is_probed_by_bus_id_and_released(probe_options):
    child = Child(answer(passed(0), passed(1)))
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(), child=child)
    assert [g['pci_bus_id'] for g in child.asked[0]] == BUS[:2] and child.asked[1] == 1024
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
    assert [g['index'] for g in child.asked[0]] == [0]
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
    assert child.asked is None and result.probed is False
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


def test_an_answer_for_other_gpus_is_not_believed(probe_options):
    result = probe(Reader([gpu(0), gpu(1)]), probe_options(), child=Child(answer(passed(0))))
    assert set(g['error_name'] for g in result.gpus) == set(['PROBE_ERROR'])


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

def fake_python(tmp_path, body):
    path = tmp_path / 'python'
    path.write_text('#!/bin/sh\n' + body + '\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_child_never_sees_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    monkeypatch.setenv('CUDA_DEVICE_ORDER', 'FASTEST_FIRST')
    python = fake_python(tmp_path, 'echo "{\\"pid\\": $$, \\"gpus\\": [], \\"seen\\": \\"${CUDA_VISIBLE_DEVICES-unset}'
                                   '${CUDA_DEVICE_ORDER-unset}\\"}"')
    found = ProbeChild(python).run([], 1024, 5)
    assert found['seen'] == 'unsetunset' and ProbeChild(python).runner.unset == _probe.CUDA_ENVIRONMENT


def test_the_child_gets_the_request_and_the_source_of_the_probe(tmp_path):
    python = fake_python(tmp_path, 'printf "%s" "$5" > "$0.request"; printf "%s" "$4" > "$0.source"; '
                                   'echo "{\\"pid\\": 7, \\"gpus\\": []}"')
    ProbeChild(python).run([gpu(1)], 64, 5)
    assert json.loads((tmp_path / 'python.request').read_text()) == dict(
        library='libcuda.so.1', mib=64, gpus=[dict(index=1, pci_bus_id=BUS[1])])
    assert 'class GpuProbe' in (tmp_path / 'python.source').read_text()


@pytest.mark.parametrize('body, message', [
    ('kill -SEGV $$', 'the CUDA probe was killed by SIGSEGV'),
    ('echo "Fatal Python error" >&2; exit 3', 'the CUDA probe exited with status 3: Fatal Python error'),
    ('echo "not json"', "the CUDA probe gave no answer that can be read (it printed 'not json')"),
    ('echo "[1, 2]"', "the CUDA probe gave no answer that can be read (it printed '[1, 2]')"),
    ('true', "the CUDA probe gave no answer that can be read (it printed '')"),
])
def test_a_child_that_dies_or_prints_garbage_is_said_in_words(tmp_path, body, message):
    with pytest.raises(GpuopsError) as info:
        ProbeChild(fake_python(tmp_path, body)).run([gpu(0)], 64, 5)
    assert str(info.value) == message


def test_a_hung_child_is_killed_at_its_deadline(tmp_path, probe_options):
    child = ProbeChild(fake_python(tmp_path, 'exec sleep 60'))
    result = probe(Reader([gpu(0)]), probe_options(timeout=2), child=child)
    assert result.gpus[0]['error_name'] == 'PROBE_TIMEOUT'
    assert result.gpus[0]['error_string'].startswith('the CUDA probe did not answer within 1.0 s')
