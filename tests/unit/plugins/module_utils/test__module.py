# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What every module does around its work (module_utils/_module.py): run_with_reader opens the
reader the options choose on a simulated host, closes it, and turns the collection's errors (bad
options, an unreadable host, a missing library) into a failed result with the error's words;
exit_with_release exits with a release's result, and a SIGTERM ends the release through its
finally blocks into a failed result that says so."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import signal
import time

import pytest
from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import nvml as _nvml
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, reader_argument_spec
from ansible_collections.gpuops.nvidia.plugins.module_utils._module import exit_with_release, run_with_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseResult

SPEC = dict(reader_argument_spec(), timeout=dict(type='float', default=10.0))


def host_params(host, **more):
    return dict(dict(backend='nvidia-smi', nvidia_smi_path=host.smi_path, host_root=host.root, timeout=7), **more)


def in_module(params, body, spec=None):
    """body(module) for a module with params (and spec, SPEC by default), as a module's main() runs it."""
    with patch_module_args(params):
        return body(AnsibleModule(argument_spec=spec or SPEC, supports_check_mode=True))


def exited(capsys, params, body, spec=None):
    """The result that body(module) exited with; warning_text: its warnings, wherever ansible-core put them."""
    def run(module):
        with pytest.raises(SystemExit):
            body(module)
    in_module(params, run, spec)
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    result['warning_text'] = json.dumps(result.get('warnings', [])) + captured.err
    return result


def closing(reader, closed):
    """The reader, whose backend's close is recorded in closed."""
    reader.reader.close = lambda: closed.append(reader.backend)
    return reader


def test_the_work_reads_the_host_under_host_root_and_its_result_comes_back(gpuhost_factory):
    host = gpuhost_factory(gpus=4, fallen=[2], minors=[7, 5, 3])
    snapshot, warnings = in_module(host_params(host), lambda module: run_with_reader(module, lambda reader: reader.read()))
    assert warnings == []
    assert [(gpu['index'], gpu['minor_number']) for gpu in snapshot.gpus] == [(0, 7), (1, 5), (2, 3)]
    assert [gpu['pci_bus_id'] for gpu in snapshot.missing] == ['00000000:3A:00.0']


def test_the_options_are_parsed_from_the_params_and_handed_to_the_work(gpuhost):
    def work(reader, parsed):
        return reader.backend, parsed
    value, warnings = in_module(host_params(gpuhost), lambda module: run_with_reader(
        module, work, lambda params: {'twice': params['timeout'] * 2}))
    assert (value, warnings) == (('nvidia-smi', {'twice': 14.0}), [])


def test_an_option_error_fails_the_task_with_its_words_before_nvidia_smi_runs(capsys, gpuhost, tmp_path):
    log = str(tmp_path / 'calls')
    params = host_params(gpuhost, nvidia_smi_path=gpuhost.counting_smi(log))
    worked = []

    def refuse(params):
        raise GpuopsError('timeout must be more than 0 seconds, got -1')
    result = exited(capsys, params, lambda module: run_with_reader(module, worked.append, refuse))
    assert (result['failed'], result['msg']) == (True, 'timeout must be more than 0 seconds, got -1')
    assert worked == [] and gpuhost.smi_calls(log) == []
    in_module(params, lambda module: run_with_reader(module, lambda reader, parsed: reader.read(), lambda params: None))
    assert gpuhost.smi_calls(log) != []


def test_a_host_whose_driver_is_not_loaded_fails_with_nvidia_smis_words_not_a_traceback(capsys, gpuhost):
    gpuhost.fault('driver-not-loaded', 'on')
    closed = []
    result = exited(capsys, host_params(gpuhost), lambda module: run_with_reader(
        module, lambda reader: closing(reader, closed).read()))
    assert result['failed'] is True
    assert result['msg'].startswith('nvidia-smi exited with 9 (the NVIDIA driver is not loaded): NVIDIA-SMI has failed')
    assert 'Traceback' not in result['msg'] and 'exception' not in result
    assert closed == ['nvidia-smi']


def test_the_reader_is_closed_after_work_that_succeeds(gpuhost):
    closed = []
    value, warnings = in_module(host_params(gpuhost), lambda module: run_with_reader(
        module, lambda reader: len(closing(reader, closed).read().gpus)))
    assert (value, closed) == (8, ['nvidia-smi'])


