# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""JMESPath on the controller (plugin_utils/_jmespath.py), as the gpu_reset verdict calls it: the
library imported on the first search, the data made of plain values first. Through the filter:
tests/unit/plugins/filter/test_json_query.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _jmespath


class Tagged(str):
    """A str subclass, as the values Ansible templates are."""


def test_the_library_is_imported_on_the_first_search():
    data = {'nvidia_gpus': [{'index': 0, 'memory_used_mib': 1}, {'index': 1, 'memory_used_mib': 4000}]}
    assert _jmespath.search(data, 'nvidia_gpus[?memory_used_mib > `32`].index') == [1]
    assert _jmespath.search(data, Tagged('length(nvidia_gpus)')) == 2


def test_the_data_is_made_of_plain_values():
    data = collections.OrderedDict([(Tagged('name'), Tagged('nvidia-persistenced')), ('raw', b'x\xff'),
                                    ('flags', (True, 1, 2.5, None)), ('seen', frozenset([3]))])
    plain = _jmespath.plain(data)
    assert plain == {'name': 'nvidia-persistenced', 'raw': 'x\ufffd', 'flags': [True, 1, 2.5, None], 'seen': [3]}
    # Plain types, not subclasses (an OrderedDict, a tagged str) that JMESPath or YAML would treat apart.
    assert plain.__class__ is dict and [key.__class__ for key in plain] == [str] * 4
    assert plain['name'].__class__ is str and plain['flags'].__class__ is list


def test_a_value_jmespath_cannot_search_is_a_query_error():
    with pytest.raises(_jmespath.QueryError, match="json_query: cannot search a value of type object"):
        _jmespath.search({'a': object()}, 'a')
