# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Slurm's running clocks against the hooks' lines (plugin_utils/_slurm_clocks.py). The parser
also reads the real slurmctld's scontrol show config in tests/slurm/test_slurm_hooks.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.slurm_clock_problems import slurm_clock_problems
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_clocks import clock_problems

WRITTEN = ('Prolog=/etc/slurm/gpu-reset/prolog.sh\nEpilog=/etc/slurm/gpu-reset/epilog.sh\n'
           'PrologEpilogTimeout=120\nPrologTimeout=120\nEpilogTimeout=120\n# A comment=5\nBatchStartTimeout=120\n')


def running(**values):
    """scontrol show config's lines (Key = value, padded as scontrol pads them)."""
    base = dict(Prolog='/etc/slurm/gpu-reset/prolog.sh', Epilog='/etc/slurm/gpu-reset/epilog.sh',
                PrologEpilogTimeout='120', BatchStartTimeout='120 sec')
    base.update(values)
    return ''.join('%-23s = %s\n' % item for item in base.items() if item[1] is not None)


def test_the_lines_own_values_and_longer_ones_are_fine():
    assert clock_problems(running(), WRITTEN, 120) == []
    assert clock_problems(running(PrologEpilogTimeout='300', BatchStartTimeout='300 sec'), WRITTEN, 120) == []


def test_a_prolog_timeout_set_after_the_include_is_named_and_takes_precedence():
    assert clock_problems(running(PrologTimeout='30', EpilogTimeout='65534'), WRITTEN, 120) == [
        'Slurm runs with PrologTimeout=30, which gives a Prolog less than the 120 s the hooks need: a line of '
        'slurm.conf read after the Include sets it; set it to 120 or more, or remove it']


def test_an_unlimited_timeout_gives_the_hooks_every_second():
    assert clock_problems(running(PrologEpilogTimeout='65534', BatchStartTimeout='UNLIMITED'), WRITTEN, 120) == []


def test_a_short_batch_start_timeout_is_named_only_for_a_prolog():
    short = running(BatchStartTimeout='10 sec')
    assert clock_problems(short, WRITTEN, 120, epilog=False) == [
        "Slurm runs with BatchStartTimeout=10, which gives a batch job's launch, its Prolog included less than the "
        "120 s the hooks need: a line of slurm.conf read after the Include sets it; set it to 120 or more, or remove it"]
    assert clock_problems(short, WRITTEN, 120, prolog=False) == []


@pytest.mark.parametrize('config, written', [
    (running(Prolog='/opt/site/prolog', Epilog='(null)', PrologEpilogTimeout='10'), WRITTEN),  # not included yet
    (running(PrologEpilogTimeout='10'), ''),  # no lines written before
    ('', WRITTEN),  # scontrol said nothing
])
def test_nothing_is_judged_before_slurm_reads_the_lines(config, written):
    assert clock_problems(config, written, 120) == []


def test_the_filter_wants_whole_seconds():
    with pytest.raises(AnsibleFilterError, match="needed must be a whole number of seconds, got 'soon'"):
        slurm_clock_problems(running(), WRITTEN, 'soon')
    assert slurm_clock_problems(running(PrologEpilogTimeout='30'), WRITTEN, '120')[0].startswith(
        'Slurm runs with PrologEpilogTimeout=30, which gives a Prolog and an Epilog less than')
