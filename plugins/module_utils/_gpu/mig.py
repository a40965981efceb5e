# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""MIG (Multi-Instance GPU): each GPU's mode and its MIG devices, read through nvidia-smi or NVML,
and each device's nodes from the driver's /proc/driver/nvidia/capabilities tree.

A MIG device is one compute instance of one GPU instance; it has its own MIG UUID. Its memory is
its GPU instance's (shared by that instance's compute instances). Output formats: real reports
collected in tests/gpusim/samples/mig/.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import under_root
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import instance_name

MODE_ARGS = ['--query-gpu=index,mig.mode.current,mig.mode.pending', '--format=csv,noheader,nounits']
MODES = {'Enabled': 'enabled', 'Disabled': 'disabled'}
NOT_APPLICABLE = ('[N/A]', 'N/A', '[Not Supported]')
# nvidia-smi -L: "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)", then "  MIG 1g.10gb     Device  0: (UUID: MIG-...)".
LIST_GPU_RE = re.compile(r'^GPU (\d+): .*\(UUID: (GPU-[0-9A-Za-z-]+)\)\s*$')
LIST_MIG_RE = re.compile(r'^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9A-Za-z-]+)\)\s*$')
# plain nvidia-smi, "MIG devices:" table: "|  1    3   0   0  |  14366MiB / 19968MiB | ..."
TABLE_ROW_RE = re.compile(r'^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|')
# its "Processes:" table: "|    1    3    0      34965      C   python      14195MiB |"
PROCESS_ROW_RE = re.compile(r'^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\S+\s+.*?\s(\d+)MiB\s*\|$')
MIG_NAME_RE = re.compile(r'MIG (\S+)\s*$')
CAPS_MINOR_RE = re.compile(r'^DeviceFileMinor:\s*(\d+)\s*$', re.M)
# The most read of a capabilities access file (the driver writes two short lines).
CAPS_FILE_MAX = 4096
CAPABILITIES = '/proc/driver/nvidia/capabilities'
CAPS_GI_RE = re.compile(r'^gi(\d+)$')
CAPS_CI_RE = re.compile(r'^ci(\d+)$')
NVML_DEVICE_NOT_FOUND = 6
NVML_NOT_SUPPORTED = (3, 13)


def mig_fact(current, pending, instances=None):
    """The mig fact of one GPU; None for a GPU without MIG."""
    if current is None:
        return None
    return {'mode_current': current, 'mode_pending': pending, 'instances': instances or []}


def instance_fact(gi, ci, profile, uuid, used, total, processes=None):
    return {'gpu_instance_id': gi, 'compute_instance_id': ci, 'profile': profile, 'uuid': uuid,
            'memory_used_mib': used, 'memory_total_mib': total, 'processes': processes or [], 'device_nodes': []}


# -- nvidia-smi ----------------------------------------------------------------------------------

def parse_modes(text):
    """{index: (current, pending)} of --query-gpu=index,mig.mode.current,mig.mode.pending; None for a
    GPU without MIG. Returns (modes, warnings)."""
    modes, warnings = {}, []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(',')]
        if not line.strip():
            continue
        if len(cells) != 3 or not cells[0].isdigit() or not all(_mode_ok(cell) for cell in cells[1:]):
            warnings.append('nvidia-smi printed an unreadable MIG mode line: %r' % line.strip()[:300])
            continue
        modes[int(cells[0])] = tuple(MODES.get(cell) for cell in cells[1:])
    return modes, warnings


def _mode_ok(cell):
    return cell in MODES or cell in NOT_APPLICABLE


def parse_list(text):
    """{GPU index: [(MIG device index, profile, MIG UUID)]} from nvidia-smi -L."""
    devices, index = {}, None
    for line in text.splitlines():
        gpu = LIST_GPU_RE.match(line)
        mig = LIST_MIG_RE.match(line)
        if gpu:
            index = int(gpu.group(1))
        elif mig and index is not None:
            devices.setdefault(index, []).append((int(mig.group(2)), mig.group(1), mig.group(3)))
    return devices


def parse_tables(text):
    """({(GPU, MIG device): (GI, CI, used MiB, total MiB)}, [(GPU, GI, CI, pid, used MiB)]) from the MIG
    devices and processes tables of plain nvidia-smi."""
    table, processes, section = {}, [], None
    for line in text.splitlines():
        if 'MIG devices:' in line or 'Processes:' in line:
            section = 'mig' if 'MIG' in line else 'processes'
            continue
        row = TABLE_ROW_RE.match(line) if section == 'mig' else PROCESS_ROW_RE.match(line.rstrip())
        if row and section == 'mig':
            gpu, gi, ci, dev, used, total = (int(value) for value in row.groups())
            table[(gpu, dev)] = (gi, ci, used, total)
        elif row and section == 'processes':
            processes.append(tuple(int(value) for value in row.groups()))
    return table, processes


