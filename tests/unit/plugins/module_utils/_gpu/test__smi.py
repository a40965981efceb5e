# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import stat
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import smi as _smi
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DriverHung, GpuopsError, PermanentReadError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import (
    SmiParseError,
    SmiReader,
    SmiRunner,
    describe_failure,
    parse_apps_csv,
    parse_gpu_csv,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import HostReader
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import gpu_state
from processes import gone, kill_left, read_pid

H200 = ('{i}, GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b1{i}, NVIDIA H200, 00000000:{bus}:00.0, 143771, '
        '{used}, {free}, {util}, 34, Enabled, Default, 550.127.05')
BUSES = ['18', '2A', '3A', '5D', '9A', 'AB', 'BA', 'DB']


def gpu_line(i, used=0, util=0):
    return H200.format(i=i, bus=BUSES[i], used=used, free=143771 - used, util=util)


def test_parses_every_field_with_types():
    gpus, warnings = parse_gpu_csv(gpu_line(0, used=76113) + '\n')
    assert warnings == []
    assert gpus == [{
        'index': 0, 'uuid': 'GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b10', 'name': 'NVIDIA H200',
        'pci_bus_id': '00000000:18:00.0', 'memory_total_mib': 143771, 'memory_used_mib': 76113,
        'memory_free_mib': 67658, 'utilization_gpu_pct': 0, 'temperature_c': 34,
        'persistence_mode': True, 'compute_mode': 'Default', 'driver_version': '550.127.05',
        'memory_reserved_mib': None,
        'remapped_rows_pending': None, 'remapped_rows_failure': None, 'retired_pages_pending': None,
        'driver_recovery_action': None, 'error': None,
    }]


def test_parses_memory_reserved_after_the_health_fields():
    gpus, warnings = parse_gpu_csv(gpu_line(0, used=1) + ', No, No, [N/A], 515\n',
                                   _smi.GPU_FIELDS + _smi.HEALTH_FIELDS + _smi.RESERVED_FIELDS)
    assert warnings == [] and gpus[0]['memory_reserved_mib'] == 515 and gpus[0]['memory_used_mib'] == 1
    assert gpus[0]['remapped_rows_pending'] is False and gpus[0]['retired_pages_pending'] is None
    fields = _smi.GPU_FIELDS + _smi.RESERVED_FIELDS
    gpus, warnings = parse_gpu_csv(gpu_line(0) + ', 515\n', fields)
    assert gpus[0]['memory_reserved_mib'] == 515 and gpus[0]['remapped_rows_pending'] is None


@pytest.mark.parametrize('marker', ['[N/A]', '[Not Supported]', 'N/A', ''])
def test_unreported_values_become_none(marker):
    line = '0, GPU-x, NVIDIA H200, 00000000:18:00.0, 143771, {m}, {m}, {m}, {m}, {m}, {m}, {m}'.format(m=marker)
    gpus, warnings = parse_gpu_csv(line)
    gpu = gpus[0]
    assert warnings == []
    for key in ('memory_used_mib', 'memory_free_mib', 'utilization_gpu_pct', 'temperature_c',
                'persistence_mode', 'compute_mode', 'driver_version'):
        assert gpu[key] is None, key
    assert gpu['memory_total_mib'] == 143771
    assert gpu['error'] is None


@pytest.mark.parametrize('marker, state', [('[Unknown Error]', 'lost'), ('[GPU is lost]', 'lost'),
                                           ('[Insufficient Permissions]', 'lost'),
                                           ('[GPU requires reset]', 'reset_required')])
def test_every_other_bracketed_value_is_an_error_of_that_gpu(marker, state):
    line = '0, GPU-x, NVIDIA H200, 00000000:18:00.0, 143771, {m}, {m}, {m}, {m}, {m}, {m}, {m}'.format(m=marker)
    [gpu], warnings = parse_gpu_csv(line)
    assert warnings == [] and gpu['memory_used_mib'] is None and gpu['memory_total_mib'] == 143771
    assert gpu['error'].startswith('the driver says: %s (for memory.used, memory.free' % marker[1:-1])
    assert gpu_state(dict(gpu, processes=[])) == state


def test_units_are_tolerated_when_nounits_is_ignored():
    line = ('0, GPU-x, NVIDIA H200, 00000000:18:00.0, 143771 MiB, 76113 MiB, 67658 MiB, 0 %, 34, '
            'Disabled, Exclusive_Process, 550.127.05')
    gpu = parse_gpu_csv(line)[0][0]
    assert (gpu['memory_used_mib'], gpu['utilization_gpu_pct'], gpu['persistence_mode']) == (76113, 0, False)
    assert gpu['compute_mode'] == 'Exclusive_Process'


@pytest.mark.parametrize('error_line', [
    'Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error',
    'Unable to determine the device handle for GPU 0000:5D:00.0: GPU is lost.  Reboot the system to recover this GPU',
])
def test_lost_gpu_line_keeps_its_bus_id_and_no_index_by_position(error_line):
    # Where a real driver prints only the error line, its position says nothing about its index.
    text = '\n'.join([gpu_line(0), gpu_line(1), gpu_line(2), error_line, gpu_line(4)]) + '\n'
    gpus, dummy = parse_gpu_csv(text)
    assert [gpu['index'] for gpu in gpus] == [0, 1, 2, None, 4]
    lost = gpus[3]
    assert lost['error'] == error_line
    assert lost['pci_bus_id'] == '00000000:5D:00.0'
    assert lost['memory_used_mib'] is None
    assert all(gpu['error'] is None for gpu in gpus if gpu is not lost)
    only, dummy = parse_gpu_csv(error_line + '\n')
    assert [(gpu['index'], gpu['pci_bus_id']) for gpu in only] == [(None, '00000000:5D:00.0')]


def test_garbage_value_is_none_with_a_warning():
    line = gpu_line(0).replace(', 0, 143771,', ', lots, 143771,', 1)
    gpus, warnings = parse_gpu_csv(line)
    assert gpus[0]['memory_used_mib'] is None
    assert warnings == ["nvidia-smi, GPU 0: memory.used: unreadable value 'lots'"]


@pytest.mark.parametrize('text', [
    'Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.154\n',
    'NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.',
    'Segmentation fault',
    'index, uuid\n',
])
def test_output_without_gpu_data_raises_parse_error(text):
    with pytest.raises(SmiParseError) as info:
        parse_gpu_csv(text)
    assert text.strip().splitlines()[0] in str(info.value)


def test_apps_with_commas_in_process_name():
    text = ('4242, python3, 76113, GPU-aaa, 00000000:18:00.0\n'
            '4243, /opt/my job,v2/bin/train, a, 1024, GPU-bbb, 00000000:2A:00.0\n'
            '4244, weird, [N/A], GPU-ccc, 00000000:3A:00.0\n')
    apps, warnings = parse_apps_csv(text)
    assert warnings == []
    assert [(a['pid'], a['name'], a['used_memory_mib'], a['gpu_uuid']) for a in apps] == [
        (4242, 'python3', 76113, 'GPU-aaa'),
        (4243, '/opt/my job,v2/bin/train, a', 1024, 'GPU-bbb'),
        (4244, 'weird', None, 'GPU-ccc'),
    ]


def test_apps_unknown_process_names_are_null():
    # tests/unit/fixtures/real_samples/smi_compute_apps/A02 (a container host), in the queried field order.
    text = ('4, [Insufficient Permissions], [N/A], GPU-0e7f33ad-cc4a-7a1a-e9a4-7dd69f9032ab, 00000000:01:00.0\n'
            '50983, [Not Found], [N/A], GPU-0e7f33ad-cc4a-7a1a-e9a4-7dd69f9032ab, 00000000:01:00.0\n'
            '40170, /opt/rh/rh-python38/root/usr/bin/python3, 185, GPU-0e7f33ad-cc4a-7a1a-e9a4-7dd69f9032ab, 00000000:01:00.0\n')
    apps, warnings = parse_apps_csv(text)
    assert warnings == []
    assert [(a['pid'], a['name'], a['used_memory_mib']) for a in apps] == [
        (4, None, None), (50983, None, None), (40170, '/opt/rh/rh-python38/root/usr/bin/python3', 185)]


def test_apps_garbage_lines_are_warned_not_raised():
    apps, warnings = parse_apps_csv('No running processes found\nsomething odd\n12\n')
    assert apps == []
    assert len(warnings) == 2


def test_describe_failure_names_the_exit_code():
    text = describe_failure(9, '', "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    assert text.startswith('nvidia-smi exited with 9 (the NVIDIA driver is not loaded): NVIDIA-SMI has failed')


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_gpu_parser_raises_only_its_own_error(text):
    try:
        gpus, warnings = parse_gpu_csv(text)
    except SmiParseError:
        return
    for gpu in gpus:
        assert isinstance(gpu['index'], int) or (gpu['index'] is None and gpu['error'])
        for value in gpu.values():
            assert value is None or isinstance(value, (str, int, bool))
            assert not (isinstance(value, str) and value.startswith('[N/A'))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([gpu_line(0), gpu_line(1, 5), ', , ,', '[N/A]', 'Unable to x 0:1:2.3',
                                 ',,,,,,,,,,,', '0, a, b, zz:zz, x, y, z, w, v, Enabled, D, 1']), max_size=8),
       st.text(max_size=40))
