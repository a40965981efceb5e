# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The per-host sequence against a fake run_module (the seam: the modules themselves are tested
through the simulator elsewhere): which modules run in which order, and why a host fails."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._sequence import ModuleError, Run

STRICT = 'length(nvidia_gpus[?memory_used_mib > `32`]) == `0`'


def gpu(index=0, used=1):
    return dict(index=index, memory_used_mib=used, state='free' if used <= 32 else 'orphaned_memory', error=None,
                processes=[], minor_number=index, pci_bus_id='00000000:%02X:00.0' % (0x10 + index))


def facts(*used):
    return {'ansible_facts': dict(nvidia_gpus=[gpu(index, mib) for index, mib in enumerate(used)],
                                  nvidia_device_holders=[])}


# What a release asked to probe (option probe) returns, on a host without the CUDA library.
NOT_PROBED = dict(probed=False, library_missing=True, gpus=[], duration_ms=1.5, verified={}, failure=None)


def release(released=True, changed=False, probed=True, **extra):
    """A release's result; a released one carries its probe (the sequence asks for it by default)
    unless probed is false (a release that was not asked to probe)."""
    result = dict(released=released, changed=changed, gpus_before=[], gpus_after=[], signalled=[], survivors=[],
                  orphaned_gpus=[], elapsed_s=0.5)
    if not released:
        result.update(failed=True, msg='GPUs not released within 60 s: GPU 0: 900 MiB used')
    elif probed:
        result['probe'] = NOT_PROBED
    result.update(extra)
    return result


class Modules:
    """run_module answering from a script: {module name: [results, one per call]} (an exception
    instance is raised); calls: (module, args) in order."""

    def __init__(self, **script):
        self.script = dict((name, list(results)) for name, results in script.items())
        self.calls = []

    def __call__(self, name, args):
        self.calls.append((name, dict(args)))
        result = self.script[name].pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    @property
    def names(self):
        return [name for name, dummy in self.calls]


def sequence(modules, check_mode=False, deadline=None, **settings):
    run = Run('node1', settings, modules, check_mode=check_mode, name=lambda option: 'gpu_reset_' + option,
              deadline=deadline, sleep=lambda seconds: None)
    return _sequence.run(run), run


def test_a_clean_host_is_one_release_and_nothing_else():
    modules = Modules(nvidia_device_release=[release(True)])
    report, run = sequence(modules)
    assert modules.names == ['nvidia_device_release'] and report['steps'] == ['Release the GPUs']
    assert report['outcome'] == 'clean' and report['reason'] is None
    args = modules.calls[0][1]
    # Options that are not set are left to the module's defaults.
    assert 'gpus' not in args and 'lock_file' not in args and 'expected_gpus' not in args
    assert args['reset_orphaned'] is False and args['facts_after'] is False and args['timeout'] == 60
    # The reset's options are the reset module's, which a clean host never runs.
    assert not set(['reset_reload_modules', 'reset_stop_units', 'bug_report_dir', 'bug_report_timeout']) & set(args)
    # The release proves what it released itself: no module call of its own for the probe.
    assert args['probe'] == dict(mib=1024, missing_library='skip', cuda_library='libcuda.so.1', level='allocation')
    kept = ('probed', 'library_missing', 'gpus', 'duration_ms', 'verified')
    assert report['probe'] == dict((key, NOT_PROBED[key]) for key in kept)


def test_a_release_that_signalled_is_released():
    modules = Modules(nvidia_device_release=[release(True, changed=True)])
    assert sequence(modules)[0]['outcome'] == 'released'


def test_a_release_that_left_the_gpus_dirty_is_read_once_more_and_failed():
    modules = Modules(nvidia_device_release=[release(False)], nvidia_gpu_facts=[facts(900)])
    report, run = sequence(modules)
    assert modules.names == ['nvidia_device_release', 'nvidia_gpu_facts']
    assert report['outcome'] == 'failed' and report['reason'].startswith('GPU 0: 900 MiB held with no process left')


