# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The NVLinks of the GPUs, read by the module's own reader (NVML, or nvidia-smi nvlink -s and
-e): which links are up, and their error counters, around the performance level's pair check
(peers.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable


# nvml.h of CUDA 12.4: NVML_NVLINK_MAX_LINKS, the counters (nvmlNvLinkErrorCounter_t) and the
# answers for a link the GPU does not have, or a GPU without NVLink.
NVLINK_MAX_LINKS = 18
NVLINK_COUNTERS = (('replay', 0), ('recovery', 1), ('crc_flit', 2), ('crc_data', 3))
NVML_NO_SUCH_LINK = (2, 3)  # NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED
COUNTER_WORDS = dict(replay='replays', recovery='recoveries', crc_flit='flit CRC errors', crc_data='data CRC errors')
# `nvidia-smi nvlink -e`'s names of the counters (the flit CRC counter is its "CRC Errors").
SMI_COUNTERS = {'replay errors': 'replay', 'recovery errors': 'recovery', 'crc errors': 'crc_flit'}
SMI_GPU = re.compile(r'^GPU (\d+):')
SMI_LINK = re.compile(r'^\s+Link (\d+): (.*?)\s*$')
SMI_COUNTER = re.compile(r'^(.*?):\s*(\d+)$')


def backend_of(reader):
    """The module's reader itself, under its HostReader (which adds the host's view to reads)."""
    return getattr(reader, 'reader', reader)


def by_backend(reader, timeout, what, with_nvml, with_smi):
    """with_nvml(nvml) in an NVML call of the reader's, with its deadline and said as what, or
    with_smi(runner, timeout) with nvidia-smi's runner: a read the reader itself does not make."""
    backend = backend_of(reader)
    if getattr(backend, 'backend', None) == 'nvml':
        return backend._call(lambda: with_nvml(backend.nvml), timeout, what)
    return with_smi(backend.runner, timeout)


def read_nvlinks(reader, indexes, timeout):
    """({index: {links, active, down, errors}}, warnings) of indexes, by the module's reader (NVML,
    or nvidia-smi nvlink -s and -e, within timeout). links: how many the GPU has (0: no NVLink);
    active, down: their numbers; errors: each counter summed over its links (None: not read). A
    GPU that cannot be read is left out, with a warning; so is every GPU when the reads fail."""
    if not indexes:
        return {}, []
    try:
        return by_backend(reader, timeout, 'reading the NVLinks', lambda nvml: nvml_nvlinks(nvml, indexes),
                          lambda runner, seconds: smi_nvlinks(runner, indexes, seconds))
    except (GpuopsError, ValueError, AttributeError) as exc:
        return {}, ['the NVLinks could not be read (%s): no NVLink is judged' % printable(str(exc), 200)]


def nvml_nvlinks(nvml, indexes):
    found, warnings = {}, []
    for index in indexes:
        try:
            found[index] = nvml_gpu_nvlinks(nvml, nvml.nvmlDeviceGetHandleByIndex(index))
        except nvml.NVMLError as exc:
            warnings.append('the NVLinks of GPU %s could not be read (%s): they are not judged' % (
                index, printable(str(exc), 200)))
    return found, warnings


def nvml_gpu_nvlinks(nvml, handle):
    active, down = [], []
    for link in range(NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            if getattr(exc, 'value', None) in NVML_NO_SUCH_LINK:
                break
            raise
        (active if state else down).append(link)
    links = active + down
    errors = {}
    for name, counter in NVLINK_COUNTERS:
        values = []
        for link in sorted(links):
            try:
                values.append(int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)))
            except nvml.NVMLError as exc:
                if getattr(exc, 'value', None) not in NVML_NO_SUCH_LINK:
                    raise
        errors[name] = sum(values) if values else None
    return dict(links=len(links), active=active, down=down, errors=errors)


def smi_nvlinks(runner, indexes, timeout):
    deadline = time.monotonic() + timeout
    status = parse_nvlink_status(smi_output(runner, ['nvlink', '-s'], deadline))
    warnings = []
    try:
        # No NVLink on any GPU: no counter to read.
        counted = parse_nvlink_errors(smi_output(runner, ['nvlink', '-e'], deadline)) if any(status.values()) else {}
    except GpuopsError as exc:
        counted = {}
        warnings.append('the NVLink error counters could not be read (%s): they are not judged' % printable(
            str(exc), 200))
    found = {}
    for index in indexes:
        links = status.get(index, {})
        by_link = counted.get(index, {})
        errors = {}
        for name, dummy in NVLINK_COUNTERS:
            values = [counters[name] for counters in by_link.values() if name in counters]
            errors[name] = sum(values) if values else None
        found[index] = dict(links=len(links), active=sorted(link for link, up in links.items() if up),
                            down=sorted(link for link, up in links.items() if not up), errors=errors)
    return found, warnings


def smi_output(runner, args, deadline):
    rc, stdout, stderr = runner.run(args, timeout=max(0.0, deadline - time.monotonic()))
    if rc != 0:
        raise GpuopsError('nvidia-smi %s exited %d: %s' % (' '.join(args), rc, (stderr or stdout).strip()[:200]))
    return stdout


def link_lines(text):
    """(GPU index, link number, what the line says of it) of each link line of `nvidia-smi nvlink`'s
    output, under its `GPU N: NAME (UUID: ...)` line; (index, None, None) for a GPU's own line."""
    index = None
    for line in text.splitlines():
        gpu = SMI_GPU.match(line)
        if gpu:
            index = int(gpu.group(1))
            yield index, None, None
            continue
        link = SMI_LINK.match(line)
        if link and index is not None:
            yield index, int(link.group(1)), link.group(2)


def parse_nvlink_status(text):
    """{index: {link: up}} from `nvidia-smi nvlink -s`: per GPU a `GPU 0: NAME (UUID: ...)` line, then
    `Link 0: 26.562 GB/s` for a link up and `Link 3: <inactive>` for one down. A GPU without NVLink
    is not printed."""
    found = {}
    for index, link, said in link_lines(text):
        links = found.setdefault(index, {})
        if link is not None:
            links[link] = not said.startswith('<')
    return found


def parse_nvlink_errors(text):
    """{index: {link: {counter: value}}} from `nvidia-smi nvlink -e`: `Link 0: Replay Errors: 0` and
    its Recovery Errors and CRC Errors lines (the flit CRC counter); other counters (a newer
    driver's), N/A and lines of other shapes are left out."""
    found = {}
    for index, link, said in link_lines(text):
        links = found.setdefault(index, {})
        counter = SMI_COUNTER.match(said) if said is not None else None
        name = SMI_COUNTERS.get(counter.group(1).strip().lower()) if counter else None
        if name:
            links.setdefault(link, {})[name] = int(counter.group(2))
    return found
