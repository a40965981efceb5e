# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The metrics as operators consume them: the alert rules of examples/prometheus checked and
tested by Debian's promtool, and the textfile of real Slurm hook runs on a simulated host (one
released, one failed and drained, one held for a person, one whose performance probe found a GPU's
link degraded) served by Debian's prometheus-node-exporter, scraped over loopback, and judged by the
alert rules."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from adhoc import run_hook_runner
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import History
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._finish import metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, 'examples', 'prometheus')
RULES = os.path.join(EXAMPLES, 'gpuops.rules.yml')
PACKAGES = 'prometheus prometheus-node-exporter'
# Where Debian puts them, should PATH leave those directories out.
SYSTEM_PATH = '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'
# Seconds node_exporter may take to answer after it starts (a busy machine), and each request.
EXPORTER_START_S = 20
REQUEST_S = 5
# The Slurm hook's budget and the release's time in these runs.
BUDGET_S = 60
RELEASE_S = 10

SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def tool(name):
    """The path of a Debian tool these tests need; the test fails, saying what to install, without it."""
    found = shutil.which(name) or shutil.which(name, path=SYSTEM_PATH)
    if found is None:
        pytest.fail("%s is not installed: install Debian's packages prometheus and prometheus-node-exporter "
                    '(apt-get install -y %s; scripts/test.sh integration installs them)' % (name, PACKAGES), pytrace=False)
    return found


@pytest.fixture(scope='module')
def promtool():
    return tool('promtool')


@pytest.fixture(scope='module')
def node_exporter_program():
    return tool('prometheus-node-exporter')


def samples(text):
    """[(name, {label: value}, value)] of a metrics text (the text format, no timestamps)."""
    found = []
    for line in text.splitlines():
        if not line.strip() or line.startswith('#'):
            continue
        match = SAMPLE_RE.match(line)
        assert match, 'not a sample line: %r' % line
        found.append((match.group(1), dict(LABEL_RE.findall(match.group(2) or '')), float(match.group(3))))
    return found


def key(name, labels):
    """A sample's name and labels, a bucket's bound as a number (node_exporter writes 2592000 as 2.592e+06)."""
    labels = dict(labels)
    if 'le' in labels:
        labels['le'] = float(labels['le'])
    return name, tuple(sorted(labels.items()))


# -- the rules --------------------------------------------------------------------------------

def test_promtool_checks_the_rules_and_passes_their_tests(promtool):
    check = subprocess.run([promtool, 'check', 'rules', 'gpuops.rules.yml'], cwd=EXAMPLES, capture_output=True,
                           text=True, timeout=120, check=False)
    assert check.returncode == 0 and 'SUCCESS' in check.stdout, check.stdout + check.stderr
    alerts = [rule['alert'] for rule in rules()]
    assert '%d rules found' % len(alerts) in check.stdout, check.stdout
    test = subprocess.run([promtool, 'test', 'rules', 'gpuops.rules.test.yml'], cwd=EXAMPLES, capture_output=True,
                          text=True, timeout=120, check=False)
    assert test.returncode == 0 and 'SUCCESS' in test.stdout, test.stdout + test.stderr
    # Each alert has a test of its own in the file.
    with open(os.path.join(EXAMPLES, 'gpuops.rules.test.yml')) as handle:
        tested = handle.read()
    assert [alert for alert in alerts if 'alertname: %s\n' % alert not in tested] == []


# -- a real run's metrics, through node_exporter ----------------------------------------------

def run_hook(host, directory, textfile_dir, **more):
    """(exit status, report, drain command's arguments or None) of the Slurm hook's runner on
    host, every GPU, writing its metrics to textfile_dir; more: gpu_reset_* variables."""
    return run_hook_runner(directory, dict({
        'gpu_reset_nvidia_smi_path': host.smi_path, 'gpu_reset_host_root': host.root,
        'gpu_reset_backend': 'nvidia-smi', 'gpu_reset_probe': False, 'gpu_reset_grace_period': 0.5,
        'gpu_reset_lock_file': str(directory / 'release.lock'), 'gpu_reset_textfile_dir': str(textfile_dir)}, **more),
        os.environ, RELEASE_S, BUDGET_S)


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=REQUEST_S) as response:
        return response.status, response.read().decode('utf-8')


