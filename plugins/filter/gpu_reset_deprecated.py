# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The deprecated filters gpu_reset_problems and gpu_reset_verdict (to be removed in 1.0.0),
documented in gpu_reset_problems.yml and gpu_reset_verdict.yml.

They live in a file of another name because ansible-core (2.19) loads every file of the
collection's filter directory, by the file's name, whenever any of the collection's filters is
first used, and applies the deprecation that meta/runtime.yml gives that name: in a file named
after one of them, every use of any filter of the collection warned of both. Here meta/runtime.yml's
deprecation is given only where one of them is used."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._settings import settings_problems
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._verdict import verdict


def gpu_reset_problems(settings, variables=None):
    """settings_problems over the settings and the variables, naming the role's variables."""
    given = dict(settings)
    given.update((name[len(PREFIX):], value) for name, value in (variables or {}).items() if name.startswith(PREFIX))
    return settings_problems(given, lambda option: PREFIX + option)[1]


def gpu_reset_verdict(release, host, **kwargs):
    return verdict(host, release=release, **kwargs)


class FilterModule(object):

    def filters(self):
        return {'gpu_reset_problems': gpu_reset_problems, 'gpu_reset_verdict': gpu_reset_verdict}
