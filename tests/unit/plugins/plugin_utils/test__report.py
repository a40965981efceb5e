# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The report file of a host: its name escaped, inside the report directory."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._report import ReportPathError, report_name, report_path


@pytest.mark.parametrize('host, name', [
    ('gpu07', 'gpu07.json'),
    ('gpu07.rack3.example.org', 'gpu07.rack3.example.org.json'),
    ('../victim', '%2E.%2Fvictim.json'),
    ('/etc/cron.d/x', '%2Fetc%2Fcron.d%2Fx.json'),
    ('.', '%2E.json'),
    ('..', '%2E..json'),
    ('.hidden', '%2Ehidden.json'),
    ('a%2Fb', 'a%252Fb.json'),
    ('n\x1b[31m\n', 'n%1B%5B31m%0A.json'),
    ('n\u00e9', 'n%C3%A9.json'),
])
def test_a_host_name_becomes_one_file_name(host, name):
    assert report_name(host) == name


def test_two_hosts_never_share_a_report():
    assert report_name('a/b') != report_name('a%2Fb')


@pytest.mark.parametrize('host', ['../victim', '../../etc/passwd', '/etc/passwd', 'a/../../b', '..'])
def test_the_report_stays_inside_the_report_dir(tmp_path, host):
    reports = tmp_path / 'reports'
    path = report_path(str(reports), host)
    assert os.path.dirname(os.path.realpath(path)) == os.path.realpath(str(reports))


@pytest.mark.parametrize('host, message', [
    ('', r"gpu_reset_report_dir: the host name '' cannot name a report file"),
    (None, r'gpu_reset_report_dir: the host name None cannot name a report file'),
    ('/' * 100, r'gpu_reset_report_dir: the report file of host /{80}\.\.\.\(20 more characters\) would be named '
                r'with 305 bytes once escaped; a file name holds at most 255'),
])
def test_a_name_that_cannot_be_made_safe_is_refused_naming_it(tmp_path, host, message):
    with pytest.raises(ReportPathError, match=message):
        report_path(str(tmp_path), host)


def test_a_report_file_that_links_outside_is_refused(tmp_path):
    reports = tmp_path / 'reports'
    reports.mkdir()
    os.symlink(str(tmp_path / 'victim.json'), str(reports / 'gpu07.json'))
    with pytest.raises(ReportPathError, match=r'report file of host gpu07, .*/reports/gpu07.json, resolves to '
                                              r'.*/victim.json, outside .*/reports; refusing to write it'):
        report_path(str(reports), 'gpu07')
