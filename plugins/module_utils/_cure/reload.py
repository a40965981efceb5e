# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""A reload of the NVIDIA driver's kernel modules: the cure of GPUs whose reset the platform
refused (FLR blocked by the hypervisor), short of a reboot (reset_reload_modules, off by default).

Only when every GPU of the host is idle (no process on any, none lost), no module that depends on
nvidia is in use, and no process holds a /dev/nvidia* node: persistence mode off where it is on,
the dependent modules unloaded with ``rmmod`` in dependency order (a module before the modules it
holds), then ``nvidia``; all of them loaded back with ``modprobe`` in reverse order; persistence
mode restored; every GPU checked back (bound to nvidia on the PCI bus, with its minor number).
A module that will not unload stops the reload: what was unloaded is loaded back. Loading back
is given time even past the deadline (LOAD_MIN_S each) and a SIGTERM waits for it. modprobe
and rmmod are the ones beside nvidia-smi when it is given as a path, else those on PATH.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError, printable
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.holders import find_holders
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nodes import expand_devices
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.host import device_patterns, read_host, under_root
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.modules import DRIVER, MODULE_RE, module_holders
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reset import escalation
from ansible_collections.gpuops.nvidia.plugins.module_utils._run import Runner, sigterm_deferred
from ansible_collections.gpuops.nvidia.plugins.module_utils._release.signals import system_log

# A reload is not started with less time left than this: unloading takes a moment, loading nvidia
# on eight GPUs a few seconds.
RELOAD_FLOOR_S = 10.0
# Loading a module back, and restoring persistence mode, is given this long at least, even past
# the deadline: a host is never left without its driver for want of time.
LOAD_MIN_S = 10.0
# Why each GPU is reloaded: its reset the platform refused, or it goes with the driver.
REFUSED = 'reset refused by the platform'
WITH_THE_DRIVER = 'reloaded with the driver'
# Where kmod installs modprobe and rmmod.
SYSTEM_DIRS = ('/usr/sbin', '/sbin')
# Every node of the driver, its GPUs' and MIG instances' included.
NODES = ('/dev/nvidia*', '/dev/nvidia-caps/*')
# The nodes a reload leaves stale (a module loaded again gets a new character device major) and
# modprobe does not make again, with the module they go with and how nvidia-modprobe(1), the
# driver's own tool, makes them: the UVM nodes (-u -c 0), the modeset node (-m); each MIG
# capability node from its procfs file (-f PATH, the file's DeviceFileMinor).
UVM_NODES = ('/dev/nvidia-uvm', '/dev/nvidia-uvm-tools')
MODESET_NODE = '/dev/nvidia-modeset'
CAPS_DIR = '/dev/nvidia-caps'
CAPS_PROC = '/proc/driver/nvidia/capabilities'
# The most capability files read to find a node's (a GPU has at most a few dozen MIG instances).
CAPS_FILES_AT_MOST = 4096
CONTAINERS_NOTE = ('containers started before the reload keep the old device nodes: restart them '
                   '(NVML and CUDA fail in them until then)')


def _program(name, nvidia_smi_path):
    """name beside nvidia_smi_path when that is a path and it is there, else on PATH, else in the
    system directories kmod installs it in (a PATH without them is common outside root's shell)."""
    if os.sep in nvidia_smi_path:
        beside = os.path.join(os.path.dirname(nvidia_smi_path), name)
        if os.path.isfile(beside):
            return beside
    if shutil.which(name) is None:
        for directory in SYSTEM_DIRS:
            if os.path.isfile(os.path.join(directory, name)):
                return os.path.join(directory, name)
    return name


def unload_order(host_root='/'):
    """The modules that hold nvidia, each before the modules it holds, then nvidia itself."""
    names = [holder['name'] for holder in module_holders(host_root)]
    base = under_root('/sys/module', host_root)
    order = []
    while len(order) < len(names):
        ready = [name for name in names if name not in order and set(_holders(base, name)) <= set(order)]
        order.extend(ready or [name for name in reversed(names) if name not in order])
    return order + [DRIVER]


def _holders(base, name):
    try:
        return [holder for holder in os.listdir(os.path.join(base, name, 'holders')) if MODULE_RE.match(holder)]
    except OSError:
        return []


def _busy(gpu):
    """'GPU 5 (pid 4242)': a GPU that keeps the driver from reloading, and why (its error when lost)."""
    why = gpu['error'] if gpu.get('error') else 'pid %s' % ', '.join(str(process.get('pid')) for process in gpu['processes'])
    return 'GPU %s (%s)' % (gpu.get('index'), why)


