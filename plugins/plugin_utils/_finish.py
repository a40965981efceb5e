# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The sequence's last step: drain a host that is not clean, write its node_exporter metrics on
it and its report, for the action gpuops.nvidia.gpu_reset and the Slurm hook alike.

What runs on the host goes through the second seam, a Host: command(argv, seconds) runs a
command there and returns (rc, stderr); write(path, text) replaces a file there. The action's
Host runs them over Ansible's connection, the hook's on the node itself. The report is written
where the sequence runs (the controller for the action, the node for the hook). A step that
cannot write what was asked for fails the host, saying why in its report.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import tempfile

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._report import ReportPathError, report_path

WRITE_METRICS = 'write node_exporter metrics'
WRITE_REPORT = 'write the report on the controller'

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRICS_TEMPLATE = os.path.join(COLLECTION, 'roles', 'gpu_reset', 'templates', 'gpu_reset.prom.j2')
METRICS_FILE = 'gpu_reset.prom'


class HostError(Exception):
    """A command or a write on the host that could not be done; its text says why."""


def finish(run, host, drain, drain_misconfigured=False, hook=None):
    """The finishing steps after run's verdict (run.report), as run.options ask.

    drain(report, seconds): drains the host (run_drain, or the hook's own choice between a
    drain and a reboot). A misconfigured host is drained only with drain_misconfigured: nothing
    was read there (the hook drains it all the same, since its next job would run on it).
    hook: gives {budget_s, duration_s} of the Slurm hook's run when called, for its own gauges."""
    report, options = run.report, run.options
    if report['outcome'] == 'failed' and options['on_failure'] == 'drain' and (drain_misconfigured or not run.misconfigured):
        if run.check_mode:
            report['would_drain'] = True
        else:
            drain(report, options['drain_timeout'])
    if options['textfile_dir'] and not run.check_mode:
        try:
            host.write(os.path.join(options['textfile_dir'], METRICS_FILE), metrics(report, hook and hook()))
        except (HostError, OSError, ImportError) as exc:
            failed(report, WRITE_METRICS, exc)
    if options['report_dir']:
        try:
            write_report(options['report_dir'], run.host, report)
        except (OSError, ReportPathError) as exc:
            failed(report, WRITE_REPORT, exc)
    return report


def run_drain(report, host, argv, seconds):
    """Run the drain command argv on host within seconds; the report says whether it drained,
    and its reason why not."""
    try:
        rc, stderr = host.command(argv, max(seconds, 1))
        why = None if rc == 0 else (stderr.strip() or 'rc %d' % rc)
    except HostError as exc:
        why = str(exc)
    report['drained'] = why is None
    if why is not None:
        report['reason'] = '%s; the drain command failed: %s' % (report['reason'], why)
    return report


def failed(report, step, why):
    """Fail report for step, keeping the reason it has."""
    report['outcome'] = 'failed'
    report['reason'] = '%s%s: %s' % (report['reason'] + '; ' if report['reason'] else '', step, why)


def metrics(report, hook=None):
    """The node_exporter text of report (the role's template gpu_reset.prom.j2, plain Jinja)."""
    import jinja2

    with open(METRICS_TEMPLATE) as handle:
        template = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True).from_string(handle.read())
    return template.render(gpu_reset_result=report, gpu_reset__hook=hook)


def write_report(directory, host, report):
    """The report in directory, named after host (escaped, inside directory)."""
    path = report_path(directory, host)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    write_file(path, json.dumps(report, indent=2) + '\n')


def write_file(path, text):
    """Replace path with text, mode 0644, at once (a reader never sees half of it)."""
    handle, tmp = tempfile.mkstemp(prefix='.gpuops-', dir=os.path.dirname(path) or '.')
    try:
        with os.fdopen(handle, 'w') as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