def test_own_query_that_holds_first_releases_nothing():
    modules = Modules(nvidia_gpu_facts=[facts(1)], nvidia_gpu_probe=[dict(NOT_PROBED, changed=False)])
    report, run = sequence(modules, clean_query=STRICT)
    # No release to probe what it released: the probe module proves the GPUs the query judged clean.
    assert modules.names == ['nvidia_gpu_facts', 'nvidia_gpu_probe'] and report['outcome'] == 'clean'
    assert report['steps'] == ['Read the GPUs and who holds them', 'Prove the GPUs by allocation']


def test_own_query_is_read_again_a_bounded_number_of_times():
    modules = Modules(nvidia_gpu_facts=[facts(900)] * 5,
                      nvidia_device_release=[release(True, changed=True, facts_after=facts(900)['ansible_facts'])])
    report, run = sequence(modules, clean_query=STRICT)
    assert modules.names == ['nvidia_gpu_facts', 'nvidia_device_release'] + ['nvidia_gpu_facts'] * _sequence.VERIFY_READS
    assert report['outcome'] == 'failed' and report['reason'] == 'GPU 0: 900 MiB held with no process left ' \
        '(orphaned memory; only a GPU reset frees it, set gpu_reset_allow_gpu_reset to allow it)'


def test_own_query_stops_reading_once_it_holds():
    modules = Modules(nvidia_gpu_facts=[facts(900), facts(900), facts(1)],
                      nvidia_device_release=[release(True, changed=True, facts_after=facts(900)['ansible_facts'])])
    report, run = sequence(modules, clean_query=STRICT)
    assert modules.names.count('nvidia_gpu_facts') == 3 and report['outcome'] == 'released'
    # The release was asked for its final facts, for the query.
    assert modules.calls[1][1]['facts_after'] is True


def test_check_mode_releases_in_check_mode_and_reads_nothing_more():
    would = release(True, changed=True, signalled=[dict(pid=7, comm='python3', signals_sent=[], exited=False)])
    modules = Modules(nvidia_device_release=[dict(would, released=False)])
    report, run = sequence(modules, check_mode=True)
    assert modules.names == ['nvidia_device_release'] and modules.calls[0][1]['facts_after'] is True
    assert report['outcome'] == 'would_release' and report['reason'] == 'check mode: would signal 1 process(es): pid 7 (python3)'


@pytest.mark.parametrize('settings, reason', [
    (dict(timeout='5s', backend='nvml2'), "gpu_reset is misconfigured: gpu_reset_backend is 'nvml2', expected one "
                                          "of auto, nvml, nvidia-smi; gpu_reset_timeout is '5s', expected a number"),
    (dict(timeout=0), 'gpu_reset is misconfigured: gpu_reset_timeout must be more than 0 seconds, got 0.0'),
    (dict(clean_query=' '), 'gpu_reset is misconfigured: gpu_reset_clean_query must be a JMESPath expression or '
                            'null, it is empty'),
])
def test_a_misconfigured_host_runs_no_module(settings, reason):
    modules = Modules()
    report, run = sequence(modules, **settings)
    assert modules.calls == [] and report['outcome'] == 'failed' and report['reason'] == reason
    assert run.misconfigured


def test_a_query_that_gives_no_boolean_fails_before_the_release():
    modules = Modules(nvidia_gpu_facts=[facts(1)])
    report, run = sequence(modules, clean_query='length(nvidia_gpus)')
    assert modules.names == ['nvidia_gpu_facts']
    assert report['reason'].startswith('gpu_reset_clean_query must give true or false, it gave 1')


def test_a_module_that_gave_no_result_is_named_with_its_step():
    modules = Modules(nvidia_device_release=[ModuleError('gpuops.nvidia.nvidia_device_release gave no result '
                                                         'within 9.0 s and was stopped')])
    report, run = sequence(modules)
    assert report['outcome'] == 'failed' and report['reason'] == (
        'Release the GPUs: gpuops.nvidia.nvidia_device_release gave no result within 9.0 s and was stopped')


