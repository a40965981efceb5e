# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Quiesce against a systemctl written here (a script that keeps each unit's state in a file) and
cgroups written into a /proc of files; a real systemd runs the same in the Molecule scenario
quiesce."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pathlib
import pwd
import re
import signal
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import Holder, read_process
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure import quiesce as _quiesce
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.quiesce import (
    ACTIVE_CHECK_S,
    HOST_ENGINE_ANSWER_S,
    HOST_ENGINE_RESTART_S,
    DEFAULT_STOP_UNITS,
    RESTART_MIN_S,
    MPS_CONTROL,
    Quiesce,
    quiesced_reset,
    systemd_unit,
    unit_of,
    valid_service,
)

# Each call is logged; a unit's state lives in STATE/<unit>; FAIL names a verb that fails, HANG a
# verb that never answers.
SYSTEMCTL = r'''#!/bin/sh
echo "$*" >> "%(log)s"
[ "$1" = --no-ask-password ] && shift
verb=$1; shift; [ "$1" = -- ] && shift
[ "$verb" = "%(fail)s" ] && { echo "Job for $1 failed." >&2; exit 1; }
[ "$verb" = "%(hang)s" ] && exec sleep 60
rc=0
for unit in "$@"; do
  case $verb in
    stop) echo inactive > "%(state)s/$unit" ;;
    start) echo active > "%(state)s/$unit" ;;
    restart) echo active > "%(state)s/$unit"; grep -qx once "%(state)s/$unit.mute" 2>/dev/null && rm "%(state)s/$unit.mute" ;;
    is-active) s=$(cat "%(state)s/$unit" 2>/dev/null || echo inactive); echo "$s"; [ "$s" = active ] || rc=3 ;;
  esac
done
exit $rc
'''


# DCGM's dcgmi against the host engine of nvidia-dcgm.service: it answers as `dcgmi discovery -l`
# does (NVIDIA/DCGM#229), unless STATE/nvidia-dcgm.service.mute says the host engine does not
# answer ('once': until its unit is restarted; 'always'): then dcgmi waits, as on a host engine
# that accepted the connection and never answers.
DCGMI = r'''#!/bin/sh
echo "$*" >> "%(log)s"
[ -e "%(state)s/nvidia-dcgm.service.mute" ] && exec sleep 60
echo "1 GPU found."
'''


def write_script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


class Host:
    """A /proc of cgroup files, a systemd runtime directory and a systemctl."""

    def __init__(self, tmp_path, fail='', hang='', systemd=True):
        self.proc = tmp_path / 'proc'
        self.log = tmp_path / 'systemctl.log'
        self.state = tmp_path / 'units'
        self.state.mkdir()
        self.systemd_dir = tmp_path / 'run-systemd-system'
        if systemd:
            self.systemd_dir.mkdir()
        self.systemctl = write_script(tmp_path / 'systemctl', SYSTEMCTL % dict(
            log=self.log, state=self.state, fail=fail or 'none', hang=hang or 'none'))
        self.dcgmi_log = tmp_path / 'dcgmi.log'
        self.dcgmi = write_script(tmp_path / 'dcgmi', DCGMI % dict(log=self.dcgmi_log, state=self.state))
        self.cgroup(1, '/init.scope')

    def cgroup(self, pid, path, v1=True):
        """pid in cgroup path: as a cgroup v1 host shows it (name=systemd, and the kernel's unused 0::
        line), or as a v2 host does."""
        directory = self.proc / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        lines = '9:name=systemd:%s\n4:memory:/\n0::/\n' % path if v1 else '0::%s\n' % path
        (directory / 'cgroup').write_text(lines)

    def unit(self, name, state='active'):
        (self.state / name).write_text(state + '\n')

    def calls(self):
        return self.log.read_text().splitlines() if self.log.exists() else []

    def quiesce(self, blocking, patterns=None, deadline=None, own=(), clock=time.monotonic):
        patterns = DEFAULT_STOP_UNITS if patterns is None else patterns
        return Quiesce(blocking, patterns, clock() + 60 if deadline is None else deadline, clock=clock,
                       proc=str(self.proc), own=own, systemctl=self.systemctl, systemd_dir=str(self.systemd_dir),
                       log=lambda message: None, dcgmi=self.dcgmi)


def holder(pid, comm, exe=None):
    return Holder(pid, 1, 0, comm, comm, exe or '/usr/bin/' + comm, 100, 'S', pid, 1, ['/dev/nvidia6'])


