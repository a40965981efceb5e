# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The escalation on its own seam, on gpusim: an Observer of the simulated host read once, the GPUs
to reset handed to Escalation.run (or preview), and the host, the result and the GPUs' history
read after it. No release loop: the read after the reset is a callback that counts its calls."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_PROTECT, READ_MIN_S, Budget, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.escalation import Escalation
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.backend import select_reader
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import ORPHANED
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.observation import Observer
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.release import ReleaseOptions, ReleaseResult
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.state import StateDir, boot_id, load_cures

XID = 'Xid 95 since the last cure'


class Seam:
    """An Observer of host as a release with reset_orphaned sees it (its budget and deadlines
    started), the snapshot it read, the nvidia-smi calls logged, and the read after the reset."""

    def __init__(self, host, tmp_path, timeout=30.0, **options):
        self.host = host
        self.log = str(tmp_path / 'smi.log')
        smi = host.counting_smi(self.log)
        given = dict(host_root=host.root, nvidia_smi_path=smi, state_dir=host.state_dir, protect=DEFAULT_PROTECT,
                     timeout=timeout, reset_orphaned=True, lock_file=str(tmp_path / 'release.lock'))
        given.update(options)
        self.options = ReleaseOptions(['/dev/nvidia*'], **given)
        reader, dummy = select_reader('nvidia-smi', smi, 10)
        self.seen = Observer(HostReader(reader, host.root), self.options, clock=time.monotonic)
        now = time.monotonic()
        self.seen.start(Budget('the release', timeout, time.monotonic), now + timeout, now + timeout - READ_MIN_S)
        self.snapshot, dummy = self.seen.observe(force_read=True, full=True)
        self.result = ReleaseResult()
        self.rereads = []
        self.fail_reread = None

    def reread(self, result):
        """The release's read after the reset, as far as the escalation needs it: the snapshot."""
        self.rereads.append(result)
        if self.fail_reread:
            raise GpuopsError(self.fail_reread)
        snapshot, dummy = self.seen.observe(force_read=True, final=True, full=True)
        result.gpus_after = self.seen.memory(snapshot) if snapshot is not None else []
        return snapshot

    def escalation(self):
        return Escalation(self.seen, self.reread)

    def run(self, todo):
        self.escalation().run(self.result, self.snapshot, todo)
        return self.result

    def preview(self, todo):
        self.escalation().preview(self.result, self.snapshot, todo)
        return self.result

    def calls(self, word):
        """The nvidia-smi calls whose arguments hold word."""
        return [' '.join(argv) for argv in self.host.smi_calls(self.log) if word in argv]

    def uuid(self, index):
        return self.host.state['gpus'][index]['uuid']

    def history(self, index):
        return History.for_host(self.host.root, self.host.state_dir).events(self.uuid(index))


def test_orphaned_memory_on_one_gpu_resets_that_gpu_alone_and_is_proven_by_a_read_after(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [ORPHANED]})
    escalation = result.escalation
    assert escalation['attempted'] is True and escalation['ok'] is True and escalation['gpus'] == [3]
    assert 'GPU 3 reset: GPU %s was successfully reset.' % gpuhost.state['gpus'][3]['pci_bus_id'] in escalation['message']
    assert seam.calls('--gpu-reset') == ['--gpu-reset -i 3']
    assert gpuhost.memory_used() == dict((index, 1) for index in range(8))
    # Persistence mode was on: off for the reset, on again after it.
    assert escalation['persistence_mode_off'] == [3] and escalation['persistence_mode_restored'] is True
    assert gpuhost.state['gpus'][3]['persistence_mode'] == 'Enabled'
    assert len(seam.rereads) == 1 and seam.rereads[0] is result
    assert [gpu['memory_used_mib'] for gpu in result.gpus_after] == [1] * 8
    assert escalation['problems'] == [] and result.failure is None and result.changed is True


