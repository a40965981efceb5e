# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_deprecated import FilterModule as Problems
from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_deprecated import FilterModule, gpu_reset_verdict


def test_filters_registered():
    assert FilterModule().filters()['gpu_reset_verdict'] is gpu_reset_verdict
    assert gpu_reset_verdict(None, 'n1', error='x')['outcome'] == 'failed'


def test_release_result_is_the_input():
    release = dict(released=True, changed=True, gpus_before=[{'index': 0, 'memory_used_mib': 900}],
                   gpus_after=[{'index': 0, 'memory_used_mib': 1}], signalled=[], survivors=[], orphaned_gpus=[])
    report = gpu_reset_verdict(release, 'n1', started=1.0, now=3.5)
    assert report['outcome'] == 'released' and report['duration_s'] == 2.5 and report['host'] == 'n1'


def test_problems_filter():
    problems = Problems().filters()['gpu_reset_problems']
    assert problems(dict(timeout=60, grace_period=5, signals=['TERM'], devices=['/dev/nvidia*'])) == []
    assert problems(dict(timeout=60, grace_period=5, signals=[], devices=['/dev/nvidia*'])) == [
        'gpu_reset_signals must name at least one signal, e.g. [TERM, KILL]']


def test_summary_filter_is_the_verdicts_summary():
    from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_summary import FilterModule as Summary
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import summary
    assert Summary().filters()['gpu_reset_summary'] is summary
