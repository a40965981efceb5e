# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: slurm_clock_problems
short_description: What keeps Slurm's running clocks from giving the hooks their time
version_added: 0.1.0
author:
  - gpuops maintainers
description:
  - Takes the output of C(scontrol show config) and returns what keeps it from giving a Prolog, an
    Epilog and a batch job's launch the seconds the hooks need, one text per setting (C(PrologEpilogTimeout),
    from Slurm 25.05 C(PrologTimeout) and C(EpilogTimeout) where set, C(BatchStartTimeout)), naming its value
    and what it needs.
  - It judges only once Slurm reads the lines of the role P(gpuops.nvidia.slurm_hooks#role) (its Prolog or Epilog
    is the one those lines name). A value equal to the one those lines set is theirs and changes with them;
    another one, lower than needed, comes from a line of C(slurm.conf) read after the C(Include).
options:
  _input:
    description: The output of C(scontrol show config).
    type: str
    required: true
  written:
    description: The lines the role wrote before (its C(slurm-hooks.conf)), empty when there are none.
    type: str
    required: true
  needed:
    description: The seconds each clock must give (the role's C(slurm_hooks_prolog_epilog_timeout)).
    type: int
    required: true
  prolog:
    description: Whether the hooks run as the Prolog (then C(BatchStartTimeout) is judged too).
    type: bool
    default: true
  epilog:
    description: Whether the hooks run as the Epilog.
    type: bool
    default: true
'''

EXAMPLES = r'''
- name: Check Slurm's running clocks
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
  vars:
    problems: "{{ config.stdout | gpuops.nvidia.slurm_clock_problems(written, 120) }}"
'''

RETURN = r'''
_value:
  description: One text per setting that gives less than needed; empty when none does, or when Slurm
    does not read the role's lines yet.
  type: list
  elements: str
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_clocks import clock_problems


def slurm_clock_problems(config, written, needed, prolog=True, epilog=True):
    try:
        needed = int(needed)
    except (TypeError, ValueError):
        raise AnsibleFilterError('slurm_clock_problems: needed must be a whole number of seconds, got %r' % (needed,))
    return clock_problems(config, written, needed, prolog=bool(prolog), epilog=bool(epilog))


class FilterModule(object):

    def filters(self):
        return {'slurm_clock_problems': slurm_clock_problems}
