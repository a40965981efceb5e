# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._settings import convert, settings_problems
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX, defaults


def role_name(option):
    return PREFIX + option


@pytest.mark.parametrize('name, value, expected', [
    ('timeout', '5s', "gpu_reset_timeout is '5s', expected a number"),
    ('memory_threshold_mib', '1.5', "gpu_reset_memory_threshold_mib is '1.5', expected a whole number"),
    ('backend', 'nvml2', "gpu_reset_backend is 'nvml2', expected one of auto, nvml, nvidia-smi"),
    ('gpus', {'gpu': 0}, "gpu_reset_gpus is {'gpu': 0}, expected a list"),
    ('allow_gpu_reset', 'maybe', "gpu_reset_allow_gpu_reset is 'maybe', expected true or false"),
    ('drain_command', {'argv': 'x'}, "gpu_reset_drain_command is {'argv': 'x'}, expected a list of strings"),
    ('slow_gpu_policy', 'drain', "gpu_reset_slow_gpu_policy is 'drain', expected one of report, hold"),
    ('probe_level', 'bandwidth', "gpu_reset_probe_level is 'bandwidth', expected one of allocation, memory, performance"),
])
def test_a_wrong_value_is_named_with_what_it_must_be(name, value, expected):
    assert convert({name: value}, role_name)[1] == [expected]


@pytest.mark.parametrize('name, value, given', [
    ('signals', '[KILLX]', '{"gpu_reset_signals": ["KILLX"]}'),
    ('signals', '[TERM, "KILL"]', '{"gpu_reset_signals": ["TERM", "KILL"]}'),
    ('gpus', ' [0,2] ', '{"gpu_reset_gpus": [0, 2]}'),
    ('extra_protect', "['my daemon']", '{"gpu_reset_extra_protect": ["my daemon"]}'),
])
def test_a_list_given_as_text_in_brackets_is_told_how_to_give_it(name, value, given):
    """-e gpu_reset_signals=[KILLX] gives the text '[KILLX]': said so, with the JSON that gives the
    list (also where Ansible's own reading of the text would pass, as a list of one text)."""
    said = '%s is %r, a text that looks like a list: on the command line a list is given as JSON, -e %s' % (
        role_name(name), value, "'%s'" % given)
    assert settings_problems({name: value}, role_name)[1] == [said]


@pytest.mark.parametrize('name, value, expected', [
    ('timeout', '5', 5.0),            # -e gives text; Ansible converts it
    ('timeout', 2.5, 2.5),
    ('allow_gpu_reset', 'yes', True),
    ('gpus', '0,2', ['0', '2']),       # a list given as text, as Ansible splits it (the release's rules read '0' as GPU 0)
    ('gpus', None, None),              # not set
    ('timeout', None, 60),             # not set: the default
])
def test_what_ansible_accepts_is_converted_as_ansible_does(name, value, expected):
    options, found = convert({name: value})
    assert found == [] and options[name] == expected


def test_what_is_not_given_takes_its_default():
    options, found = convert({})
    assert found == [] and options == defaults()


def test_a_wrong_type_ends_the_check_before_the_release_rules():
    # The release's rules would add a second text about the same value.
    assert settings_problems({'timeout': '5s'}, role_name)[1] == ["gpu_reset_timeout is '5s', expected a number"]


