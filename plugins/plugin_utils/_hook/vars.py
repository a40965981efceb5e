# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The Slurm hook's settings: the spec's defaults (plugin_utils/_spec.py), then the hook's
variables file, then the variables the hook fixes (hook_vars); and gpu_reset_host_root as that
file sets it, for the modes that read no settings."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import DRAIN_COMMAND, PREFIX, defaults


class NeedsPlaybook(Exception):
    """A setting that only the playbook can honour."""


def load_settings(vars_file=None, overrides=None):
    """The spec's defaults, the variables file, then overrides: {gpu_reset_name: value}."""
    import yaml

    settings = dict((PREFIX + name, value) for name, value in defaults().items())
    if vars_file:
        with open(vars_file) as handle:
            try:
                given = yaml.safe_load(handle) or {}
            except yaml.YAMLError as exc:
                raise ValueError('%s is not valid YAML: %s' % (vars_file, ' '.join(str(exc).split())))
        if not isinstance(given, dict):
            raise ValueError('%s must be a YAML mapping of gpu_reset_* variables' % vars_file)
        for name, value in given.items():
            if name == 'gpu_reset_drain_command' and value != DRAIN_COMMAND:
                raise NeedsPlaybook('a gpu_reset_drain_command of your own')
            if name == 'gpu_reset_clean_query' and value is not None:
                raise NeedsPlaybook('a gpu_reset_clean_query of your own')
            if '{{' in json.dumps(value) or '{%' in json.dumps(value):
                raise NeedsPlaybook('a templated value (%s)' % name)
            settings[name] = value
    settings.update(overrides or {})
    return settings


def hook_vars(args, gpus=None, job=None):
    """The variables the hook fixes, over the variables file: drain on failure, the release's
    time, the job's GPUs (nvidia-smi indexes, job_gpus) and the job itself (job_setting)."""
    found = {'gpu_reset_on_failure': 'drain'}
    if gpus is not None:
        found['gpu_reset_gpus'] = gpus
    if job is not None:
        found['gpu_reset_job'] = job
    if args.timeout is not None:
        found['gpu_reset_timeout'] = args.timeout
    return found


def host_root_of(vars_file):
    """gpu_reset_host_root as the variables file sets it ('/' when it does not, or cannot be read:
    the playbook then says why)."""
    import yaml

    if not vars_file:
        return '/'
    try:
        with open(vars_file) as handle:
            given = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        given = None
    root = given.get('gpu_reset_host_root') if isinstance(given, dict) else None
    return root if isinstance(root, str) and '{' not in root else '/'