class Reset:
    """GpuReset's run: records whether it ran and which units were active then."""

    def __init__(self, host, ok=True, raises=None):
        self.host, self.ok, self.raises = host, ok, raises
        self.reasons = {}
        self.active_during = None

    def run(self, todo):
        self.active_during = sorted(path.name for path in self.host.state.iterdir()
                                    if path.read_text().strip() == 'active')
        if self.raises:
            raise self.raises
        return {'attempted': True, 'gpus': sorted(todo), 'ok': self.ok, 'message': 'reset said so',
                'persistence_mode_off': [], 'persistence_mode_restored': None}


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


# What the restore keeps for DCGM's host engine: asked, restarted once, asked again.
HOST_ENGINE_RESERVE = 2 * HOST_ENGINE_ANSWER_S + HOST_ENGINE_RESTART_S


def dcgm(host):
    """nv-hostengine in nvidia-dcgm.service and dcgm-exporter in nvidia-dcgm-exporter.service,
    both holding GPU 6, and nvidia-powerd in a unit no default allows, holding GPU 0."""
    host.cgroup(201, '/system.slice/nvidia-dcgm.service')
    host.cgroup(202, '/system.slice/nvidia-dcgm-exporter.service')
    host.unit('nvidia-dcgm.service')
    host.unit('nvidia-dcgm-exporter.service')
    return [(holder(201, 'nv-hostengine'), [6]), (holder(202, 'dcgm-exporter'), [6])]


# -- units from cgroups ---------------------------------------------------------------------

def test_the_unit_is_the_first_service_or_scope_of_the_cgroup_path():
    assert unit_of('/system.slice/nvidia-dcgm.service') == 'nvidia-dcgm.service'
    assert unit_of('/nvidia.slice/nvidia-dcgm.service/payload') == 'nvidia-dcgm.service'
    assert unit_of('/user.slice/user-1000.slice/user@1000.service/app.slice/x.service') == 'user@1000.service'
    assert unit_of('/user.slice/user-1000.slice/session-3.scope') == 'session-3.scope'
    assert unit_of('/') is None and unit_of(None) is None


def test_cgroup_v1_reads_systemds_own_hierarchy_not_the_unused_unified_line(host):
    host.cgroup(300, '/system.slice/nvidia-dcgm.service', v1=True)
    assert systemd_unit(300, str(host.proc)) == 'nvidia-dcgm.service'
    host.cgroup(301, '/system.slice/nvsm.service', v1=False)
    assert systemd_unit(301, str(host.proc)) == 'nvsm.service'
    assert systemd_unit(302, str(host.proc)) is None  # gone


def test_a_containers_own_cgroup_prefix_is_taken_off_by_pid_1s_init_scope(host):
    # A container booting systemd on cgroup v1: every path starts with the container's cgroup,
    # whose name may end in .scope (systemd's cgroup driver on the host).
    prefix = '/machine.slice/libpod-0123abcd.scope'
    host.cgroup(1, prefix + '/init.scope')
    host.cgroup(300, prefix + '/system.slice/nvidia-dcgm.service')
    host.cgroup(301, prefix)  # podman exec: the container's root
    assert systemd_unit(300, str(host.proc)) == 'nvidia-dcgm.service'
    assert systemd_unit(301, str(host.proc)) == 'libpod-0123abcd.scope'


def test_only_valid_service_names_are_ever_passed_to_systemctl():
    for name in ('nvidia-dcgm.service', 'getty@tty1.service', 'dev-disk-by\\x2duuid.service', 'a:b_c.service'):
        assert valid_service(name), name
    for name in ('-x.service', '--now.service', 'a b.service', 'a/b.service', 'x.scope', 'x.service\n', '',
                 'x' * 250 + '.service', 'nvidia-dcgm.service;reboot'):
        assert not valid_service(name), name


# -- what may be stopped --------------------------------------------------------------------

def test_the_default_allows_nvidias_dcgm_units_and_plans_to_stop_them(host):
    quiesce = host.quiesce(dcgm(host))
    assert quiesce.units == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service']
    assert quiesce.refusal() is None
    report = quiesce.report()
    assert report['to_stop'] == quiesce.units and report['stopped'] == [] and report['refusal'] is None
    assert [entry['action'] for entry in report['held_by']] == ['stop', 'stop']
    assert host.calls() == []  # planning runs nothing


def test_a_unit_the_list_does_not_allow_leaves_the_reset_unattempted_and_is_named(host):
    blocking = dcgm(host) + [(holder(203, 'nvidia-powerd'), [6])]
    host.cgroup(203, '/system.slice/nvidia-powerd.service')
    quiesce = host.quiesce(blocking)
    refusal = quiesce.refusal()
    assert refusal.startswith('GPU 6 not reset: held by pid 203 (nvidia-powerd, unit nvidia-powerd.service), '
                              'never stopped (reset_stop_units does not allow its unit')
    entry = quiesced_reset(quiesce, Reset(host), [6])
    assert entry['attempted'] is False and entry['ok'] is False and entry['message'] == refusal
    assert host.calls() == []  # nothing stopped, not even the allowed units


