# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _verdict

KEYS = ['host', 'outcome', 'reason', 'check_mode', 'gpus_before', 'gpus_after', 'gpus_free', 'gpus_held', 'signalled', 'survivors',
        'other_jobs', 'foreign_holders', 'unreadable',
        'orphaned_gpus', 'escalation', 'held', 'history', 'gpus', 'release_s', 'started', 'duration_s', 'drained',
        'misconfigured']


def gpu(index, used=1, state='free', error=None, processes=()):
    return dict(index=index, memory_used_mib=used, state=state, error=error, processes=list(processes),
                minor_number=index, pci_bus_id='00000000:%02X:00.0' % (0x10 + index))


def holder(pid, gpus, comm='python3', protected=False):
    return dict(pid=pid, comm=comm, user='alice', protected=protected,
                devices=['/dev/nvidia%d' % index for index in gpus] + ['/dev/nvidiactl'])


def facts(gpus, holders=()):
    """What nvidia_gpu_facts registers."""
    return {'ansible_facts': dict(nvidia_gpus=list(gpus), nvidia_device_holders=list(holders))}


def memory(*used):
    return [{'index': index, 'memory_used_mib': mib} for index, mib in enumerate(used)]


def release(released, changed=False, before=(1, 1), after=(1, 1), **extra):
    result = dict(released=released, changed=changed, gpus_before=memory(*before), gpus_after=memory(*after),
                  signalled=[], survivors=[], orphaned_gpus=[], elapsed_s=0.5)
    result.update(extra)
    return result


def test_clean_host_is_clean_without_a_reason():
    report = _verdict.verdict('n1', release=release(True), started=100.0, now=100.25)
    assert list(report) == KEYS
    assert report['outcome'] == 'clean' and report['reason'] is None
    assert report['gpus_before'] == report['gpus_after'] == memory(1, 1)
    assert report['duration_s'] == 0.25 and report['release_s'] == 0.5 and report['escalation'] is None


def test_release_that_signalled_is_released():
    signalled = [dict(pid=7, comm='python3', signals_sent=['TERM'], exited=True)]
    report = _verdict.verdict('n1', release=release(True, changed=True, before=(4000, 1), signalled=signalled))
    assert report['outcome'] == 'released' and report['signalled'] == signalled
    assert report['gpus_before'] == memory(4000, 1)


@pytest.mark.parametrize('changed, outcome', [(False, 'clean'), (True, 'released')])
def test_a_release_that_did_not_prove_a_host_clean_that_then_reads_clean(changed, outcome):
    """Nothing signalled or reset: the host was clean, whatever cut the release's own proof short."""
    unproven = release(False, changed=changed, failure='GPUs not released: the GPUs could not be read: no time was left')
    report = _verdict.verdict('n1', release=unproven, facts=facts([gpu(0), gpu(1)]))
    assert report['outcome'] == outcome and report['reason'] is None


def test_survivor_is_named_with_its_gpu_and_why():
    survivor = dict(holder(9, [1]), reason='uninterruptible', gpus=[1], signals_sent=['TERM', 'KILL'])
    report = _verdict.verdict('n1', release=release(False, changed=True, survivors=[survivor]),
                              facts=facts([gpu(0), gpu(1, 2049, 'busy')], [holder(9, [1])]))
    assert report['outcome'] == 'failed'
    assert report['reason'] == 'GPU 1: 2049 MiB used, held by pid 9 (python3, uninterruptible)'
    assert report['gpus_after'] == memory(1, 2049)


def module_escalation(ok, message, gpus=(1,), off=(1,), restored=True, attempted=True):
    """The escalation of nvidia_device_release with reset_orphaned."""
    return dict(attempted=attempted, gpus=list(gpus), ok=ok, message=message, persistence_mode_off=list(off),
                persistence_mode_restored=restored if off else None)


REFUSED = ('nvidia-smi --gpu-reset -i 1 refused (exit 255, internal driver error): The following GPUs could not be '
           'reset: GPU 00000000:11:00.0: In use by another client')