def test_gpu_parser_on_line_mixtures(lines, noise):
    try:
        parse_gpu_csv('\n'.join(lines + [noise]))
    except SmiParseError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_apps_parser_never_raises(text):
    apps, warnings = parse_apps_csv(text)
    assert all(isinstance(app['pid'], int) for app in apps)


# The runner: real subprocesses standing in for nvidia-smi.

def write_script(tmp_path, body, name='nvidia-smi'):
    path = tmp_path / name
    path.write_text('#!/bin/sh\n' + body + '\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_runner_returns_output_and_code(tmp_path):
    script = write_script(tmp_path, 'echo "$@"; echo oops >&2; exit 15')
    assert SmiRunner(script).run(['-L']) == (15, '-L\n', 'oops\n')


def test_runner_kills_a_hung_nvidia_smi_that_ignores_sigterm(tmp_path):
    script = write_script(tmp_path, "trap '' TERM INT HUP; sleep 30 & wait; sleep 30")
    started = time.monotonic()
    with pytest.raises(GpuopsError, match='did not answer within 0.5 s'):
        SmiRunner(script, timeout=0.5).run(['--query-gpu=index'])
    assert time.monotonic() - started < 5


def test_runner_reports_a_missing_executable(tmp_path):
    with pytest.raises(PermanentReadError, match='not found or not executable'):
        SmiRunner(str(tmp_path / 'nope')).run([])
    with pytest.raises(PermanentReadError, match='set nvidia_smi_path'):
        SmiRunner('no-such-nvidia-smi-command').run([])


def test_runner_rejects_a_file_that_is_not_executable(tmp_path):
    path = tmp_path / 'nvidia-smi'
    path.write_text('')
    with pytest.raises(PermanentReadError, match=r'is not executable \(mode 0644\)'):
        SmiRunner(str(path)).run([])


def test_runner_names_a_missing_interpreter(tmp_path):
    path = tmp_path / 'nvidia-smi'
    path.write_text('#!/opt/gone/python3 -u\nprint("hello")\n')
    path.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(PermanentReadError, match="bad interpreter '/opt/gone/python3' in its #! line"):
        SmiRunner(str(path)).run(['-L'])
    assert time.monotonic() - started < 2


def test_runner_names_a_file_that_is_not_a_program_for_this_host(tmp_path):
    path = tmp_path / 'nvidia-smi'
    path.write_bytes(b'\x7fELF' + os.urandom(4096))
    path.chmod(0o755)
    with pytest.raises(PermanentReadError, match='not an executable this host can run .exec format error'):
        SmiRunner(str(path)).run(['-L'])


@pytest.mark.parametrize('fault, rc', [('driver-not-loaded', 9), ('mismatch', 18)])
def test_runner_exit_codes_no_retry_can_cure_are_permanent(gpuhost, fault, rc):
    gpuhost.fault(fault)
    started = time.monotonic()
    with pytest.raises(PermanentReadError, match=r'nvidia-smi exited with %d \(' % rc):
        SmiReader(SmiRunner(gpuhost.smi_path)).read()
    assert time.monotonic() - started < 5


def test_runner_library_not_found_is_permanent(tmp_path):
    # What nvidia-smi 535 and 550 print, exit 12, when libnvidia-ml.so cannot be loaded.
    said = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
            "NVIDIA Display Driver is properly installed and present in your system.")
    script = write_script(tmp_path, 'echo "%s"; exit 12' % said)
    with pytest.raises(PermanentReadError, match=r"exited with 12 \(the NVML shared library could not be found or loaded\): "
                                                 r"NVIDIA-SMI couldn't find libnvidia-ml.so"):
        SmiRunner(script).run(['--query-gpu=index'])