class NodeExporter:
    """Debian's prometheus-node-exporter with only its textfile collector, on a loopback port,
    its log in a file."""

    def __init__(self, program, textfile_dir, log):
        self.program, self.textfile_dir, self.log = program, str(textfile_dir), log
        self.proc = self.url = None

    def start(self):
        """Start it and wait until it answers; another port when the first was taken meanwhile."""
        for dummy in range(3):
            port = free_port()
            self.url = 'http://127.0.0.1:%d/metrics' % port
            with open(str(self.log), 'a') as log:
                self.proc = subprocess.Popen([self.program, '--collector.disable-defaults', '--collector.textfile',
                                              '--collector.textfile.directory=%s' % self.textfile_dir,
                                              '--web.listen-address=127.0.0.1:%d' % port],
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            if self.wait_answer():
                return
            if 'address already in use' not in self.log.read_text():
                break
        pytest.fail('prometheus-node-exporter did not answer on %s within %d s; its log:\n%s'
                    % (self.url, EXPORTER_START_S, self.log.read_text()))

    def wait_answer(self):
        """True once it serves /metrics; False when it exited or did not answer in time."""
        ends = time.monotonic() + EXPORTER_START_S
        while time.monotonic() < ends:
            if self.proc.poll() is not None:
                return False
            try:
                if get(self.url)[0] == 200:
                    return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        return False

    def scrape(self):
        status, text = get(self.url)
        assert status == 200
        return text

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def node_exporter(node_exporter_program, tmp_path):
    """start(textfile_dir) -> a started NodeExporter; every one started is stopped at teardown."""
    started = []

    def start(textfile_dir):
        exporter = NodeExporter(node_exporter_program, textfile_dir, tmp_path / ('node_exporter-%d.log' % len(started)))
        started.append(exporter)
        exporter.start()
        return exporter

    try:
        yield start
    finally:
        for exporter in started:
            exporter.stop()


def released_host(host):
    """A job's process holds GPUs 0 and 1: the hook signals it and the GPUs come free."""
    host.hold(gpus='0,1', mib=4096, name='train')
    return {}


def failed_host(host):
    """GPU 1 holds memory with no process, and its GPU reset is refused: the hook drains the node."""
    host.fault('stuck', gpu=1, mib=2048)
    host.fault('reset-refused', gpu=1)
    return {'gpu_reset_allow_gpu_reset': True}


def held_host(host):
    """GPU 1 holds memory with no process again, after two incidents this week that a GPU reset
    cured (its history): its reset budget of 2 is spent, and the hook holds the node for a person."""
    uuid = host.state['gpus'][1]['uuid']
    history = History.for_host(host.root)
    now = time.time()
    for days in (3, 1):
        assert history.record([(uuid, 1, 'orphaned memory')], 'reset', when=now - days * 86400, outcome='cured',
                              duration_s=4.0, proof='read clean after the reset')
        assert history.record([(uuid, 1, 'orphaned memory')], 'cure', when=now - days * 86400, how='reset')
    host.fault('stuck', gpu=1, mib=2048)
    return {'gpu_reset_allow_gpu_reset': True, 'gpu_reset_reset_budget': 2, 'gpu_reset_hold_after_cures': 5}


def slow_host(host):
    """The performance probe (the simulated libcuda.so.1) finds GPU 3's link trained down to Gen3 x8
    under load, its copies below its peers' with it: a slow GPU is warned about, the run is clean."""
    host.slow(3, link=(3, 8))
    return {'gpu_reset_probe': True, 'gpu_reset_probe_level': 'performance',
            'gpu_reset_probe_cuda_library': host.install_cuda()}


SCENARIOS = {
    'released': (released_host, 0, 'released'),
    'failed': (failed_host, 10, 'failed'),
    'held': (held_host, 10, 'failed'),
    'slow': (slow_host, 0, 'clean'),
}
# Each scenario's alerts: a name, or a name and the labels of the series it fired on.
SLOW_GPU = {'gpu': '3', 'pci_bus_id': '00000000:5D:00.0'}
FIRING = {'released': [], 'failed': ['GpuResetDrained'], 'held': ['GpuResetDrained', 'GpuResetHeldForPerson'],
          'slow': [('GpuResetPcieLinkDegraded', dict(SLOW_GPU, reason='PCIE_LINK_DEGRADED')),
                   ('GpuResetGpuSlowerThanPeers', dict(SLOW_GPU, reason='D2H_BELOW_PEERS')),
                   ('GpuResetGpuSlowerThanPeers', dict(SLOW_GPU, reason='H2D_BELOW_PEERS'))]}
# The families that are not gauges, and the suffixes of their samples.
NOT_GAUGES = {'gpu_reset_gpu_cures_total': 'counter', 'gpu_reset_gpu_time_to_repair_seconds': 'histogram',
              'gpu_reset_gpu_time_between_incidents_seconds': 'histogram'}


def family(name):
    """The metric family of a sample's name (a histogram's _bucket, _sum and _count are its own)."""
    for suffix in ('_bucket', '_sum', '_count'):
        if name.endswith(suffix) and NOT_GAUGES.get(name[:-len(suffix)]) == 'histogram':
            return name[:-len(suffix)]
    return name


@pytest.mark.parametrize('scenario', sorted(SCENARIOS))
def test_node_exporter_serves_every_gauge_of_a_real_run(gpuhost, tmp_path, node_exporter, promtool, scenario):
    make, status, outcome = SCENARIOS[scenario]
    textfile_dir = tmp_path / 'textfile'
    textfile_dir.mkdir()
    rc, report, drained = run_hook(gpuhost, tmp_path, textfile_dir, **make(gpuhost))
    assert (rc, report['outcome']) == (status, outcome), report['reason']
    in_file = assert_served(node_exporter, textfile_dir)

    values = dict((key(name, labels), value) for name, labels, value in in_file)
    assert values[key('gpu_reset_hook_budget_seconds', {})] == BUDGET_S
    assert 0 < values[key('gpu_reset_hook_duration_seconds', {})] < BUDGET_S
    assert values[key('gpu_reset_outcome', {'outcome': outcome})] == 1
    gpus = set((labels['gpu'], labels['pci_bus_id']) for name, labels, value in in_file if name == 'gpu_reset_gpu_state')
    assert len(gpus) == 8 and all(bus for dummy, bus in gpus), gpus
    resets = [labels for name, labels, value in in_file if name == 'gpu_reset_gpu_reset_timestamp_seconds']
    if scenario == 'released':
        assert values[key('gpu_reset_success', {})] == 1 and values[key('gpu_reset_drained', {})] == 0
        assert values[key('gpu_reset_processes_signalled', {})] >= 1 and drained is None
        assert resets == [] and values[key('gpu_reset_held_for_person', {})] == 0
    elif scenario == 'held':
        uuid = gpuhost.state['gpus'][1]['uuid']
        assert drained[3].startswith('reason=gpu_reset(hold): GPU 1 (%s)' % uuid), drained
        gpu = [dict(labels) for name, labels, value in in_file if name == 'gpu_reset_gpu_state' and labels['gpu'] == '1'][0]
        gpu = {'gpu': '1', 'pci_bus_id': gpu['pci_bus_id']}
        assert values[key('gpu_reset_held_for_person', {})] == 1
        assert values[key('gpu_reset_gpu_held', gpu)] == 1
        assert values[key('gpu_reset_gpu_cures_total', dict(gpu, kind='reset'))] == 2
        repair = 'gpu_reset_gpu_time_to_repair_seconds'
        assert values[key(repair + '_count', gpu)] == 2 and values[key(repair + '_sum', gpu)] == 8
        assert values[key(repair + '_bucket', dict(gpu, le='15'))] == 2
        between = 'gpu_reset_gpu_time_between_incidents_seconds'
        # Three incidents: the two cured, and the one held now (still open): 2 days, then just over 1.
        assert values[key(between + '_count', gpu)] == 2
        assert values[key(between + '_bucket', dict(gpu, le='86400'))] == 0
        assert values[key(between + '_bucket', dict(gpu, le='259200'))] == 2
    elif scenario == 'slow':
        assert values[key('gpu_reset_success', {})] == 1 and drained is None
        bus = dict((labels['gpu'], labels['pci_bus_id']) for name, labels, value in in_file
                   if name == 'gpu_reset_gpu_state')
        assert bus['3'] == SLOW_GPU['pci_bus_id'], bus
        slow = sorted((labels['gpu'], labels['reason']) for name, labels, value in in_file
                      if name == 'gpu_reset_gpu_slow' and value == 1)
        assert slow == [('3', 'D2H_BELOW_PEERS'), ('3', 'H2D_BELOW_PEERS'), ('3', 'PCIE_LINK_DEGRADED')], slow
        for gpu in sorted(bus):
            labels = {'gpu': gpu, 'pci_bus_id': bus[gpu]}
            link = [values[key('gpu_reset_gpu_pcie_link_' + name, labels)]
                    for name in ('generation', 'width', 'max_generation', 'max_width')]
            assert link == ([3, 8, 5, 16] if gpu == '3' else [5, 16, 5, 16]), (gpu, link)
            copies = [values[key('gpu_reset_gpu_bandwidth_gbps', dict(labels, copy=copy))] for copy in ('h2d', 'd2h')]
            assert all(figure < 7 if gpu == '3' else 52 <= figure <= 57 for figure in copies), (gpu, copies)
            assert values[key('gpu_reset_gpu_bandwidth_gbps', dict(labels, copy='hbm'))] > 3000
        # The nvidia-smi reader has no replay counter.
        assert [name for name, labels, value in in_file if name == 'gpu_reset_gpu_pcie_replays'] == []
    else:
        assert values[key('gpu_reset_success', {})] == 0 and values[key('gpu_reset_drained', {})] == 1
        assert drained[:3] == ['update', 'nodename=gpu07', 'state=drain'], drained
        assert [labels['gpu'] for labels in resets] == ['1'] and resets[0]['pci_bus_id'], resets
        assert values[key('gpu_reset_gpu_orphaned_mib', resets[0])] >= 2048
    assert_alerts(promtool, tmp_path, in_file, scenario, FIRING[scenario])


def assert_served(node_exporter, textfile_dir):
    """The samples of textfile_dir/gpu_reset.prom, once node_exporter served every one of them with
    its labels, its value and its family's type, and logged no complaint."""
    in_file = samples((textfile_dir / 'gpu_reset.prom').read_text())
    exporter = node_exporter(textfile_dir)
    scraped_text = exporter.scrape()
    exporter.stop()
    scraped = dict((key(name, labels), value) for name, labels, value in samples(scraped_text))

    # Every sample of the file, with its labels and its value, and every gauge typed as such.
    missing = [(name, labels) for name, labels, value in in_file if key(name, labels) not in scraped]
    assert missing == [], 'not served by node_exporter: %s\n--- served:\n%s' % (missing, scraped_text)
    for name, labels, value in in_file:
        assert math.isclose(scraped[key(name, labels)], value, rel_tol=1e-12), (name, labels, value)
    for name in set(family(name) for name, labels, value in in_file):
        assert '# TYPE %s %s\n' % (name, NOT_GAUGES.get(name, 'gauge')) in scraped_text, name
    assert scraped[key('node_textfile_scrape_error', {})] == 0
    mtimes = [dict(labels).get('file', '') for (name, labels) in scraped if name == 'node_textfile_mtime_seconds']
    assert [path for path in mtimes if path.endswith('gpu_reset.prom')], scraped_text
    log = exporter.log.read_text()
    assert [line for line in log.splitlines() if complains(line)] == [], log
    return in_file


# A clean run's report whose performance probe (the NVML reader, which counts replays) found GPU 3's
# link trained down, its copies below its peer's with it, and GPU 0 healthy: the families the probe
# adds, independent of the simulated CUDA library.
PERFORMANCE_REPORT = {
    'host': 'gpu07', 'outcome': 'clean', 'reason': None, 'started': 1767225600.5, 'duration_s': 1.75,
    'drained': False, 'signalled': [], 'escalation': None,
    'gpus': [{'index': index, 'pci_bus_id': bus, 'state': 'free', 'recovery_action': 'none', 'orphaned_mib': 0,
              'seconds_until_free': 0} for index, bus in ((0, '00000000:18:00.0'), (3, '00000000:5D:00.0'))],
    'probe': {'probed': True, 'library_missing': False, 'duration_ms': 900.5, 'verified': {}, 'gpus': [
        {'index': 0, 'pci_bus_id': '00000000:18:00.0', 'ok': True, 'level': 'performance', 'h2d_gbps': 55.1,
         'd2h_gbps': 54.8, 'hbm_gbps': 3710.4, 'link': {'gen': 5, 'width': 16, 'max_gen': 5, 'max_width': 16},
         'replays': 0, 'slow': []},
        {'index': 3, 'pci_bus_id': '00000000:5D:00.0', 'ok': True, 'level': 'performance', 'h2d_gbps': 6.5,
         'd2h_gbps': 6.25, 'hbm_gbps': 3702.5, 'link': {'gen': 3, 'width': 8, 'max_gen': 5, 'max_width': 16},
         'replays': 3, 'slow': [{'reason': reason, 'message': '%s: GPU 3 (00000000:5D:00.0): ...' % reason}
                                for reason in ('PCIE_LINK_DEGRADED', 'PCIE_REPLAYS', 'H2D_BELOW_PEERS')]},
    ]},
}


def test_node_exporter_serves_the_performance_probes_gauges(tmp_path, node_exporter, promtool):
    textfile_dir = tmp_path / 'textfile'
    textfile_dir.mkdir()
    (textfile_dir / 'gpu_reset.prom').write_text(metrics(PERFORMANCE_REPORT))
    in_file = assert_served(node_exporter, textfile_dir)
    names = set(name for name, labels, value in in_file)
    assert {'gpu_reset_gpu_bandwidth_gbps', 'gpu_reset_gpu_pcie_link_generation', 'gpu_reset_gpu_pcie_link_width',
            'gpu_reset_gpu_pcie_link_max_generation', 'gpu_reset_gpu_pcie_link_max_width',
            'gpu_reset_gpu_pcie_replays', 'gpu_reset_gpu_slow'} <= names, sorted(names)
    gpu3 = {'gpu': '3', 'pci_bus_id': '00000000:5D:00.0'}
    # PCIE_REPLAYS is on the dashboard, not an alert of its own.
    assert_alerts(promtool, tmp_path, in_file, 'gpu08', [
        ('GpuResetPcieLinkDegraded', dict(gpu3, reason='PCIE_LINK_DEGRADED')),
        ('GpuResetGpuSlowerThanPeers', dict(gpu3, reason='H2D_BELOW_PEERS'))])


def assert_alerts(promtool, directory, in_file, instance, firing):
    """The alert rules over the run's gauges, as Prometheus would have scraped them for ten
    minutes from instance: exactly the alerts of firing fire."""
    series = [{'series': '%s{%s}' % (name, ', '.join('%s="%s"' % item for item in sorted(
        dict(labels, instance=instance, job='node').items()))), 'values': '%r+0x10' % value}
        for name, labels, value in in_file]
    expected = []
    for alert in firing:
        alert, labels = alert if isinstance(alert, tuple) else (alert, {})
        labels = dict(labels, alertname=alert, alertstate='firing', instance=instance, job='node',
                      severity=severity(alert))
        expected.append({'labels': 'ALERTS{%s}' % ', '.join('%s="%s"' % item for item in sorted(labels.items())),
                         'value': 1})
    test = {'rule_files': [RULES], 'evaluation_interval': '1m', 'tests': [{
        'interval': '1m', 'input_series': series,
        'promql_expr_test': [{'expr': 'ALERTS{alertstate="firing"}', 'eval_time': '5m', 'exp_samples': expected}]}]}
    path = directory / 'alerts.test.yml'
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([promtool, 'test', 'rules', str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def complains(line):
    """Whether a line of node_exporter's log is an error, or a warning about the metrics file."""
    return 'level=error' in line or ('level=warn' in line and 'gpu_reset' in line)


def rules():
    """The alert rules, each a dict (alert, expr, labels, annotations)."""
    with open(RULES) as handle:
        return [rule for group in yaml.safe_load(handle)['groups'] for rule in group['rules']]


def severity(alert):
    return [rule['labels']['severity'] for rule in rules() if rule['alert'] == alert][0]