def test_orphaned_memory_names_the_setting_or_the_failed_reset():
    read = facts([gpu(0), gpu(1, 513, 'orphaned_memory')])
    report = _verdict.verdict('n1', release=release(False, orphaned_gpus=[1]), facts=read)
    assert report['reason'] == ('GPU 1: 513 MiB held with no process left (orphaned memory; only a GPU reset '
                                'frees it, set gpu_reset_allow_gpu_reset to allow it)')
    assert report['escalation'] is None
    refused = release(False, orphaned_gpus=[1], escalation=module_escalation(False, REFUSED))
    report = _verdict.verdict('n1', release=refused, facts=read, allow_gpu_reset=True)
    assert report['reason'] == ('GPU 1: 513 MiB held with no process left (orphaned memory; only a GPU reset '
                                'frees it, and the reset failed: %s)' % REFUSED)
    assert report['escalation'] == {'gpus': [1], 'reasons': [], 'persistence_mode_off': [1], 'reset_ok': False,
                                    'output': REFUSED, 'persistence_mode_restored': True, 'problems': []}
    assert list(report['escalation']) == ['gpus', 'reasons', 'persistence_mode_off', 'reset_ok', 'output',
                                          'persistence_mode_restored', 'problems']


def test_failed_reset_output_is_one_line_in_the_reason():
    read = facts([gpu(0), gpu(1, 513, 'orphaned_memory')])
    refused = release(False, orphaned_gpus=[1], escalation=module_escalation(False, 'GPU 00000000:11:00.0\n could not be reset'))
    report = _verdict.verdict('n1', release=refused, facts=read, allow_gpu_reset=True)
    assert report['reason'].endswith('and the reset failed: GPU 00000000:11:00.0 could not be reset)')
    assert report['escalation']['output'] == 'GPU 00000000:11:00.0\n could not be reset'


def test_reset_that_frees_orphaned_memory_is_a_release():
    done = module_escalation(True, 'GPU 1 reset: GPU 00000000:11:00.0 was successfully reset. All done.', off=())
    report = _verdict.verdict('n1', release=release(True, changed=True, before=(1, 4097), orphaned_gpus=[],
                                                    escalation=done), allow_gpu_reset=True)
    assert report['outcome'] == 'released' and report['reason'] is None
    assert report['gpus_after'] == memory(1, 1)
    # The release reads the GPUs again after the reset: GPU 1 is no longer among its orphaned_gpus.
    assert report['orphaned_gpus'] == [1]
    assert report['escalation'] == {'gpus': [1], 'reasons': [], 'persistence_mode_off': [], 'reset_ok': True,
                                    'output': 'GPU 1 reset: GPU 00000000:11:00.0 was successfully reset. All done.',
                                    'persistence_mode_restored': None, 'problems': []}


def test_a_reset_that_left_the_fabric_behind_fails_the_host_though_the_gpus_read_clean():
    back = dict(index=1, state='Completed', status='Success', ok=True)
    stuck = dict(index=1, state='In Progress', status='N/A', ok=False, note='the GPU did not register in time')
    problem = 'GPU 1: the NVLink fabric is not back after the GPU reset (state In Progress, status N/A: ...)'
    done = dict(module_escalation(True, 'GPU 1 reset', off=()), fabric=[stuck], problems=[problem])
    report = _verdict.verdict('n1', release=release(False, changed=True, before=(1, 4097), escalation=done),
                              facts=facts([gpu(0), gpu(1)]), allow_gpu_reset=True)
    assert report['outcome'] == 'failed' and report['reason'] == problem
    assert report['escalation']['fabric'] == [stuck] and report['escalation']['problems'] == [problem]
    fine = dict(module_escalation(True, 'GPU 1 reset', off=()), fabric=[back], problems=[])
    report = _verdict.verdict('n1', release=release(True, changed=True, before=(1, 4097), escalation=fine),
                              facts=facts([gpu(0), gpu(1)]), allow_gpu_reset=True)
    assert report['outcome'] == 'released' and report['reason'] is None


