# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gauges' names and labels as operators consume them: the table of the guide "Monitoring and
alerts" (docs/docsite/rst/guide_monitoring.rst), the template gpu_reset.prom.j2 (as the Slurm
hook renders it and as the role does) and the alert rules of examples/prometheus agree, so that a
rename cannot go unnoticed."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

import pytest
import yaml

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(REPO, 'roles', 'gpu_reset', 'templates', 'gpu_reset.prom.j2')
RULES = os.path.join(REPO, 'examples', 'prometheus', 'gpuops.rules.yml')
GUIDE = os.path.join(REPO, 'docs', 'docsite', 'rst', 'guide_monitoring.rst')
SECTION = 'The gauges\n----------\n'
# A row of the guide's list-table: "* - ``name``", then "- labels" on the next line.
ROW_RE = re.compile(r'^\s*\* - ``(gpu_reset_[a-z_]+)``\s*$')
CELL_RE = re.compile(r'^\s+- (.*)$')
# A sample line of the text format: name, {labels} (optional), value.
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# A result that has every gauge in its metrics: a GPU reset, a drain, the hook's budget.
RESULT = {
    'host': 'gpu07', 'outcome': 'failed', 'reason': 'GPU 1: 2048 MiB held with no process left',
    'started': 1767225600.5, 'duration_s': 3.25, 'drained': True,
    'signalled': [{'pid': 4242, 'signal': 'TERM'}],
    'escalation': {'gpus': [1], 'reset_ok': False},
    'probe': {'verified': {'GPU-11111111-2222-3333-4444-555555555555': {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'verified_at': 1767225601.25}}},
    'gpus': [
        {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'state': 'free', 'recovery_action': 'none',
         'orphaned_mib': 0, 'seconds_until_free': 1.5},
        {'index': 1, 'pci_bus_id': '00000000:2A:00.0', 'state': 'orphaned_memory', 'recovery_action': 'reset_gpu',
         'orphaned_mib': 2048, 'seconds_until_free': None},
    ],
}
RESULT['gpus'][1]['uuid'] = 'GPU-66666666-7777-8888-9999-000000000000'
# GPU 1 held for a person, with a history of two incidents: the history's families are written too.
RESULT['held'] = [{'index': 1, 'uuid': RESULT['gpus'][1]['uuid'], 'reason': 'its reset budget is spent'}]
RESULT['history'] = {RESULT['gpus'][1]['uuid']: {
    'cures': {'reset': 2}, 'incidents': {'repair_s': [12.5, 40.0], 'between_s': [86400.0], 'open_since': None}}}
# The performance probe's figures (gpu_reset_probe_level: performance, the NVML reader): GPU 1's
# link trained down, so its copies are below its peer's too.
RESULT['probe']['gpus'] = [
    {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'h2d_gbps': 55.1, 'd2h_gbps': 54.8, 'hbm_gbps': 3710.4,
     'link': {'gen': 5, 'width': 16, 'max_gen': 5, 'max_width': 16}, 'replays': 0, 'slow': []},
    {'index': 1, 'pci_bus_id': '00000000:2A:00.0', 'h2d_gbps': 6.5, 'd2h_gbps': 6.4, 'hbm_gbps': 3705.0,
     'link': {'gen': 3, 'width': 8, 'max_gen': 5, 'max_width': 16}, 'replays': 0,
     'slow': [{'reason': 'PCIE_LINK_DEGRADED', 'message': 'PCIE_LINK_DEGRADED: GPU 1 (00000000:2A:00.0): ...'}]},
]
HOOK = {'budget_s': 60.0, 'duration_s': 4.5}
# The families that are not gauges: a counter's name ends with _total, a histogram's samples are
# its _bucket (with le), _sum and _count.
HISTOGRAM_SUFFIXES = ('_bucket', '_sum', '_count')


def guide_gauges():
    """{name: set of labels} of the gauges' table of the guide "Monitoring and alerts"."""
    with open(GUIDE) as handle:
        text = handle.read()
    assert SECTION in text, '%s has no section "%s"' % (GUIDE, SECTION.splitlines()[0])
    section = text[text.index(SECTION) + len(SECTION):]
    # The section ends where the next title's underline is.
    end = re.search(r'\n[^\n]+\n-{3,}\n', section)
    section = section[:end.start()] if end else section
    lines = section.splitlines()
    found = {}
    for number, line in enumerate(lines):
        match = ROW_RE.match(line)
        if match:
            assert match.group(1) not in found, '%s is listed twice' % match.group(1)
            labels = CELL_RE.match(lines[number + 1])
            assert labels, 'the row of %s has no labels cell' % match.group(1)
            found[match.group(1)] = set(re.findall(r'``([a-z_]+)``', labels.group(1)))
    return found


