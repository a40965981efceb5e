# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The host's own view of its NVIDIA GPUs: the PCI bus, the driver's entries, minor numbers.

A GPU has three names: nvidia-smi/NVML's index, its PCI bus id and the driver's minor number
(the N of /dev/nvidiaN). The PCI bus (``/sys/bus/pci/devices``) says which GPUs the host has;
``/proc/driver/nvidia/gpus/<bus id>/information`` says which of them the driver attached and
under which minor number. Every path is read under ``host_root``, so that a simulated host or a
host's /sys and /proc/driver mounted into a container can be read in place.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os
import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import bus_key, normalize_bus_id
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import GpuReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.scope import node_number

PCI_DEVICES = '/sys/bus/pci/devices'
DRIVER_GPUS = '/proc/driver/nvidia/gpus'
DRIVER_VERSION = '/proc/driver/nvidia/version'
DRIVER_VERSION_RE = re.compile(r'^NVRM version:.*?Kernel Module(?:\s+for\s+\S+)?\s+([0-9]+(?:\.[0-9]+)+)\s', re.M)
NVIDIA_VENDOR = 0x10de
# PCI base class 0x03 (display), subclass 0x00 (VGA compatible) or 0x02 (3D controller): the
# classes NVIDIA GPUs carry; the audio function (0x0403) and NVSwitches (0x0680) are not GPUs.
GPU_CLASSES = (0x0300, 0x0302)


def under_root(path, host_root='/'):
    """path (absolute) as it is found under host_root."""
    if not host_root or os.path.normpath(host_root) == '/':
        return path
    return os.path.join(host_root, path.lstrip('/'))


# The most read of one of the host's small files (a PCI id, the driver's information on a GPU).
SMALL_FILE_MAX = 65536


def device_patterns(patterns, host_root='/'):
    """Device globs resolved under host_root: the glob characters of host_root itself are escaped."""
    if not host_root or os.path.normpath(host_root) == '/':
        return list(patterns)
    root = glob.escape(os.path.normpath(host_root))
    return [root + pattern if pattern.startswith('/') else pattern for pattern in patterns]


def _read_text(path):
    """A small file of sysfs or /proc/driver (at most SMALL_FILE_MAX bytes of it), or None."""
    try:
        with open(path, 'rb') as handle:
            return handle.read(SMALL_FILE_MAX).decode('utf-8', 'replace')
    except (IOError, OSError):
        return None


def _hex(text):
    try:
        return int(text.strip(), 16)
    except (AttributeError, ValueError):
        return None


def read_pci(host_root='/'):
    """{bus_key: {'bus_id', 'pci_id', 'driver'}} of the NVIDIA GPUs on the PCI bus, or None when
    the PCI bus cannot be read (no /sys). driver: the name of the kernel driver bound to the GPU
    (nvidia, vfio-pci, ...), None when none is (its probe failed). Virtual functions (SR-IOV)
    are left out: they are not GPUs of their own to the host's driver."""
    base = under_root(PCI_DEVICES, host_root)
    try:
        names = os.listdir(base)
    except OSError:
        return None
    gpus = {}
    for name in names:
        device = os.path.join(base, name)
        if _hex(_read_text(os.path.join(device, 'vendor'))) != NVIDIA_VENDOR:
            continue
        klass = _hex(_read_text(os.path.join(device, 'class')))
        if klass is None or (klass >> 8) not in GPU_CLASSES or os.path.lexists(os.path.join(device, 'physfn')):
            continue
        key = bus_key(name)
        if key is None:
            continue
        device_id = _hex(_read_text(os.path.join(device, 'device')))
        try:
            driver = os.path.basename(os.readlink(os.path.join(device, 'driver')))
        except OSError:
            driver = None
        gpus[key] = {
            'bus_id': normalize_bus_id(name),
            'pci_id': '10de:%04x' % device_id if device_id is not None else None,
            'driver': driver,
        }
    return gpus