def test_a_reset_the_platform_refused_asks_for_a_reboot_in_one_line():
    from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import RESET_REFUSED
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import reboot_cures

    line = 'GPU 1 needs a reboot (%s)' % RESET_REFUSED
    output = 'nvidia-smi --gpu-reset -i 1 refused (exit 255): GPU 00000000:11:00.0: Unknown Error'
    refused = dict(module_escalation(False, output, off=()), flr_refused=[1], problems=[line])
    read = facts([gpu(0), gpu(1, 513, 'orphaned_memory')])
    report = _verdict.verdict('n1', release=release(False, changed=True, before=(1, 513), orphaned_gpus=[1],
                                                    escalation=refused), facts=read, allow_gpu_reset=True)
    assert report['outcome'] == 'failed' and report['reason'].startswith(line + '; GPU 1: 513 MiB held'), report['reason']
    assert report['reason'].count('reset_refused') == 1
    assert report['escalation']['flr_refused'] == [1]
    assert [row['recovery_action'] for row in report['gpus']] == [None, 'reboot']
    # The hook asks for a reboot, as for a GPU fallen off the bus.
    assert reboot_cures(report) is True
    plain = dict(module_escalation(False, output.replace('Unknown Error', 'In use by another client'), off=()))
    report = _verdict.verdict('n1', release=release(False, changed=True, before=(1, 513), orphaned_gpus=[1],
                                                    escalation=plain), facts=read, allow_gpu_reset=True)
    assert reboot_cures(report) is False and 'reset_refused' not in report['reason']


def test_no_escalation_in_the_report_without_an_attempt_or_an_allowed_reset():
    # Check mode: the release says what it would reset, the report has nothing to tell.
    would = module_escalation(None, 'check mode: GPU 1 would be reset', off=(), attempted=False)
    report = _verdict.verdict('n1', release=release(False, orphaned_gpus=[1], escalation=would), check_mode=True,
                              facts_before=facts([gpu(0), gpu(1, 513, 'orphaned_memory')]), allow_gpu_reset=True)
    assert report['outcome'] == 'would_release' and report['escalation'] is None
    # A reset that gpu_reset_allow_gpu_reset did not allow is never reported.
    done = release(True, changed=True, escalation=module_escalation(True, 'GPU 1 reset'))
    assert _verdict.verdict('n1', release=done)['escalation'] is None
    assert _verdict.verdict('n1', release=done, allow_gpu_reset=True)['escalation']['reset_ok'] is True


def test_lost_gpu_and_stray_holder():
    lost = dict(gpu(2, None, 'lost', error='Unable to determine the device handle'), index=None)
    read = facts([gpu(0), lost], [holder(5, [0])])
    report = _verdict.verdict('n1', release=release(False), facts=read)
    assert report['reason'] == ('GPU 00000000:12:00.0 lost or unreadable (Unable to determine the device handle); '
                                'pid 5 (python3, user alice) still holds /dev/nvidia0, /dev/nvidiactl')


def test_query_of_the_users_own_judges_before_and_after():
    query = "length(nvidia_device_holders[?!protected && comm != 'sidecar']) == `0`"
    before = facts([gpu(0, 900, 'busy')], [holder(3, [0], comm='sidecar')])
    report = _verdict.verdict('n1', facts_before=before, query=query)
    assert report['outcome'] == 'clean' and report['gpus_before'] == report['gpus_after'] == memory(900)
    dirty = facts([gpu(0, 900, 'busy')], [holder(4, [0])])
    after = release(True, changed=True, facts_after=facts([gpu(0)])['ansible_facts'])
    report = _verdict.verdict('n1', release=after, facts_before=dirty, query=query)
    assert report['outcome'] == 'released' and report['gpus_before'] == memory(900)
    report = _verdict.verdict('n1', release=dict(after, facts_after=dirty['ansible_facts']), facts_before=dirty,
                              query=query)
    assert report['outcome'] == 'failed'
    assert report['reason'] == ('GPU 0: 900 MiB used; '
                                'pid 4 (python3, user alice) still holds /dev/nvidia0, /dev/nvidiactl')


def test_query_that_passes_clean_gpus_the_reason_says_so():
    report = _verdict.verdict('n1', release=release(True), facts_before=facts([gpu(0)]), query='`false`')
    assert report['outcome'] == 'failed' and report['reason'] == 'the GPUs do not pass gpu_reset_clean_query'


