# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""A job's Prolog or Epilog: which GPUs are the job's (SLURM_JOB_GPUS through gres.conf, or the
MIG instances of CUDA_VISIBLE_DEVICES), which job it is and which jobs still run on the node, then
the reset for it (reset_for_job)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import sys
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import named_unread
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.jobs import read_listpids
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.reset import reboot_stamp, reset
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.slurm import SLURM_CALL_S
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.status import RUNNER_BRAKE_HELD, RUNNER_DRAINED, RUNNER_NOT_DRAINED
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._spec import PREFIX, SETTINGS_SPEC


# One part of SLURM_JOB_GPUS: an index or a range of them, ASCII digits only.
GPU_PART_RE = re.compile(r'^\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?$')


def gpu_list(text):
    """Slurm's SLURM_JOB_GPUS (0,1,5; ranges such as 0-3,6 too) as a list of its numbers, each once:
    the places of the job's GPUs in gres.conf (job_gpus makes them nvidia-smi indexes).

    For both runners. ValueError, naming the part, for anything else, and for a number past the
    MAX_GPUS (64) a node can have: checked before a range is expanded, so 0-2000000 costs nothing."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import MAX_GPUS

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


def job_gpus(args, host_root, environ=None):
    """(the nvidia-smi indexes of the job's GPUs and its MIG instances, None for every GPU; why they
    cannot be told, or None): SLURM_JOB_GPUS through the node's gres.conf (plugin_utils/_gres.py),
    or the MIG UUIDs of CUDA_VISIBLE_DEVICES when gres.conf cannot tell; the mapping said on
    stderr, for the hook's log."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._gres import GresError, gres_conf_path, job_gpu_indexes

    if args.gpus is None:
        return None, None
    try:
        indexes, note = job_gpu_indexes(args.gpus, args.node, args.gres_conf or gres_conf_path(),
                                        host_root if isinstance(host_root, str) and host_root else '/')
    except GresError as exc:
        problem = 'SLURM_JOB_GPUS=%s: %s' % (','.join(str(gpu) for gpu in args.gpus), exc)
        instances = mig_uuids(environ)
        if not instances:
            return None, problem
        indexes, note = instances, '%s; CUDA_VISIBLE_DEVICES names MIG instances %s, released as those' % (
            problem, ','.join(instances))
    sys.stderr.write('gpu_reset: %s\n' % note)
    return indexes, None