def test_an_empty_list_allows_nothing(host):
    quiesce = host.quiesce(dcgm(host), patterns=[])
    assert 'pid 201 (nv-hostengine, unit nvidia-dcgm.service), pid 202 (dcgm-exporter, unit ' \
           'nvidia-dcgm-exporter.service), never stopped' in quiesce.refusal()
    assert quiesce.units == []


def test_globs_match_unit_names(host):
    host.cgroup(204, '/system.slice/nvsm-core.service')
    quiesce = host.quiesce([(holder(204, 'nvsm_core'), [0, 1])])
    assert quiesce.units == ['nvsm-core.service'] and quiesce.refusal() is None
    assert host.quiesce([(holder(204, 'nvsm_core'), [0])], patterns=['nvsm.service']).refusal() is not None


def test_a_holder_in_no_service_is_never_stopped(host):
    host.cgroup(205, '/user.slice/user-0.slice/session-4.scope')
    host.cgroup(206, '/')
    quiesce = host.quiesce([(holder(205, 'nv-hostengine'), [2]), (holder(206, 'dcgm-exporter'), [2])],
                           patterns=['*'])
    assert quiesce.units == []
    assert 'pid 205 (nv-hostengine, unit session-4.scope), pid 206 (dcgm-exporter, unit none), never stopped ' \
           '(it runs in no service that reset_stop_units allows to be stopped' in quiesce.refusal()


def test_the_unit_the_release_runs_in_is_never_stopped(host):
    # A Slurm hook run by slurmd: stopping slurmd.service would stop the release itself.
    host.cgroup(207, '/system.slice/slurmd.service')
    host.cgroup(4000, '/system.slice/slurmd.service')
    quiesce = host.quiesce([(holder(207, 'nv-hostengine'), [1])], patterns=['*'], own=[4000, 1])
    assert quiesce.units == [] and 'the release itself runs there' in quiesce.refusal()


def test_a_unit_name_that_is_no_service_name_is_refused_and_escaped(host):
    host.cgroup(208, '/system.slice/-\x1b[2Jevil.service')
    refusal = host.quiesce([(holder(208, 'nv-hostengine'), [0])], patterns=['*']).refusal()
    assert 'unit -\\x1b[2Jevil.service' in refusal and '\x1b' not in refusal
    assert 'its unit is no valid systemd service name' in refusal


def test_persistenced_and_the_fabric_manager_hand_the_gpu_over_themselves(host):
    host.cgroup(209, '/system.slice/nvidia-persistenced.service')
    host.cgroup(210, '/system.slice/nvidia-fabricmanager.service')
    quiesce = host.quiesce([(holder(209, 'nvidia-persistenced'), [6]), (holder(210, 'nvidia-fabricmanager'), [6])])
    assert quiesce.blockers == [] and quiesce.units == [] and quiesce.refusal() is None


def test_no_systemd_no_stop(tmp_path):
    host = Host(tmp_path, systemd=False)
    entry = quiesced_reset(host.quiesce(dcgm(host)), Reset(host), [6])
    assert entry['attempted'] is False and host.calls() == []
    assert 'nvidia-dcgm.service, nvidia-dcgm-exporter.service must be stopped for it, but systemd does not run ' \
           'this host (no %s); nothing was stopped' % host.systemd_dir in entry['message']


def test_no_systemctl_no_stop(host, monkeypatch):
    monkeypatch.setenv('PATH', str(host.proc))
    quiesce = Quiesce(dcgm(host), DEFAULT_STOP_UNITS, time.monotonic() + 30, proc=str(host.proc),
                      systemd_dir=str(host.systemd_dir), log=lambda message: None)
    assert 'but systemctl is not on PATH; nothing was stopped' in quiesce.refusal()


# -- stopping and starting ----------------------------------------------------------------------

def test_the_units_are_stopped_for_the_reset_and_started_again(host):
    reset = Reset(host)
    entry = quiesced_reset(host.quiesce(dcgm(host)), reset, [6])
    assert entry['ok'] is True and entry['message'] == 'reset said so'
    assert reset.active_during == []  # both stopped while the reset ran
    assert host.calls() == [
        '--no-ask-password stop -- nvidia-dcgm.service',
        '--no-ask-password stop -- nvidia-dcgm-exporter.service',
        '--no-ask-password start -- nvidia-dcgm.service nvidia-dcgm-exporter.service',
        '--no-ask-password is-active -- nvidia-dcgm.service nvidia-dcgm-exporter.service',
    ]
    quiesced = entry['quiesced']
    assert quiesced['stopped'] == quiesced['started'] == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service']
    assert quiesced['active_after'] == {'nvidia-dcgm.service': 'active', 'nvidia-dcgm-exporter.service': 'active'}
    assert quiesced['problems'] == [] and quiesced['mps_quit'] is False


