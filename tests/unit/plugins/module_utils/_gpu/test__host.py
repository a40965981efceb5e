# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The host's view of its GPUs: PCI bus, the driver's /proc entries, minor numbers, lost GPUs."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._health.health import fallen_off_bus, parse_xid_events
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import (
    HostReader,
    apply_host,
    check_expected_gpus,
    device_patterns,
    gpu_nodes,
    mark_fallen,
    parse_information,
    read_driver,
    read_driver_version,
    read_host,
    read_pci,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import GpuReader, Snapshot

# /proc/driver/nvidia/gpus/<bus id>/information as nv-procfs.c writes it (tabs included).
INFORMATION = ("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 312\n"
               "GPU UUID: \t GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b11\nVideo BIOS: \t 96.00.74.00.0d\n"
               "Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
               "Bus Location: \t 0000:%s:00.0\nDevice Minor: \t %d\nGPU Excluded:\t %s\n")

# tests/unit/fixtures/real_samples/kernel_xid/K07 (syslog), verbatim.
K07 = """Jan  3 07:39:45 ubuntu kernel: [17257.355375] NVRM: The NVIDIA GPU 0000:5d:00.0
Jan  3 07:39:45 ubuntu kernel: [17257.355375] NVRM: (PCI ID: 10de:2330) installed in this system has
Jan  3 07:39:45 ubuntu kernel: [17257.355375] NVRM: fallen off the bus and is not responding to commands.
Jan  3 07:39:45 ubuntu kernel: [17257.355551] nvidia: probe of 0000:5d:00.0 failed with error -1
Jan  3 07:39:45 ubuntu kernel: [17257.418931] NVRM: The NVIDIA probe routine failed for 1 device(s).
"""


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as handle:
        handle.write(text)


def pci_device(root, bus, vendor='0x10de', device='0x2330', klass='0x030200', physfn=False, driver=None):
    base = os.path.join(str(root), 'sys/bus/pci/devices', bus)
    for name, value in (('vendor', vendor), ('device', device), ('class', klass)):
        write(os.path.join(base, name), value + '\n')
    if physfn:
        os.symlink('../0000:18:00.0', os.path.join(base, 'physfn'))
    if driver:
        os.symlink('../../../bus/pci/drivers/' + driver, os.path.join(base, 'driver'))


def driver_gpu(root, bus, minor, excluded='No'):
    write(os.path.join(str(root), 'proc/driver/nvidia/gpus', '0000:%s:00.0' % bus, 'information'),
          INFORMATION % (bus, minor, excluded))


@pytest.fixture
def host(tmp_path):
    """Four H100s on the bus (18, 2a, 3a, 5d); the driver attached three, numbered in another
    order than the bus; 5d fell off the bus at boot. Plus an NVSwitch, a host bridge and a VF."""
    for bus in ('18', '2a', '3a'):
        pci_device(tmp_path, '0000:%s:00.0' % bus, driver='nvidia')
    pci_device(tmp_path, '0000:5d:00.0')                                        # probe failed: unbound
    pci_device(tmp_path, '0000:05:00.0', device='0x22a3', klass='0x068000')     # NVSwitch
    pci_device(tmp_path, '0000:00:00.0', vendor='0x8086', klass='0x060000')     # host bridge
    pci_device(tmp_path, '0000:18:00.4', klass='0x030200', physfn=True)         # SR-IOV VF
    for bus, minor in (('18', 2), ('2a', 0), ('3a', 1)):
        driver_gpu(tmp_path, bus, minor)
    return tmp_path


def gpu(index, bus, error=None, **values):
    return dict(dict(index=index, pci_bus_id='00000000:%s:00.0' % bus.upper(), error=error, processes=[]), **values)


def test_pci_bus_lists_nvidia_display_devices_only(host):
    pci = read_pci(str(host))
    assert sorted(info['bus_id'] for info in pci.values()) == [
        '00000000:18:00.0', '00000000:2A:00.0', '00000000:3A:00.0', '00000000:5D:00.0']
    assert set(info['pci_id'] for info in pci.values()) == set(['10de:2330'])
    assert sorted((info['driver'] or '-') for info in pci.values()) == ['-', 'nvidia', 'nvidia', 'nvidia']


def test_information_file_in_the_drivers_format():
    info = parse_information(INFORMATION % ('9a', 7, 'No'))
    assert info == {'minor': 7, 'model': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b11',
                    'bus_id': '00000000:9A:00.0', 'excluded': False}
    assert parse_information('Device Minor: \t 0\nBlacklisted:\t Yes\n')['excluded'] is True
    assert parse_information('Model: x\n')['minor'] is None


def test_missing_directories_are_unknown_not_errors(tmp_path):
    assert read_pci(str(tmp_path)) is None and read_driver(str(tmp_path)) is None
    view = read_host(str(tmp_path))
    assert view.attached() == [] and view.minor('00000000:18:00.0') is None


def test_gpu_nodes_follow_the_minor_numbers(host):
    dev = ['/x/dev/nvidia-uvm', '/x/dev/nvidia0', '/x/dev/nvidia1', '/x/dev/nvidia2', '/x/dev/nvidiactl']
    nodes, problem = gpu_nodes(dev, str(host))
    assert problem is None
    # Index order is bus order: 18 -> 0 (minor 2), 2a -> 1 (minor 0), 3a -> 2 (minor 1).
    assert nodes == {0: 2, 1: 0, 2: 1}


def test_gpu_nodes_skip_excluded_gpus(host):
    driver_gpu(host, '10', 3, excluded='Yes')
    nodes, dummy = gpu_nodes(['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia2', '/dev/nvidia3'], str(host))
    assert nodes == {0: 2, 1: 0, 2: 1}


def test_gpu_nodes_without_the_driver_directory_assume_index_and_say_so(tmp_path):
    nodes, problem = gpu_nodes(['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidiactl'], str(tmp_path))
    assert nodes == {0: 0, 1: 1}
    assert 'proc/driver/nvidia/gpus cannot be read' in problem and 'host_root' in problem


def test_device_patterns_resolve_under_the_host_root():
    assert device_patterns(['/dev/nvidia*'], '/') == ['/dev/nvidia*']
    assert device_patterns(['/dev/nvidia*', '/dev/nvidia-caps/*'], '/srv/host[1]/') == [
        '/srv/host[[]1]/dev/nvidia*', '/srv/host[[]1]/dev/nvidia-caps/*']


def test_snapshot_gains_minor_numbers_and_the_gpu_missing_from_the_reader(host):
    snapshot = Snapshot([gpu(0, '18'), gpu(1, '2a', nvml_minor_number=0), gpu(2, '3a')], '550.127.05')
    apply_host(snapshot, read_host(str(host)))
    assert [g['minor_number'] for g in snapshot.gpus] == [2, 0, 1]
    assert not any('nvml_minor_number' in g for g in snapshot.gpus)
    [lost] = snapshot.missing
    assert lost['index'] is None and lost['pci_bus_id'] == '00000000:5D:00.0' and lost['minor_number'] is None
    assert 'on the PCI bus (PCI ID 10de:2330) but no driver is bound to it' in lost['error']
    assert 'absent from nvidia-smi' in lost['error']
    assert snapshot.warnings == ['GPU 00000000:5D:00.0 is lost: ' + lost['error']]


def test_gpus_bound_to_a_driver_but_not_shown_here_are_not_lost(host):
    # A container sees the host's whole PCI bus but only its own GPUs in /proc/driver/nvidia/gpus
    # and nvidia-smi; a GPU given to a VM is bound to vfio-pci.
    pci_device(host, '0000:9a:00.0', driver='nvidia')
    pci_device(host, '0000:ab:00.0', driver='vfio-pci')
    snapshot = Snapshot([gpu(0, '18'), gpu(1, '2a'), gpu(2, '3a')], None)
    apply_host(snapshot, read_host(str(host)))
    assert [g['pci_bus_id'] for g in snapshot.missing] == ['00000000:5D:00.0']


def test_nvml_minor_number_is_checked_against_the_driver(host):
    snapshot = Snapshot([gpu(0, '18', nvml_minor_number=5), gpu(1, '2a'), gpu(2, '3a')], '550.127.05')
    apply_host(snapshot, read_host(str(host)), backend='nvml')
    assert snapshot.gpus[0]['minor_number'] == 2
    assert any('NVML gives minor number 5' in w and 'says 2' in w for w in snapshot.warnings)


def test_nvml_minor_number_is_used_when_the_driver_directory_is_missing(tmp_path):
    snapshot = Snapshot([gpu(0, '18', nvml_minor_number=3), gpu(1, '2a')], None)
    apply_host(snapshot, read_host(str(tmp_path)), backend='nvml')
    assert [g['minor_number'] for g in snapshot.gpus] == [3, None]
    assert snapshot.missing == [] and snapshot.warnings == []


def test_reader_order_other_than_the_bus_is_a_warning(host):
    snapshot = Snapshot([gpu(0, '2a'), gpu(1, '18'), gpu(2, '3a')], None)
    apply_host(snapshot, read_host(str(host)))
    assert any('another order than the PCI bus' in w for w in snapshot.warnings)


def test_gpu_attached_but_not_listed_and_excluded_gpu(host):
    driver_gpu(host, '5d', 3)
    pci_device(host, '0000:9a:00.0')
    driver_gpu(host, '9a', 4, excluded='Yes')
    snapshot = Snapshot([gpu(0, '18'), gpu(1, '2a'), gpu(2, '3a')], None)
    apply_host(snapshot, read_host(str(host)), backend='nvml')
    [lost] = snapshot.missing
    assert lost['pci_bus_id'] == '00000000:5D:00.0' and lost['minor_number'] == 3 and lost['name'] == 'NVIDIA H100 80GB HBM3'
    assert lost['error'].startswith('attached by the NVIDIA driver (minor number 3) but absent from NVML: still seen on the PCI bus (')
    assert any('00000000:9A:00.0 is excluded' in w for w in snapshot.warnings)


def test_unnamed_unreadable_gpu_is_not_counted_twice(host):
    driver_gpu(host, '5d', 3)
    snapshot = Snapshot([gpu(0, '18'), gpu(1, '2a'), gpu(2, '3a'), dict(gpu(3, '5d', error='Unknown Error'), pci_bus_id=None)], None)
    apply_host(snapshot, read_host(str(host)))
    assert snapshot.missing == []


def test_gpus_the_kernel_log_says_fell_off_are_lost():
    gpus = [gpu(0, '18'), gpu(1, '5d'), gpu(2, '9a', error='GPU is lost')]
    mark_fallen(gpus, fallen_off_bus(parse_xid_events(K07.splitlines() + [
        'NVRM: Xid (PCI:0000:9a:00): 79, pid=0, name=x, GPU has fallen off the bus.'])))
    assert gpus[0]['error'] is None
    assert gpus[1]['error'] == 'the kernel log says this GPU has fallen off the bus'
    assert gpus[2]['error'] == 'GPU is lost; the kernel log says this GPU has fallen off the bus'


def test_expected_gpus_names_what_was_seen_and_what_was_lost():
    gpus = [gpu(0, '18'), gpu(1, '2a'), gpu(None, '5d', error='on the PCI bus but not attached')]
    check_expected_gpus(gpus, 2)
    check_expected_gpus(gpus, None)
    with pytest.raises(GpuopsError) as caught:
        check_expected_gpus(gpus, 3)
    assert str(caught.value) == ('expected_gpus: 3 GPUs expected, 2 seen (00000000:18:00.0, 00000000:2A:00.0); '
                                 'lost: 00000000:5D:00.0 (on the PCI bus but not attached)')
    with pytest.raises(GpuopsError, match='1 GPU expected, 0 seen$'):
        check_expected_gpus([], 1)
    with pytest.raises(GpuopsError, match='zero or more'):
        check_expected_gpus([], -1)


class Fixed(GpuReader):
    backend = 'nvidia-smi'

    def __init__(self):
        self.reads = 0
        self.closed = False

    def read(self, timeout=None, full=True):
        self.reads += 1
        return Snapshot([gpu(0, '18'), gpu(1, '2a'), gpu(2, '3a')], '550.127.05')

    def close(self):
        self.closed = True


def test_host_reader_adds_the_host_to_every_read(host):
    inner = Fixed()
    reader = HostReader(inner, str(host))
    for dummy in range(2):
        snapshot = reader.read()
        assert [g['minor_number'] for g in snapshot.gpus] == [2, 0, 1] and len(snapshot.missing) == 1
    reader.close()
    assert inner.reads == 2 and inner.closed and reader.backend == 'nvidia-smi'


@pytest.mark.parametrize('expected', [-1, -8])
def test_a_negative_expected_gpus_is_refused(expected):
    with pytest.raises(GpuopsError, match='expected_gpus must be zero or more, got %d' % expected):
        check_expected_gpus([gpu(0, '18')], expected)


def test_a_gpu_listed_without_a_bus_id_is_placed_by_its_index_and_hides_no_other(host):
    # Before: one unnamed GPU (a row of [Unknown Error] cells) made the host view skip every GPU
    # the driver attached but the reader did not list.
    driver_gpu(host, '5d', 3)
    pci_device(host, '0000:9a:00.0', driver='nvidia')
    driver_gpu(host, '9a', 4)
    unnamed = dict(gpu(1, '2a', error='the driver says: Unknown Error (for pci.bus_id)'), pci_bus_id=None)
    snapshot = Snapshot([gpu(0, '18'), unnamed], None)
    apply_host(snapshot, read_host(str(host)))
    assert snapshot.gpus[1]['pci_bus_id'] == '00000000:2A:00.0'
    assert any("GPU 1: nvidia-smi gives no bus id; it is taken to be 00000000:2A:00.0" in w for w in snapshot.warnings)
    assert [g['pci_bus_id'] for g in snapshot.missing] == ['00000000:3A:00.0', '00000000:5D:00.0', '00000000:9A:00.0']
    assert all('still seen on the PCI bus (%s/sys/bus/pci/devices/0000:' % host in g['error']
               for g in snapshot.missing if g['minor_number'] is not None)


def test_gpus_without_a_bus_id_or_an_index_are_counted_once(host):
    driver_gpu(host, '5d', 3)
    nameless = dict(gpu(None, '2a', error='Unknown Error'), pci_bus_id=None)
    snapshot = Snapshot([gpu(0, '18'), nameless], None)
    apply_host(snapshot, read_host(str(host)))
    # Two of the driver's GPUs are not listed by bus id and one GPU is listed without one: both
    # are reported, each saying that the nameless one may be it.
    assert [g['pci_bus_id'] for g in snapshot.missing] == ['00000000:2A:00.0', '00000000:3A:00.0', '00000000:5D:00.0']
    assert all('lists 1 GPU(s) it cannot name, which may be this one' in g['error']
               for g in snapshot.missing if g['minor_number'] is not None)


# The first line of /proc/driver/nvidia/version: the proprietary modules (NVIDIA's README), the
# open ones (nix-community/nixGL#186, #121), and a Jetson's (nixGL#139: no desktop branch).
@pytest.mark.parametrize('first_line, version', [
    ('NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024', '550.127.05'),
    ('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build  '
     '(dvs-builder@U16-A24-9-2)  Thu Oct 10 12:15:00 UTC 2024', '565.57.01'),
    ('NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  35.3.1  Release Build  '
     '(buildbrain@mobile-u64-6289-d7000)  Sun Mar 19 08:09:33 PDT 2023', '35.3.1'),
    ('garbage', None),
])
def test_the_driver_version_is_read_from_proc(tmp_path, first_line, version):
    path = tmp_path / 'proc' / 'driver' / 'nvidia'
    path.mkdir(parents=True)
    (path / 'version').write_text(first_line + '\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n')
    assert read_driver_version(str(tmp_path)) == version


def test_the_host_reader_tells_the_reader_the_drivers_version_before_its_first_read(host):
    path = host / 'proc' / 'driver' / 'nvidia' / 'version'
    path.write_text('NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 30 12:00:00 UTC 2025\n')
    inner = Fixed()
    HostReader(inner, str(host)).read()
    assert inner.driver_hint == '535.261.03'
    assert read_driver_version(str(host / 'nowhere')) is None