def test_a_cured_gpu_is_recorded_in_its_history_and_its_older_xids_stop_counting(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    seam = Seam(gpuhost, tmp_path)
    started = time.time()
    seam.run({3: [ORPHANED]})
    reset, cure = seam.history(3)
    assert (reset['kind'], reset['outcome'], reset['proof'], reset['reason']) == (
        'reset', 'cured', 'read clean after the reset', ORPHANED)
    assert reset['pci_bus_id'] == gpuhost.state['gpus'][3]['pci_bus_id'] and reset['duration_s'] >= 0
    assert (cure['kind'], cure['how']) == ('cure', 'reset')
    assert [seam.history(index) for index in range(8) if index != 3] == [[]] * 7
    cures = load_cures(StateDir.for_host(gpuhost.state_dir, gpuhost.root), boot_id())
    assert list(cures) == [seam.uuid(3)] and cures[seam.uuid(3)] >= started - 1


def test_a_refused_reset_is_reported_in_the_drivers_words_and_nothing_wider_is_done(gpuhost, tmp_path):
    gpuhost.fault('reset-refused', gpu=3)
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [XID]})
    escalation = result.escalation
    assert escalation['attempted'] is True and escalation['ok'] is False and escalation['flr_refused'] == []
    bus = gpuhost.state['gpus'][3]['pci_bus_id']
    assert 'nvidia-smi --gpu-reset -i 3 refused (exit 255' in escalation['message']
    assert 'The following GPUs could not be reset: GPU %s: In use by another client' % bus in escalation['message']
    # No other GPU, no reload of the driver.
    assert seam.calls('--gpu-reset') == ['--gpu-reset -i 3'] and 'module_reload' not in escalation
    assert sorted(os.listdir(os.path.join(gpuhost.root, 'sys', 'module'))) == ['nvidia', 'nvidia_modeset', 'nvidia_uvm']
    assert result.released is False
    assert result.failure == 'GPUs not released: GPU 3 needs a GPU reset (%s); the GPU reset failed: %s' % (
        XID, escalation['message'])
    failed, = seam.history(3)
    assert (failed['kind'], failed['outcome'], failed['reason']) == ('reset_failed', 'cure_failed', XID)
    assert 'In use by another client' in failed['error']


def test_each_gpu_is_reset_on_its_own_and_a_refusal_of_one_is_named_beside_the_other(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    gpuhost.fault('stuck', gpu=5, mib=8192)
    gpuhost.fault('reset-refused', gpu=5)
    seam = Seam(gpuhost, tmp_path)
    escalation = seam.run({3: [ORPHANED], 5: [ORPHANED]}).escalation
    assert seam.calls('--gpu-reset') == ['--gpu-reset -i 3', '--gpu-reset -i 5']
    assert escalation['ok'] is False and escalation['gpus'] == [3, 5]
    assert escalation['message'].startswith('GPU 3 reset: GPU %s was successfully reset.' % gpuhost.state['gpus'][3]['pci_bus_id'])
    assert 'nvidia-smi --gpu-reset -i 5 refused (exit 255, internal driver error): The following GPUs could not be reset: ' \
           'GPU %s: In use by another client' % gpuhost.state['gpus'][5]['pci_bus_id'] in escalation['message']
    assert gpuhost.memory_used()[3] == 1 and gpuhost.memory_used()[5] == 8193


def test_of_two_gpus_the_one_whose_reset_worked_is_recorded_cured_and_the_other_failed(gpuhost, tmp_path):
    """Each GPU as its own reset went: GPU 3's worked and it reads clean (reset, cured; its older Xids
    no longer count), GPU 5's was refused (reset_failed); only GPU 5 still needs a reset."""
    gpuhost.fault('reset-refused', gpu=5)
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [XID], 5: [XID]})
    escalation = result.escalation
    assert escalation['ok'] is False and escalation['gpus_reset'] == [3]
    reset, cure = seam.history(3)
    assert (reset['kind'], reset['outcome'], cure['kind']) == ('reset', 'cured', 'cure')
    failed, = seam.history(5)
    assert (failed['kind'], failed['outcome']) == ('reset_failed', 'cure_failed')
    assert list(load_cures(StateDir.for_host(gpuhost.state_dir, gpuhost.root), boot_id())) == [seam.uuid(3)]
    assert 'GPU 5 needs a GPU reset' in result.failure and 'GPU 3 needs' not in result.failure