def test_runner_other_failures_are_not_permanent(tmp_path):
    script = write_script(tmp_path, 'echo "GPU is lost"; exit 15')
    assert SmiRunner(script).run(['-L']) == (15, 'GPU is lost\n', '')


@pytest.mark.parametrize('detach', ['', 'setsid '])
def test_runner_answer_is_read_when_nvidia_smi_exits_though_a_child_keeps_its_pipes(tmp_path, detach):
    pidfile = str(tmp_path / 'child.pid')
    script = write_script(tmp_path, '%ssleep 30 & echo $! > %s; echo "0, NVIDIA H200"; echo warn >&2; exit 0' % (detach, pidfile))
    started = time.monotonic()
    try:
        assert SmiRunner(script, timeout=10).run(['--query-gpu=index,name']) == (0, '0, NVIDIA H200\n', 'warn\n')
        assert time.monotonic() - started < 2
    finally:
        child = read_pid(pidfile)
        if not detach:  # left in its process group: killed with it
            assert gone(child)
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize('detach', ['', 'setsid '])
def test_runner_timeout_kills_nvidia_smi_and_every_process_it_started(tmp_path, detach):
    pidfile = str(tmp_path / 'child.pid')
    script = write_script(tmp_path, '%ssleep 30 & echo $! > %s; sleep 30' % (detach, pidfile))
    started = time.monotonic()
    try:
        with pytest.raises(GpuopsError, match='did not answer within 0.5 s and was killed') as error:
            SmiRunner(script, timeout=0.5).run(['--query-gpu=index'])
        assert not isinstance(error.value, PermanentReadError)
        assert time.monotonic() - started < 3
        assert gone(read_pid(pidfile))
    finally:
        kill_left(pidfile)


