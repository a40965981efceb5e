# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""Reset of GPUs that need one (orphaned memory, or what the driver and their health call for):
the last resort of a release.

For each GPU: persistence mode off when it is on (persistence counts as a client of the device,
and nvidia-persistenced lets the GPU go when it is switched off), ``nvidia-smi --gpu-reset -i N``,
and persistence mode back on in a ``finally``, whatever the reset did. When nvidia-smi refuses
the reset and names other GPUs with it (the NVLink peers some systems require to be reset in the
same command, nvidia-smi(1) on --gpu-reset), the reset is tried once more with those peers,
provided they are themselves GPUs in scope that need a reset; otherwise the refusal is
reported in nvidia-smi's own words. A refusal that says the platform does not allow the reset (a
function-level reset blocked by the hypervisor: FLR_REFUSED) names the GPU in flr_refused: a
driver reload or a reboot is its cure. Every call fits in the release's deadline; restoring
persistence mode is given a little time even past it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import EXIT_CODES, GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import bus_ids_in, normalize_bus_id
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import ORPHANED
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, sigterm_deferred
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import system_log

# Restoring persistence mode runs even when the deadline has passed: this long at least.
RESTORE_MIN_S = 5.0
# The longest text of nvidia-smi quoted in a message.
QUOTE_MAX = 600
# What nvidia-smi says of a GPU whose reset the platform refused: "The following GPUs could not
# be reset:" and a line "  GPU 00000000:1A:00.0: <NVML's words>" (the form of
# real-samples/smi_errors/E10). "Unknown Error" is what AWS bare metal and EKS give on every GPU,
# FLR being blocked at the hypervisor (NVIDIA/ai-cloud-validation#603); "Not Supported" and
# "Insufficient Permissions" are NVML's words for a reset the device or the VM does not allow
# (nvmlErrorString of NVML_ERROR_NOT_SUPPORTED and NVML_ERROR_NO_PERMISSION). "In use by another
# client" is not among them: that one a release can cure.
FLR_REFUSED = ('unknown error', 'not supported', 'insufficient permissions')
REFUSED_LINE_RE = re.compile(r'^\s*GPU\s+([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*:\s*(.+?)\s*$')


def _said(stdout, stderr):
    """nvidia-smi's words on one line."""
    text = ' '.join(line.strip() for line in (stdout + '\n' + stderr).splitlines() if line.strip())
    return text[:QUOTE_MAX] or '(no output)'


def flr_refused(text):
    """The PCI bus ids (normalised) of the GPUs whose reset nvidia-smi's text says the platform
    refused (FLR_REFUSED); an empty list when it refused for another reason or not at all."""
    found = []
    for line in text.splitlines():
        match = REFUSED_LINE_RE.match(line)
        if match and match.group(2).lower() in FLR_REFUSED:
            found.append(normalize_bus_id(match.group(1)))
    return found


def _names(indexes):
    return ', '.join(str(index) for index in indexes)


def escalation(gpus, ok, message, attempted=True, persistence_mode_off=(), persistence_mode_restored=None,
               reasons=None, refused=(), reset=None):
    """The escalation entry of a release result.

    reset: the indexes whose reset worked (all of gpus when ok, none when not by default: where
    some worked and others did not, each is judged, and recorded, as its own reset went);
    persistence_mode_off: the indexes whose persistence mode was switched off for the reset;
    persistence_mode_restored: whether it was switched back on on all of them (None when none was
    switched off); reasons: {index: [why it is reset]}; refused: the indexes whose reset the
    platform refused (flr_refused: a reboot or a driver reload is their cure)."""
    reasons = reasons or {}
    reset = (gpus if ok else ()) if reset is None else reset
    return {'attempted': attempted, 'gpus': list(gpus), 'ok': ok, 'message': message,
            'gpus_reset': sorted(set(reset)), 'flr_refused': sorted(set(refused)),
            'reasons': [{'index': index, 'reasons': list(reasons.get(index) or [ORPHANED])} for index in gpus],
            'persistence_mode_off': sorted(set(persistence_mode_off)),
            'persistence_mode_restored': persistence_mode_restored if persistence_mode_off else None}