def test_a_host_whose_python_cannot_run_the_module_says_how_to_fix_it():
    failure = {'failed': True, 'msg': 'MODULE FAILURE: No start of json char found', 'module_stderr': 'no python3'}
    modules = Modules(nvidia_device_release=[failure])
    report, run = sequence(modules)
    assert report['reason'] == (
        'Release the GPUs: the Python Ansible found could not run the module; set ansible_python_interpreter for this '
        'host to a Python 3 that can, for example /usr/bin/python3 (it printed: no python3)')


def test_a_release_error_before_judging_is_the_reason():
    modules = Modules(nvidia_device_release=[{'failed': True, 'msg': 'gpus: no GPU 9 on this host (it has 0, 1)'}])
    report, run = sequence(modules)
    assert modules.names == ['nvidia_device_release']
    assert report['reason'] == 'Release the GPUs: gpus: no GPU 9 on this host (it has 0, 1)'


def test_a_failed_read_after_the_release_is_named_with_its_step():
    modules = Modules(nvidia_device_release=[release(False)],
                      nvidia_gpu_facts=[{'failed': True, 'msg': 'nvidia-smi did not answer within 5.0 s'}])
    report, run = sequence(modules)
    assert report['reason'] == 'Read the GPUs and check that they are clean: nvidia-smi did not answer within 5.0 s'


def test_no_time_left_to_read_again_keeps_the_release_s_account():
    modules = Modules(nvidia_device_release=[release(False)], nvidia_gpu_facts=[ModuleError('stopped')])
    report, run = sequence(modules)
    assert report['reason'] == 'Release the GPUs: GPUs not released within 60 s: GPU 0: 900 MiB used'


def test_the_reads_end_before_the_deadline():
    modules = Modules(nvidia_device_release=[release(False)], nvidia_gpu_facts=[facts(900)])
    sequence(modules, deadline=time.monotonic() + 4)
    assert 1 <= modules.calls[1][1]['timeout'] <= 3


def test_the_release_s_failed_probe_fails_the_host():
    failure = 'the allocation probe failed on 1 of 1 GPUs: GPU 0: CUDA_ERROR_ECC_UNCORRECTABLE at cuMemAlloc'
    modules = Modules(nvidia_device_release=[release(True, probe=dict(NOT_PROBED, probed=True, library_missing=False,
                                                                      failure=failure))])
    report, run = sequence(modules, gpus=[0])
    assert modules.names == ['nvidia_device_release'] and report['steps'] == ['Release the GPUs']
    assert report['outcome'] == 'failed' and report['reason'] == 'Prove the GPUs by allocation: ' + failure


def test_with_the_probe_off_the_release_is_not_asked_to_probe():
    modules = Modules(nvidia_device_release=[release(True, probed=False)])
    report, run = sequence(modules, probe=False)
    assert 'probe' not in modules.calls[0][1] and 'probe' not in report


def test_a_deadline_that_leaves_the_probe_too_little_time_after_the_release_calls_the_probe_module():
    """With a deadline (the hook), the release's probe gets what its timeout leaves; too little,
    and the release is not asked to probe."""
    modules = Modules(nvidia_device_release=[release(True)])
    sequence(modules, deadline=time.monotonic() + 100, timeout=30)
    assert 60 < modules.calls[0][1]['probe']['timeout'] < 70
    # Here the release ends at once: the time its timeout would have taken is left for the probe module.
    modules = Modules(nvidia_device_release=[release(True, probed=False)],
                      nvidia_gpu_probe=[dict(NOT_PROBED, changed=False)])
    report, run = sequence(modules, deadline=time.monotonic() + 31.5, timeout=30)
    assert 'probe' not in modules.calls[0][1] and modules.names == ['nvidia_device_release', 'nvidia_gpu_probe']
    assert report['outcome'] == 'clean' and report['probe']['library_missing'] is True