@pytest.mark.parametrize('settings, problem', [
    (dict(timeout=0), 'gpu_reset_timeout must be more than 0 seconds, got 0'),
    (dict(timeout='nan'), 'gpu_reset_timeout must be a finite number of seconds, got nan'),
    (dict(timeout=float('inf')), 'got inf'),
    (dict(timeout=2147484), 'gpu_reset_timeout must be at most 2147483 seconds'),
    (dict(timeout='soon'), "gpu_reset_timeout is 'soon', expected a number"),
    (dict(grace_period=-1), 'gpu_reset_grace_period must be zero or more, got -1'),
    (dict(grace_period=60, signals=['TERM', 'KILL']), 'gpu_reset_signals [TERM, KILL] with grace_period 60.0 s'),
    (dict(memory_threshold_mib=-1), 'gpu_reset_memory_threshold_mib must be between 0 and 16384 MiB'),
    (dict(signals=[]), 'gpu_reset_signals must name at least one signal'),
    (dict(signals=['STOP']), 'gpu_reset_signals: '),
    (dict(devices=[]), 'gpu_reset_devices must name at least one device node glob'),
    (dict(devices=['nvidia*']), "gpu_reset_devices: 'nvidia*' is not an absolute path"),
    (dict(gpus=[]), 'gpu_reset_gpus: name at least one GPU index'),
    (dict(gpus=['two']), "gpu_reset_gpus: 'two' is not a GPU index, N:G (GPU N, its GPU instance G), N:G:C"),
    (dict(gpus=['0:x']), "gpu_reset_gpus: '0:x' is not a GPU index"),
    (dict(gpus=['MIG']), "gpu_reset_gpus: 'MIG' is not a GPU index"),
    (dict(clean_query='  '), 'gpu_reset_clean_query must be a JMESPath expression or null, it is empty'),
    (dict(on_failure='drain', drain_command=[]), 'gpu_reset_drain_command is empty'),
    (dict(timeout=1), 'gpu_reset_timeout must be at least 2.0 s'),
    # The rules of the reset's escalation and of the probe, on the controller too: a host is never
    # released, then failed (and drained) for a setting.
    (dict(probe_mib=0), 'gpu_reset_probe_mib must be 1 or more, got 0'),
    (dict(probe_slow_fraction=0), 'gpu_reset_probe_slow_fraction must be more than 0 and at most 0.9'),
    (dict(probe_slow_fraction=0.95), 'gpu_reset_probe_slow_fraction must be more than 0 and at most 0.9'),
    (dict(stop_units=['*']), "gpu_reset_stop_units: '*' is no systemd unit name or glob of one"),
    (dict(stop_units=['a b.service']), "gpu_reset_stop_units: 'a b.service' is no systemd unit name"),
    (dict(bug_report_dir='evidence'), "gpu_reset_bug_report_dir: 'evidence' is not an absolute path"),
    (dict(bug_report_timeout=0), 'gpu_reset_bug_report_timeout must be more than 0 seconds, got 0'),
    (dict(max_drained='10 %'), "gpu_reset_max_drained: '10 %' is neither a number of nodes nor a percentage (N%)"),
    (dict(max_drained='-1'), "gpu_reset_max_drained: '-1' is neither a number of nodes nor a percentage (N%)"),
])
def test_each_problem_is_named_once(settings, problem):
    good = dict(timeout=60, grace_period=5, memory_threshold_mib=32, signals=['TERM'], devices=['/dev/nvidia*'],
                gpus=None, clean_query=None, on_failure='fail', drain_command=['true'])
    assert settings_problems(good, role_name)[1] == []
    # Extra variables (-e) arrive as text.
    options, found = settings_problems(dict(good, timeout='60', memory_threshold_mib='32', gpus=['1']), role_name)
    assert found == [] and options['gpus'] == [1]
    assert settings_problems(dict(good, gpus=[0, '1', '2:07', ' 2:3:0 ', 'MIG-5c4e1b4a-21b1-5a0c-9c6f-1f6bdfbd2d85']),
                             role_name)[1] == []
    found = settings_problems(dict(good, **settings), role_name)[1]
    assert len(found) == 1 and problem in found[0]


def test_a_malformed_job_is_refused_on_the_controller_naming_the_variable():
    found = settings_problems({'job': {'id': '5; reboot', 'shared_gpus': [0]}}, role_name)[1]
    assert found == ["gpu_reset_job.id must be a Slurm job id (digits), got '5; reboot'"]
    assert settings_problems({'job': {'id': '5', 'uid': 0, 'shared_gpus': [0], 'live_jobs': {'6': [1234]}}},
                             role_name)[1] == []