@pytest.mark.parametrize('rc, output, message', [
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
     'exited with 9 (the NVIDIA driver is not loaded)'),
    (18, 'Failed to initialize NVML: Driver/library version mismatch', 'exited with 18'),
    (0, 'garbage garbage', 'printed no GPU data: garbage garbage'),
    (0, '', 'printed nothing'),
])
def test_reader_turns_failures_into_clear_errors(tmp_path, rc, output, message):
    script = write_script(tmp_path, 'echo "%s"; exit %d' % (output.replace('"', '\\"'), rc))
    with pytest.raises(GpuopsError, match=message.replace('(', r'\(').replace(')', r'\)')):
        SmiReader(SmiRunner(script)).read()


def test_reader_no_devices_is_an_empty_snapshot(tmp_path):
    script = write_script(tmp_path, 'echo "No devices were found"; exit 6')
    snapshot = SmiReader(SmiRunner(script)).read()
    assert snapshot.gpus == []
    assert snapshot.warnings == ['nvidia-smi: No devices were found']


def test_reader_joins_processes_to_gpus_and_takes_driver_version(tmp_path):
    gpus = '\n'.join(gpu_line(i, used=76113 if i == 1 else 0) for i in range(2))
    apps = '4242, python3, 76113, GPU-5c7f3c52-1f05-0d3c-1f4b-3f2a6c0e9b11, 00000000:2A:00.0'
    script = write_script(tmp_path, 'case "$1" in --query-gpu=*) echo "%s";; *) echo "%s";; esac' % (gpus, apps))
    snapshot = SmiReader(SmiRunner(script)).read()
    assert snapshot.driver_version == '550.127.05'
    assert [gpu['processes'] for gpu in snapshot.gpus] == [[], [{'pid': 4242, 'name': 'python3', 'used_memory_mib': 76113}]]
    assert all('driver_version' not in gpu for gpu in snapshot.gpus)
    assert os.path.basename(script) == 'nvidia-smi'


