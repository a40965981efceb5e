# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The release's rules for its options (module_utils/_options.py), as the controller checks them
before any host is touched. Each message through the release: test__release.py; through the
settings of the action and the hook: tests/unit/plugins/plugin_utils/test__settings.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import (
    check_escalation_options,
    check_release_options,
)

MIG_UUID = 'MIG-5c4e1b4a-21b1-5a0c-9c6f-1f6bdfbd2d85'


def test_valid_options_give_the_signals_and_the_gpus_each_once_in_order():
    signals, gpus = check_release_options(['/dev/nvidia*'], gpus=[3, '1', 1, '2:07', MIG_UUID, 0],
                                          signals=['INT', 'TERM', 'KILL'], grace_period=1, timeout=10)
    assert signals == [('INT', 2), ('TERM', 15), ('KILL', 9)]
    # Whole GPUs by index first, then the MIG instances.
    assert gpus == [0, 1, 3, '2:7', MIG_UUID]
    assert check_release_options(['/dev/nvidia*']) == ([('TERM', 15), ('KILL', 9)], None)


@pytest.mark.parametrize('options, message', [
    (dict(timeout=1), r'timeout must be at least 2\.0 s \(the GPUs are read at the start and at the end, each read '
                      r'given at least 0\.5 s\), got 1'),
    (dict(gpus=['x']), "gpus: 'x' is not a GPU index, N:G"),
    (dict(devices=[]), 'devices must name at least one device node glob'),
    (dict(devices=['']), "devices: '' is not an absolute path or glob"),
    (dict(expected_gpus=-1), 'expected_gpus must be zero or more, got -1'),
    (dict(signals=['TERM', 'KILL'], grace_period=60, timeout=60), r'signals \[TERM, KILL\] with grace_period 60\.0 s'),
])
def test_the_first_option_that_is_not_valid_is_named(options, message):
    devices = options.pop('devices', ['/dev/nvidia*'])
    with pytest.raises(GpuopsError, match=message):
        check_release_options(devices, **options)


@pytest.mark.parametrize('unit, valid', [
    ('nvidia-dcgm.service', True), ('nvsm*.service', True), ('dcgm-exporter@0.service', True),
    ('*', False), ('?*', False), ('a b.service', False), ('foo\n', False), ('x' * 256, False),
])
def test_a_unit_stopped_for_a_reset_is_a_systemd_name_or_a_narrow_glob(unit, valid):
    if valid:
        assert check_escalation_options(reset_stop_units=[unit]) is None
    else:
        with pytest.raises(GpuopsError, match="reset_stop_units: .* is no systemd unit name or glob of one"):
            check_escalation_options(reset_stop_units=[unit])


@pytest.mark.parametrize('options, message', [
    (dict(bug_report_dir='evidence'), "bug_report_dir: 'evidence' is not an absolute path"),
    (dict(bug_report_timeout=0), 'bug_report_timeout must be more than 0 seconds'),
])
def test_the_bug_report_options_are_checked(options, message):
    with pytest.raises(GpuopsError, match=message):
        check_escalation_options(**options)