def smi_instances(index, listed, table, processes, names):
    """The instance facts of GPU index from nvidia-smi's -L, MIG table and processes table; names:
    {pid: process name} from --query-compute-apps."""
    out = []
    for dev, profile, uuid in listed.get(index, []):
        gi, ci, used, total = table.get((index, dev), (None, None, None, None))
        own = [{'pid': pid, 'name': names.get(pid), 'used_memory_mib': mib}
               for gpu, p_gi, p_ci, pid, mib in processes if (gpu, p_gi, p_ci) == (index, gi, ci)]
        out.append(instance_fact(gi, ci, profile, uuid, used, total, own))
    return out


def smi_read(run, gpus, timeout=None):
    """({index: mig fact}, warnings) through nvidia-smi; run(args, timeout) -> (rc, stdout, stderr)."""
    rc, stdout, stderr = run(MODE_ARGS, timeout)
    if rc != 0:
        return {}, ['MIG mode unavailable: nvidia-smi exited %d: %s' % (rc, (stdout + stderr).strip()[:300])]
    modes, warnings = parse_modes(stdout)
    facts = dict((index, mig_fact(*mode)) for index, mode in modes.items())
    if not any(mode[0] == 'enabled' for mode in modes.values()):
        return facts, warnings
    listed = parse_list(_output(run, ['-L'], timeout, warnings))
    table, processes = parse_tables(_output(run, [], timeout, warnings))
    names = dict((process['pid'], process['name']) for gpu in gpus for process in gpu.get('processes') or [])
    for index, fact in facts.items():
        if fact and fact['mode_current'] == 'enabled':
            fact['instances'] = smi_instances(index, listed, table, processes, names)
            warnings.extend(_incomplete(index, fact['instances']))
    return facts, warnings


def _output(run, args, timeout, warnings):
    """What nvidia-smi printed for args; a warning when it failed."""
    rc, stdout, stderr = run(args, timeout)
    if rc != 0:
        warnings.append('MIG devices: nvidia-smi %s exited %d: %s' % (' '.join(args), rc, (stdout + stderr).strip()[:300]))
    return stdout


def _incomplete(index, instances):
    return ['GPU %d: nvidia-smi lists MIG device %s but its MIG table does not' % (index, instance['uuid'])
            for instance in instances if instance['gpu_instance_id'] is None]


# -- NVML ----------------------------------------------------------------------------------------

def nvml_read(nv, handle, processes):
    """The mig fact of one GPU through NVML; processes(handle) -> the process list of a handle."""
    try:
        current, pending = nv.nvmlDeviceGetMigMode(handle)
    except (nv.NVMLError, AttributeError) as exc:
        if getattr(exc, 'value', None) in NVML_NOT_SUPPORTED or isinstance(exc, AttributeError):
            return None
        raise
    fact = mig_fact(_nvml_mode(current), _nvml_mode(pending))
    if current == 1:
        fact['instances'] = [_nvml_instance(nv, mig, processes) for mig in _nvml_handles(nv, handle)]
    return fact


def _nvml_mode(value):
    return 'enabled' if value == 1 else 'disabled'


def _nvml_handles(nv, handle):
    handles = []
    for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            handles.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
        except nv.NVMLError as exc:
            if getattr(exc, 'value', None) != NVML_DEVICE_NOT_FOUND:
                raise
    return handles