def template_types():
    """{name: type} of the template's # TYPE lines, each with its # HELP line."""
    with open(TEMPLATE) as handle:
        lines = handle.read().splitlines()
    types = dict(line.split()[2:4] for line in lines if line.startswith('# TYPE '))
    helps = [line.split()[2] for line in lines if line.startswith('# HELP ')]
    assert sorted(helps) == sorted(types), 'each gauge has one # HELP and one # TYPE line'
    return types


def samples(text):
    """{family: set of frozensets of label names} of a metrics text, and its lines' values (a
    histogram's samples under its family's name, without their le)."""
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith('# TYPE '))
    found = {}
    for line in text.splitlines():
        if not line or line.startswith('#'):
            continue
        match = SAMPLE_RE.match(line)
        assert match, 'not a sample line: %r' % line
        float(match.group(3))
        labels = frozenset(name for name, dummy in LABEL_RE.findall(match.group(2) or '') if name != 'le')
        name = match.group(1)
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and types.get(name[:-len(suffix)]) == 'histogram':
                name = name[:-len(suffix)]
        found.setdefault(name, set()).add(labels)
    return found


def write_metrics(directory, result, hook=None):
    """The metrics as the finishing step writes them (_finish.metrics)."""
    with open(os.path.join(directory, 'gpu_reset.prom'), 'w') as handle:
        handle.write(metrics(result, hook))


def rendered_by_the_hook(tmp_path):
    write_metrics(str(tmp_path), RESULT, hook=HOOK)
    with open(str(tmp_path / 'gpu_reset.prom')) as handle:
        return handle.read()


def rendered_by_the_role():
    """The metrics as the role's task writes them: no hook."""
    return metrics(RESULT)


def test_every_gauge_is_a_documented_gauge_of_the_gpu_reset_prefix():
    types = template_types()
    assert types and set(types.values()) == {'gauge', 'counter', 'histogram'}
    assert all(re.match(r'^gpu_reset_[a-z_]+$', name) for name in types), sorted(types)
    assert all(name.endswith('_total') == (kind == 'counter') for name, kind in types.items()), types
    assert all(name.endswith('_seconds') for name, kind in types.items() if kind == 'histogram'), types
    documented = guide_gauges()
    assert sorted(documented) == sorted(types), (
        'the guide "Monitoring and alerts" and gpu_reset.prom.j2 disagree: only in the guide %s, '
        'only in the template %s'
        % (sorted(set(documented) - set(types)), sorted(set(types) - set(documented))))


def test_the_labels_are_the_documented_ones(tmp_path):
    documented = guide_gauges()
    rendered = samples(rendered_by_the_hook(tmp_path))
    assert sorted(rendered) == sorted(documented), 'a gauge is missing from a full render'
    for name, label_sets in rendered.items():
        assert label_sets == {frozenset(documented[name])}, (name, label_sets, documented[name])


def test_the_per_gpu_gauges_share_one_label_set(tmp_path):
    rendered = samples(rendered_by_the_hook(tmp_path))
    per_gpu = [name for name in rendered if name.startswith('gpu_reset_gpu_')]
    assert len(per_gpu) >= 5
    for name in per_gpu:
        (labels,) = rendered[name]
        assert {'gpu', 'pci_bus_id'} <= labels and len(labels - {'gpu', 'pci_bus_id'}) <= 1, (name, labels)


def test_the_new_gauges_carry_what_the_result_says(tmp_path):
    text = rendered_by_the_hook(tmp_path)
    assert 'gpu_reset_drained 1\n' in text
    assert 'gpu_reset_gpu_reset_timestamp_seconds{gpu="1",pci_bus_id="00000000:2A:00.0"} 1767225600.5\n' in text
    assert 'gpu_reset_hook_budget_seconds 60.0\n' in text and 'gpu_reset_hook_duration_seconds 4.5\n' in text


def test_the_role_renders_the_same_gauges_but_the_hooks():
    """The role has no budget: the hook's two gauges are left out, every other one is there."""
    text = rendered_by_the_role()
    rendered = samples(text)
    hook_only = {'gpu_reset_hook_budget_seconds', 'gpu_reset_hook_duration_seconds'}
    assert sorted(rendered) == sorted(set(guide_gauges()) - hook_only)
    assert 'gpu_reset_gpu_reset_timestamp_seconds{gpu="1",pci_bus_id="00000000:2A:00.0"} 1767225600.5\n' in text


@pytest.mark.parametrize('escalation', [None, {'gpus': []}])
def test_a_run_without_a_gpu_reset_has_no_reset_samples(tmp_path, escalation):
    write_metrics(str(tmp_path), dict(RESULT, escalation=escalation, drained=False))
    with open(str(tmp_path / 'gpu_reset.prom')) as handle:
        rendered = samples(handle.read())
    assert 'gpu_reset_gpu_reset_timestamp_seconds' not in rendered
    assert 'gpu_reset_hook_budget_seconds' not in rendered