def test_the_probe_runs_only_on_a_clean_verdict_and_a_failed_probe_fails_the_host():
    modules = Modules(nvidia_device_release=[release(True, probed=False)],
                      nvidia_gpu_probe=[{'failed': True, 'msg': 'GPU 0: CUDA_ERROR_ECC_UNCORRECTABLE', 'probed': True}])
    report, run = sequence(modules, probe=True, gpus=[0])
    assert modules.names == ['nvidia_device_release', 'nvidia_gpu_probe'] and modules.calls[1][1]['gpus'] == [0]
    assert report['outcome'] == 'failed'
    assert report['reason'] == 'Prove the GPUs by allocation: GPU 0: CUDA_ERROR_ECC_UNCORRECTABLE'
    modules = Modules(nvidia_device_release=[release(False)], nvidia_gpu_facts=[facts(900)])
    sequence(modules, probe=True)
    assert 'nvidia_gpu_probe' not in modules.names


def test_module_warnings_are_kept_once():
    modules = Modules(nvidia_device_release=[release(False, warnings=['w1'])],
                      nvidia_gpu_facts=[dict(facts(900), warnings=['w1', 'w2'])])
    report, run = sequence(modules)
    assert run.warnings == ['w1', 'w2']


DUE = [{'index': 0, 'reasons': ['orphaned memory']}]


def test_reload_modules_is_passed_to_the_reset_as_reset_reload_modules():
    modules = Modules(nvidia_device_release=[release(False, reset_due=DUE)], nvidia_device_reset=[release(True, changed=True)])
    sequence(modules, allow_gpu_reset=True, reload_modules=True)
    assert modules.calls[0][1]['reset_orphaned'] is True and 'reset_reload_modules' not in modules.calls[0][1]
    args = modules.calls[1][1]
    assert args['reset_reload_modules'] is True and args['reset_due'] == DUE and 'reset_orphaned' not in args


def test_the_reset_runs_only_where_the_release_names_a_gpu_and_gets_what_is_left_of_its_timeout():
    modules = Modules(nvidia_device_release=[release(False, changed=True, reset_due=DUE, elapsed_s=20.0,
                                                     signalled=[{'pid': 42}], gpus_before=[gpu(0, 900)])],
                      nvidia_device_reset=[release(True, gpus_after=[gpu(0, 1)])])
    report, run = sequence(modules, allow_gpu_reset=True, stop_units=['nvidia-dcgm.service'])
    assert modules.names == ['nvidia_device_release', 'nvidia_device_reset']
    assert report['steps'] == ['Release the GPUs', 'Reset the GPUs that need it']
    args = modules.calls[1][1]
    assert args['timeout'] == 40.0 and args['reset_stop_units'] == ['nvidia-dcgm.service']
    # The report is the reset's reading, with what the release signalled before it.
    assert report['outcome'] == 'released' and run.release['signalled'] == [{'pid': 42}]
    assert run.release['gpus_before'] == [gpu(0, 900)] and run.release['elapsed_s'] == 20.5


def test_a_gpu_held_for_a_person_stays_not_released_after_the_reset_of_another():
    held = [{'index': 1, 'uuid': 'GPU-1', 'reason': 'GPU 1 held for a person: its fault came back'}]
    modules = Modules(nvidia_device_release=[release(False, reset_due=DUE, held=held)],
                      nvidia_device_reset=[release(True, changed=True)], nvidia_gpu_facts=[facts(1, 900)])
    report, run = sequence(modules, allow_gpu_reset=True)
    assert run.release['released'] is False and run.release['msg'].startswith('GPU 1 held for a person')
    assert report['outcome'] == 'failed'


def test_no_reset_without_a_gpu_that_needs_one():
    modules = Modules(nvidia_device_release=[release(False, reset_due=[])], nvidia_gpu_facts=[facts(900)])
    sequence(modules, allow_gpu_reset=True)
    assert 'nvidia_device_reset' not in modules.names