def mig_uuids(environ=None):
    """The MIG UUIDs of CUDA_VISIBLE_DEVICES when it names only MIG instances (as slurmd sets it for
    a MIG GRES), else []. The release finds them among the instances the driver lists, or fails."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import MIG_UUID_RE

    environ = os.environ if environ is None else environ
    names = [name.strip() for name in environ.get('CUDA_VISIBLE_DEVICES', '').split(',')]
    return names if names != [''] and all(MIG_UUID_RE.match(name) for name in names) else []


# -- the job the hook runs for, and the other jobs on the node ----------------------------------

JOB_ID_RE = re.compile(r'^[0-9]{1,12}\Z')


def job_setting(args, gpus, host_root, environ=None):
    """The release's job option (see nvidia_device_release) for the job slurmd runs the hook for
    (SLURM_JOB_ID, SLURM_JOB_UID), or None outside a job: which of its GPUs Slurm shares with other
    jobs (gres.conf's Name=shard and Name=mps lines), and the jobs still on the node with their
    pids (scontrol listpids, from the node's own slurmd, which the release reads again before each
    round of signals: scontrol). What cannot be read is said on stderr and
    taken the safe way: a GPU whose sharing cannot be told is shared, jobs that cannot be listed
    are all live."""
    environ = os.environ if environ is None else environ
    job_id = environ.get('SLURM_JOB_ID', '')
    if not JOB_ID_RE.match(job_id):
        if job_id:
            sys.stderr.write('gpu_reset: SLURM_JOB_ID %s is not a job id: released as for no job\n' % printable(job_id, 40))
        return None
    uid = environ.get('SLURM_JOB_UID', '')
    return {'id': job_id, 'uid': int(uid) if uid.isdigit() and len(uid) < 11 else None,
            'shared_gpus': shared_gpus(args, gpus, host_root),
            'live_jobs': live_jobs(args.scontrol, min(SLURM_CALL_S, (args.deadline or 60) / 10.0)),
            'scontrol': args.scontrol}


def shared_gpus(args, gpus, host_root):
    """The GPUs of gpus (None: every GPU) that gres.conf shares between jobs."""
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils._gres import GresError, gres_conf_path, shared_gpu_indexes

    path = args.gres_conf or gres_conf_path()
    if gpus is None and not os.path.exists(path):
        return []
    try:
        found = shared_gpu_indexes(args.node, path, host_root if isinstance(host_root, str) and host_root else '/')
    except GresError as exc:
        if gpus is None:
            sys.stderr.write('gpu_reset: which GPUs Slurm shares cannot be told (%s): taken as none\n' % exc)
            return []
        sys.stderr.write("gpu_reset: whether the job's GPUs are shared cannot be told (%s): taken as shared\n" % exc)
        return [gpu for gpu in gpus if isinstance(gpu, int)]
    shared = [index for index in found if gpus is None or index in gpus]
    if shared:
        sys.stderr.write('gpu_reset: GPU %s shared with other jobs (gres.conf): only the job\'s own processes are '
                         'released there\n' % ','.join(str(index) for index in shared))
    return shared


def live_jobs(scontrol, seconds):
    """{job id: [pids]} of the jobs slurmd runs on this node (scontrol listpids), or None when it
    cannot be asked."""
    jobs, problem = read_listpids(scontrol, max(seconds, 1))
    if problem is not None:
        sys.stderr.write('gpu_reset: scontrol listpids failed (%s): every job a cgroup names counts as live\n' % problem)
    return jobs


def max_drained(args):
    """The fleet brake's cap: --max-drained (GPU_RESET_MAX_DRAINED), else the spec's default, the
    action's."""
    return SETTINGS_SPEC['max_drained']['default'] if args.max_drained is None else args.max_drained


def reset_for_job(args, settings, started):
    """The reset of the job's GPUs (every GPU outside a job) with settings, its report on stdout;
    the exit status (0 whatever it found, in observe mode). started: time.monotonic() when the
    hook started, its --deadline counted from then."""
    gpus, problem = job_gpus(args, settings.get(PREFIX + 'host_root'))
    if gpus is not None:
        settings[PREFIX + 'gpus'] = gpus
    if problem is None:
        settings[PREFIX + 'job'] = job_setting(args, gpus, settings.get(PREFIX + 'host_root'))
    result = reset(settings, args.node, args.scontrol, args.deadline - (time.monotonic() - started),
                   reboot_stamp=reboot_stamp(args), refused=problem, budget=(started, args.deadline),
                   observe=args.observe, max_drained=max_drained(args), drain_rate=args.max_drain_rate)
    sys.stdout.write(json.dumps(result) + '\n')
    unread = result.get('unreadable') or []
    if unread:
        sys.stderr.write('gpu_reset: the descriptors of %d process(es) could not all be read: %s\n'
                         % (len(unread), printable(named_unread(unread), 400)))
    if args.observe:
        # Slurm drains a node whose Prolog fails: observe mode leaves it in service whatever it found.
        if result['outcome'] in ('failed', 'would_release'):
            sys.stderr.write('gpu_reset: observe mode, nothing changed: %s %s: %s\n' % (
                printable(args.node), 'would be drained' if result.get('would_drain') else 'is not clean',
                printable(result['reason'])))
        return 0
    if result['outcome'] == 'failed':
        sys.stderr.write('gpu_reset: %s is not clean: %s\n' % (printable(args.node), printable(result['reason'])))
        if (result.get('brake') or {}).get('held'):
            return RUNNER_BRAKE_HELD
        return RUNNER_DRAINED if result.get('drained') else RUNNER_NOT_DRAINED
    return 0