class GpuReset:
    """Resets GPUs with nvidia-smi through runner (an SmiRunner), before deadline (runner's clock).

    bus_ids: {index: pci bus id} of every GPU the host has, to recognise the peers a refusal
    names; eligible: the indexes that may be reset (the in-scope GPUs that need a reset);
    reasons: {index: [why it is reset]}, orphaned memory unless said otherwise.
    """

    def __init__(self, runner, bus_ids, eligible, deadline, clock=time.monotonic, log=system_log, reasons=None):
        self.runner = runner
        self.index_of = dict((normalize_bus_id(bus), index) for index, bus in bus_ids.items() if bus)
        self.bus_ids = bus_ids
        self.eligible = set(eligible)
        self.deadline = deadline
        self.clock = clock
        self.log = log
        self.reasons = dict(reasons or {})
        # {index: restored} of every GPU whose persistence mode was switched off, the last try counting.
        self.restored = {}
        # The indexes whose reset the platform refused (flr_refused), and those nvidia-smi was run
        # to reset (not those no time was left for).
        self.refused = set()
        self.tried = set()

    def _left(self):
        return self.deadline - self.clock()

    def _smi(self, args, restore=False):
        """(rc, stdout, stderr) of nvidia-smi args within the deadline; GpuopsError when it cannot
        run, does not answer, or there is no time left."""
        left = self._left()
        if restore:
            left = max(left, RESTORE_MIN_S)
        return self.runner.run(args, timeout=left)

    def _persistence(self, index):
        """True/False: GPU index's persistence mode as nvidia-smi reports it now, None if unknown."""
        rc, stdout, stderr = self._smi(['-i', str(index), '--query-gpu=persistence_mode', '--format=csv,noheader'])
        value = stdout.strip()
        if rc != 0 or value not in ('Enabled', 'Disabled'):
            raise GpuopsError('the persistence mode of GPU %s could not be read: %s' % (index, _said(stdout, stderr)))
        return value == 'Enabled'

    def _set_persistence(self, index, on, restore=False):
        rc, stdout, stderr = self._smi(['-i', str(index), '-pm', '1' if on else '0'], restore)
        if rc != 0:
            raise GpuopsError('nvidia-smi -i %s -pm %d failed (exit %d, %s): %s' % (
                index, 1 if on else 0, rc, EXIT_CODES.get(rc, 'unexpected exit code'), _said(stdout, stderr)))

    def _reset_group(self, group):
        """(ok, text, peers): reset the GPUs of group together. peers: the other GPUs a refusal
        names (None for a GPU it names that this host does not list)."""
        persistent, outcome, restore_problems = [], None, []
        try:
            for index in group:
                if self._persistence(index):
                    self._set_persistence(index, False)
                    persistent.append(index)
                    self.restored[index] = False
            why = sorted(set(reason for index in group for reason in self.reasons.get(index) or [ORPHANED]))
            self.log('gpuops.nvidia: resetting GPU %s (%s) with nvidia-smi --gpu-reset' % (_names(group), ', '.join(why)))
            rc, stdout, stderr = self._reset_call(group)
        except GpuopsError as exc:
            outcome = (False, str(exc), [])
        finally:
            with sigterm_deferred():  # a SIGTERM waits until persistence mode is back
                for index in persistent:
                    try:
                        self._set_persistence(index, True, restore=True)
                        self.restored[index] = True
                    except GpuopsError as exc:
                        restore_problems.append('persistence mode of GPU %s not restored: %s' % (index, exc))
        if outcome is None and rc == 0:
            outcome = (True, 'GPU %s reset: %s' % (_names(group), _said(stdout, stderr)), [])
        elif outcome is None:
            named = [self.index_of.get(bus) for bus in bus_ids_in(stdout + '\n' + stderr)]
            refused = [self.index_of.get(bus) for bus in flr_refused(stdout + '\n' + stderr)]
            self.refused.update(index for index in refused if index in group)
            outcome = (False, 'nvidia-smi --gpu-reset -i %s refused (exit %d, %s): %s' % (
                ','.join(str(index) for index in group), rc, EXIT_CODES.get(rc, 'unexpected exit code'),
                _said(stdout, stderr)), [index for index in named if index not in group])
        if restore_problems:
            self.log('gpuops.nvidia: ' + '; '.join(restore_problems))
            outcome = (False, '%s; %s' % (outcome[1], '; '.join(restore_problems)), outcome[2])
        return outcome

    def _reset_call(self, group):
        """(rc, stdout, stderr) of nvidia-smi --gpu-reset of group, which counts as tried once
        nvidia-smi runs: not when no time was left to start it, or it could not start."""
        try:
            answer = self._smi(['--gpu-reset', '-i', ','.join(str(index) for index in group)])
        except CommandTimeout:
            self.tried.update(group)
            raise
        self.tried.update(group)
        return answer

    def run(self, indexes):
        """Reset each GPU of indexes; returns the escalation entry."""
        done, failed, messages = [], [], []
        todo = sorted(indexes)
        while todo:
            group = [todo.pop(0)]
            ok, text, peers = self._reset_group(group)
            if not ok and peers:
                if None not in peers and self.eligible.issuperset(peers):
                    group = sorted(set(group + peers))
                    todo = [index for index in todo if index not in group]
                    ok, text, dummy = self._reset_group(group)
                else:
                    text += ' (nvidia-smi names GPU %s with it, which %s not among the GPUs in scope that need a ' \
                            'reset, so %s not reset with it)' % (
                                _names('?' if index is None else index for index in peers),
                                'is' if len(peers) == 1 else 'are', 'it was' if len(peers) == 1 else 'they were')
            (done if ok else failed).extend(group)
            messages.append(text)
        restored = all(self.restored.values())
        return escalation(sorted(done + failed), not failed, '; '.join(messages), attempted=bool(self.tried),
                          persistence_mode_off=self.restored, persistence_mode_restored=restored, reasons=self.reasons,
                          refused=self.refused.difference(done), reset=done)


def would_reset(reasons):
    """The escalation entry of check mode: what would be reset. reasons: {index: [why]}."""
    indexes = sorted(reasons)
    return escalation(indexes, None, 'check mode: GPU %s would be reset (persistence mode off, '
                      'nvidia-smi --gpu-reset, persistence mode restored)' % _names(indexes), attempted=False,
                      reasons=reasons)
