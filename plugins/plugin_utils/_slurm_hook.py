# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset sequence without ansible-playbook, for Slurm's Prolog and Epilog.

A Prolog runs before every job, so its start-up counts: ansible-playbook alone takes longer to
start than the release takes on a clean node. This program runs the one sequence
(plugin_utils/_sequence.py, the action gpuops.nvidia.gpu_reset's) on the node itself, its
modules run as programs (run_module below), then the role's finishing section:

1. the settings: the spec's defaults (plugin_utils/_spec.py; the probe on), then the hook's
   variables file, then what the hook fixes (the job's GPUs, the release's time, drain on
   failure), checked by the sequence as the action checks them;
2. the sequence: release, read again when the release did not leave the GPUs clean, judge, and
   prove the GPUs judged clean by allocation (gpu_reset_probe, on by default here;
   gpu_reset_probe_mib). A host without libcuda.so.1 is probed with a note in the report, not
   drained (gpu_reset_probe_missing_library: fail drains it);
3. on failure, the role's default drain command (scontrol ... state=drain reason="gpu_reset: <why>");
   then the node_exporter metrics and the JSON report, when asked for.

    python -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook \\
        --node NODE [--vars-file FILE] [--gpus 0,1] [--timeout S] [--deadline S] [--scontrol PATH]
        [--playbook-vars FILE]

Exit status: 0 clean or released; 10 failed, the node drained with the reason; 11 failed and
the drain command failed too (the report says why); the reason on stderr and the report on
stdout; 2 the settings or the arguments could not be read (nothing done); 3 the settings need
the playbook (a clean query of the user's own, a drain command of the user's own, or a templated
value): the hook then runs ansible-playbook instead. Never 1, which is what Python itself exits
with when it crashes or cannot import the collection.

With --playbook-vars FILE it only writes the variables the hook fixes (on_failure, timeout, the
job's GPUs, parsed here as for the module runner) to FILE as JSON, for ansible-playbook -e @FILE.

Unlike the role in a fleet run, a misconfigured node is drained too, with the reason: a Prolog
or Epilog that fails drains the node anyway, only with a reason that says nothing.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import json
import os
import re
import sys
import tempfile
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _sequence
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._sequence import ModuleError
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import DRAIN_COMMAND, PREFIX, defaults

# The runner's exit statuses (gpu-reset-hook.sh maps them to its own, see examples/slurm/README.md).
# Not 1: that is what a Python that crashes or cannot import the collection exits with, and it
# must never read as "drained with the reason".
RUNNER_SETTINGS_UNREADABLE = 2
RUNNER_NEEDS_PLAYBOOK = 3
RUNNER_DRAINED = 10
RUNNER_NOT_DRAINED = 11

MODULES = 'ansible_collections.gpuops.nvidia.plugins.modules.'
# plugins/plugin_utils/_slurm_hook.py -> the collection, and the directory that holds ansible_collections/
COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(COLLECTION)))
# The role's metrics, one template for both.
METRICS_TEMPLATE = os.path.join(COLLECTION, 'roles', 'gpu_reset', 'templates', 'gpu_reset.prom.j2')
# Seconds kept for the drain command at the end of the hook's time (at most a tenth of it).
DRAIN_RESERVE_S = 5
# The hook's own defaults over the spec's: the probe is on.
HOOK_DEFAULTS = {'probe': True}


class NeedsPlaybook(Exception):
    """A setting that only the playbook can honour."""


def load_settings(vars_file=None, overrides=None):
    """The spec's defaults (the hook's over them), the variables file, then overrides: {gpu_reset_name: value}."""
    import yaml

    settings = dict((PREFIX + name, value) for name, value in dict(defaults(), **HOOK_DEFAULTS).items())
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


def setting(settings, name):
    return settings.get(PREFIX + name)