def _nvml_instance(nv, mig, processes):
    name = _text(nv.nvmlDeviceGetName(mig))
    match = MIG_NAME_RE.search(name)
    memory = nv.nvmlDeviceGetMemoryInfo(mig)
    return instance_fact(int(nv.nvmlDeviceGetGpuInstanceId(mig)), int(nv.nvmlDeviceGetComputeInstanceId(mig)),
                         match.group(1) if match else name, _text(nv.nvmlDeviceGetUUID(mig)),
                         memory.used // (1024 * 1024), memory.total // (1024 * 1024), processes(mig))


def _text(value):
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else value


# -- the host's device nodes ---------------------------------------------------------------------

def caps_minor(path):
    """The DeviceFileMinor of a capabilities access file; None when it cannot be read."""
    try:
        with open(path) as f:
            match = CAPS_MINOR_RE.search(f.read(CAPS_FILE_MAX))
    except (IOError, OSError):
        return None
    return int(match.group(1)) if match else None


def add_device_nodes(gpu, host_root='/'):
    """Fill in device_nodes of each instance of a GPU fact: the parent's /dev/nvidiaN and the caps
    nodes of its GPU instance and compute instance (minors from the driver's access files, under
    gpu<N> of the GPU's minor number N). Returns warnings for access files that cannot be read."""
    minor, warnings = gpu.get('minor_number'), []
    for instance in (gpu.get('mig') or {}).get('instances', []):
        if minor is None or instance['gpu_instance_id'] is None:
            continue
        gi = '%s/gpu%d/mig/gi%d' % (CAPABILITIES, minor, instance['gpu_instance_id'])
        nodes = [under_root('/dev/nvidia%d' % minor, host_root)]
        for access in ('%s/access' % gi, '%s/ci%d/access' % (gi, instance['compute_instance_id'])):
            number = caps_minor(under_root(access, host_root))
            if number is None:
                warnings.append('GPU %s MIG device %s: cannot read %s' % (
                    gpu['index'], instance['uuid'], under_root(access, host_root)))
                continue
            nodes.append(under_root('/dev/nvidia-caps/nvidia-cap%d' % number, host_root))
        instance['device_nodes'] = nodes
    return warnings


def caps_instances(minor, host_root='/'):
    """The MIG devices the driver's capabilities tree lists under the GPU of minor number minor, as
    instance facts without profile, UUID or memory (the host's word on a parent it cannot read)."""
    base = under_root('%s/gpu%d/mig' % (CAPABILITIES, minor), host_root)
    found = []
    for gi_name in _listdir(base):
        gi = CAPS_GI_RE.match(gi_name)
        for ci_name in _listdir(os.path.join(base, gi_name)) if gi else ():
            ci = CAPS_CI_RE.match(ci_name)
            if ci:
                found.append(instance_fact(int(gi.group(1)), int(ci.group(1)), None, None, None, None))
    return sorted(found, key=lambda instance: (instance['gpu_instance_id'], instance['compute_instance_id']))


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except (IOError, OSError):
        return []


# -- what the release and the reasons say of MIG -------------------------------------------------

def instances_in_use(fact, memory_threshold_mib):
    """[(instance, why)] of the MIG devices of a GPU's mig fact that are in use: a process on it, or
    its memory above the threshold."""
    used = []
    for instance in (fact or {}).get('instances') or []:
        why = ['pid %s' % process.get('pid') for process in instance.get('processes') or []]
        mib = instance.get('memory_used_mib')
        if mib is not None and mib > memory_threshold_mib:
            why.append('%s MiB used' % mib)
        if why:
            used.append((instance, why))
    return used


def pending_change(fact):
    """'MIG mode disabled -> enabled' when a mode change waits for a GPU reset, else None."""
    if not fact or fact.get('mode_pending') in (None, fact.get('mode_current')):
        return None
    return 'MIG mode %s -> %s pending' % (fact.get('mode_current'), fact.get('mode_pending'))


def reset_changes(before, after):
    """What a GPU reset changed of a GPU's MIG, as read before and after it (mig facts; after None:
    not read). Only what the driver reports: nothing is recreated or assumed."""
    if after is None:
        return ['MIG after the reset not read']
    changes = []
    if before.get('mode_current') != after.get('mode_current'):
        changes.append('MIG mode %s -> %s' % (before.get('mode_current'), after.get('mode_current')))
    if after.get('mode_pending') != after.get('mode_current'):
        changes.append('still %s' % pending_change(after))
    kept = set(_key(instance) for instance in after.get('instances') or [])
    had = set(_key(instance) for instance in before.get('instances') or [])
    gone = [instance for instance in before.get('instances') or [] if _key(instance) not in kept]
    new = [instance for instance in after.get('instances') or [] if _key(instance) not in had]
    if gone:
        changes.append('MIG instances gone: %s' % ', '.join(instance_name(instance) for instance in gone))
    if new:
        changes.append('MIG instances new: %s' % ', '.join(instance_name(instance) for instance in new))
    return changes


def _key(instance):
    return (instance.get('gpu_instance_id'), instance.get('compute_instance_id'), instance.get('uuid'))


def layout(fact):
    """A mig fact as the reset's report keeps it: the modes and each instance's ids, profile and UUID."""
    if fact is None:
        return None
    return {'mode_current': fact.get('mode_current'), 'mode_pending': fact.get('mode_pending'),
            'instances': [dict((key, instance.get(key)) for key in ('gpu_instance_id', 'compute_instance_id', 'profile', 'uuid'))
                          for instance in fact.get('instances') or []]}