def test_a_unit_held_by_two_processes_is_stopped_once(host):
    host.cgroup(211, '/system.slice/nvidia-dcgm.service')
    blocking = dcgm(host) + [(holder(211, 'nv-hostengine'), [5])]
    assert host.quiesce(blocking).units == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service']


def test_the_units_are_started_again_when_the_reset_fails(host):
    entry = quiesced_reset(host.quiesce(dcgm(host)), Reset(host, ok=False), [6])
    assert entry['ok'] is False
    assert entry['quiesced']['started'] == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service']
    assert (host.state / 'nvidia-dcgm.service').read_text().strip() == 'active'


def test_the_units_are_started_again_when_the_reset_raises(host):
    quiesce = host.quiesce(dcgm(host))
    with pytest.raises(RuntimeError):
        quiesced_reset(quiesce, Reset(host, raises=RuntimeError('interrupted')), [6])
    assert quiesce.started == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service']
    assert host.calls()[-2].startswith('--no-ask-password start -- ')


def test_a_stop_that_fails_leaves_the_reset_unattempted_and_starts_again_what_was_stopped(tmp_path):
    host = Host(tmp_path, fail='stop')
    reset = Reset(host)
    entry = quiesced_reset(host.quiesce(dcgm(host)), reset, [6])
    assert reset.active_during is None and entry['attempted'] is False and entry['ok'] is False
    assert 'GPU 6 not reset: systemctl stop nvidia-dcgm.service failed (exit 1): Job for nvidia-dcgm.service ' \
           'failed.' in entry['message']
    # Only the first unit was asked to stop: only it is started again.
    assert entry['quiesced']['stopped'] == ['nvidia-dcgm.service']
    assert host.calls()[1:] == ['--no-ask-password start -- nvidia-dcgm.service',
                                '--no-ask-password is-active -- nvidia-dcgm.service']


def test_a_start_that_fails_is_reported_with_the_state_after(tmp_path):
    host = Host(tmp_path, fail='start')
    entry = quiesced_reset(host.quiesce(dcgm(host)), Reset(host), [6])
    quiesced = entry['quiesced']
    assert entry['ok'] is True  # the GPUs were reset; the services are another matter, said here
    assert quiesced['started'] == [] and quiesced['active_after']['nvidia-dcgm.service'] == 'inactive'
    assert 'systemctl start nvidia-dcgm.service, nvidia-dcgm-exporter.service failed (exit 1)' in quiesced['problems'][0]
    assert 'nvidia-dcgm.service is inactive after the reset, not active' in quiesced['problems']
    assert 'nvidia-dcgm.service is inactive after the reset' in entry['message']


# -- DCGM's host engine after the restore -----------------------------------------------------

def restarts(host):
    return [call for call in host.calls() if ' restart ' in call]


def test_a_host_engine_that_answers_is_asked_once_and_left_alone(host):
    entry = quiesced_reset(host.quiesce(dcgm(host)), Reset(host), [6])
    assert entry['quiesced']['host_engines'] == [
        {'unit': 'nvidia-dcgm.service', 'answers': True, 'restarted': False, 'said': None}]
    assert host.dcgmi_log.read_text().splitlines() == ['discovery -l'] and restarts(host) == []


def test_a_host_engine_that_does_not_answer_is_restarted_once_and_named(host, monkeypatch):
    # Its dcgmi waits 60 s: the check gives up after 1, restarts the unit, and asks again.
    monkeypatch.setattr(_quiesce, 'HOST_ENGINE_ANSWER_S', 1.0)
    blocking = dcgm(host)
    (host.state / 'nvidia-dcgm.service.mute').write_text('once\n')
    entry = quiesced_reset(host.quiesce(blocking), Reset(host), [6])
    quiesced = entry['quiesced']
    assert restarts(host) == ['--no-ask-password restart -- nvidia-dcgm.service']
    assert quiesced['host_engines'] == [{'unit': 'nvidia-dcgm.service', 'answers': True, 'restarted': True, 'said': None}]
    assert quiesced['problems'] == [] and entry['ok'] is True
    assert host.dcgmi_log.read_text().splitlines() == ['discovery -l', 'discovery -l']


