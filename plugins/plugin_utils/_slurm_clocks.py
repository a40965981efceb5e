# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Slurm's clocks against the hook's budget: which lines the role writes for a Slurm version, and
whether the running configuration (scontrol show config) gives the hook what those lines ask.

Slurm kills a Prolog or Epilog that runs past its timeout: PrologEpilogTimeout, or from Slurm
25.05 PrologTimeout and EpilogTimeout, which take precedence over it where set (slurm.conf(5)).
A batch job whose launch, its Prolog included, runs past BatchStartTimeout (10 s by default) may
be taken for missing. The role's lines set each to slurm_hooks_prolog_epilog_timeout; a line that
slurm.conf reads after the Include wins, and that is what the running configuration shows."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

CONFIG_LINE_RE = re.compile(r'^([A-Za-z]+)\s*=\s*(.*?)\s*$')
# What scontrol prints for a timeout that is not set (INFINITE16 and NO_VAL16 as numbers).
UNLIMITED = ('65534', '65535', 'UNLIMITED', 'INFINITE', '(null)', 'N/A', '')


def config_values(text):
    """{key: value} of the lines 'Key = value' of scontrol show config or of slurm.conf lines."""
    found = {}
    for line in str(text or '').splitlines():
        if line.lstrip().startswith('#'):
            continue
        match = CONFIG_LINE_RE.match(line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def seconds(value):
    """The seconds of a timeout as scontrol prints it ('120', '120 sec'); None when unlimited."""
    text = str(value).strip()
    if text.upper() in UNLIMITED:
        return None
    match = re.match(r'^([0-9]+)(?:\s*sec)?$', text)
    return int(match.group(1)) if match else None


def clock_problems(running, written, needed, prolog=True, epilog=True):
    """What keeps the running configuration (running: scontrol show config) from giving the hook
    needed seconds, each naming the setting, its value and what it needs. Judged only once Slurm
    reads the role's lines (its Prolog or Epilog is the hooks'; written: the lines the role wrote
    before, slurm-hooks.conf): a value equal to the one those lines set is theirs and changes with
    them; another one, lower than needed, comes from a line read after them."""
    running, written = config_values(running), config_values(written)
    ours = [written.get(name) for name in ('Prolog', 'Epilog') if written.get(name)]
    if not ours or not any(running.get(name) == path for name in ('Prolog', 'Epilog') for path in ours):
        return []
    wanted = []
    if prolog:
        wanted.append(('PrologTimeout' if seconds(running.get('PrologTimeout', '')) is not None else 'PrologEpilogTimeout',
                       'a Prolog'))
        wanted.append(('BatchStartTimeout', "a batch job's launch, its Prolog included"))
    if epilog:
        wanted.append(('EpilogTimeout' if seconds(running.get('EpilogTimeout', '')) is not None else 'PrologEpilogTimeout',
                       'an Epilog'))
    # {setting: what it times}, in the order named: PrologEpilogTimeout may time both.
    settings = {}
    for name, what in wanted:
        settings.setdefault(name, []).append(what)
    problems = []
    for name, whats in settings.items():
        value = seconds(running.get(name, ''))
        if name not in running or value is None or value >= needed or \
                (name in written and seconds(written[name]) == value):
            continue
        problems.append('Slurm runs with %s=%d, which gives %s less than the %d s the hooks need: a line of '
                        'slurm.conf read after the Include sets it; set it to %d or more, or remove it'
                        % (name, value, ' and '.join(whats), needed, needed))
    return problems