# A driver's nvidia-smi that refuses some fields: it prints nvidia-smi's message for the first
# one it does not know and exits 2, as the real tool does.
REFUSING = """for arg in "$@"; do case "$arg" in --query-gpu=*)
  for field in %s; do case "$arg" in *"$field"*) echo "Field \\"$field\\" is not a valid field to query."; echo; exit 2;; esac; done
  echo "$arg" >> %s
  out="%s"
  case "$arg" in *gpu_recovery_action*) out="$out, None";; esac
  case "$arg" in *remapped_rows*) out="$out, No, No";; esac
  case "$arg" in *retired_pages*) out="$out, [N/A]";; esac
  case "$arg" in *memory.reserved*) out="$out, 515";; esac
  echo "$out"; exit 0;; esac; done"""


def refusing_smi(tmp_path, refused):
    line = gpu_line(0, used=1)
    log = tmp_path / 'queries'
    script = write_script(tmp_path, REFUSING % (' '.join(refused) or 'none-refused', log, line))
    return SmiReader(SmiRunner(script)), log


def test_reader_reads_memory_reserved(tmp_path):
    reader, log = refusing_smi(tmp_path, [])
    snapshot = reader.read()
    assert snapshot.gpus[0]['memory_reserved_mib'] == 515 and snapshot.gpus[0]['remapped_rows_pending'] is False
    assert snapshot.warnings == []
    assert 'memory.reserved' in log.read_text()


def test_reader_without_memory_reserved_keeps_the_health_fields_and_warns(tmp_path):
    reader, log = refusing_smi(tmp_path, ['memory.reserved'])
    snapshot = reader.read()
    gpu = snapshot.gpus[0]
    assert gpu['memory_reserved_mib'] is None and gpu['memory_used_mib'] == 1 and gpu['remapped_rows_pending'] is False
    assert snapshot.warnings == [_smi.RESERVED_WARNING]
    assert len(log.read_text().splitlines()) == 1


def test_reader_keeps_memory_reserved_when_the_health_fields_are_refused(tmp_path):
    # The 535 and 550 nvidia-smi list remapped_rows.* under --query-remapped-rows only.
    reader, log = refusing_smi(tmp_path, ['remapped_rows.pending'])
    snapshot = reader.read()
    assert snapshot.gpus[0]['memory_reserved_mib'] == 515 and snapshot.gpus[0].get('remapped_rows_pending') is None
    assert _smi.RESERVED_WARNING not in snapshot.warnings
    reader, log = refusing_smi(tmp_path, ['remapped_rows.pending', 'memory.reserved'])
    snapshot = reader.read()
    assert snapshot.gpus[0]['memory_reserved_mib'] is None and snapshot.gpus[0]['memory_used_mib'] == 1
    assert _smi.RESERVED_WARNING in snapshot.warnings


# A lost GPU, as real drivers print it: the full query prints only its error line.

def read_host(host):
    return SmiReader(SmiRunner(host.smi_path)).read()


@pytest.mark.parametrize('message, error', [
    ('unknown', 'Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error'),
    ('lost', 'Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost.  Reboot the system to recover this GPU'),
])
def test_a_lost_gpu_never_hides_or_renames_the_others(gpuhost, message, error):
    job = gpuhost.hold(gpus=[5], mib=4096, name='python3')
    gpuhost.fault('lost', gpu=3, message=message)
    snapshot = read_host(gpuhost)
    assert [(gpu['index'], gpu['pci_bus_id'], gpu['error']) for gpu in snapshot.gpus] == [
        (i, '00000000:%s:00.0' % BUSES[i], error if i == 3 else None) for i in range(8)]
    lost = snapshot.gpus[3]
    assert lost['memory_used_mib'] is None and lost['uuid'] is None and lost['processes'] == []
    # The healthy GPUs are read in full, processes included.
    assert snapshot.gpus[5]['memory_used_mib'] == 1 + 4096  # the idle reading and the job
    assert snapshot.gpus[5]['processes'] == [{'pid': job['pid'], 'name': 'python3', 'used_memory_mib': 4096}]
    assert snapshot.driver_version == '550.127.05'
    assert snapshot.warnings[0].startswith('nvidia-smi could not read every GPU (%s)' % error)