def test_check_mode_would_release_and_names_the_processes():
    signalled = [dict(pid=7, comm='python3', signals_sent=[], exited=False)]
    dirty = facts([gpu(0, 4000, 'busy')], [holder(7, [0])])['ansible_facts']
    report = _verdict.verdict('n1', release=release(False, changed=True, signalled=signalled, facts_after=dirty),
                              check_mode=True)
    assert report['outcome'] == 'would_release' and report['check_mode'] is True
    assert report['reason'].startswith('check mode: would signal 1 process(es): pid 7 (python3); GPU 0: 4000 MiB used')


def test_scope_narrows_the_judgement():
    read = facts([gpu(0), gpu(1, 5000, 'busy')], [holder(8, [1])])
    report = _verdict.verdict('n1', release=release(False, changed=True), facts=read, gpus=[0])
    assert report['outcome'] == 'released' and report['gpus_after'] == memory(1)


def test_error_fails_the_host_with_it_first():
    report = _verdict.verdict('n1', error='gpu_reset is misconfigured: gpu_reset_signals must name at least one signal')
    assert report['outcome'] == 'failed' and report['signalled'] == [] and report['gpus_before'] == []
    assert report['reason'] == 'gpu_reset is misconfigured: gpu_reset_signals must name at least one signal'


def test_free_and_held_gpus_are_counted_by_the_threshold():
    clean = _verdict.verdict('n1', release=release(True, before=(1, 32)), memory_threshold_mib=32)
    assert (clean['gpus_free'], clean['gpus_held']) == (2, 0)
    # The summary of a GPU that is not clean counts it held, however the clean query judged the host.
    failed = _verdict.verdict('n1', release=release(False, changed=True, after=(1, 33)),
                              facts=facts([gpu(0), gpu(1, 33)]), memory_threshold_mib=32)
    assert (failed['gpus_free'], failed['gpus_held']) == (1, 1)
    lost = _verdict.verdict('n1', release=release(True, changed=True, after=(1, None)))
    assert (lost['gpus_free'], lost['gpus_held']) == (1, 1)


def summary_of(reports):
    """The summary of hosts whose hostvars hold these reports (None: the host has none)."""
    hostvars = dict((host, {} if report is None else {'gpu_reset_result': report}) for host, report in reports.items())
    return _verdict.summary(list(reports), hostvars)


def test_summary_lists_failed_hosts_first_and_counts_every_outcome():
    signalled = [dict(pid=7, comm='python3', signals_sent=['TERM']), dict(pid=8, comm='python3', signals_sent=['TERM', 'KILL'])]
    lines = summary_of({
        'gpu-a': _verdict.verdict('gpu-a', release=release(True)),
        'gpu-b2': _verdict.verdict('gpu-b2', release=release(True, changed=True, before=(4000, 1), signalled=signalled)),
        'gpu-c': _verdict.verdict('gpu-c', error='Release the GPUs: nvidia-smi\n  not found', started=100, now=103.26),
        'gpu-d': None,
    })
    assert lines == [
        '3 of 4 host(s): 1 clean, 1 released, 1 failed',
        'FAILED    gpu-c   after 3.3 s: Release the GPUs: nvidia-smi; not found',
        'released  gpu-b2  2 process(es) stopped (python3; TERM+KILL), 2 GPU(s) free in 0.5 s',
        'clean     1 host(s), nothing to do (2 GPU(s) free): gpu-a',
        'no result from gpu-d (unreachable, or in a later serial batch)',
    ]


def test_summary_of_100_hosts_with_95_clean_groups_them_in_one_line():
    reports = dict(('gpu%03d' % n, _verdict.verdict('gpu%03d' % n, release=release(True))) for n in range(1, 101)
                   if n not in (7, 8, 50, 99, 100))
    reports['gpu007'] = _verdict.verdict('gpu007', error='GPU 3 lost or unreadable (GPU is lost)', started=0, now=12)
    reports['login1'] = _verdict.verdict('login1', error='the role failed', started=0, now=1)
    for n in (8, 50, 99):
        reports['gpu%03d' % n] = _verdict.verdict('gpu%03d' % n, release=release(True, changed=True, before=(4000, 1)))
    lines = summary_of(reports)
    assert len(lines) == 7 < 30
    assert lines[0] == '100 of 100 host(s): 95 clean, 3 released, 2 failed'
    assert lines[1] == 'FAILED    gpu007  after 12.0 s: GPU 3 lost or unreadable (GPU is lost)'
    assert lines[2] == 'FAILED    login1  after 1.0 s: the role failed'
    assert [line.split()[1] for line in lines[3:6]] == ['gpu008', 'gpu050', 'gpu099']
    assert lines[6] == ('clean     95 host(s), nothing to do (190 GPU(s) free): '
                        'gpu[001-006,009-049,051-098]')