def test_a_reset_the_platform_refuses_asks_for_a_reboot_of_that_gpu(gpuhost, tmp_path):
    gpuhost.fault('reset-flr-refused', gpu=2, value='Not Supported')
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({2: [XID]})
    escalation = result.escalation
    assert escalation['ok'] is False and escalation['flr_refused'] == [2]
    assert 'GPU %s: Not Supported' % gpuhost.state['gpus'][2]['pci_bus_id'] in escalation['message']
    assert seam.seen.reboot_only == set([2]) and 'module_reload' not in escalation
    assert 'GPU 2 needs a reboot' in result.failure and 'needs a GPU reset' not in result.failure
    failed, = seam.history(2)
    assert (failed['kind'], failed['outcome'], failed['to']) == ('reset_failed', 'escalated', 'reboot')


def test_check_mode_says_what_would_be_reset_and_changes_nothing(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    seam = Seam(gpuhost, tmp_path, reset_reload_modules=True)
    result = seam.preview({3: [ORPHANED]})
    escalation = result.escalation
    assert escalation['attempted'] is False and escalation['ok'] is None and escalation['gpus'] == [3]
    assert escalation['message'].startswith('check mode: GPU 3 would be reset')
    assert escalation['module_reload']['attempted'] is False
    assert result.changed is True
    assert seam.calls('--gpu-reset') == [] and seam.calls('-pm') == [] and seam.rereads == []
    assert gpuhost.memory_used()[3] == 8193 and gpuhost.state['gpus'][3]['persistence_mode'] == 'Enabled'
    assert seam.history(3) == []


def test_with_no_time_left_no_reset_is_run_and_the_message_says_why(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    seam = Seam(gpuhost, tmp_path)
    # The snapshot was read; the release's time is spent since.
    seam.seen.deadline = time.monotonic() + 0.2
    seam.seen.signal_deadline = seam.seen.deadline - READ_MIN_S
    result = seam.run({3: [ORPHANED]})
    escalation = result.escalation
    assert escalation['ok'] is False
    assert 'no time was left within the timeout to run nvidia-smi' in escalation['message']
    assert seam.calls('--gpu-reset') == [] and seam.calls('-pm') == []
    assert gpuhost.memory_used()[3] == 8193
    assert 'MIG before the reset: no time left' in seam.seen.warnings
    # Not tried: nothing changed, no kernel module blamed, and the history says it was not attempted.
    assert escalation['attempted'] is False and result.changed is False
    assert 'kernel modules that hold nvidia' not in escalation['message']
    not_tried, = seam.history(3)
    assert (not_tried['kind'], not_tried['outcome']) == ('not_attempted', 'not_attempted')
    assert 'no time was left' in not_tried['why']


def test_a_gpu_the_driver_places_a_process_on_now_is_not_reset(gpuhost, tmp_path):
    holder = gpuhost.hold(gpus=[3], mib=512)
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [XID]})
    assert result.escalation is None and seam.rereads == [] and seam.calls('--gpu-reset') == []
    assert 'reset_due: GPU 3 not reset: the driver places a process on it now' in seam.seen.warnings
    assert gpuhost.memory_used()[3] == 513 and holder['pid'] in [rec['pid'] for rec in gpuhost.ps() if rec['alive']]


def test_orphaned_memory_freed_since_the_plan_needs_no_reset(gpuhost, tmp_path):
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [ORPHANED]})
    assert result.escalation is None and seam.rereads == [] and seam.calls('--gpu-reset') == []
    assert seam.history(3) == []


def test_a_gpu_with_a_mig_instance_in_use_is_not_reset_and_not_released(gpuhost, tmp_path):
    gpuhost.mig(3, ['1g.18gb', '2g.35gb'])
    seam = Seam(gpuhost, tmp_path)
    # Started on an instance after the GPUs were read: the MIG layout read right before the reset finds it.
    daemon = gpuhost.hold(gpus=[3], mib=700, mig=7, name='nv-hostengine', daemon=True)
    result = seam.run({3: [XID]})
    assert result.escalation is None and seam.calls('--gpu-reset') == []
    assert result.released is False
    assert result.failure.startswith('GPUs not released: GPU 3 needs a reset (%s), not attempted: MIG instance in use: '
                                     'GI 7 CI 0' % XID)
    assert '[pid %d, 700 MiB used]' % daemon['pid'] in result.failure
    assert len(gpuhost.state['gpus'][3]['mig']['instances']) == 2


