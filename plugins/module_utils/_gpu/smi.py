# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The nvidia-smi backend: the one place that runs nvidia-smi, and its CSV parser."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    EXIT_CODES,
    UNREPORTED_PROCESS_NAMES,
    DriverHung,
    GpuopsError,
    PermanentReadError,
    printable,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._reason import driver_hung
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import smi_read
from ansible_collections.gpuops.nvidia.plugins.module_utils._pci import PCI_BUS_ID_RE, normalize_bus_id
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.reader import (
    RECOVERY_ACTION_BRANCH,
    GpuReader,
    Snapshot,
    driver_branch,
    driver_error,
    light_base,
    light_gpu,
    parse_recovery_action,
    recovery_verdict,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout, Runner


# nvidia-smi field name -> fact name, in the order they are queried.
GPU_FIELDS = [
    ('index', 'index'),
    ('uuid', 'uuid'),
    ('name', 'name'),
    ('pci.bus_id', 'pci_bus_id'),
    ('memory.total', 'memory_total_mib'),
    ('memory.used', 'memory_used_mib'),
    ('memory.free', 'memory_free_mib'),
    ('utilization.gpu', 'utilization_gpu_pct'),
    ('temperature.gpu', 'temperature_c'),
    ('persistence_mode', 'persistence_mode'),
    ('compute_mode', 'compute_mode'),
    ('driver_version', 'driver_version'),
]
# Memory repair state, queried with the GPU fields. A driver refuses the whole query for a field
# it does not know (`Field "remapped_rows.pending" is not a valid field to query.`, exit 2): the
# 535 and 550 drivers list remapped_rows.* only under --query-remapped-rows (their man pages and
# binaries), 590 drivers also under --query-gpu. A refused field is dropped and the query repeated;
# remapped rows are then read with --query-remapped-rows.
HEALTH_FIELDS = [
    ('remapped_rows.pending', 'remapped_rows_pending'),
    ('remapped_rows.failure', 'remapped_rows_failure'),
    ('retired_pages.pending', 'retired_pages_pending'),
]
# Memory the driver reserves, outside memory.used (drivers that report it apart). A driver that
# does not know the field refuses the query; it is repeated without it, and the value is null.
RESERVED_FIELDS = [('memory.reserved', 'memory_reserved_mib')]
# The driver's GPU Recovery Action (see _reader.DRIVER_RECOVERY_ACTIONS): drivers from 565 on;
# older ones refuse the field, and it is asked for no more. It comes first of the fields a driver
# may refuse: nvidia-smi names the first field it does not know, and a driver that does not know
# this one (before 565) does not know remapped_rows.* in --query-gpu either (590), so both go
# at once and the first read costs no more calls than before.
RECOVERY_FIELDS = [('gpu_recovery_action', 'driver_recovery_action')]
# The fields a driver may refuse; the query is repeated without them.
OPTIONAL_FIELDS = RECOVERY_FIELDS + HEALTH_FIELDS + RESERVED_FIELDS
# A light read (see GpuReader.read): what names each GPU, and what changes while a release waits.
LIGHT_FIELDS = [('index', 'index'), ('uuid', 'uuid'), ('pci.bus_id', 'pci_bus_id'), ('memory.used', 'memory_used_mib'),
                ('memory.free', 'memory_free_mib'), ('utilization.gpu', 'utilization_gpu_pct')]
RESERVED_WARNING = ('nvidia-smi does not know memory.reserved (an older driver): memory_reserved_mib is null, '
                    'and memory used may include the memory the driver reserves, so idle GPUs may look used')
YES_NO_FACTS = frozenset(fact for dummy, fact in HEALTH_FIELDS)
INT_FACTS = frozenset(['index', 'memory_total_mib', 'memory_used_mib', 'memory_free_mib',
                       'utilization_gpu_pct', 'temperature_c', 'memory_reserved_mib'])
APP_FIELDS = ['pid', 'process_name', 'used_memory', 'gpu_uuid', 'gpu_bus_id']

NO_DEVICES = 'No devices were found'
INVALID_FIELD = 'is not a valid field to query'
INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')
REMAPPED_ROWS_FIELDS = [('remapped_rows.pending', 'remapped_rows_pending'),
                        ('remapped_rows.failure', 'remapped_rows_failure')]
# A GPU the driver cannot open. nvidia-smi prints the line in place of the whole answer, so the
# other GPUs are read one by one with -i (nvidia-smi(1): "nvidia-smi -i can now query information
# from healthy GPU when there is a problem with other GPU"). Real spellings: "for GPU0000:65:00.0",
# "for GPU 0000:0B:00.0", "for gpu 0000:08:00.0" (-L), a 3-digit domain "000:BA:80.0".
HANDLE_ERROR_RE = re.compile(r'^Unable to determine the device handle for (?:GPU|gpu)')
# Past this index, probing with -i stops even if nvidia-smi never says "No devices were found".
MAX_GPUS = 64
# Cells that say a value does not apply to this GPU (nvidia-smi(1)): null. Every other bracketed
# cell is the driver's error for the GPU (see _reader.driver_error).
NOT_APPLICABLE = frozenset(['', 'N/A', '[N/A]', 'Not Supported', '[Not Supported]'])
NUMBER_RE = re.compile(r'^(-?[0-9]+(?:\.[0-9]+)?)(?:\s*(?:MiB|%|C|W|MHz))?$')


class SmiParseError(GpuopsError):
    """nvidia-smi printed something that is not the CSV it was asked for."""


def cell_error(raw):
    """The driver's words in a bracketed cell that is not "does not apply" ('GPU requires reset',
    'Unknown Error', 'Insufficient Permissions', ...), or None."""
    raw = raw.strip()
    if raw in NOT_APPLICABLE or not (raw.startswith('[') and raw.endswith(']')):
        return None
    return raw[1:-1].strip() or None


def parse_value(fact, raw):
    """Turn one CSV cell into a fact value; (value, problem) where problem is None or a text.
    A bracketed cell is None (cell_error says whether it is the driver's error)."""
    raw = raw.strip()
    if raw == '' or raw.upper() == 'N/A' or (raw.startswith('[') and raw.endswith(']')):
        return None, None
    if fact == 'driver_recovery_action':
        return parse_recovery_action(raw), None
    if fact in INT_FACTS:
        match = NUMBER_RE.match(raw)
        if not match:
            return None, 'unreadable value %r' % raw
        return int(float(match.group(1))), None
    if fact == 'persistence_mode':
        if raw in ('Enabled', 'Disabled'):
            return raw == 'Enabled', None
        return None, 'unreadable value %r' % raw
    if fact in YES_NO_FACTS:
        if raw in ('Yes', 'No'):
            return raw == 'Yes', None
        if raw.isdigit():
            return int(raw) > 0, None
        return None, 'unreadable value %r' % raw
    if fact == 'pci_bus_id':
        if not PCI_BUS_ID_RE.match(raw):
            return None, 'unreadable value %r' % raw
        return normalize_bus_id(raw), None
    return raw, None


def is_handle_error(line):
    """Whether a line of nvidia-smi output is its "Unable to determine the device handle" error."""
    return bool(HANDLE_ERROR_RE.match(line.strip()))


def parse_gpu_csv(text, fields=None):
    """Parse ``--query-gpu=<fields> --format=csv,noheader,nounits`` output.

    fields: the (nvidia-smi field, fact) pairs queried, GPU_FIELDS first (GPU_FIELDS +
    HEALTH_FIELDS by default); a line of GPU_FIELDS alone is read too. Returns (gpus, warnings); every gpu has every
    fact of GPU_FIELDS + HEALTH_FIELDS and an error. A GPU nvidia-smi cannot read (lost, unknown
    error) is an error line that names its bus id: it becomes a GPU with that pci_bus_id, the
    line as error and index None, since real drivers print it in place of the whole answer and
    its position says nothing (SmiReader places it). Raises SmiParseError when no line is usable.
    """
    fields = fields or GPU_FIELDS + OPTIONAL_FIELDS
    # A line as wide as the fields asked for, or as GPU_FIELDS (+ HEALTH_FIELDS) alone: read by
    # the field list of its width.
    widths = {len(GPU_FIELDS): GPU_FIELDS, len(GPU_FIELDS + HEALTH_FIELDS): GPU_FIELDS + HEALTH_FIELDS}
    widths[len(fields)] = fields
    gpus, warnings = [], []
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        cells = line.split(',')
        if len(cells) in widths and not line.startswith('Unable to'):
            gpu, problems = _gpu_from_cells(widths[len(cells)], cells)
            for problem in problems:
                warnings.append('nvidia-smi, GPU %s: %s' % (gpu['index'], problem))
            gpus.append(gpu)
        elif PCI_BUS_ID_RE.search(line):
            gpus.append(_unreadable_gpu(line.strip()))
        else:
            warnings.append('nvidia-smi printed an unreadable line: %r' % line.strip()[:300])
    if not gpus and lines:
        raise SmiParseError('nvidia-smi printed no GPU data: %s' % _first_line(text))
    return gpus, warnings


def _gpu_from_cells(fields, cells):
    gpu, problems, said = dict((fact, None) for dummy, fact in GPU_FIELDS + OPTIONAL_FIELDS), [], {}
    gpu['error'] = None
    for (field, fact), raw in zip(fields, cells):
        error = cell_error(raw)
        if error:
            said.setdefault(error, []).append(field)
        value, problem = parse_value(fact, raw)
        if problem:
            problems.append('%s: %s' % (field, problem))
        gpu[fact] = value
    driver_error(gpu, said)
    return recovery_verdict(gpu, gpu['driver_recovery_action']), problems


def _unreadable_gpu(line, index=None):
    gpu = dict((fact, None) for dummy, fact in GPU_FIELDS + OPTIONAL_FIELDS)
    match = PCI_BUS_ID_RE.search(line)
    gpu.update(index=index, pci_bus_id=normalize_bus_id(match.group(1)) if match else None, error=line)
    return gpu


# The fixed cells of a process line: a line whose cells do not read exactly so is rejected (a
# process name is printed raw and may hold line breaks that forge lines).
APP_UUID_RE = re.compile(r'^(?:(?:GPU|MIG)-[0-9A-Za-z-]+|\[N/A\])$')
APP_USED_RE = re.compile(r'^(?:[0-9]+(?: MiB)?|\[[A-Za-z /]+\])$')


def parse_apps_csv(text):
    """Parse ``--query-compute-apps=<APP_FIELDS> --format=csv,noheader,nounits`` output.

    process_name is printed unquoted and may itself contain commas, so the fixed fields
    are taken from both ends of the line, and each must read exactly as nvidia-smi prints it.
    Returns (apps, warnings).
    """
    apps, warnings = [], []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith('No running') or is_handle_error(line):
            # A GPU that cannot be read is reported with the GPU list.
            continue
        app = _app_from_line(line)
        if app is None:
            warnings.append('nvidia-smi printed an unreadable process line: %r' % printable(line.strip(), 300))
            continue
        apps.append(app)
    return apps, warnings


def _app_from_line(line):
    cells = [cell.strip() for cell in line.split(',')]
    if len(cells) < len(APP_FIELDS) or not cells[0].isdigit() or not APP_USED_RE.match(cells[-3]) \
            or not APP_UUID_RE.match(cells[-2]) or not (PCI_BUS_ID_RE.fullmatch(cells[-1]) or cells[-1] == '[N/A]'):
        return None
    used, dummy = parse_value('memory_used_mib', cells[-3])
    bus_id, dummy = parse_value('pci_bus_id', cells[-1])
    name = ','.join(line.split(',')[1:-3]).strip()
    return {
        'pid': int(cells[0]),
        'name': None if name in UNREPORTED_PROCESS_NAMES else name,
        'used_memory_mib': used,
        'gpu_uuid': None if cells[-2] == '[N/A]' else cells[-2],
        'gpu_bus_id': bus_id,
    }


def _first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return '(no output)'


def describe_failure(rc, stdout, stderr):
    """An operator-readable sentence for a failed nvidia-smi call."""
    meaning = EXIT_CODES.get(rc, 'unexpected exit code')
    said = _first_line(stderr) if stderr.strip() else _first_line(stdout)
    return 'nvidia-smi exited with %d (%s): %s' % (rc, meaning, said)


class SmiRunner(Runner):
    """Runs nvidia-smi with a hard deadline: the collection's single caller of nvidia-smi.

    The shared Runner does the running (its own session, the process group and every
    descendant killed on a timeout, exec failures in words); nvidia-smi adds its name, the hint
    to give, and the exit codes that no second try can cure (no driver, no library, a
    driver/library mismatch), which raise PermanentReadError at once.
    """

    # nvidia-smi exit codes that no retry cures (meanings in EXIT_CODES).
    PERMANENT_EXIT_CODES = (9, 12, 18)
    HINT = 'install the NVIDIA driver utilities or set nvidia_smi_path'
    TIMEOUT_NOTE = '; the driver may be stuck on a sick GPU'

    def __init__(self, path='nvidia-smi', timeout=10.0):
        super(SmiRunner, self).__init__(path, timeout, name='nvidia-smi', hint=self.HINT)

    def run(self, args, timeout=None):
        """Run nvidia-smi with args; return (rc, stdout, stderr).

        Raise PermanentReadError when it cannot run or exits with a permanent code,
        CommandTimeout (a GpuopsError) when it does not exit within timeout seconds, and
        DriverHung when it hung in the driver then (CommandTimeout.in_driver): a reboot's case,
        not a slow answer's.
        """
        try:
            rc, stdout, stderr = super(SmiRunner, self).run(args, timeout)
        except CommandTimeout as exc:
            if not exc.in_driver:
                raise
            raise DriverHung(driver_hung(' '.join(['nvidia-smi'] + list(args)), exc.how_stuck()))
        if rc in self.PERMANENT_EXIT_CODES:
            raise PermanentReadError(describe_failure(rc, stdout, stderr))
        return rc, stdout, stderr


class SmiReader(GpuReader):
    """Reads GPU state by running nvidia-smi's CSV queries."""

    backend = 'nvidia-smi'

    def __init__(self, runner):
        self.runner = runner
        # The health fields this driver refuses, learnt on the first read: later reads (the
        # release polls) ask only for what it knows.
        self._known_fields = None
        # Whether the first query left out the fields that driver_hint's branch does not know.
        self._guessed = False
        # The last full read, for light reads to build on: {index: GPU}, and its driver version.
        self._base = None
        self._base_driver = None

    def read(self, timeout=None, full=True):
        if not full and self._base is not None:
            snapshot = self._read_light(timeout)
            if snapshot is not None:
                return snapshot
        snapshot = self._read_full(timeout)
        self._base = light_base(snapshot) or None
        self._base_driver = snapshot.driver_version
        return snapshot

    def _read_light(self, timeout):
        """The GPUs' memory, utilisation and processes on top of the last full read; None when
        nvidia-smi's answer is anything but a plain reading of the same GPUs."""
        base, driver = self._base, self._base_driver
        rc, stdout, stderr = self._query_gpus(LIGHT_FIELDS, timeout)
        if rc != 0 or NO_DEVICES in stdout + stderr:
            return None
        try:
            rows, warnings = parse_gpu_csv(stdout, LIGHT_FIELDS)
        except SmiParseError:
            return None
        gpus = [light_gpu(base, row['index'], row['uuid'], row, row['error']) for row in rows]
        if warnings or len(gpus) != len(base) or None in gpus:
            return None
        apps, app_warnings = self._read_apps([gpu['index'] for gpu in gpus], timeout)
        _attach_processes(gpus, apps)
        return Snapshot(gpus, driver, app_warnings, full=False)

    def _read_full(self, timeout):
        fields, rejected, (rc, stdout, stderr) = self._query_gpus_known_fields(timeout)
        if NO_DEVICES in stdout or NO_DEVICES in stderr:
            return Snapshot([], None, ['nvidia-smi: %s' % NO_DEVICES])
        try:
            gpus, warnings = parse_gpu_csv(stdout, fields)
        except SmiParseError:
            if rc != 0:
                raise GpuopsError(describe_failure(rc, stdout, stderr))
            raise
        if not gpus:
            if rc != 0:
                raise GpuopsError(describe_failure(rc, stdout, stderr))
            raise SmiParseError('nvidia-smi printed nothing for --query-gpu')
        if self._guess_was_wrong(gpus):
            return self._read_full(timeout)
        # A GPU that nvidia-smi could not place (its error line, or a row without an index)
        # may stand in for the whole answer: the GPUs are then read one by one.
        if rc != 0 or any(gpu['error'] and gpu['index'] is None for gpu in gpus):
            gpus, warnings = self._read_one_by_one(gpus, fields, rc, stdout, stderr, timeout)
        indexes = [gpu['index'] for gpu in gpus if _answered(gpu) and gpu['index'] is not None]
        warnings += self._read_remapped_rows(gpus, fields, rejected, indexes, timeout)
        if RESERVED_FIELDS[0] not in fields:
            warnings.append(RESERVED_WARNING)
        apps, app_warnings = self._read_apps(indexes, timeout)
        _attach_processes(gpus, apps)
        driver = next((gpu.pop('driver_version') for gpu in gpus if gpu.get('driver_version')), None)
        for gpu in gpus:
            gpu.pop('driver_version', None)
        return Snapshot(gpus, driver, warnings + app_warnings)

    def _query_gpus(self, fields, timeout, index=None):
        where = [] if index is None else ['-i', str(index)]
        return self.runner.run(where + ['--query-gpu=' + ','.join(field for field, dummy in fields),
                                        '--format=csv,noheader,nounits'], timeout=timeout)

    def _first_fields(self):
        """(fields, rejected) to ask the driver for first: every field, but those that its branch
        (driver_hint) is known not to have, which saves the query that it would refuse."""
        branch = driver_branch(self.driver_hint)
        if branch is None or branch >= RECOVERY_ACTION_BRANCH:
            return GPU_FIELDS + OPTIONAL_FIELDS, []
        self._guessed = True
        unknown = RECOVERY_FIELDS + REMAPPED_ROWS_FIELDS
        why = 'not asked of --query-gpu on driver %s, older than %d' % (self.driver_hint, RECOVERY_ACTION_BRANCH)
        return ([pair for pair in GPU_FIELDS + OPTIONAL_FIELDS if pair not in unknown],
                [(field, why) for field, dummy in unknown])

    def _guess_was_wrong(self, gpus):
        """True when the first query left fields out for a driver branch that nvidia-smi's own
        driver_version contradicts: the fields are asked for again, from the start."""
        if not self._guessed:
            return False
        self._guessed = False
        reported = next((driver_branch(gpu.get('driver_version')) for gpu in gpus if gpu.get('driver_version')), None)
        if reported is None or reported < RECOVERY_ACTION_BRANCH:
            return False
        self.driver_hint = None
        self._known_fields = None
        return True

    def _query_gpus_known_fields(self, timeout):
        """(fields, rejected, (rc, stdout, stderr)): the GPU query without the health fields this
        driver refuses; rejected: [(field, nvidia-smi's words)]."""
        fields, rejected = self._known_fields or self._first_fields()
        while True:
            rc, stdout, stderr = self._query_gpus(fields, timeout)
            said = stdout + stderr
            if rc != 2 or INVALID_FIELD not in said:
                if rc == 0:
                    self._known_fields = (fields, rejected)
                return fields, rejected, (rc, stdout, stderr)
            match = INVALID_FIELD_RE.search(said)
            optional = [pair for pair in fields if pair in OPTIONAL_FIELDS]
            name = match.group(1) if match else None
            # The remapped_rows.* fields come and go together (see HEALTH_FIELDS), and with the
            # recovery action (see RECOVERY_FIELDS).
            family = REMAPPED_ROWS_FIELDS if name in dict(REMAPPED_ROWS_FIELDS) else [(name, None)]
            if name in dict(RECOVERY_FIELDS):
                family = RECOVERY_FIELDS + REMAPPED_ROWS_FIELDS
            refused = [pair for pair in optional if pair[0] in dict(family)] or optional
            if not optional:
                return fields, rejected, (rc, stdout, stderr)
            rejected = rejected + [(field, _first_line(said)) for field, dummy in refused]
            fields = [pair for pair in fields if pair not in refused]

    def _read_one_by_one(self, first, fields, rc, stdout, stderr, timeout):
        """The GPUs, read with -i 0, -i 1, ... until nvidia-smi says there is no such GPU.

        A lost GPU makes the full query print only its error line; each healthy GPU still
        answers to -i with its own index, and the lost one answers with its error line, which
        places it. Errors of the full query that no -i answered for are kept with index None.
        """
        gpus, warnings = [], []
        for index in range(MAX_GPUS):
            try:
                answer = self._query_gpus(fields, timeout, index)
            except GpuopsError as exc:
                # A GPU that hangs nvidia-smi must not hide the ones after it.
                gpus.append(_unreadable_gpu(str(exc), index))
                continue
            if NO_DEVICES in answer[1] + answer[2]:
                break
            try:
                rows, row_warnings = parse_gpu_csv(answer[1], fields)
            except SmiParseError:
                # No GPU of that index (6: "a query to find an object was unsuccessful", 2: an
                # invalid -i), or nvidia-smi cannot go on: either way, the probing ends.
                if answer[0] not in (2, 6):
                    warnings.append('nvidia-smi -i %d: %s' % (index, describe_failure(*answer)))
                break
            gpus.extend(_placed(rows, index, gpus))
            warnings.extend(row_warnings)
        found = set(gpu['pci_bus_id'] for gpu in gpus if gpu['pci_bus_id'])
        indexes = set(gpu['index'] for gpu in gpus)
        for gpu in first:
            if gpu['pci_bus_id'] not in found and (gpu['error'] or gpu['index'] not in indexes):
                gpus.append(gpu)
        lost = [gpu for gpu in gpus if gpu['error']]
        said = '; '.join(gpu['error'] for gpu in lost) or describe_failure(rc, stdout, stderr)
        warnings.insert(0, 'nvidia-smi could not read every GPU (%s); the others were read one by one '
                           'with -i' % said[:500])
        gpus.sort(key=lambda gpu: (gpu['index'] is None, gpu['index'] or 0, gpu['pci_bus_id'] or ''))
        return gpus, warnings

    def _run_each(self, args, indexes, timeout):
        """(rc, stdout, stderr) of nvidia-smi args; when a GPU's error line stands in for the
        answer, the answers of each readable GPU (-i) joined instead."""
        rc, stdout, stderr = self.runner.run(args, timeout=timeout)
        if not any(is_handle_error(line) for line in stdout.splitlines()):
            return rc, stdout, stderr
        outputs, worst = [], 0
        for index in indexes:
            answer = self.runner.run(['-i', str(index)] + args, timeout=timeout)
            outputs.append(answer[1])
            worst = worst or answer[0]
        return worst, ''.join(outputs), ''

    def _read_remapped_rows(self, gpus, fields, rejected, indexes, timeout):
        """Fill in the health facts --query-gpu refused; [warning] for those that stay null."""
        missing = dict((field, said) for field, said in rejected if field in dict(HEALTH_FIELDS))
        wanted = [pair for pair in REMAPPED_ROWS_FIELDS if pair[0] in missing]
        if wanted:
            args = ['--query-remapped-rows=gpu_bus_id,' + ','.join(field for field, dummy in wanted),
                    '--format=csv,noheader,nounits']
            rc, stdout, stderr = self._run_each(args, indexes, timeout)
            by_bus = dict((gpu['pci_bus_id'], gpu) for gpu in gpus if _answered(gpu) and gpu['pci_bus_id'])
            read = set()
            for line in stdout.splitlines():
                cells = [cell.strip() for cell in line.split(',')]
                gpu = by_bus.get(parse_value('pci_bus_id', cells[0])[0]) if len(cells) == len(wanted) + 1 else None
                if gpu is None:
                    continue
                for (field, fact), raw in zip(wanted, cells[1:]):
                    gpu[fact] = parse_value(fact, raw)[0]
                read.add(gpu['pci_bus_id'])
            if read == set(by_bus):
                for field, dummy in wanted:
                    missing.pop(field)
            else:
                reason = describe_failure(rc, stdout, stderr) if rc else 'it printed no line for some GPUs'
                for field, dummy in wanted:
                    missing[field] = '--query-remapped-rows: %s' % reason
        if not missing:
            return []
        facts = ', '.join(fact for field, fact in HEALTH_FIELDS if field in missing)
        reasons = sorted(set(missing.values()))
        return ['nvidia-smi cannot report %s on this driver (%s); %s null' % (
            facts, '; '.join(reasons)[:500], 'it is' if len(missing) == 1 else 'they are')]

    def read_mig(self, gpus, timeout=None):
        try:
            return smi_read(lambda args, limit: self.runner.run(args, timeout=limit), gpus, timeout)
        except GpuopsError as exc:
            return {}, ['MIG devices unavailable: %s' % exc]

    def _read_apps(self, indexes, timeout):
        rc, stdout, stderr = self._run_each(
            ['--query-compute-apps=' + ','.join(APP_FIELDS), '--format=csv,noheader,nounits'], indexes, timeout)
        apps, warnings = parse_apps_csv(stdout)
        if rc != 0 and not apps:
            warnings.append('process list unavailable: ' + describe_failure(rc, stdout, stderr))
        return apps, warnings


def _answered(gpu):
    """Whether nvidia-smi answered for the GPU (with values, some of them perhaps the driver's
    verdict), rather than printing its error line in place of an answer."""
    return gpu['error'] is None or gpu['error'].startswith('the driver')


def _placed(rows, index, seen):
    """The rows of nvidia-smi's answer to -i index that are new: each bus id is listed once.

    The GPU of that index is the row that answers for it (its own index, or the one row left
    without a readable index); the error line of a GPU already listed, which a driver may print
    again for every -i, is left out, and so is a row whose bus id is listed already."""
    known = set(gpu['pci_bus_id'] for gpu in seen if gpu['pci_bus_id'])
    fresh = [row for row in rows if row['pci_bus_id'] is None or row['pci_bus_id'] not in known]
    own = [row for row in fresh if row['index'] == index] or [row for row in fresh if row['index'] is None][:1]
    kept, buses = [], set()
    for row in fresh:
        if row['pci_bus_id'] in buses or (row['index'] is None and row not in own):
            continue
        if row in own:
            row['index'] = index
        buses.add(row['pci_bus_id'])
        kept.append(row)
    return kept


def _attach_processes(gpus, apps):
    by_uuid = dict((gpu['uuid'], gpu) for gpu in gpus if gpu.get('uuid'))
    by_bus = dict((gpu['pci_bus_id'], gpu) for gpu in gpus if gpu.get('pci_bus_id'))
    for gpu in gpus:
        gpu['processes'] = []
    for app in apps:
        gpu = by_uuid.get(app['gpu_uuid']) or by_bus.get(app['gpu_bus_id'])
        if gpu is not None:
            gpu['processes'].append(
                {'pid': app['pid'], 'name': app['name'], 'used_memory_mib': app['used_memory_mib']})