def test_two_lost_gpus_and_the_old_in_place_variant(gpuhost):
    gpuhost.fault('lost', gpu=0, message='lost')
    gpuhost.fault('lost', gpu=7, in_place=True)
    snapshot = read_host(gpuhost)
    assert [gpu['index'] for gpu in snapshot.gpus] == list(range(8))
    assert [gpu['index'] for gpu in snapshot.gpus if gpu['error']] == [0, 7]
    assert snapshot.gpus[0]['error'].endswith('GPU is lost.  Reboot the system to recover this GPU')
    assert snapshot.gpus[7]['pci_bus_id'] == '00000000:DB:00.0'


def test_a_lost_gpu_that_does_not_answer_to_its_index_keeps_its_bus_id(tmp_path):
    # Only the error line, even to -i: the GPU keeps the bus id its message names, index None.
    line = 'Unable to determine the device handle for GPU 000:BA:80.0: Unknown Error'
    script = write_script(tmp_path, '''
case "$*" in
  *--query-gpu*-i*|-i*--query-gpu*) ;;
esac
case "$1" in
  -i) if [ "$2" = 0 ]; then echo "%s"; exit 0; fi; echo "No devices were found"; exit 6;;
  --query-gpu=*) echo "%s"; exit 255;;
  *) exit 0;;
esac''' % (gpu_line(0), line))
    snapshot = SmiReader(SmiRunner(script)).read()
    assert [(gpu['index'], gpu['pci_bus_id'], gpu['error']) for gpu in snapshot.gpus] == [
        (0, '00000000:18:00.0', None), (None, '00000000:BA:80.0', line)]


@pytest.mark.parametrize('driver', ['535.261.03', '550.163.01', '590.48.01'])
def test_remapped_rows_are_read_on_every_driver(gpuhost_factory, driver):
    host = gpuhost_factory(gpus=4, driver_version=driver)
    host.fault('remap', gpu=1, pending=True)
    host.fault('remap', gpu=2, failure=True)
    snapshot = read_host(host)
    assert [(gpu['remapped_rows_pending'], gpu['remapped_rows_failure']) for gpu in snapshot.gpus] == [
        (False, False), (True, False), (False, True), (False, False)]
    assert snapshot.warnings == []


def test_a_health_field_the_driver_refuses_is_null_with_one_warning(tmp_path):
    # A driver that knows none of the health fields, in --query-gpu or --query-remapped-rows.
    script = write_script(tmp_path, '''
case "$1" in
  --query-gpu=*remapped_rows.pending*) echo 'Field "remapped_rows.pending" is not a valid field to query.'; echo; exit 2;;
  --query-gpu=*remapped_rows.failure*) echo 'Field "remapped_rows.failure" is not a valid field to query.'; echo; exit 2;;
  --query-gpu=*retired_pages*) echo 'Field "retired_pages.pending" is not a valid field to query.'; echo; exit 2;;
  --query-gpu=*) echo "%s"; exit 0;;
  --query-remapped-rows=*) echo 'Invalid combination of input arguments.'; exit 2;;
  *) exit 0;;
esac''' % gpu_line(0))
    snapshot = SmiReader(SmiRunner(script)).read()
    gpu = snapshot.gpus[0]
    assert (gpu['remapped_rows_pending'], gpu['remapped_rows_failure'], gpu['retired_pages_pending']) == (None, None, None)
    assert len(snapshot.warnings) == 1
    warning = snapshot.warnings[0]
    assert warning.startswith('nvidia-smi cannot report remapped_rows_pending, remapped_rows_failure, '
                              'retired_pages_pending on this driver (')
    assert 'Field "retired_pages.pending" is not a valid field to query.' in warning
    assert '--query-remapped-rows: nvidia-smi exited with 2' in warning and warning.endswith('they are null')