def test_the_alert_rules_use_only_gauges_the_template_writes():
    with open(RULES) as handle:
        rules = yaml.safe_load(handle)
    types = template_types()
    exprs = [rule['expr'] for group in rules['groups'] for rule in group['rules']]
    used = set(name for expr in exprs for name in re.findall(r'\bgpu_reset_[a-z_]+\b', expr))
    assert used and used <= set(types), sorted(used - set(types))
    alerts = [rule['alert'] for group in rules['groups'] for rule in group['rules']]
    with open(os.path.join(REPO, 'examples', 'prometheus', 'README.md')) as handle:
        documented = handle.read()
    assert [alert for alert in alerts if '`%s`' % alert not in documented] == []


# A clean run whose performance probe (nvidia-smi reader: no replay counter) found GPU 3's link
# trained down to Gen3 x8 and its copies below GPU 0's, and GPU 0 healthy; GPU 7 lost (nothing read).
PERFORMANCE = {
    'host': 'gpu07', 'outcome': 'clean', 'reason': None, 'started': 1767225600.5, 'duration_s': 1.75, 'drained': False,
    'signalled': [], 'escalation': None, 'gpus': [],
    'probe': {'probed': True, 'library_missing': False, 'duration_ms': 900.5, 'verified': {}, 'gpus': [
        {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'ok': True, 'level': 'performance', 'h2d_gbps': 55.1,
         'd2h_gbps': 54.8, 'hbm_gbps': 3710.4, 'link': {'gen': 5, 'width': 16, 'max_gen': 5, 'max_width': 16},
         'replays': None, 'copy_round': 1, 'slow': []},
        {'index': 3, 'pci_bus_id': '00000000:9A:00.0', 'ok': True, 'level': 'performance', 'h2d_gbps': 6.5,
         'd2h_gbps': 6.25, 'hbm_gbps': None, 'link': {'gen': 3, 'width': 8, 'max_gen': 5, 'max_width': 16},
         'replays': None, 'copy_round': 2, 'slow': [
             {'reason': 'PCIE_LINK_DEGRADED', 'message': 'PCIE_LINK_DEGRADED: GPU 3 (00000000:9A:00.0): its PCIe link '
                                                         'ran at Gen3 x8 while loaded, below its maximum of Gen5 x16'},
             {'reason': 'H2D_BELOW_PEERS', 'message': 'H2D_BELOW_PEERS: GPU 3 (00000000:9A:00.0): ...'},
             {'reason': 'D2H_BELOW_PEERS', 'message': 'D2H_BELOW_PEERS: GPU 3 (00000000:9A:00.0): ...'}]},
        {'index': None, 'pci_bus_id': '00000000:DB:00.0', 'ok': False, 'level': None, 'h2d_gbps': None,
         'd2h_gbps': None, 'hbm_gbps': None, 'link': None, 'replays': None, 'copy_round': None, 'slow': []},
    ]},
}
PERFORMANCE_LINES = '''\
# HELP gpu_reset_gpu_bandwidth_gbps Each GPU's bandwidths in GB/s as the performance probe measured them: h2d (host to GPU), d2h (GPU to host), hbm (memory).
# TYPE gpu_reset_gpu_bandwidth_gbps gauge
gpu_reset_gpu_bandwidth_gbps{gpu="0",pci_bus_id="00000000:18:00.0",copy="h2d"} 55.1
gpu_reset_gpu_bandwidth_gbps{gpu="0",pci_bus_id="00000000:18:00.0",copy="d2h"} 54.8
gpu_reset_gpu_bandwidth_gbps{gpu="0",pci_bus_id="00000000:18:00.0",copy="hbm"} 3710.4
gpu_reset_gpu_bandwidth_gbps{gpu="3",pci_bus_id="00000000:9A:00.0",copy="h2d"} 6.5
gpu_reset_gpu_bandwidth_gbps{gpu="3",pci_bus_id="00000000:9A:00.0",copy="d2h"} 6.25
# HELP gpu_reset_gpu_pcie_link_generation Each GPU's PCIe link generation, read by the performance probe while the GPU copied (an idle link runs slower).
# TYPE gpu_reset_gpu_pcie_link_generation gauge
gpu_reset_gpu_pcie_link_generation{gpu="0",pci_bus_id="00000000:18:00.0"} 5
gpu_reset_gpu_pcie_link_generation{gpu="3",pci_bus_id="00000000:9A:00.0"} 3
# HELP gpu_reset_gpu_pcie_link_width Each GPU's PCIe link width (lanes), read by the performance probe while the GPU copied.
# TYPE gpu_reset_gpu_pcie_link_width gauge
gpu_reset_gpu_pcie_link_width{gpu="0",pci_bus_id="00000000:18:00.0"} 16
gpu_reset_gpu_pcie_link_width{gpu="3",pci_bus_id="00000000:9A:00.0"} 8
# HELP gpu_reset_gpu_pcie_link_max_generation The highest PCIe link generation each GPU and its slot allow, as the performance probe read it.
# TYPE gpu_reset_gpu_pcie_link_max_generation gauge
gpu_reset_gpu_pcie_link_max_generation{gpu="0",pci_bus_id="00000000:18:00.0"} 5
gpu_reset_gpu_pcie_link_max_generation{gpu="3",pci_bus_id="00000000:9A:00.0"} 5
# HELP gpu_reset_gpu_pcie_link_max_width The widest PCIe link (lanes) each GPU and its slot allow, as the performance probe read it.
# TYPE gpu_reset_gpu_pcie_link_max_width gauge
gpu_reset_gpu_pcie_link_max_width{gpu="0",pci_bus_id="00000000:18:00.0"} 16
gpu_reset_gpu_pcie_link_max_width{gpu="3",pci_bus_id="00000000:9A:00.0"} 16
# HELP gpu_reset_gpu_slow 1 for each reason the performance probe called a GPU slow (PCIE_LINK_DEGRADED, PCIE_REPLAYS, H2D/D2H/HBM_BELOW_PEERS).
# TYPE gpu_reset_gpu_slow gauge
gpu_reset_gpu_slow{gpu="3",pci_bus_id="00000000:9A:00.0",reason="PCIE_LINK_DEGRADED"} 1
gpu_reset_gpu_slow{gpu="3",pci_bus_id="00000000:9A:00.0",reason="H2D_BELOW_PEERS"} 1
gpu_reset_gpu_slow{gpu="3",pci_bus_id="00000000:9A:00.0",reason="D2H_BELOW_PEERS"} 1
'''
PERFORMANCE_FAMILIES = {
    'gpu_reset_gpu_bandwidth_gbps', 'gpu_reset_gpu_pcie_link_generation', 'gpu_reset_gpu_pcie_link_width',
    'gpu_reset_gpu_pcie_link_max_generation', 'gpu_reset_gpu_pcie_link_max_width', 'gpu_reset_gpu_pcie_replays',
    'gpu_reset_gpu_slow'}


