# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset settings, the one spec: the options of the action gpuops.nvidia.gpu_reset
(the per-host sequence), then those of its finishing steps (drain, metrics, report: _finish.py). The role's variables are these names with the prefix gpu_reset_
(roles/gpu_reset/meta/argument_specs.yml and defaults/main.yml are tested against this spec);
the hook's settings start from these defaults."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib

from ansible_collections.gpuops.nvidia.plugins.module_utils._quiesce import DEFAULT_STOP_UNITS

PREFIX = 'gpu_reset_'

SEQUENCE_SPEC = dict(
    devices=dict(type='list', elements='str', default=['/dev/nvidia*']),
    gpus=dict(type='list', elements='raw', default=None),
    backend=dict(type='str', choices=['auto', 'nvml', 'nvidia-smi'], default='auto'),
    nvidia_smi_path=dict(type='str', default='nvidia-smi'),
    host_root=dict(type='path', default='/'),
    expected_gpus=dict(type='int', default=None),
    signals=dict(type='list', elements='str', default=['TERM', 'KILL']),
    grace_period=dict(type='float', default=5),
    timeout=dict(type='float', default=60),
    memory_threshold_mib=dict(type='int', default=32),
    extra_protect=dict(type='list', elements='str', default=[]),
    lock_file=dict(type='path', default=None),
    clean_query=dict(type='str', default=None),
    allow_gpu_reset=dict(type='bool', default=False),
    reload_modules=dict(type='bool', default=False),
    hold_after_cures=dict(type='int', default=2),
    hold_window_days=dict(type='float', default=7.0),
    stop_units=dict(type='list', elements='str', default=list(DEFAULT_STOP_UNITS)),
    kernel_log=dict(type='path', default=None),
    bug_report_dir=dict(type='path', default=None),
    bug_report_timeout=dict(type='float', default=120),
    assert_clean=dict(type='bool', default=True),
    probe=dict(type='bool', default=True),
    probe_mib=dict(type='int', default=1024),
    probe_level=dict(type='str', choices=['allocation', 'memory'], default='allocation'),
    probe_missing_library=dict(type='str', choices=['skip', 'fail'], default='skip'),
    probe_cuda_library=dict(type='str', default='libcuda.so.1'),
    job=dict(type='dict', default=None),
)

# The default drain command, as the role templates it (the hook builds the same argv itself).
DRAIN_COMMAND = [
    'scontrol', 'update', 'nodename={{ inventory_hostname_short }}', 'state=drain',
    'reason={{ gpu_reset_result.reason | default(none) | gpuops.nvidia.gpu_reset_drain_reason }}',
]

FINISH_SPEC = dict(
    on_failure=dict(type='str', choices=['fail', 'drain'], default='fail'),
    drain_command=dict(type='list', elements='str', default=DRAIN_COMMAND),
    drain_timeout=dict(type='int', default=60),
    max_drained=dict(type='str', default='10%'),
    report_dir=dict(type='path', default=None),
    textfile_dir=dict(type='path', default=None),
)

SETTINGS_SPEC = dict(SEQUENCE_SPEC, **FINISH_SPEC)

# Variables of the playbook reset_gpus.yml and the role's own results, also named gpu_reset_*:
# no typo.
OTHER_VARIABLES = frozenset(PREFIX + name for name in (
    'result', 'become', 'serial', 'max_fail_percentage', 'sliced'))


def defaults(spec=None):
    """{name: default} of spec (SETTINGS_SPEC)."""
    return dict((name, option.get('default')) for name, option in (spec or SETTINGS_SPEC).items())


def known_variables():
    """Every gpu_reset_* variable with a meaning: the settings and OTHER_VARIABLES."""
    return set(PREFIX + name for name in SETTINGS_SPEC) | OTHER_VARIABLES


def unknown_variables(names):
    """The gpu_reset_* names among names that no spec knows (gpu_reset__* are the role's own)."""
    known = known_variables()
    ours = [name for name in names if name.startswith(PREFIX) and not name.startswith(PREFIX + '_')]
    return sorted(name for name in ours if name not in known)


def nearest_variable(name):
    """The known variable that name is most likely a typo of, or None. Compared without the
    prefix, which every name shares."""
    suffixes = sorted(known[len(PREFIX):] for known in known_variables())
    close = difflib.get_close_matches(name[len(PREFIX):], suffixes, n=1)
    return PREFIX + close[0] if close else None