def test_a_host_engine_still_silent_after_its_restart_is_a_problem_in_the_message(host, monkeypatch):
    monkeypatch.setattr(_quiesce, 'HOST_ENGINE_ANSWER_S', 1.0)
    blocking = dcgm(host)
    (host.state / 'nvidia-dcgm.service.mute').write_text('always\n')
    entry = quiesced_reset(host.quiesce(blocking), Reset(host), [6])
    engine = entry['quiesced']['host_engines'][0]
    assert engine['answers'] is False and engine['restarted'] is True
    assert re.search(r'dcgmi discovery -l did not answer within [0-9.]+ s and was killed', engine['said']), engine
    assert restarts(host) == ['--no-ask-password restart -- nvidia-dcgm.service']  # once, never again
    assert 'the DCGM host engine of nvidia-dcgm.service does not answer dcgmi discovery -l after the GPU reset, ' \
           'and restarted once still does not' in entry['message']


def test_without_dcgmi_the_host_engine_is_not_checked_and_that_is_said(host):
    host.dcgmi = 'gpuops-no-such-dcgmi'
    entry = quiesced_reset(host.quiesce(dcgm(host)), Reset(host), [6])
    assert entry['quiesced']['host_engines'] == [{'unit': 'nvidia-dcgm.service', 'answers': None, 'restarted': False,
                                                  'said': 'not checked: gpuops-no-such-dcgmi is not on PATH'}]
    assert restarts(host) == [] and entry['quiesced']['problems'] == []


def test_a_host_engine_is_found_by_its_unit_name_or_by_the_program_in_it(host):
    host.cgroup(220, '/system.slice/dcgm.service')
    host.cgroup(221, '/system.slice/hostengine-site.service')
    host.unit('dcgm.service')
    host.unit('hostengine-site.service')
    quiesce = host.quiesce([(holder(220, 'dcgm'), [0]), (holder(221, 'nv-hostengine'), [0])], patterns=['*'])
    quiesced_reset(quiesce, Reset(host), [0])
    assert [engine['unit'] for engine in quiesce.host_engines] == ['dcgm.service', 'hostengine-site.service']


def test_only_a_stopped_host_engine_adds_its_check_to_the_restores_reserve(host):
    host.cgroup(202, '/system.slice/nvidia-dcgm-exporter.service')
    exporter = host.quiesce([(holder(202, 'dcgm-exporter'), [6])])
    assert exporter.restore_reserve() == RESTART_MIN_S + ACTIVE_CHECK_S
    assert host.quiesce(dcgm(host)).restore_reserve() == RESTART_MIN_S + ACTIVE_CHECK_S + HOST_ENGINE_RESERVE


def test_a_hung_stop_is_bounded_by_the_deadline(tmp_path):
    host = Host(tmp_path, hang='stop')
    started = time.monotonic()
    reserve = RESTART_MIN_S + ACTIVE_CHECK_S + HOST_ENGINE_RESERVE  # the restore's, kept out of the stops' time
    entry = quiesced_reset(host.quiesce(dcgm(host), deadline=started + reserve + 3), Reset(host), [6])
    assert time.monotonic() - started < 10  # the start after it answers at once
    assert entry['attempted'] is False and re.search(r'did not answer within [0-9.]+ s and was killed', entry['message'])
    assert entry['quiesced']['started'] == ['nvidia-dcgm.service']


def test_the_units_are_started_again_past_the_deadline(host):
    # The reset used up the time: starting the units again is still given its few seconds.
    clock = FakeClock()
    entry = quiesced_reset(host.quiesce(dcgm(host), deadline=clock() + 60, clock=clock), SlowReset(host, clock, 61), [6])
    assert entry['quiesced']['started'] == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service']


def test_a_reset_that_cannot_leave_the_restores_reserve_is_not_started(host):
    # 10 s left, and starting two units again (and asking the host engine) may take 40: nothing is
    # stopped, and the reason says so.
    clock = FakeClock()
    quiesce = host.quiesce(dcgm(host), deadline=clock() + 10, clock=clock)
    assert quiesce.restore_reserve() == RESTART_MIN_S + ACTIVE_CHECK_S + HOST_ENGINE_RESERVE
    reset = Reset(host)
    entry = quiesced_reset(quiesce, reset, [6])
    assert reset.active_during is None and entry['attempted'] is False and host.calls() == []
    assert entry['message'] == (
        'GPU 6 not reset: nvidia-dcgm.service, nvidia-dcgm-exporter.service would be stopped for it, and starting '
        'them again may take 40 s, which leaves less than the 2.0 s a reset needs of the 10.0 s left of the '
        'timeout; nothing was stopped (a longer timeout leaves the time)')
    assert entry['quiesced']['refusal'] == entry['message'] and entry['quiesced']['stopped'] == []