class ModuleRunner:
    """The sequence's seam on the node: a module of the collection run as a program, within the
    time left before ends (time.monotonic())."""

    def __init__(self, ends):
        self.ends = ends

    def __call__(self, name, args):
        """The module's result (a dict; one that failed too, with failed and msg); ModuleError
        when it gives none (stopped at the deadline, with what it started, or a crash)."""
        from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
        from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Runner

        with tempfile.NamedTemporaryFile('w', prefix='gpuops-args-', suffix='.json', delete=False) as handle:
            json.dump({'ANSIBLE_MODULE_ARGS': args}, handle)
        runner = Runner(sys.executable, name='gpuops.nvidia.%s' % name, env={
            'PYTHONPATH': COLLECTIONS_ROOT + (os.pathsep + os.environ['PYTHONPATH'] if os.environ.get('PYTHONPATH') else '')})
        try:
            rc, stdout, stderr = runner.run(['-m', MODULES + name, handle.name],
                                            timeout=max(self.ends - time.monotonic(), 1))
        except CommandTimeout as exc:
            raise ModuleError('gpuops.nvidia.%s gave no result within %.1f s and was stopped' % (name, exc.timeout))
        except GpuopsError as exc:
            raise ModuleError(str(exc))
        finally:
            os.unlink(handle.name)
        out = stdout.strip()
        try:
            result = json.loads(out[out.index('{'):])
        except ValueError:
            raise ModuleError('gpuops.nvidia.%s gave no result (rc %d): %s' % (name, rc, ' '.join((stderr or out).split())[-500:]))
        if not isinstance(result, dict):
            raise ModuleError('gpuops.nvidia.%s gave no result (rc %d)' % (name, rc))
        return result


def drain_command(scontrol, node, reason):
    """The role's default gpu_reset_drain_command: the reason escaped and capped, one argument."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._drain import drain_reason

    return [scontrol, 'update', 'nodename=%s' % node, 'state=drain', 'reason=' + drain_reason(reason)]


def drain(result, scontrol, node, seconds):
    """Run the drain command and note it in the report as the role does."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
    from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner

    argv = drain_command(scontrol, node, result['reason'])
    try:
        rc, dummy, stderr = Runner(argv[0]).run(argv[1:], timeout=max(seconds, 1))
        ok, why = rc == 0, (stderr.strip() or 'rc %d' % rc)
    except GpuopsError as exc:
        ok, why = False, str(exc)
    result['drained'] = ok
    if not ok:
        result['reason'] = '%s; the drain command failed: %s' % (result['reason'], why)
    return result


def write_metrics(directory, result):
    """The role's node_exporter metrics (its template gpu_reset.prom.j2), written atomically."""
    import jinja2

    with open(METRICS_TEMPLATE) as handle:
        template = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True).from_string(handle.read())
    text = template.render(gpu_reset_result=result)
    write_file(os.path.join(directory, 'gpu_reset.prom'), text)


def write_file(path, text):
    handle, tmp = tempfile.mkstemp(prefix='.gpuops-', dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, 'w') as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def reset(settings, node, scontrol, deadline):
    """The sequence on one node, then the finishing section; returns its report (gpu_reset_result)."""
    ends = time.monotonic() + deadline
    # The modules end that much before the hook's time does, for the drain command.
    modules_end = ends - min(DRAIN_RESERVE_S, deadline / 10.0)
    run = _sequence.Run(node, dict((name[len(PREFIX):], value) for name, value in settings.items()),
                        ModuleRunner(modules_end), name=lambda option: PREFIX + option, deadline=modules_end)
    result = _sequence.run(run)
    # A misconfigured node is drained too (see above).
    if result['outcome'] == 'failed' and setting(settings, 'on_failure') == 'drain':
        drain(result, scontrol, node, min(setting(settings, 'drain_timeout'), max(ends - time.monotonic(), 1)))
    if setting(settings, 'textfile_dir'):
        try:
            write_metrics(setting(settings, 'textfile_dir'), result)
        except (OSError, ImportError) as exc:
            _sequence.failed(result, 'write node_exporter metrics', exc)
    if setting(settings, 'report_dir'):
        try:
            write_report(setting(settings, 'report_dir'), node, result)
        except (OSError, ValueError) as exc:  # ValueError: ReportPathError, a host name that cannot name a file
            _sequence.failed(result, 'write the report on the controller', exc)
    return result