def parse_information(text):
    """The fields of a /proc/driver/nvidia/gpus/<bus id>/information file that matter here:
    minor (int or None), model, uuid, bus_id, excluded (bool)."""
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(':')
        if sep:
            fields[name.strip()] = value.strip()
    minor = fields.get('Device Minor')
    excluded = fields.get('GPU Excluded', fields.get('Blacklisted'))
    bus = fields.get('Bus Location')
    return {
        'minor': int(minor) if minor is not None and minor.isdigit() else None,
        'model': fields.get('Model') or None,
        'uuid': fields.get('GPU UUID') or None,
        'bus_id': normalize_bus_id(bus) if bus and bus_key(bus) else None,
        'excluded': excluded == 'Yes',
    }


def read_driver(host_root='/'):
    """{bus_key: information fields + 'bus_id'} of the GPUs the NVIDIA driver attached, or None
    when the driver's directory cannot be read (no driver loaded, or no /proc/driver)."""
    base = under_root(DRIVER_GPUS, host_root)
    try:
        names = os.listdir(base)
    except OSError:
        return None
    gpus = {}
    for name in names:
        key = bus_key(name)
        if key is None:
            continue
        info = parse_information(_read_text(os.path.join(base, name, 'information')) or '')
        info['bus_id'] = info['bus_id'] or normalize_bus_id(name)
        gpus[key] = info
    return gpus


class HostView:
    """What the host says about its GPUs. pci and driver: see read_pci and read_driver; each is
    None when it could not be read."""

    def __init__(self, pci, driver, host_root='/'):
        self.pci = pci
        self.driver = driver
        self.host_root = host_root

    def attached(self):
        """The driver's GPUs that NVML enumerates (not excluded), in PCI bus order: the order of
        nvidia-smi's and NVML's indexes."""
        return [self.driver[key] for key in sorted(self.driver or {}) if not self.driver[key]['excluded']]

    def minor(self, bus_id):
        info = (self.driver or {}).get(bus_key(bus_id))
        return info['minor'] if info else None


def read_host(host_root='/'):
    return HostView(read_pci(host_root), read_driver(host_root), host_root)


def gpu_nodes(paths, host_root='/', view=None):
    """({index: N}, warning or None): for each GPU whose device node /dev/nvidiaN is among paths,
    the number N of that node.

    The index is nvidia-smi's, N the GPU's minor number. Without the driver's /proc entries the
    minor number is taken to be the index, as nothing else tells, and the warning says so.
    """
    present = set(number for number in (node_number(path) for path in paths) if number is not None)
    view = view or HostView(None, read_driver(host_root), host_root)
    if view.driver is None:
        return dict((number, number) for number in present), (
            'gpus: %s cannot be read, so /dev/nvidiaN is taken to be the GPU of index N; '
            'on hosts where minor numbers and indexes differ that is another GPU (set '
            'host_root where the host\'s /proc/driver is mounted)' % under_root(DRIVER_GPUS, host_root))
    nodes = {}
    for index, info in enumerate(view.attached()):
        if info['minor'] in present:
            nodes[index] = info['minor']
    return nodes, None


def _lost_entry(bus_id, info, error):
    return {
        'index': None, 'uuid': info.get('uuid'), 'name': info.get('model'), 'pci_bus_id': bus_id,
        'minor_number': info.get('minor'), 'memory_total_mib': None, 'memory_used_mib': None,
        'memory_free_mib': None, 'utilization_gpu_pct': None, 'temperature_c': None,
        'persistence_mode': None, 'compute_mode': None, 'processes': [], 'error': error,
    }


