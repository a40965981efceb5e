# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The sequence's last step (plugin_utils/_finish.py): drain a host that is not clean, write its
node_exporter metrics and its report; through the Slurm hook's host (the node itself) and its runs
on simulated hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import stat
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _finish, _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook import reset as _hook_reset
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.vars import load_settings
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX


def failed_run(check_mode=False, error='GPU 2 lost or unreadable', **settings):
    """A run of gpu07 judged failed with error, its settings the hook's defaults and settings
    (gpu_reset_* names), checked as the sequence checks them."""
    given = load_settings(None, dict({PREFIX + 'on_failure': 'drain'}, **settings))
    run = _sequence.Run('gpu07', dict((name[len(PREFIX):], value) for name, value in given.items()), None,
                        check_mode=check_mode)
    _sequence.check_settings(run)
    run.error = run.error or error
    _sequence.judge(run)
    return run


@pytest.fixture
def scontrol(tmp_path):
    """A drain command that writes down its arguments: (its path, the calls so far)."""
    path = tmp_path / 'scontrol'
    calls = tmp_path / 'calls.jsonl'
    path.write_text('#!%s\nimport json, sys\nopen(%r, "a").write(json.dumps(sys.argv[1:]) + "\\n")\n'
                    % (sys.executable, str(calls)))
    path.chmod(0o755)
    return str(path), lambda: [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_a_failed_host_is_drained_and_its_metrics_and_report_are_written(tmp_path, scontrol):
    command, calls = scontrol
    run = failed_run(gpu_reset_textfile_dir=str(tmp_path / 'textfile'), gpu_reset_report_dir=str(tmp_path / 'reports'))
    (tmp_path / 'textfile').mkdir()
    report = _finish.finish(run, _hook_reset.NodeHost, lambda report, seconds: _finish.run_drain(
        report, _hook_reset.NodeHost, [command, 'update', 'nodename=gpu07', 'state=drain'], seconds))
    assert (report['outcome'], report['reason'], report['drained']) == ('failed', 'GPU 2 lost or unreadable', True)
    assert calls() == [['update', 'nodename=gpu07', 'state=drain']]
    metrics = tmp_path / 'textfile' / _finish.METRICS_FILE
    assert 'gpu_reset_success 0' in metrics.read_text().splitlines()
    assert stat.S_IMODE(os.stat(str(metrics)).st_mode) == 0o644
    assert json.loads((tmp_path / 'reports' / 'gpu07.json').read_text()) == report
    # Each file replaced at once: no temporary file is left beside it.
    assert os.listdir(str(tmp_path / 'textfile')) == [_finish.METRICS_FILE]
    assert os.listdir(str(tmp_path / 'reports')) == ['gpu07.json']


@pytest.mark.parametrize('argv, why', [
    (['/bin/sh', '-c', 'echo "Invalid node name specified" >&2; exit 1'], 'Invalid node name specified'),
    (['/bin/sh', '-c', 'exit 3'], 'rc 3'),
    (['/nonexistent/scontrol', 'update'], "scontrol not found or not executable at '/nonexistent/scontrol'"),
])
def test_a_drain_command_that_fails_is_said_in_the_reason(argv, why):
    report = _finish.run_drain({'reason': 'GPU 2 lost'}, _hook_reset.NodeHost, argv, 5)
    assert report == {'reason': 'GPU 2 lost; the drain command failed: %s' % why, 'drained': False}


def test_in_check_mode_nothing_is_drained_or_measured_but_the_report_says_so(tmp_path):
    (tmp_path / 'textfile').mkdir()
    run = failed_run(check_mode=True, gpu_reset_textfile_dir=str(tmp_path / 'textfile'),
                     gpu_reset_report_dir=str(tmp_path / 'reports'))
    drains = []
    report = _finish.finish(run, _hook_reset.NodeHost, lambda report, seconds: drains.append(seconds))
    assert drains == [] and report['would_drain'] is True and report['drained'] is False
    assert os.listdir(str(tmp_path / 'textfile')) == []
    assert json.loads((tmp_path / 'reports' / 'gpu07.json').read_text())['would_drain'] is True


@pytest.mark.parametrize('drain_misconfigured', [False, True])
def test_a_misconfigured_host_is_drained_only_where_asked(drain_misconfigured):
    run = failed_run(gpu_reset_timeout=0)
    assert run.misconfigured and run.report['outcome'] == 'failed'
    drains = []
    _finish.finish(run, _hook_reset.NodeHost, lambda report, seconds: drains.append(seconds),
                   drain_misconfigured=drain_misconfigured)
    assert drains == ([run.options['drain_timeout']] if drain_misconfigured else [])


def test_metrics_that_cannot_be_written_fail_the_host_saying_why(tmp_path):
    (tmp_path / 'textfile').write_text('a file, not a directory\n')
    run = failed_run(gpu_reset_on_failure='fail', gpu_reset_textfile_dir=str(tmp_path / 'textfile'))
    report = _finish.finish(run, _hook_reset.NodeHost, None)
    assert report['outcome'] == 'failed'
    assert report['reason'].startswith('GPU 2 lost or unreadable; %s: ' % _finish.WRITE_METRICS), report['reason']


def test_a_file_is_replaced_whole_or_left_as_it_was(tmp_path):
    path = tmp_path / 'gpu_reset.prom'
    path.write_text('old\n')
    path.chmod(0o600)
    _finish.write_file(str(path), 'new\n')
    assert path.read_text() == 'new\n' and stat.S_IMODE(os.stat(str(path)).st_mode) == 0o644
    with pytest.raises(OSError):
        _finish.write_file(str(tmp_path / 'missing' / 'gpu_reset.prom'), 'new\n')
    assert os.listdir(str(tmp_path)) == ['gpu_reset.prom']


def test_a_node_named_with_dot_dot_writes_its_report_inside_the_report_dir(hook, tmp_path):
    """SLURMD_NODENAME=../victim: the report is %2E.%2Fvictim.json in the report directory, and
    nothing is written beside it."""
    reports = tmp_path / 'reports'
    reports.mkdir()
    rc, report, drained = hook('--node', '../victim', '--timeout', '5', gpu_reset_report_dir=str(reports))
    assert (rc, report['outcome']) == (0, 'clean'), report
    assert os.listdir(str(reports)) == ['%2E.%2Fvictim.json']
    assert not (tmp_path / 'victim.json').exists()
    with open(str(reports / '%2E.%2Fvictim.json')) as handle:
        assert json.load(handle)['host'] == '../victim'


def test_a_node_name_that_cannot_name_a_report_fails_saying_so(hook, tmp_path):
    rc, report, drained = hook('--node', 'n' * 300, '--timeout', '5', gpu_reset_report_dir=str(tmp_path / 'reports'))
    assert report['outcome'] == 'failed'
    assert report['reason'].startswith('write the report on the controller: gpu_reset_report_dir: the report file '
                                       'of host %s...(220 more characters) would be named with 305 bytes' % ('n' * 80))
