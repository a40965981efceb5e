# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The NVLink fabric after a GPU reset: on NVSwitch systems (HGX/DGX H100, H200, B200) a reset
GPU registers with the fabric manager again, and until its fabric state reads Completed with
status Success a multi-GPU job cannot use NVLink (NVIDIA/nccl#1488; NVIDIA's Fabric Manager
guide). nvidia-smi reports it as fabric.state (Not Supported, Not Started, In Progress,
Completed) and fabric.status (Success, or the error of a registration that completed: NVML's
nvmlGpuFabricInfo_t, whose status counts only once the state is Completed). A GPU without an
NVSwitch fabric reports no state (N/A, Not Supported), and a driver whose nvidia-smi does not
know the fields cannot say: neither is waited for."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import CALL_FLOOR_S, GpuopsError, printable

FIELDS = '--query-gpu=index,fabric.state,fabric.status'
COMPLETED = 'Completed'
SUCCESS = 'Success'
# Still registering: worth waiting for.
PENDING = ('Not Started', 'In Progress')
# No NVSwitch fabric: nothing to wait for. Only these mean "does not apply".
NO_FABRIC = ('[N/A]', 'N/A', '[Not Supported]', 'Not Supported')
POLL_S = 0.5
# The longest text of nvidia-smi kept in an entry.
QUOTE_MAX = 200


def _entry(index, state, status, ok, note=None):
    entry = {'index': index, 'state': state, 'status': status, 'ok': ok}
    if note:
        entry['note'] = note
    return entry


def _parse(stdout, indexes):
    """{index: (state, status)} of the lines of the GPUs of indexes."""
    found = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split(',')]
        if len(cells) == 3 and cells[0].isdigit() and int(cells[0]) in indexes:
            found[int(cells[0])] = (printable(cells[1])[:QUOTE_MAX], printable(cells[2])[:QUOTE_MAX])
    return found


def _judge(index, state, status):
    """The entry of one GPU whose state is no longer pending."""
    if state == COMPLETED:
        ok = status == SUCCESS
        return _entry(index, state, status, ok, None if ok else 'the fabric registration completed with %s' % status)
    if state in PENDING:
        return _entry(index, state, status, False, 'the GPU did not register with the NVLink fabric in time')
    if state in NO_FABRIC:
        return _entry(index, state, status, True, 'no NVLink fabric')
    # Any other word, bracketed or not, is the driver's verdict on the GPU.
    return _entry(index, state, status, False, 'nvidia-smi reports a fabric state it does not document')


def wait_for_fabric(runner, indexes, deadline, clock=time.monotonic, sleep=time.sleep):
    """The fabric entries of the GPUs of indexes once none is still registering, or at deadline
    (runner: an SmiRunner; deadline on clock). Each: index, state, status, ok, and a note when
    it is not plainly back. A GPU whose fabric cannot be read is not ok."""
    indexes = sorted(indexes)
    ids = ','.join(str(index) for index in indexes)
    while True:
        try:
            rc, stdout, stderr = runner.run(['-i', ids, FIELDS, '--format=csv,noheader'], timeout=deadline - clock())
        except GpuopsError as exc:
            return [_entry(index, None, None, False, 'the fabric state could not be read: %s' % exc) for index in indexes]
        said = ' '.join((stdout + ' ' + stderr).split())
        if rc != 0 and 'not a valid field' in said:
            return [_entry(index, None, None, True, 'this nvidia-smi does not report the fabric state')
                    for index in indexes]
        found = _parse(stdout, set(indexes))
        if rc != 0 or len(found) != len(indexes):
            note = 'the fabric state could not be read: nvidia-smi (exit %d) said %s' % (rc, printable(said)[:QUOTE_MAX])
            return [_entry(index, None, None, False, note) for index in indexes]
        pending = [index for index in indexes if found[index][0] in PENDING]
        # A poll is made only while its call keeps its floor after the pause; otherwise the reading
        # in hand stands (a fabric still registering then is not back in time).
        if not pending or clock() + POLL_S + CALL_FLOOR_S >= deadline:
            return [_judge(index, *found[index]) for index in indexes]
        sleep(POLL_S)