def performance_lines(text):
    """The lines of text that belong to the performance probe's families, # HELP and # TYPE included."""
    return ''.join(line + '\n' for line in text.splitlines()
                   if (line.split()[2] if line.startswith('#') else re.split(r'[{ ]', line)[0]) in PERFORMANCE_FAMILIES)


def test_a_performance_probe_writes_its_figures_and_each_reason_of_a_slow_gpu(tmp_path):
    write_metrics(str(tmp_path), PERFORMANCE)
    with open(str(tmp_path / 'gpu_reset.prom')) as handle:
        text = handle.read()
    assert performance_lines(text) == PERFORMANCE_LINES
    # One block, right after the run's own gauges; no replays family: the reader had no counter.
    assert PERFORMANCE_LINES in text
    assert 'gpu_reset_gpu_pcie_replays' not in text
    samples(text)


def test_the_replays_are_written_where_the_reader_counted_them():
    result = dict(PERFORMANCE, probe=dict(PERFORMANCE['probe'], gpus=[
        dict(gpu, replays=count) for gpu, count in zip(PERFORMANCE['probe']['gpus'], (0, 12, None))]))
    text = metrics(result)
    assert (
        '# HELP gpu_reset_gpu_pcie_replays By how much each GPU\'s PCIe replay counter grew during the performance '
        "probe's copies (NVML reader only).\n"
        '# TYPE gpu_reset_gpu_pcie_replays gauge\n'
        'gpu_reset_gpu_pcie_replays{gpu="0",pci_bus_id="00000000:18:00.0"} 0\n'
        'gpu_reset_gpu_pcie_replays{gpu="3",pci_bus_id="00000000:9A:00.0"} 12\n# HELP ') in text


@pytest.mark.parametrize('probe', [
    None,
    {'probed': False, 'library_missing': True, 'gpus': None, 'verified': {}},
    # The allocation and memory levels: none of the performance keys.
    {'probed': True, 'verified': {}, 'gpus': [
        {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'ok': True, 'level': 'allocation', 'verified_at': 1767225601.25}]},
    # Performance, every GPU healthy and no figure read.
    {'probed': True, 'verified': {}, 'gpus': [
        {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'h2d_gbps': None, 'd2h_gbps': None, 'hbm_gbps': None,
         'link': None, 'replays': None, 'slow': []}]},
])
def test_without_performance_figures_no_family_of_theirs_is_written(probe):
    text = metrics(dict(PERFORMANCE, probe=probe))
    assert performance_lines(text) == ''
    assert 'gpu_reset_held_for_person 0\n' in text