def test_nothing_is_reserved_when_no_unit_is_stopped(tmp_path, mps_daemon):
    daemon, log, proc = mps_holder(tmp_path, mps_daemon)
    quiesce = Quiesce([(daemon, [0])], DEFAULT_STOP_UNITS, time.monotonic() + 1, proc=proc, log=lambda message: None)
    assert quiesce.restore_reserve() == 0 and quiesce.time_refusal() is None


class DeadlineReset(Reset):
    """GpuReset's contract: its calls end by the deadline it was given, a slow one right at it."""

    def __init__(self, host, deadline):
        super(DeadlineReset, self).__init__(host)
        self.deadline = deadline

    def run(self, todo):
        entry = super(DeadlineReset, self).run(todo)
        time.sleep(max(self.deadline - time.monotonic(), 0))
        return entry


def test_a_unit_restore_outlives_a_slow_reset_within_the_deadline(tmp_path, monkeypatch):
    # The reset takes all the time it is given; starting the units again takes 4 s. The reset is
    # given the deadline less the restore's reserve, so the units are active by the deadline (the
    # reset given the whole deadline would leave them starting 4 s past it).
    monkeypatch.setattr(_quiesce, 'RESTART_MIN_S', 6.0)
    monkeypatch.setattr(_quiesce, 'ACTIVE_CHECK_S', 2.0)
    monkeypatch.setattr(_quiesce, 'HOST_ENGINE_ANSWER_S', 1.0)
    monkeypatch.setattr(_quiesce, 'HOST_ENGINE_RESTART_S', 1.0)
    host = Host(tmp_path)
    text = open(host.systemctl).read().replace('verb=$1; shift;', 'verb=$1; shift; [ "$verb" = start ] && sleep 4;')
    write_script(tmp_path / 'systemctl', text)
    quiesce = host.quiesce(dcgm(host), deadline=time.monotonic() + 11 + 3)
    assert quiesce.work_deadline() == quiesce.deadline - 11
    entry = quiesced_reset(quiesce, DeadlineReset(host, quiesce.work_deadline()), [6])
    finished = time.monotonic()
    assert entry['quiesced']['started'] == ['nvidia-dcgm.service', 'nvidia-dcgm-exporter.service'], entry
    assert finished <= quiesce.deadline + 1, finished - quiesce.deadline


# The release as a program: quiesced_reset under sigterm_raises, a reset that hangs; what it printed.
TERMINATED = r'''
import sys, time
sys.path[:0] = %(path)r
from test__quiesce import Host, dcgm, Reset
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.quiesce import quiesced_reset
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Terminated, sigterm_raises
import pathlib
host = Host.__new__(Host)
host.proc, host.log, host.state = pathlib.Path(%(proc)r), pathlib.Path(%(log)s), pathlib.Path(%(state)r)
host.systemctl, host.systemd_dir, host.dcgmi = %(systemctl)r, pathlib.Path(%(systemd)r), %(dcgmi)r

class Hang(Reset):
    def run(self, todo):
        super(Hang, self).run(todo)
        print('resetting', flush=True)
        time.sleep(120)

try:
    with sigterm_raises():
        quiesced_reset(host.quiesce(dcgm(host), deadline=time.monotonic() + 300), Hang(host), [6])
except Terminated as exc:
    print('exited: %%s' %% exc, flush=True)
'''


def test_sigterm_during_a_reset_starts_the_units_again_before_the_exit(tmp_path):
    # SIGTERM, as the hook sends it at its deadline, raises in the release: its finally starts the
    # units again (a start that takes 2 s, and a second SIGTERM meanwhile, do not cut it short).
    host = Host(tmp_path)
    text = open(host.systemctl).read().replace('verb=$1; shift;', 'verb=$1; shift; [ "$verb" = start ] && sleep 2;')
    write_script(tmp_path / 'systemctl', text)
    dcgm(host)
    script = TERMINATED % dict(path=[p for p in sys.path if p], proc=str(host.proc), log=repr(str(host.log)),
                               state=str(host.state), systemctl=host.systemctl, systemd=str(host.systemd_dir),
                               dcgmi=host.dcgmi)
    proc = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(__file__))
    try:
        assert proc.stdout.readline() == 'resetting\n'
        assert (host.state / 'nvidia-dcgm.service').read_text().strip() == 'inactive'
        proc.send_signal(signal.SIGTERM)
        for dummy in range(100):  # the start has begun: a second SIGTERM must not cut it short
            if any(call.startswith('--no-ask-password start') for call in host.calls()):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, dummy = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out == 'exited: stopped by SIGTERM\n' and proc.returncode == 0
    assert [(host.state / unit).read_text().strip() for unit in ('nvidia-dcgm.service', 'nvidia-dcgm-exporter.service')] \
        == ['active', 'active']
    assert host.calls()[-1] == '--no-ask-password is-active -- nvidia-dcgm.service nvidia-dcgm-exporter.service'