def test_refused_health_fields_are_asked_for_once_per_reader(gpuhost_factory, tmp_path):
    host = gpuhost_factory(gpus=2, driver_version='535.261.03')
    calls = tmp_path / 'calls'
    script = write_script(tmp_path, 'echo "$1" >> %s; exec %s "$@"' % (calls, host.smi_path), name='nvidia-smi')
    reader = SmiReader(SmiRunner(script))
    first, second = reader.read(), reader.read()
    assert [gpu['remapped_rows_pending'] for gpu in first.gpus + second.gpus] == [False] * 4
    asked = [line.split('=')[0] + ('+remap' if line.startswith('--query-gpu=') and 'remapped_rows' in line else '')
             for line in calls.read_text().splitlines()]
    # The first read learns what this driver refuses (gpu_recovery_action, and with it remapped_rows.*).
    assert asked == ['--query-gpu+remap', '--query-gpu', '--query-remapped-rows', '--query-compute-apps',
                     '--query-gpu', '--query-remapped-rows', '--query-compute-apps']


def test_apps_lines_that_do_not_read_exactly_are_rejected():
    # A process name with a line break splits its line in two: neither half may pass for a line.
    text = ('4242, python3\n'
            '999, x, 100 MiB, GPU-aaa, 00000000:18:00.0 and more\n'
            '998, x, lots, GPU-aaa, 00000000:18:00.0\n'
            '997, x, 100, not-a-uuid, 00000000:18:00.0\n'
            '996, \x1b]0;owned\x07, 100, GPU-aaa, 00000000:18:00.0\n'
            '995, \x1b[2J, 100\n')
    apps, warnings = parse_apps_csv(text)
    assert [app['pid'] for app in apps] == [996]
    assert len(warnings) == 5 and all('unreadable process line' in warning for warning in warnings)
    assert not any('\x1b' in warning for warning in warnings)


# -- light reads and the driver's branch ---------------------------------------------------------

def counted_reader(host, tmp_path):
    """(reader through the host's view, a function giving the nvidia-smi calls so far)."""
    log = str(tmp_path / 'calls.log')
    reader = HostReader(SmiReader(SmiRunner(host.counting_smi(log))), host.root)
    return reader, lambda: host.smi_calls(log)


def queries(calls):
    return [argv[0].split('=')[0] for argv in calls]


def test_a_light_read_asks_for_memory_and_processes_only(gpuhost, tmp_path):
    reader, calls = counted_reader(gpuhost, tmp_path)
    reader.read()
    before = len(calls())
    job = gpuhost.hold(gpus=[4], mib=2048, util=30)
    snapshot = reader.read(full=False)
    light = calls()[before:]
    assert queries(light) == ['--query-gpu', '--query-compute-apps']
    assert light[0][0] == '--query-gpu=index,uuid,pci.bus_id,memory.used,memory.free,utilization.gpu'
    assert snapshot.full is False
    assert snapshot.gpus[4]['memory_used_mib'] == 2049 and snapshot.gpus[4]['utilization_gpu_pct'] == 30
    assert [process['pid'] for process in snapshot.gpus[4]['processes']] == [job['pid']]
    assert snapshot.gpus[4]['minor_number'] == 4 and snapshot.gpus[4]['memory_total_mib'] == 143771


def test_a_light_read_keeps_the_drivers_word_of_the_full_read(gpuhost, tmp_path):
    gpuhost.fault('reset-required', gpu=2)
    gpuhost.fault('remap', gpu=5, pending=True)
    reader, calls = counted_reader(gpuhost, tmp_path)
    full = reader.read()
    light = reader.read(full=False)
    assert light.full is False and queries(calls()).count('--query-remapped-rows') == 1
    assert light.gpus[2]['reset_required'] is True and 'GPU requires reset' in light.gpus[2]['error']
    assert gpu_state(light.gpus[2]) == 'reset_required'
    assert light.gpus[5]['remapped_rows_pending'] is True
    assert light.gpus == full.gpus


