# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The Slurm hook's exit statuses (plugin_utils/_slurm_hook.py), in each of its modes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


# The runner's exit statuses (gpu-reset-hook.sh maps them to its own, see examples/slurm/README.md).
# Not 1: that is what a Python that crashes or cannot import the collection exits with, and it
# must never read as "drained with the reason".
RUNNER_SETTINGS_UNREADABLE = 2
RUNNER_NEEDS_PLAYBOOK = 3
RUNNER_DRAINED = 10
RUNNER_NOT_DRAINED = 11
# Not clean, and left in service: the fleet brake held (too many nodes drained by gpu_reset).
RUNNER_BRAKE_HELD = 12
# The health check's statuses besides 0 (nothing to do, or resumed) and RUNNER_DRAINED/NOT_DRAINED
# (not clean, kept drained with the new reason): the resume failed, or Slurm's answers could not be
# read. None is RUNNER_BRAKE_HELD's: the hook's log says each in its own words.
HEALTH_RESUME_FAILED = 13
HEALTH_UNREADABLE = 14
