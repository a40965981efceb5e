# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.gpu_reset_report_path import FilterModule

report_path = FilterModule().filters()['gpu_reset_report_path']


def test_the_role_names_the_report_as_the_hook_does(tmp_path):
    assert report_path(str(tmp_path), '../victim') == str(tmp_path / '%2E.%2Fvictim.json')


@pytest.mark.parametrize('directory, host, message', [
    ('/reports', '', r"gpu_reset_report_dir: the host name '' cannot name a report file"),
    (None, 'gpu07', r'gpu_reset_report_path: gpu_reset_report_dir must be a directory, got None'),
])
def test_what_cannot_name_a_report_is_a_filter_error(directory, host, message):
    with pytest.raises(AnsibleFilterError, match=message):
        report_path(directory, host)