class FakeClock:
    """A monotonic clock that moves only when a test moves it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class SlowReset(Reset):
    """A reset that takes seconds on clock."""

    def __init__(self, host, clock, seconds):
        super(SlowReset, self).__init__(host)
        self.clock, self.seconds = clock, seconds

    def run(self, todo):
        self.clock.now += self.seconds
        return super(SlowReset, self).run(todo)


# -- the MPS control daemon -----------------------------------------------------------------

MPS = r'''#!/bin/sh
read -r command
echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "%(log)s"
[ "$command" = quit ] && kill "%(pid)s"
'''


@pytest.fixture
def mps_daemon(tmp_path):
    """A process standing in for the MPS control daemon, started with a pipe directory of its own."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / 'mps-pipes'))
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env)
    yield proc
    proc.kill()
    proc.wait()


def mps_holder(tmp_path, proc, script=MPS):
    """(holder, log, proc dir): the daemon as a holder, the log of the fake nvidia-cuda-mps-control,
    and a /proc in which it runs in no service (its stat, cmdline and environ are the real ones)."""
    info = read_process(proc.pid)
    log = tmp_path / 'mps.log'
    exe = write_script(tmp_path / MPS_CONTROL, script % dict(log=log, pid=proc.pid))
    fake = tmp_path / 'proc' / str(proc.pid)
    fake.mkdir(parents=True)
    (fake / 'cgroup').write_text('0::/\n')
    for name in ('stat', 'cmdline', 'environ'):
        os.symlink('/proc/%d/%s' % (proc.pid, name), str(fake / name))
    # What runs, as /proc/PID/exe names it: the fake nvidia-cuda-mps-control.
    os.symlink(str(exe), str(fake / 'exe'))
    return Holder(proc.pid, info.ppid, info.uid, MPS_CONTROL, MPS_CONTROL, exe, info.starttime, 'S', 0, 1,
                  ['/dev/nvidia0']), log, str(tmp_path / 'proc')


def test_the_mps_control_daemon_outside_a_service_is_asked_to_quit_in_its_own_pipe_directory(tmp_path, mps_daemon):
    daemon, log, proc = mps_holder(tmp_path, mps_daemon)
    quiesce = Quiesce([(daemon, [0])], DEFAULT_STOP_UNITS, time.monotonic() + 10, proc=proc, log=lambda message: None)
    assert quiesce.blockers[0].action == 'quit' and quiesce.refusal() is None
    entry = quiesced_reset(quiesce, _NoUnits(), [0])
    assert entry['ok'] is True and entry['quiesced']['mps_quit'] is True and entry['quiesced']['stopped'] == []
    assert log.read_text() == 'quit %s\n' % (tmp_path / 'mps-pipes')
    assert mps_daemon.wait(timeout=5) is not None


class _NoUnits:
    reasons = {}

    def run(self, todo):
        return {'attempted': True, 'gpus': sorted(todo), 'ok': True, 'message': 'reset',
                'persistence_mode_off': [], 'persistence_mode_restored': None}


def test_the_mps_control_daemon_is_left_alone_unless_the_list_names_it(tmp_path, mps_daemon):
    daemon, log, proc = mps_holder(tmp_path, mps_daemon)
    quiesce = Quiesce([(daemon, [0])], ['nvidia-dcgm.service'], time.monotonic() + 10, proc=proc,
                      log=lambda message: None)
    assert 'unit none), never stopped' in quiesce.refusal()
    assert quiesced_reset(quiesce, _NoUnits(), [0])['attempted'] is False
    assert not log.exists() and mps_daemon.poll() is None


def test_an_mps_control_daemon_that_does_not_quit_leaves_the_reset_unattempted(tmp_path, mps_daemon):
    daemon, log, proc = mps_holder(tmp_path, mps_daemon, script='#!/bin/sh\nread -r command\necho "$command" >> "%(log)s"\n')
    quiesce = Quiesce([(daemon, [0])], [MPS_CONTROL], time.monotonic() + 2, proc=proc, log=lambda message: None)
    entry = quiesced_reset(quiesce, _NoUnits(), [0])
    assert entry['attempted'] is False and entry['quiesced']['mps_quit'] is False
    assert 'the MPS control daemon (pid %d) did not exit after quit within the timeout' % mps_daemon.pid in entry['message']


