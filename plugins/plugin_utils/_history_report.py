# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""What a fleet's GPU histories say (each host's /var/lib/gpuops/history.json, module_utils/_state/history.py),
per node and per GPU: incidents, cures by kind, mean time between incidents, time lost, whether
held for a person; the worst first. The filter gpuops.nvidia.gpu_reset_history_report and
scripts/history_report.py print it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import CURE_KINDS, event_count, incidents, parse_history

HEADER = ('node', 'gpu', 'incidents', 'open', 'cures (reset/probe/reboot)', 'mean between', 'time lost', 'held')


class Unreadable(str):
    """Why a host's history file could not be read, in its place."""


def parse(text):
    """(the history's {uuid: [events]}, [the node's events], why it is unreadable or None) of the
    text of a history file (or its data, or Unreadable)."""
    if isinstance(text, Unreadable):
        return {}, [], str(text)
    try:
        data = json.loads(text) if isinstance(text, (str, bytes)) else text
    except ValueError:
        return {}, [], 'not JSON'
    if not isinstance(data, dict) or not isinstance(data.get('gpus'), dict):
        return {}, [], 'not a history of gpuops.nvidia'
    gpus, node = parse_history(data)
    return gpus, node, None


def gpu_row(node, uuid, events, now):
    """One GPU's figures."""
    found = incidents(events)
    cures = dict.fromkeys(CURE_KINDS, 0)
    for event in events:
        how = 'reboot' if event['kind'] == 'reboot_asked' else event.get('how') if event['kind'] == 'cure' else None
        if how in cures:
            cures[how] += event_count(event)
    lost = sum(found['repair_s']) + (now - found['open_since'] if found['open_since'] is not None else 0.0)
    between = found['between_s']
    index = [event['index'] for event in events if isinstance(event.get('index'), int)]
    return {
        'node': node, 'uuid': uuid, 'index': index[-1] if index else None,
        'incidents': len(found['repair_s']) + (found['open_since'] is not None), 'open': found['open_since'] is not None,
        'cures': cures, 'mean_between_s': sum(between) / len(between) if between else None,
        'lost_s': max(lost, 0.0), 'held': bool(events) and events[-1]['kind'] == 'cure_failed',
    }


def report(histories, now=None):
    """{nodes: [{node, gpus: [gpu_row], incidents, lost_s, reboots, held, warning}], worst first}
    of histories ({node: the text or the data of its history file})."""
    now = time.time() if now is None else now
    nodes = []
    for node, text in histories.items():
        gpus, node_events, warning = parse(text)
        rows = sorted((gpu_row(node, uuid, events, now) for uuid, events in gpus.items() if events), key=_worst)
        nodes.append({'node': node, 'gpus': rows, 'incidents': sum(row['incidents'] for row in rows),
                      'lost_s': sum(row['lost_s'] for row in rows),
                      'reboots': sum(event_count(event) for event in node_events if event['kind'] == 'reboot_asked'),
                      'held': any(row['held'] for row in rows) or bool(node_events) and node_events[-1]['kind'] == 'cure_failed',
                      'warning': warning})
    return sorted(nodes, key=_worst)


def _worst(row):
    return (-row['lost_s'], -row['incidents'], str(row.get('uuid') or row.get('node')))


def duration(seconds):
    """seconds as 45s, 12m, 3.5h or 2.1d; - for none."""
    if seconds is None:
        return '-'
    for unit, size in (('d', 86400.0), ('h', 3600.0), ('m', 60.0)):
        if seconds >= size:
            return '%.1f%s' % (seconds / size, unit)
    return '%ds' % round(seconds)


def lines(found):
    """report() as text lines: a table of every GPU with a history, each node's total first."""
    table = [HEADER]
    for node in found:
        name = printable(str(node['node']), 60)
        table.append((name, 'all', str(node['incidents']), '', 'reboots %d' % node['reboots'], '',
                      duration(node['lost_s']), 'yes' if node['held'] else ''))
        if node['warning']:
            table.append((name, '', '', '', 'history unreadable: %s' % node['warning'], '', '', ''))
        for row in node['gpus']:
            cures = '/'.join(str(row['cures'][how]) for how in CURE_KINDS)
            table.append((name, '%s %s' % ('' if row['index'] is None else row['index'], row['uuid']), str(row['incidents']),
                          'yes' if row['open'] else '', cures, duration(row['mean_between_s']), duration(row['lost_s']),
                          'yes' if row['held'] else ''))
    widths = [max(len(row[column]) for row in table) for column in range(len(HEADER))]
    return ['  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
