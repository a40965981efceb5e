# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_drain_reason import FilterModule

drain_reason = FilterModule().filters()['gpu_reset_drain_reason']


@pytest.mark.parametrize('reason, expected', [
    (None, 'gpu_reset: GPUs not clean'),
    ('', 'gpu_reset: GPUs not clean'),
    ('GPU 3: lost', 'gpu_reset: GPU 3: lost'),
    # The verdict's reasons are printable already: a backslash stays one.
    ('a\nb\x1b[2J\\', 'gpu_reset: a\\x0ab\\x1b[2J\\'),
    ('z' * 250, 'gpu_reset: %s...(50 more characters)' % ('z' * 200)),
])
def test_the_reason_is_escaped_and_capped(reason, expected):
    assert drain_reason(reason) == expected