def test_a_daemon_whose_path_names_another_file_now_is_not_run_from_that_path(tmp_path, mps_daemon, monkeypatch):
    # The file at the daemon's path was swapped after it started: that path is not run as root;
    # nvidia-cuda-mps-control is looked up on PATH instead (none here).
    daemon, log, proc = mps_holder(tmp_path, mps_daemon)
    running = tmp_path / 'running'
    running.write_text('')
    link = os.path.join(proc, str(daemon.pid), 'exe')
    os.unlink(link)
    os.symlink(str(running), link)
    monkeypatch.setenv('PATH', str(tmp_path / 'empty'))
    quiesce = Quiesce([(daemon, [0])], DEFAULT_STOP_UNITS, time.monotonic() + 10, proc=proc, log=lambda message: None)
    entry = quiesced_reset(quiesce, _NoUnits(), [0])
    assert entry['attempted'] is False and 'nvidia-cuda-mps-control not found' in entry['message'], entry
    assert not log.exists() and mps_daemon.poll() is None


def test_the_mps_program_checked_is_the_one_run_though_a_user_swaps_its_directory(mps_daemon, monkeypatch):
    # The program sits below a directory that nobody (another user) can write: between the check
    # and the exec (the hook below), nobody swaps its directory for one with a program of theirs.
    # The file checked, held open, is the one that runs.
    try:
        nobody = pwd.getpwnam('nobody')
    except KeyError:
        pytest.skip('no user nobody')
    if os.geteuid() != 0:
        pytest.skip('needs root: the program must belong to root and another user swap its directory')
    top = tempfile.mkdtemp(prefix='gpuops-mps-')
    try:
        os.chmod(top, 0o711)  # private, but nobody can pass through
        high = os.path.join(top, 'high')
        os.mkdir(high)
        os.chown(high, nobody.pw_uid, nobody.pw_gid)
        os.mkdir(os.path.join(high, 'bin'), 0o755)
        log = os.path.join(top, 'mps.log')
        exe = os.path.join(high, 'bin', MPS_CONTROL)
        with open(exe, 'w') as handle:
            handle.write(MPS % dict(log=log, pid=mps_daemon.pid))
        os.chmod(exe, 0o755)
        daemon, dummy, proc = mps_holder(pathlib.Path(top), mps_daemon)
        os.unlink(os.path.join(proc, str(daemon.pid), 'exe'))
        os.symlink(exe, os.path.join(proc, str(daemon.pid), 'exe'))
        daemon.exe = exe
        swap = ('mv {high}/bin {high}/old && mkdir {high}/bin && printf "#!/bin/sh\\ntouch {high}/swapped-ran\\n" > '
                '{high}/bin/{name} && chmod 755 {high}/bin/{name}').format(high=high, name=MPS_CONTROL)

        class SwappingRunner(_quiesce.Runner):
            def run(self, *args, **kwargs):
                subprocess.run(['/bin/sh', '-c', swap], user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
                               check=True)
                return super(SwappingRunner, self).run(*args, **kwargs)

        monkeypatch.setattr(_quiesce, 'Runner', SwappingRunner)
        quiesce = Quiesce([(daemon, [0])], DEFAULT_STOP_UNITS, time.monotonic() + 10, proc=proc, log=lambda message: None)
        entry = quiesced_reset(quiesce, _NoUnits(), [0])
        assert os.stat(os.path.join(high, 'bin', MPS_CONTROL)).st_uid == nobody.pw_uid  # swapped indeed
        assert not os.path.exists(os.path.join(high, 'swapped-ran'))
        assert open(log).read().startswith('quit ')  # the program checked ran
        assert entry['ok'] is True and entry['quiesced']['mps_quit'] is True, entry
    finally:
        shutil.rmtree(top)


def test_an_mps_program_others_can_write_is_not_run(tmp_path, mps_daemon, monkeypatch):
    daemon, log, proc = mps_holder(tmp_path, mps_daemon)
    os.chmod(daemon.exe, 0o777)
    monkeypatch.setenv('PATH', str(tmp_path / 'empty'))
    entry = quiesced_reset(Quiesce([(daemon, [0])], DEFAULT_STOP_UNITS, time.monotonic() + 10, proc=proc,
                                   log=lambda message: None), _NoUnits(), [0])
    assert entry['attempted'] is False and 'nvidia-cuda-mps-control not found on PATH' in entry['message'], entry
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    os.symlink(daemon.exe, str(bin_dir / MPS_CONTROL))
    monkeypatch.setenv('PATH', str(bin_dir))
    entry = quiesced_reset(Quiesce([(daemon, [0])], DEFAULT_STOP_UNITS, time.monotonic() + 10, proc=proc,
                                   log=lambda message: None), _NoUnits(), [0])
    assert 'not run: it can be written by others (mode 0777)' in entry['message'], entry
    assert not log.exists() and mps_daemon.poll() is None