def test_an_error_that_is_no_gpuops_error_is_not_disguised_as_a_failed_read(gpuhost):
    closed = []

    def work(reader):
        closing(reader, closed)
        raise KeyError('memory_used_mib')
    with pytest.raises(KeyError):
        in_module(host_params(gpuhost), lambda module: run_with_reader(module, work))
    assert closed == ['nvidia-smi']


def test_a_backend_whose_python_library_is_missing_fails_saying_what_to_install(capsys, gpuhost, monkeypatch):
    # The boundary the simulator cannot reach: whether nvidia-ml-py is installed in this Python.
    monkeypatch.setattr(_nvml, 'HAS_PYNVML', False)
    monkeypatch.setattr(_nvml, 'PYNVML_IMPORT_ERROR', 'Traceback (most recent call last):\nImportError: No module named pynvml\n')
    worked = []
    result = exited(capsys, host_params(gpuhost, backend='nvml'), lambda module: run_with_reader(module, worked.append))
    assert (result['failed'], result['msg']) == (True, missing_required_lib('nvidia-ml-py'))
    assert 'nvidia-ml-py' in result['msg'] and worked == []


def test_a_backend_the_reader_does_not_know_fails_naming_the_choices(capsys, gpuhost):
    spec = dict(SPEC, backend=dict(type='str'))
    result = exited(capsys, host_params(gpuhost, backend='cuda'), lambda module: run_with_reader(module, len), spec)
    assert (result['failed'], result['msg']) == (True, "backend must be one of auto, nvml, nvidia-smi, got 'cuda'")


@pytest.fixture
def sigterm_ignored():
    """SIGTERM ignored around the test: were exit_with_release to leave it alone, a SIGTERM the test
    sends would not end pytest; put back after."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGTERM, before)


def release_result(failure=None, warnings=()):
    result = ReleaseResult()
    result.changed = result.released = failure is None
    result.signalled = [{'pid': 4242}]
    result.failure = failure
    result.warnings = list(warnings)
    result.diff = {'before': 'pid 4242 (train)\n', 'after': ''}
    return result


def test_a_release_that_succeeded_exits_with_its_values_and_every_warning(capsys, gpuhost):
    result = exited(capsys, host_params(gpuhost), lambda module: exit_with_release(
        module, lambda: (release_result(warnings=['from the release']), ['from the reader']), 'release'))
    assert 'failed' not in result and 'diff' not in result
    assert (result['changed'], result['released'], result['signalled']) == (True, True, [{'pid': 4242}])
    assert result['warning_text'].index('from the reader') < result['warning_text'].index('from the release')


def test_a_release_that_failed_fails_with_its_failure_as_msg_and_keeps_its_values(capsys, gpuhost):
    result = exited(capsys, host_params(gpuhost), lambda module: exit_with_release(
        module, lambda: (release_result('GPU 3: 900 MiB used'), []), 'release'))
    assert (result['failed'], result['msg'], result['released']) == (True, 'GPU 3: 900 MiB used', False)
    assert result['signalled'] == [{'pid': 4242}] and result['reset_due'] == []


def test_diff_mode_adds_the_holders_before_and_after(capsys, gpuhost):
    result = exited(capsys, host_params(gpuhost, _ansible_diff=True), lambda module: exit_with_release(
        module, lambda: (release_result(), []), 'release'))
    assert result['diff'] == {'before': 'pid 4242 (train)\n', 'after': '',
                              'before_header': 'holders before', 'after_header': 'holders after'}


@pytest.mark.parametrize('what', ['release', 'reset'])
def test_a_sigterm_ends_the_run_through_its_finally_blocks_and_fails_saying_so(capsys, gpuhost, sigterm_ignored, what):
    steps = []

    def run():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
            steps.append('ran on')
        finally:
            # A second SIGTERM does not cut the restore short.
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            steps.append('restored')
        return release_result(), []
    result = exited(capsys, host_params(gpuhost), lambda module: exit_with_release(module, run, what))
    # The handler from before the release is back.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert steps == ['restored']
    assert (result['failed'], result['msg']) == (True, (
        'the %s was stopped by SIGTERM before its end; the units it had stopped for a GPU reset, if any, were asked '
        'to start again before it exited' % what))


def test_a_sigterm_while_the_gpus_are_read_closes_the_reader(capsys, gpuhost, sigterm_ignored):
    closed = []

    def work(reader):
        closing(reader, closed).read()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    result = exited(capsys, host_params(gpuhost), lambda module: exit_with_release(
        module, lambda: run_with_reader(module, work), 'release'))
    assert result['failed'] is True and result['msg'].startswith('the release was stopped by SIGTERM')
    assert closed == ['nvidia-smi']