def test_a_misconfigured_host_s_line_says_no_time():
    report = _verdict.verdict('gpu01', error='gpu_reset is misconfigured: gpu_reset_grace_period must be zero or more, '
                              'got -1.0', started=0, now=0, misconfigured=True)
    assert _verdict.misconfigured(report)
    assert _verdict.summary_line(report) == (
        'FAILED    gpu01  gpu_reset is misconfigured: gpu_reset_grace_period must be zero or more, got -1.0')


def test_a_reason_that_only_reads_as_a_misconfiguration_is_none():
    # The words may come from anywhere (a process's name in the reason): what the run knew decides.
    report = _verdict.verdict('gpu01', error='gpu_reset is misconfigured: said by a process name', started=0, now=1)
    assert not _verdict.misconfigured(report) and report['misconfigured'] is False


def test_host_list_writes_numbered_names_in_ranges():
    assert _verdict.host_list(['n3', 'n1', 'n2', 'n10', 'gpu-a', 'rack2-gpu07', 'rack2-gpu08']) == (
        'gpu-a,n10,n[1-3],rack2-gpu[07-08]')
    assert _verdict.host_list(['10.0.0.5']) == '10.0.0.5'


def test_summary_in_check_mode_is_one_short_line_per_host():
    signalled = [dict(pid=7 + n, comm='python3', signals_sent=[]) for n in range(64)]
    report = _verdict.verdict('n1', release=release(True, before=(70000, 1), signalled=signalled), check_mode=True,
                              facts_before=facts([gpu(0, 70000, 'busy'), gpu(1)]), query=_verdict.CLEAN_QUERY % 32)
    lines = summary_of({'n1': report})
    assert lines == ['1 of 1 host(s): 0 clean, 0 released, 0 failed, 1 would be released (check mode)',
                     'checked   n1  would signal 64 process(es) (python3), 1 GPU(s) free, 1 held']


def test_summary_names_the_gpus_a_reset_freed():
    escalation = module_escalation(True, 'GPU 00000000:11:00.0 was successfully reset.', gpus=(1,))
    report = _verdict.verdict('n1', release=release(True, changed=True, escalation=escalation, orphaned_gpus=[]),
                              allow_gpu_reset=True)
    assert summary_of({'n1': report})[1] == 'released  n1  0 process(es) stopped, GPU(s) 1 reset, 2 GPU(s) free in 0.5 s'


def test_reports_by_host_leave_out_hosts_without_one():
    report = _verdict.verdict('gpu-a', release=release(True))
    hostvars = {'gpu-a': {'gpu_reset_result': report}, 'gpu-b': {}, 'gpu-c': {'gpu_reset_result': {'outcome': None}}}
    assert _verdict.reports(['gpu-a', 'gpu-b', 'gpu-c'], hostvars) == {'gpu-a': report}


def test_summary_of_a_slice_says_so():
    lines = _verdict.summary(['gpu-a'], {'gpu-a': {'gpu_reset_result': _verdict.verdict('gpu-a', release=release(True))}},
                             sliced=True)
    assert lines[0] == '1 of 1 host(s) in this slice: 1 clean, 0 released, 0 failed'


def test_user_chosen_names_reach_the_reason_escaped():
    final = {'nvidia_gpus': [{'index': 0, 'memory_used_mib': 900, 'processes': [
        {'pid': 7, 'name': 'job\n7, forged line\x1b[2J'}]}], 'nvidia_device_holders': [
        {'pid': 8, 'comm': 'x\x1b]0;t\x07', 'user': 'u', 'devices': ['/dev/nvidia0'], 'protected': False}]}
    text = _verdict.reason(final, [], 32, error='module failed:\x1b[31m red')
    assert '\n' not in text and '\x1b' not in text and '\x07' not in text
    assert 'pid 7 (job\\x0a7, forged line\\x1b[2J)' in text