def apply_host(snapshot, view, backend='nvidia-smi'):
    """Add to a Snapshot what the host knows: each GPU's minor_number, and in snapshot.missing
    the GPUs on the PCI bus that the reader does not list (lost). Warnings go to the snapshot."""
    reader_name = 'NVML' if backend == 'nvml' else 'nvidia-smi'
    order = [bus_key(info['bus_id']) for info in view.attached()] if view.driver is not None else None
    _name_by_index(snapshot, view, reader_name)
    misordered = []
    for gpu in snapshot.gpus:
        nvml_minor = gpu.pop('nvml_minor_number', None)
        minor = view.minor(gpu.get('pci_bus_id'))
        if minor is not None and nvml_minor is not None and minor != nvml_minor:
            snapshot.warnings.append(
                'GPU %s (%s): NVML gives minor number %d, %s says %d; the driver\'s file is used'
                % (gpu.get('index'), gpu.get('pci_bus_id'), nvml_minor,
                   under_root(DRIVER_GPUS, view.host_root), minor))
        gpu['minor_number'] = minor if minor is not None else nvml_minor
        index, key = gpu.get('index'), bus_key(gpu.get('pci_bus_id'))
        if order is not None and key is not None and index is not None and key in order and order.index(key) != index:
            misordered.append('GPU %s is %s' % (index, gpu.get('pci_bus_id')))
    if misordered:
        snapshot.warnings.append('%s numbers the GPUs in another order than the PCI bus (%s); gpus: '
                                 'takes index N to be the N-th GPU on the bus' % (reader_name, ', '.join(misordered)))
    snapshot.missing = _missing(snapshot, view, reader_name)
    for gpu in snapshot.missing:
        snapshot.warnings.append('GPU %s is lost: %s' % (gpu['pci_bus_id'], gpu['error']))
    return snapshot


def _name_by_index(snapshot, view, reader_name):
    """Give a GPU that the reader lists under an index but without a bus id (its row said
    [Unknown Error] there) the bus id of the driver's GPU of that index, when no other GPU of
    the reader has it: the reader numbers the driver's GPUs in PCI bus order (see attached)."""
    attached = view.attached() if view.driver is not None else []
    listed = set(bus_key(gpu.get('pci_bus_id')) for gpu in snapshot.gpus)
    for gpu in snapshot.gpus:
        index = gpu.get('index')
        if gpu.get('pci_bus_id') or index is None or not 0 <= index < len(attached):
            continue
        bus_id = attached[index]['bus_id']
        if bus_key(bus_id) in listed:
            continue
        gpu['pci_bus_id'] = bus_id
        listed.add(bus_key(bus_id))
        snapshot.warnings.append('GPU %d: %s gives no bus id; it is taken to be %s, the driver\'s GPU of that '
                                 'index in PCI bus order' % (index, reader_name, bus_id))


def _missing(snapshot, view, reader_name):
    if view.pci is None:
        return []
    listed = set(bus_key(gpu.get('pci_bus_id')) for gpu in snapshot.gpus)
    # GPUs the reader lists without a bus id (nor an index to place them by) may be any of the
    # driver's GPUs it does not name: as many of those are not counted twice.
    unnamed = sum(1 for gpu in snapshot.gpus if bus_key(gpu.get('pci_bus_id')) is None)
    unlisted = [key for key in sorted(view.driver or {})
                if key not in listed and key in view.pci if not view.driver[key]['excluded']]
    missing = []
    for key in sorted(view.pci):
        if key in listed:
            continue
        pci = view.pci[key]
        info = (view.driver or {}).get(key)
        if info is not None and info['excluded']:
            snapshot.warnings.append('GPU %s is excluded from use by the NVIDIA driver (NVreg_ExcludedGpus) '
                                     'and not counted' % pci['bus_id'])
            continue
        if info is not None:
            if len(unlisted) <= unnamed:
                continue  # the reader lists a GPU it could not name: this one, most likely
            error = ('attached by the NVIDIA driver (minor number %s) but absent from %s: still seen on the PCI '
                     'bus (%s) and in the driver\'s list (%s)' % (
                         info['minor'], reader_name, _sysfs_path(pci['bus_id'], view.host_root),
                         _driver_path(pci['bus_id'], view.host_root)))
            if unnamed:
                error += '; %s also lists %d GPU(s) it cannot name, which may be this one' % (reader_name, unnamed)
        elif pci['driver'] is not None:
            # Bound to a driver but not shown here: a GPU that a container does not expose (its
            # /proc/driver/nvidia/gpus lists only its own), or one given to vfio-pci for a VM.
            continue
        else:
            error = ('on the PCI bus (PCI ID %s) but no driver is bound to it: still seen at %s, absent from %s '
                     'and from %s; a GPU that fell off the bus at boot looks like this (see the kernel log)'
                     % (pci['pci_id'] or '10de', _sysfs_path(pci['bus_id'], view.host_root), reader_name,
                        under_root(DRIVER_GPUS, view.host_root)))
        missing.append(_lost_entry(pci['bus_id'], info or {}, error))
    return missing


