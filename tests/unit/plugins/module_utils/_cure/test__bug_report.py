# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia-bug-report.sh into bug_report_dir: written through the directory opened and checked."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._cure import bug_report as _bug_report

# Writes NAME.gz where --output-file NAME says, as nvidia-bug-report.sh does.
PROGRAM = '''#!%s -S
import gzip, sys
name = sys.argv[sys.argv.index("--output-file") + 1]
with gzip.open(name + ".gz", "wt") as handle:
    handle.write("the host's kernel log")
'''


def program(tmp_path):
    path = tmp_path / 'nvidia-bug-report.sh'
    path.write_text(PROGRAM % sys.executable)
    path.chmod(0o755)
    return str(path)


def test_the_report_goes_into_the_directory_checked_though_it_is_swapped_for_a_link(tmp_path, monkeypatch):
    # Between the check and the run (the hook below), the directory is swapped for a link to
    # another: the report is written into the directory opened and checked, not where the link points.
    reports, elsewhere = tmp_path / 'reports', tmp_path / 'elsewhere'
    elsewhere.mkdir()

    class SwappingRunner(_bug_report.Runner):
        def run(self, *args, **kwargs):
            os.rename(str(reports), str(tmp_path / 'reports-checked'))
            os.symlink(str(elsewhere), str(reports))
            return super(SwappingRunner, self).run(*args, **kwargs)

    monkeypatch.setattr(_bug_report, 'Runner', SwappingRunner)
    report = _bug_report.collect(str(reports), 30, program(tmp_path))
    assert os.path.islink(str(reports))  # swapped indeed
    assert os.listdir(str(elsewhere)) == []
    written = os.listdir(str(tmp_path / 'reports-checked'))
    assert len(written) == 1 and written[0].startswith('nvidia-bug-report-') and written[0].endswith('.log.gz')
    # The report names it by the path given (the operator's name for it).
    assert report['ok'] is True and report['path'] == os.path.join(str(reports), written[0]), report


def test_a_directory_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / 'real'
    real.mkdir(mode=0o700)
    os.symlink(str(real), str(tmp_path / 'link'))
    report = _bug_report.collect(str(tmp_path / 'link'), 30, program(tmp_path))
    assert report['ok'] is False and 'is not a directory (a symbolic link is not followed)' in report['message']
    assert os.listdir(str(real)) == []


def test_the_directory_is_made_private(tmp_path):
    report = _bug_report.collect(str(tmp_path / 'new' / 'reports'), 30, program(tmp_path))
    assert report['ok'] is True, report
    assert stat.S_IMODE(os.stat(str(tmp_path / 'new' / 'reports')).st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason='plants a link of another user: needs root')
def test_a_directory_reached_through_a_link_of_another_user_is_refused(tmp_path):
    real = tmp_path / 'real'
    (real / 'reports').mkdir(parents=True, mode=0o700)
    os.symlink(str(real), str(tmp_path / 'link'))
    os.lchown(str(tmp_path / 'link'), 65534, 65534)
    report = _bug_report.collect(str(tmp_path / 'link' / 'reports'), 30, program(tmp_path))
    assert report['ok'] is False and 'is below %s, a symbolic link owned by nobody' % (tmp_path / 'link') in report['message']
    assert os.listdir(str(real / 'reports')) == []


def test_a_directory_reached_through_a_link_of_root_is_used(tmp_path):
    (tmp_path / 'real').mkdir()
    os.symlink('real', str(tmp_path / 'link'))
    report = _bug_report.collect(str(tmp_path / 'link' / 'reports'), 30, program(tmp_path))
    assert report['ok'] is True, report
    assert len(os.listdir(str(tmp_path / 'real' / 'reports'))) == 1
