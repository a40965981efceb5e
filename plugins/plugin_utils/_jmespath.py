# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""JMESPath on the controller: the json_query filter and the gpu_reset verdict use this.

Nothing here imports ansible-core's controller code (ansible.errors): the Slurm hook's runner
uses the verdict, and a process that imports it counts as a controller for every module it
forks (_hook/reset.py). The filters turn QueryError into AnsibleFilterError."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from collections.abc import Mapping, Sequence


class QueryError(ValueError):
    """A query, or the data it runs over, that cannot be evaluated."""


def _jmespath():
    """The jmespath library, imported on the first search: a run whose verdict needs no query
    (the usual path) does not pay for the import in each worker."""
    try:
        import jmespath
    except ImportError:
        return None
    return jmespath


def plain(value):
    """A copy of value made of the builtin types only (templated values subclass them)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, Mapping):
        return dict((plain(key), plain(item)) for key, item in value.items())
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode('utf-8', 'replace')
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (Sequence, set, frozenset)):
        return [plain(item) for item in value]
    raise QueryError('json_query: cannot search a value of type %s' % type(value).__name__)


def search(data, expr, library=None):
    """Evaluate the JMESPath expression expr over data; errors are QueryError."""
    library = library or _jmespath()
    if library is None:
        raise QueryError(
            'json_query needs the jmespath Python library on the controller (pip install jmespath)')
    if not isinstance(expr, str):
        raise QueryError('json_query: the expression must be a string, got %s' % type(expr).__name__)
    try:
        return library.search(str(expr), plain(data))
    except library.exceptions.ParseError as exc:
        raise QueryError('json_query: invalid JMESPath expression %r: %s' % (str(expr), exc))
    except library.exceptions.JMESPathError as exc:
        raise QueryError('json_query: %r failed: %s' % (str(expr), exc))