def _sysfs_path(bus_id, host_root):
    """Where the kernel lists a GPU on the PCI bus: /sys/bus/pci/devices/0000:5d:00.0."""
    return under_root('%s/%s' % (PCI_DEVICES, bus_id[4:].lower()), host_root)


def _driver_path(bus_id, host_root):
    return under_root('%s/%s' % (DRIVER_GPUS, bus_id[4:].lower()), host_root)


def mark_fallen(gpus, fallen):
    """Mark as lost the GPUs (dicts with pci_bus_id and error) whose bus key (_pci.bus_key)
    is in fallen: those the kernel log says have fallen off the bus (_health.fallen_off_bus)."""
    keys = set(fallen or ())
    for gpu in gpus:
        if bus_key(gpu.get('pci_bus_id')) not in keys:
            continue
        said = 'the kernel log says this GPU has fallen off the bus'
        gpu['error'] = '%s; %s' % (gpu['error'], said) if gpu.get('error') else said
    return gpus


def check_expected_gpus(gpus, expected):
    """Raise GpuopsError when fewer than expected of gpus (dicts with pci_bus_id and error, the
    lost ones included) can be read."""
    if expected is None:
        return
    if expected < 0:
        raise GpuopsError('expected_gpus must be zero or more, got %s' % expected)
    if gpus is None:
        return
    seen = [gpu for gpu in gpus if not gpu.get('error')]
    if len(seen) >= expected:
        return
    lost = ['%s (%s)' % (gpu.get('pci_bus_id') or 'GPU %s' % gpu.get('index'), gpu['error'])
            for gpu in gpus if gpu.get('error')]
    raise GpuopsError('expected_gpus: %d GPU%s expected, %d seen%s%s' % (
        expected, '' if expected == 1 else 's', len(seen),
        ' (%s)' % ', '.join(gpu.get('pci_bus_id') or 'GPU %s' % gpu.get('index') for gpu in seen) if seen else '',
        '; lost: %s' % '; '.join(lost) if lost else ''))


def read_expected_gpus(reader, expected, timeout=None):
    """With expected set, read the GPUs once and raise GpuopsError when fewer can be read."""
    if expected is None:
        return
    check_expected_gpus(None, expected)
    snapshot = reader.read(timeout=timeout)
    check_expected_gpus(snapshot.gpus + snapshot.missing, expected)


def read_driver_version(host_root='/'):
    """The version of the loaded NVIDIA kernel module, from /proc/driver/nvidia/version (its first
    line: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  ..." or, for the open
    modules, "... Open Kernel Module for x86_64  565.57.01  Release Build ..."); None when the
    file cannot be read or says no version."""
    match = DRIVER_VERSION_RE.search(_read_text(under_root(DRIVER_VERSION, host_root)) or '')
    return match.group(1) if match else None


class HostReader(GpuReader):
    """A reader that adds the host's view (minor numbers, GPUs missing from the reader) to
    every snapshot of the reader it wraps, and tells it the driver's version before its first
    read (driver_hint)."""

    def __init__(self, reader, host_root='/'):
        self.reader = reader
        self.host_root = host_root or '/'
        self.backend = reader.backend
        self.view = None

    def read(self, timeout=None, full=True):
        if self.view is None and getattr(self.reader, 'driver_hint', None) is None:
            self.reader.driver_hint = read_driver_version(self.host_root)
        snapshot = self.reader.read(timeout=timeout, full=full)
        if self.view is None:
            self.view = read_host(self.host_root)
        return apply_host(snapshot, self.view, self.backend)

    def read_mig(self, gpus, timeout=None):
        return self.reader.read_mig(gpus, timeout=timeout)

    def close(self):
        self.reader.close()