def test_the_mig_instances_a_reset_ended_are_made_again_and_proven(gpuhost, tmp_path):
    before = gpuhost.mig(3, ['1g.18gb', '2g.35gb'])
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [XID]})
    escalation = result.escalation
    assert escalation['ok'] is True and escalation['gpus'] == [3]
    entry, = escalation['mig']
    assert entry['restored']['ok'] is True and entry['restored']['problems'] == []
    assert entry['changes'][-1].startswith('MIG instances made again and proven: ')
    assert sorted(dev['profile'] for dev in gpuhost.state['gpus'][3]['mig']['instances']) == \
        sorted(dev['profile'] for dev in before['instances'])
    assert result.held == [] and result.failure is None


def test_a_mig_layout_not_made_again_holds_the_gpu_for_a_person(gpuhost, tmp_path):
    gpuhost.mig(3, ['3g.71gb'])
    gpuhost.fault('mig-create', gpu=3, value='Insufficient Resources')
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [XID]})
    assert result.escalation['ok'] is True and result.escalation['mig'][0]['restored']['ok'] is False
    assert gpuhost.state['gpus'][3]['mig']['instances'] == []
    held, = result.held
    assert held['index'] == 3 and held['reason'].endswith('its MIG instances were not made again after its reset, '
                                                          'held for a person')
    assert result.released is False and 'GPU 3 lost its MIG instances to the reset' in result.failure
    kinds = [(event['kind'], event.get('outcome')) for event in seam.history(3)]
    assert kinds == [('cure_failed', 'held'), ('reset', 'cure_failed'), ('cure', None)], kinds


def test_a_fabric_not_back_after_the_reset_is_a_problem_of_the_read_after(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    gpuhost.fault('fabric', gpu=3, value='Insufficient Resources', seconds=0)
    seam = Seam(gpuhost, tmp_path)
    result = seam.run({3: [ORPHANED]})
    escalation = result.escalation
    assert escalation['ok'] is True and [entry['ok'] for entry in escalation['fabric']] == [False]
    assert escalation['problems'] == ['GPU 3: the NVLink fabric is not back after the GPU reset (state Completed, status '
                                      'Insufficient Resources: the fabric registration completed with Insufficient Resources)']
    assert result.released is False and result.failure == 'GPUs not released: %s' % escalation['problems'][0]
    reset = seam.history(3)[0]
    assert reset['outcome'] == 'cure_failed' and 'NVLink fabric is not back' in reset['why']


def test_a_read_after_the_reset_that_fails_still_records_the_reset_as_not_proven(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    seam = Seam(gpuhost, tmp_path)
    seam.fail_reread = 'nvidia-smi did not answer'
    with pytest.raises(GpuopsError, match='^nvidia-smi did not answer$'):
        seam.run({3: [ORPHANED]})
    assert gpuhost.memory_used()[3] == 1
    reset = seam.history(3)[0]
    assert (reset['kind'], reset['outcome'], reset['why']) == (
        'reset', 'cure_failed', 'the GPUs could not be read again after the reset')


def test_a_failed_reset_leaves_a_bug_report_for_the_driver(gpuhost, tmp_path):
    gpuhost.fault('reset-refused', gpu=3)
    reports = tmp_path / 'reports'
    reports.mkdir(mode=0o700)
    seam = Seam(gpuhost, tmp_path, bug_report_dir=str(reports), bug_report_timeout=30.0)
    result = seam.run({3: [XID]})
    report = result.escalation['bug_report']
    assert report['ok'] is True, report
    assert os.path.dirname(report['path']) == str(reports) and os.path.isfile(report['path'])
    assert 'bug_report_dir: ' not in ' '.join(seam.seen.warnings)


def test_no_bug_report_is_collected_for_a_reset_that_worked(gpuhost, tmp_path):
    gpuhost.fault('stuck', gpu=3, mib=8192)
    reports = tmp_path / 'reports'
    reports.mkdir(mode=0o700)
    seam = Seam(gpuhost, tmp_path, bug_report_dir=str(reports))
    result = seam.run({3: [ORPHANED]})
    assert result.escalation['ok'] is True and 'bug_report' not in result.escalation
    assert os.listdir(str(reports)) == []