def test_a_gpu_the_driver_says_needs_a_reset_is_named_with_the_setting():
    sick = gpu(1, 0, 'reset_required', error='the driver says: GPU requires reset (for temperature.gpu)')
    report = _verdict.verdict('n1', release=release(False), facts=facts([gpu(0), sick]))
    assert report['outcome'] == 'failed'
    assert report['reason'] == ('GPU 1 needs a GPU reset (the driver says: GPU requires reset (for temperature.gpu); '
                                'set gpu_reset_allow_gpu_reset to allow it)')


def test_gpus_missing_from_the_reader_fail_the_host_that_the_release_did_not_release():
    # Before: the release said released: true and the summary "clean ... (6 GPU(s) free)".
    error = ('attached by the NVIDIA driver (minor number 6) but absent from nvidia-smi: still seen on the PCI bus '
             '(/sys/bus/pci/devices/0000:16:00.0)')
    missing = dict(gpu(6, None, 'lost', error=error), index=None)
    report = _verdict.verdict('n1', release=release(False), facts=facts([gpu(0), missing]))
    assert report['outcome'] == 'failed' and report['reason'].startswith('GPU 00000000:16:00.0 lost or unreadable (')
    assert _verdict.summary_line(report).startswith('FAILED')


def test_per_gpu_metrics_from_the_release_and_from_the_facts():
    states = [dict(index=0, pci_bus_id='00000000:18:00.0', state='free', driver_recovery_action=None, memory_used_mib=1),
              dict(index=1, pci_bus_id='00000000:2A:00.0', state='free', driver_recovery_action='none', memory_used_mib=1),
              dict(index=2, pci_bus_id='00000000:3A:00.0', state='reset_required', driver_recovery_action='reset_gpu',
                   memory_used_mib=0)]
    report = _verdict.verdict('n1', release=release(False, before=(1, 4000, 0), after=(1, 1, 0), gpu_states=states))
    # The UUID (for the GPU's history) is the release's; these states give none.
    assert [row.pop('uuid') for row in report['gpus']] == [None, None, None]
    assert report['gpus'] == [
        {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'state': 'free', 'recovery_action': None, 'orphaned_mib': 0,
         'seconds_until_free': 0},
        {'index': 1, 'pci_bus_id': '00000000:2A:00.0', 'state': 'free', 'recovery_action': 'none', 'orphaned_mib': 0,
         'seconds_until_free': 0.5},
        {'index': 2, 'pci_bus_id': '00000000:3A:00.0', 'state': 'reset_required', 'recovery_action': 'reset_gpu',
         'orphaned_mib': 0, 'seconds_until_free': None}]
    held = dict(gpu(1, 700, 'orphaned_memory'), health={'recovery_action': 'reset_gpu'})
    report = _verdict.verdict('n1', release=release(False), facts=facts([gpu(0), held]))
    assert [(row['state'], row['orphaned_mib'], row['recovery_action']) for row in report['gpus']] == [
        ('free', 0, None), ('orphaned_memory', 700, 'reset_gpu')]


def test_the_metrics_template_has_per_gpu_gauges():

    import jinja2

    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import METRICS_TEMPLATE
    states = [dict(index=0, pci_bus_id='00000000:18:00.0', state='orphaned_memory', driver_recovery_action='none',
                   memory_used_mib=700)]
    report = _verdict.verdict('n1', release=release(False, before=(700,), after=(700,), gpu_states=states))
    report['gpus'][0]['orphaned_mib'] = 700
    with open(METRICS_TEMPLATE) as handle:
        template = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True).from_string(handle.read())
    text = template.render(gpu_reset_result=report)
    assert 'gpu_reset_gpu_state{gpu="0",pci_bus_id="00000000:18:00.0",state="orphaned_memory"} 1' in text
    assert 'gpu_reset_gpu_state{gpu="0",pci_bus_id="00000000:18:00.0",state="free"} 0' in text
    assert 'gpu_reset_gpu_recovery_action{gpu="0",pci_bus_id="00000000:18:00.0",action="none"} 1' in text
    assert 'gpu_reset_gpu_orphaned_mib{gpu="0",pci_bus_id="00000000:18:00.0"} 700' in text
    assert 'gpu_reset_gpu_seconds_until_free' in text and 'gpu_reset_gpu_seconds_until_free{' not in text


