# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""After a GPU reset: the MIG layout read before it made again, and each instance proven.

A reset keeps a GPU's MIG mode but ends its GPU and compute instances: they do not persist across
a reset or a reboot (NVIDIA's MIG user guide), and what made them at boot (nvidia-mig-parted, a
site's script) does not run again. Each GPU instance read before the reset is made again with
``nvidia-smi mig``, the largest first so that they fit as they did: by its profile name, with its
compute instances as they were (the GPU instance's whole one with ``-C``, else ``-cci`` by
compute-slice profile). The driver gives new ids and MIG UUIDs. Then the layout is read again and
each instance proven: the driver lists it with its profile, no memory used, its caps nodes there.

Only a GPU whose mode was enabled before and after the reset, with no instance now (none made
since by anyone else), is touched; the MIG mode is never changed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, DriverHung, GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import add_device_nodes
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import instance_name

# nvidia-smi mig -cci takes compute instance profiles by id: NVML's
# NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE constants, by the compute slices they take.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
# A compute instance smaller than its GPU instance: "1c.3g.40gb"; a whole one has the GPU instance's name.
PARTIAL_CI_RE = re.compile(r'^(\d+)c\.(\d+g\.\S+)$')
GI_SLICES_RE = re.compile(r'^(\d+)g\.')
GI_CREATED_RE = re.compile(r'^Successfully created GPU instance ID\s+(\d+) on GPU\s+(\d+) using profile MIG (\S+)', re.M)
CI_CREATED_RE = re.compile(r'^Successfully created compute instance (?:ID\s+\d+ )?on GPU\s+(\d+) GPU instance ID\s+(\d+)', re.M)


def gpu_instances(fact):
    """[(GPU instance profile, [compute instance slices, or None for the whole GPU instance])] of a
    mig fact, one entry per GPU instance, the largest first; ValueError for a profile not read."""
    by_gi = {}
    for instance in fact.get('instances') or []:
        profile = instance.get('profile') or ''
        partial = PARTIAL_CI_RE.match(profile)
        gi_profile = partial.group(2) if partial else profile
        if not GI_SLICES_RE.match(gi_profile) or instance.get('gpu_instance_id') is None:
            raise ValueError('MIG device %s: profile %r not understood' % (instance_name(instance), printable(profile, 40)))
        entry = by_gi.setdefault(instance['gpu_instance_id'], (gi_profile, []))
        entry[1].append(int(partial.group(1)) if partial else None)
    return sorted(by_gi.values(), key=lambda entry: -int(GI_SLICES_RE.match(entry[0]).group(1)))


def wanted(fact):
    """The sorted (GPU instance profile, MIG device profile) pairs of a mig fact: what must be there."""
    pairs = []
    for gi_profile, slices in gpu_instances(fact):
        pairs.extend((gi_profile, gi_profile if n is None else '%dc.%s' % (n, gi_profile)) for n in slices)
    return sorted(pairs)


def restorable(before, after):
    """None when a reset GPU's layout is to be made again, else why not (before, after: its mig
    facts read around the reset; after None: not read)."""
    if not (before or {}).get('instances'):
        return 'no MIG instance before the reset'
    if after is None:
        return 'MIG after the reset not read'
    if before.get('mode_current') != 'enabled' or after.get('mode_current') != 'enabled':
        return 'the MIG mode changed'
    if after.get('instances'):
        return 'MIG instances are there already'
    return None


class MigRestore:
    """Make the MIG layouts of reset GPUs again. run(args, timeout): nvidia-smi's runner;
    deadline and clock: when the reset's time ends, and how it is read."""

    def __init__(self, run, deadline, clock):
        self.run = run
        self.deadline = deadline
        self.clock = clock

    def make(self, index, before):
        """Make GPU index's GPU and compute instances of before (its mig fact read before the
        reset). Returns (made: ['GI 5 2g.35gb', ...], problems)."""
        try:
            layout = gpu_instances(before)
        except ValueError as exc:
            return [], [str(exc)]
        made, problems = [], []
        for gi_profile, slices in layout:
            whole = slices == [None]
            stdout, why = self._smi(['mig', '-i', str(index), '-cgi', gi_profile] + (['-C'] if whole else []))
            created = GI_CREATED_RE.search(stdout)
            if created is None:
                problems.append('GPU instance %s not made: %s' % (gi_profile, why or 'nvidia-smi said nothing of it'))
                continue
            gi = created.group(1)
            made.append('GI %s %s' % (gi, gi_profile))
            if whole:
                continue
            ids = [CI_PROFILE_BY_SLICES.get(n) for n in slices]
            if None in ids:
                problems.append('compute instances of GI %s not made: no compute instance profile of %s slices' % (
                    gi, ', '.join(str(n) for n in slices)))
                continue
            stdout, why = self._smi(['mig', '-i', str(index), '-gi', gi, '-cci', ','.join(str(i) for i in ids)])
            if len(CI_CREATED_RE.findall(stdout)) != len(ids):
                problems.append('compute instances of GI %s not all made: %s' % (gi, why or 'nvidia-smi said %d of %d' % (
                    len(CI_CREATED_RE.findall(stdout)), len(ids))))
        return made, problems

    def _smi(self, args):
        """(stdout, why it failed or None) of nvidia-smi args, within the time left."""
        left = self.deadline - self.clock()
        if left <= CALL_FLOOR_S:
            return '', 'no time left'
        try:
            rc, stdout, stderr = self.run(args, left)
        except DriverHung:
            raise  # a reboot's case, as for every other call of the reset
        except GpuopsError as exc:  # a timeout, nvidia-smi gone: said as the layout's problem
            return '', str(exc)
        return stdout, None if rc == 0 else 'nvidia-smi %s exited %d: %s' % (
            ' '.join(args), rc, printable((stdout + stderr).strip(), 300))


def proof_problems(before, after, gpu, memory_threshold_mib, host_root='/'):
    """What keeps a GPU's layout made again from being proven, read after it (after: its mig
    fact, None when not read; gpu: its fact, for its minor number): each wanted instance listed
    with its profile, no process and no memory used on it, its caps nodes there."""
    if after is None:
        return ['the MIG layout could not be read again']
    problems = []
    missing = _missing(wanted(before), [(pair[0], pair[1]) for pair in _pairs(after)])
    if missing:
        problems.append('not there: %s' % ', '.join(profile for dummy, profile in missing))
    found = dict(gpu, mig=after)
    problems.extend(add_device_nodes(found, host_root))
    for instance in after.get('instances') or []:
        used = instance.get('memory_used_mib')
        if instance.get('processes') or (used is not None and used > memory_threshold_mib):
            problems.append('%s in use already' % instance_name(instance))
        gone = [node for node in instance.get('device_nodes') or [] if not os.path.exists(node)]
        if gone:
            problems.append('%s: no device node %s' % (instance_name(instance), ', '.join(gone)))
    return problems


def _pairs(fact):
    try:
        return wanted(fact)
    except ValueError:
        return []


def _missing(want, have):
    left = list(have)
    missing = []
    for pair in want:
        if pair in left:
            left.remove(pair)
        else:
            missing.append(pair)
    return missing


def described(fact):
    """The instances of a mig fact as a reason names them: 'GI 7 CI 0 (MIG-...) 1g.18gb, ...'."""
    return ', '.join('%s %s' % (instance_name(instance), instance.get('profile'))
                     for instance in (fact or {}).get('instances') or [])