def _said(stdout, stderr):
    return printable(' '.join((stdout + ' ' + stderr).split())[:300]) or '(no output)'


class ModuleReload:
    """Reloads the driver's modules through runner (an SmiRunner for nvidia-smi), before deadline.

    gpus: the latest read of every GPU of the host; refused: the indexes whose reset the platform
    refused (the reason for the reload). run(indexes) and reasons make it the reset of
    quiesce.quiesced_reset, which stops the NVML clients around it."""

    def __init__(self, runner, gpus, refused, deadline, host_root='/', nvidia_smi_path='nvidia-smi',
                 clock=time.monotonic, log=system_log, proc='/proc'):
        self.runner = runner
        self.gpus = list(gpus)
        self.refused = sorted(refused)
        self.deadline = deadline
        self.host_root = host_root or '/'
        self.nvidia_smi_path = nvidia_smi_path
        self.clock = clock
        self.log = log
        self.proc = proc
        self.reasons = dict((gpu.get('index'), [REFUSED if gpu.get('index') in self.refused else WITH_THE_DRIVER])
                            for gpu in self.gpus if gpu.get('index') is not None)
        self.unloaded, self.loaded, self.problems = [], [], []
        self.nodes_made, self.nodes_missing, self.nodes_gone = [], [], []
        self.persistent = []
        self.restored = None

    # -- when it may run -------------------------------------------------------------------
    def refusal(self):
        """Why the reload may not run now, or None: a GPU not idle, a module in use, no driver."""
        if not os.path.isdir(under_root('/sys/module/' + DRIVER, self.host_root)):
            return 'the nvidia module is not loaded (no /sys/module/nvidia)'
        busy = [_busy(gpu) for gpu in self.gpus if gpu.get('error') or gpu.get('processes')]
        if busy:
            return 'every GPU of the host must be idle, and %s %s not' % (', '.join(busy), 'is' if len(busy) == 1 else 'are')
        used = [holder for holder in module_holders(self.host_root) if holder['refcnt'] != 0]
        if used:
            return 'kernel modules in use: %s' % ', '.join('%s (used by %s)' % (holder['name'], (
                '?' if holder['refcnt'] is None else holder['refcnt'])) for holder in used)
        return None

    def _no_programs(self):
        """Why rmmod or modprobe cannot run, or None: nothing is unloaded that cannot be loaded back."""
        for program in ('rmmod', 'modprobe'):
            try:
                Runner(_program(program, self.nvidia_smi_path)).resolve()
            except GpuopsError as exc:
                return str(exc)
        return None

    def _held(self):
        """Why a process keeps the driver from unloading, or None."""
        try:
            devices = expand_devices(device_patterns(NODES, self.host_root), self.proc)
            holders = find_holders(devices, proc=self.proc)[0] if devices else []
        except GpuopsError as exc:
            return 'the driver\'s device nodes could not be checked: %s' % exc
        if not holders:
            return None
        return 'processes hold the driver\'s device nodes: %s' % ', '.join(
            'pid %d (%s)' % (holder.pid, printable(holder.name)) for holder in holders)

    # -- acting ----------------------------------------------------------------------------
    def _left(self, at_least=0.0):
        return max(self.deadline - self.clock(), at_least)

    def _module(self, program, name, at_least=0.0):
        """None when program (rmmod, modprobe) name worked, else why not."""
        if not MODULE_RE.match(name):
            return '%s: %r is no kernel module name' % (program, name)
        try:
            rc, stdout, stderr = Runner(_program(program, self.nvidia_smi_path)).run([name], timeout=self._left(at_least))
        except GpuopsError as exc:
            return '%s %s: %s' % (program, name, exc)
        return None if rc == 0 else '%s %s failed (exit %d): %s' % (program, name, rc, _said(stdout, stderr))

    def _smi(self, args, at_least=0.0):
        rc, stdout, stderr = self.runner.run(args, timeout=self._left(at_least))
        if rc != 0:
            raise GpuopsError('nvidia-smi %s failed (exit %d): %s' % (' '.join(args), rc, _said(stdout, stderr)))
        return stdout

    def _persistence_off(self):
        """Switch persistence mode off where it is on (the driver is in use while it is)."""
        for line in self._smi(['--query-gpu=index,persistence_mode', '--format=csv,noheader']).splitlines():
            index, dummy, mode = line.partition(',')
            if mode.strip() == 'Enabled' and index.strip().isdigit():
                self.persistent.append(int(index))
        if self.persistent:
            self.restored = False
            self._smi(['-i', ','.join(str(index) for index in self.persistent), '-pm', '0'])

    def _restore_persistence(self):
        if not self.persistent or (DRIVER in self.unloaded and DRIVER not in self.loaded):
            return  # no driver to ask
        try:
            self._smi(['-i', ','.join(str(index) for index in self.persistent), '-pm', '1'], at_least=LOAD_MIN_S)
            self.restored = True
        except GpuopsError as exc:
            self.problems.append('persistence mode of GPU %s not restored: %s' % (
                ', '.join(str(index) for index in self.persistent), exc))

    def _unload(self, order):
        """Unload the modules of order, in order; None when all went, else why it stopped."""
        for name in order:
            why = self._module('rmmod', name)
            if why:
                return why
            self.unloaded.append(name)
        return None

    def _load_back(self):
        """Load back every module unloaded, nvidia first; each given LOAD_MIN_S at least."""
        for name in reversed(self.unloaded):
            why = self._module('modprobe', name, at_least=LOAD_MIN_S)
            if why:
                self.problems.append(why)
            else:
                self.loaded.append(name)

    def _nodes(self):
        """The host paths of the nodes a reload leaves stale, those there now."""
        caps = under_root(CAPS_DIR, self.host_root)
        found = list(UVM_NODES) + [MODESET_NODE] + [
            os.path.join(CAPS_DIR, name) for name in (sorted(os.listdir(caps)) if os.path.isdir(caps) else [])]
        return [node for node in found if os.path.exists(under_root(node, self.host_root))]

    def _caps_files(self, wanted):
        """{minor: host path of its capability procfs file} for the capability nodes wanted (minors)."""
        found = {}
        top = under_root(CAPS_PROC, self.host_root)
        read = 0
        for directory, dummy, names in os.walk(top):
            for name in names:
                read += 1
                if read > CAPS_FILES_AT_MOST:
                    return found
                path = os.path.join(directory, name)
                try:
                    with open(path) as handle:
                        minor = int(handle.read(4096).split('DeviceFileMinor:')[1].split()[0])
                except (IOError, OSError, IndexError, ValueError):
                    continue
                if minor in wanted:
                    found[minor] = CAPS_PROC + path[len(top):]
        return found

    def _make_nodes(self, nodes):
        """Make again, with nvidia-modprobe, the nodes (host paths) that were there before the reload
        whose modules were loaded again; those still missing after it are problems."""
        calls = []
        if any(node in UVM_NODES for node in nodes) and 'nvidia_uvm' in self.loaded:
            calls.append(['-u', '-c', '0'])
        if MODESET_NODE in nodes and 'nvidia_modeset' in self.loaded:
            calls.append(['-m'])
        caps = [node for node in nodes if node.startswith(CAPS_DIR + '/')]
        if caps and DRIVER in self.loaded:
            minors = dict((node, int(node.rsplit('nvidia-cap', 1)[1])) for node in caps if node.rsplit('nvidia-cap', 1)[-1].isdigit())
            files = self._caps_files(set(minors.values()))
            calls.extend(['-f', path] for minor, path in sorted(files.items()))
            # A MIG instance the reload ended has no capability any more: its node is not made again.
            self.nodes_gone = [node for node in caps if minors.get(node) not in files]
        program = _program('nvidia-modprobe', self.nvidia_smi_path)
        for args in calls:
            try:
                rc, stdout, stderr = Runner(program).run(args, timeout=self._left(LOAD_MIN_S))
            except GpuopsError as exc:
                self.problems.append('nvidia-modprobe %s: %s' % (' '.join(args), exc))
                break
            if rc != 0:
                self.problems.append('nvidia-modprobe %s failed (exit %d): %s' % (' '.join(args), rc, _said(stdout, stderr)))
        reloaded = [node for node in nodes if self._goes_with(node) in self.loaded and node not in self.nodes_gone]
        self.nodes_missing = [node for node in reloaded if not os.path.exists(under_root(node, self.host_root))]
        self.nodes_made = [node for node in reloaded if node not in self.nodes_missing] if calls else []
        if self.nodes_missing:
            self.problems.append('device nodes not made again after the reload: %s (nvidia-modprobe -u -c 0, -m, '
                                 '-f /proc/driver/nvidia/capabilities/...)' % ', '.join(self.nodes_missing))

    @staticmethod
    def _goes_with(node):
        """The module whose reload leaves node stale."""
        return 'nvidia_uvm' if node in UVM_NODES else 'nvidia_modeset' if node == MODESET_NODE else DRIVER

    def _not_back(self, before):
        """What a GPU bound to nvidia before the reload lacks after it (bound, same minor)."""
        after = read_host(self.host_root)
        problems = []
        for key, device in sorted((before.pci or {}).items()):
            if device.get('driver') != DRIVER:
                continue
            bound = ((after.pci or {}).get(key) or {}).get('driver')
            minor = after.minor(device['bus_id'])
            if bound != DRIVER:
                problems.append('GPU %s is not bound to nvidia after the reload (%s)' % (device['bus_id'], bound or 'no driver'))
            elif minor != before.minor(device['bus_id']):
                problems.append('GPU %s came back with minor number %s, not %s' % (
                    device['bus_id'], minor, before.minor(device['bus_id'])))
        return problems

    def run(self, indexes):
        """Reload the driver's modules (indexes: the GPUs it is for); the module_reload entry."""
        order = unload_order(self.host_root)
        why = self.refusal() or self._no_programs() or self._held()
        if why is None and self._left() < RELOAD_FLOOR_S:
            why = 'less than %.0f s of the timeout left for it (raise timeout)' % RELOAD_FLOOR_S
        if why:
            return self._entry(indexes, order, None, 'kernel modules not reloaded: %s' % why, attempted=False)
        before = read_host(self.host_root)
        nodes = self._nodes()
        stopped = None
        self.log('gpuops.nvidia: reloading the kernel modules %s (the platform refused the reset of GPU %s)' % (
            ', '.join(order), ', '.join(str(index) for index in self.refused)))
        with sigterm_deferred():  # a SIGTERM waits until the modules are back
            try:
                self._persistence_off()
                stopped = self._unload(order)
            except GpuopsError as exc:
                stopped = str(exc)
            finally:
                self._load_back()
                self._restore_persistence()
                self._make_nodes(nodes)
        return self._outcome(indexes, order, stopped, before)

    def _outcome(self, indexes, order, stopped, before):
        not_back = self._not_back(before) if self.unloaded else []
        self.problems.extend(not_back)
        if stopped:
            message = 'kernel modules not reloaded: %s; %s' % (stopped, 'loaded back: %s' % ', '.join(
                self.loaded) if self.unloaded else 'nothing was unloaded')
        else:
            message = 'kernel modules %s unloaded and loaded again' % ', '.join(order)
        if self.problems:
            message += '; ' + '; '.join(self.problems)
        if self.nodes_made:
            message += '; device nodes made again: %s; %s' % (', '.join(self.nodes_made), CONTAINERS_NOTE)
        if self.nodes_gone:
            message += '; the capability nodes of MIG instances gone with the reload: %s' % ', '.join(self.nodes_gone)
        self.log('gpuops.nvidia: ' + message)
        return self._entry(indexes, order, stopped, message, ok=not stopped and not self.problems)

    def _entry(self, indexes, order, stopped, message, attempted=True, ok=False):
        entry = escalation(sorted(indexes), ok, message, attempted=attempted, persistence_mode_off=self.persistent,
                           persistence_mode_restored=self.restored, reasons=self.reasons, refused=self.refused)
        entry.update(modules=list(order), unloaded=list(self.unloaded), loaded=list(self.loaded),
                     stopped_by=stopped, device_nodes={'made': list(self.nodes_made), 'missing': list(self.nodes_missing),
                                                       'gone': list(self.nodes_gone)})
        return entry


def would_reload(gpus, refused_reason, host_root='/'):
    """The module_reload entry of check mode: what would be unloaded and loaded again."""
    order = unload_order(host_root)
    entry = escalation(sorted(gpu.get('index') for gpu in gpus if gpu.get('index') is not None), None,
                       'check mode: if %s, the kernel modules %s would be unloaded and loaded again' % (
                           refused_reason, ', '.join(order)), attempted=False)
    entry.update(modules=order, unloaded=[], loaded=[], stopped_by=None)
    return entry


def complete_entry(entry, quiesced):
    """entry with every key of a module_reload entry, also when the reload was not started
    (quiesced: the stops' report, when the entry has none)."""
    for key in ('modules', 'unloaded', 'loaded'):
        entry.setdefault(key, [])
    entry.setdefault('stopped_by', None)
    entry.setdefault('quiesced', quiesced)
    if not entry['attempted'] and not entry['message'].startswith(('kernel modules', 'check mode')):
        entry['message'] = 'kernel modules not reloaded: %s' % entry['message']
    return entry