@pytest.mark.parametrize('result, said', [
    ({'msg': 'Module result deserialization failed: No start of json char found',
      'module_stderr': '  File "<stdin>", line 1\nSyntaxError: invalid syntax\n', 'rc': 1},
     'SyntaxError: invalid syntax'),
    # pyenv's shim of a Python it has but does not use: its first line, not the help text after it.
    ({'msg': 'Module result deserialization failed: No start of json char found',
      'module_stderr': "pyenv: python2: command not found\n\nThe `python2' command exists in these Python versions:\n"
                       "  2.7.18\n\nNote: See 'pyenv help global' for tips on allowing multiple\n"
                       "      Python versions to be found at the same time.\n", 'rc': 127},
     'pyenv: python2: command not found'),
    ({'msg': "The module interpreter '/opt/py/bin/python' was not found.",
      'module_stderr': '/bin/sh: 1: /opt/py/bin/python: not found\n', 'rc': 127},
     '/bin/sh: 1: /opt/py/bin/python: not found'),
    ({'msg': 'Module result deserialization failed: No start of json char found', 'module_stderr': '', 'rc': 0},
     'nothing'),
])
def test_a_python_that_cannot_run_the_module_is_named_with_how_to_pin_another(result, said):
    report = _verdict.verdict('n1', error={'task': 'Release the GPUs', 'result': result, 'python': '/opt/py/bin/python'})
    assert report['reason'] == (
        'Release the GPUs: /opt/py/bin/python could not run the module; set ansible_python_interpreter '
        'for this host to a Python 3 that can, for example /usr/bin/python3 (it printed: %s)' % said)


def test_a_module_that_failed_or_crashed_keeps_its_own_words():
    assert _verdict.task_error({'task': 'Release the GPUs', 'result': {'msg': 'nvidia-smi\n  not found'}}) == (
        'Release the GPUs: nvidia-smi not found')
    crashed = {'msg': 'MODULE FAILURE', 'module_stderr': 'Traceback (most recent call last):\nKeyError: 1'}
    assert _verdict.task_error({'task': 'Release the GPUs', 'result': crashed}) == 'Release the GPUs: MODULE FAILURE: KeyError: 1'


def test_a_hung_driver_that_names_no_gpu_asks_the_hook_for_a_reboot():
    from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import driver_hung
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import reboot_cures

    error = '%s; nothing was signalled' % driver_hung('nvidia-smi --query-gpu=index', 'pid 77 in D state')
    report = _verdict.verdict('n1', error=error)
    assert report['outcome'] == 'failed' and report['reason'].startswith('driver_hung: nvidia-smi')
    assert reboot_cures(report) is True
    report = _verdict.verdict('n1', error='nvidia-smi --query-gpu=index did not answer within 2.0 s and was killed')
    assert reboot_cures(report) is False


def test_a_module_reload_that_cured_a_refused_reset_is_in_the_report_and_asks_no_reboot():
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import reboot_cures

    reload = dict(attempted=True, ok=True, gpus=[0, 1], flr_refused=[1], message='kernel modules nvidia_uvm, nvidia '
                  'unloaded and loaded again', modules=['nvidia_uvm', 'nvidia'], unloaded=['nvidia_uvm', 'nvidia'],
                  loaded=['nvidia', 'nvidia_uvm'], stopped_by=None)
    escalation = dict(module_escalation(True, 'refused; ' + reload['message'], off=()), flr_refused=[], module_reload=reload)
    report = _verdict.verdict('n1', release=release(True, changed=True, before=(1, 513), escalation=escalation),
                              facts=facts([gpu(0), gpu(1)]), allow_gpu_reset=True)
    assert report['outcome'] != 'failed' and report['escalation']['module_reload'] == reload
    assert 'flr_refused' not in report['escalation'] and [row['recovery_action'] for row in report['gpus']] == [None, None]
    assert reboot_cures(report) is False