def write_report(directory, node, result):
    """The report in directory, named after node as the role names it (escaped, inside directory)."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._report import report_path

    path = report_path(directory, node)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    write_file(path, json.dumps(result, indent=2) + '\n')


# One part of SLURM_JOB_GPUS: an index or a range of them, ASCII digits only.
GPU_PART_RE = re.compile(r'^\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?$')


def gpu_list(text):
    """Slurm's SLURM_JOB_GPUS (0,1,5; ranges such as 0-3,6 too) as a list of indexes, each once.

    For both runners. ValueError, naming the part, for anything else, and for an index past the
    MAX_GPUS (64) a node can have: checked before a range is expanded, so 0-2000000 costs nothing."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._smi import MAX_GPUS

    indexes = []
    for part in text.split(','):
        indexes.extend(index for index in _gpu_range(part, MAX_GPUS) if index not in indexes)
    return indexes


def _gpu_range(part, limit):
    """The indexes of one part of SLURM_JOB_GPUS (5, or 0-3), each below limit; ValueError if not."""
    match = GPU_PART_RE.match(part)
    if not match:
        raise ValueError("SLURM_JOB_GPUS: '%s' is not a GPU index or a range of them (such as 0,1,5 or 0-3,6)"
                         % printable(part, 40))
    first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if last < first:
        raise ValueError('SLURM_JOB_GPUS: the range %d-%d ends before it starts' % (first, last))
    if last >= limit:
        raise ValueError('SLURM_JOB_GPUS: GPU %d is past the %d GPUs a node can have (indexes 0-%d)'
                         % (last, limit, limit - 1))
    return range(first, last + 1)


def gpus_argument(text):
    """gpu_list for argparse: its message as the error, no traceback."""
    try:
        return gpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def hook_vars(args):
    """The variables the hook fixes, over the variables file: drain on failure, the release's
    time, the job's GPUs."""
    found = {'gpu_reset_on_failure': 'drain'}
    if args.gpus is not None:
        found['gpu_reset_gpus'] = args.gpus
    if args.timeout is not None:
        found['gpu_reset_timeout'] = args.timeout
    return found


def write_playbook_vars(path, variables):
    """The playbook runner's extra variables (-e @path), as JSON: never spliced into a shell word."""
    with open(path, 'w') as handle:
        json.dump(variables, handle)
        handle.write('\n')
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='gpu-reset-hook', description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--node', required=True, help='the Slurm node name (SLURMD_NODENAME)')
    parser.add_argument('--vars-file', help='YAML file of gpu_reset_* variables')
    parser.add_argument('--gpus', type=gpus_argument, help="the job's GPUs (SLURM_JOB_GPUS); all when not given")
    parser.add_argument('--timeout', type=float, help='gpu_reset_timeout, the seconds the release may take')
    parser.add_argument('--deadline', type=float, default=60, help='seconds the whole run may take')
    parser.add_argument('--scontrol', default='scontrol', help='the scontrol command')
    parser.add_argument('--playbook-vars', metavar='FILE',
                        help="only write the hook's variables to FILE as JSON, for ansible-playbook -e @FILE")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.playbook_vars:
        return write_playbook_vars(args.playbook_vars, hook_vars(args))
    try:
        settings = load_settings(args.vars_file, hook_vars(args))
    except NeedsPlaybook as exc:
        sys.stderr.write('gpu_reset: %s needs the playbook\n' % exc)
        return RUNNER_NEEDS_PLAYBOOK
    except (OSError, ValueError) as exc:
        sys.stderr.write('gpu_reset: cannot read the settings: %s\n' % printable(str(exc)))
        return RUNNER_SETTINGS_UNREADABLE
    result = reset(settings, args.node, args.scontrol, args.deadline)
    sys.stdout.write(json.dumps(result) + '\n')
    if result['outcome'] == 'failed':
        sys.stderr.write('gpu_reset: %s is not clean: %s\n' % (printable(args.node), printable(result['reason'])))
        return RUNNER_DRAINED if result.get('drained') else RUNNER_NOT_DRAINED
    return 0


if __name__ == '__main__':
    sys.exit(main())