@pytest.mark.parametrize('fault', [
    dict(kind='lost', gpu=3),
    dict(kind='reset-required', gpu=6),  # the driver's word, new since the full read
])
def test_a_light_read_that_finds_something_new_reads_in_full(gpuhost, tmp_path, fault):
    reader, calls = counted_reader(gpuhost, tmp_path)
    reader.read()
    gpuhost.fault(fault.pop('kind'), **fault)
    snapshot = reader.read(full=False)
    assert snapshot.full is True
    assert [gpu['index'] for gpu in snapshot.gpus if gpu['error']] == [fault['gpu']]


def test_the_driver_branch_saves_the_query_the_driver_would_refuse(gpuhost, tmp_path):
    reader, calls = counted_reader(gpuhost, tmp_path)
    snapshot = reader.read()
    # One GPU query (550 does not know gpu_recovery_action, nor remapped rows in it), the rows apart.
    assert queries(calls()) == ['--query-gpu', '--query-remapped-rows', '--query-compute-apps']
    assert 'gpu_recovery_action' not in calls()[0][0] and 'remapped_rows' not in calls()[0][0]
    assert snapshot.driver_version == '550.127.05' and snapshot.gpus[0]['remapped_rows_pending'] is False


@pytest.mark.parametrize('loaded, said, gpu_queries', [
    # The version file says an older branch than nvidia-smi's own driver_version: asked again.
    ('570.86.15', '550.127.05', 3),
    # It says a newer one: the driver refuses the field, and the query is repeated without it.
    ('550.127.05', '570.86.15', 2),
])
def test_a_wrong_driver_branch_falls_back_to_what_the_driver_says(gpuhost_factory, tmp_path, loaded, said, gpu_queries):
    host = gpuhost_factory(driver_version=loaded)
    with open(os.path.join(host.root, 'proc/driver/nvidia/version'), 'w') as handle:
        handle.write('NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Tue Oct  8 03:22:07 UTC 2024\n' % said)
    host.fault('recovery', gpu=1, value='reset')
    reader, calls = counted_reader(host, tmp_path)
    snapshot = reader.read()
    assert queries(calls()).count('--query-gpu') == gpu_queries
    assert ('gpu_recovery_action' in calls()[0][0]) is said.startswith('570')
    knows = loaded.startswith('570')
    assert [gpu['driver_recovery_action'] for gpu in snapshot.gpus] == (
        ['none', 'reset_gpu'] + ['none'] * 6 if knows else [None] * 8)
    assert gpu_state(snapshot.gpus[1]) == ('reset_required' if knows else 'free')


def test_an_nvidia_smi_hung_in_the_driver_is_driver_hung_not_a_timeout(gpuhost):
    """gpusim's fault hang-d: the simulated nvidia-smi hangs, and what /proc would show of a real
    one stuck in the driver (state D, a stack in nvidia_uvm) is under the host's ROOT/proc, where
    the runner is pointed. A real D state cannot be made without a kernel that blocks the task."""
    gpuhost.fault('hang-d', seconds=30)
    runner = SmiRunner(gpuhost.smi_path)
    runner.proc = os.path.join(gpuhost.root, 'proc')
    with pytest.raises(DriverHung) as caught:
        SmiReader(runner).read(timeout=2.0)
    assert str(caught.value).startswith('driver_hung: nvidia-smi --query-gpu=') and 'in D state, in mutex_lock' in str(caught.value)
    assert 'only a reboot frees it' in str(caught.value)
    # Permanent: the release signals nothing after it, and no second read is tried.
    assert isinstance(caught.value, PermanentReadError)


def test_an_nvidia_smi_that_only_sleeps_past_its_deadline_did_not_answer(gpuhost):
    gpuhost.fault('hang', seconds=30)
    runner = SmiRunner(gpuhost.smi_path)
    runner.proc = os.path.join(gpuhost.root, 'proc')
    with pytest.raises(GpuopsError) as caught:
        SmiReader(runner).read(timeout=2.0)
    assert not isinstance(caught.value, DriverHung) and 'did not answer within 2.0 s' in str(caught.value)
