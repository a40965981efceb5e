# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The gpu_reset settings, the one spec: the options of the action gpuops.nvidia.gpu_reset
(the per-host sequence), then those of its finishing steps (drain, metrics, report: _finish.py).

Each option is declared here once: its type, elements, choices, default, bounds and description
(Ansible's documentation markup, written for the action: O(name) is another option of this spec,
RV(name) a value the action returns). An option the sequence passes on to a module as it is
(passed()) is not restated: its type, elements, choices and default are the module's own argument
spec's, its description the module's documentation's; only what differs (a default of its own)
and what the sequence adds (more) are said here.

scripts/gen_settings.py writes from it the role's variables (roles/gpu_reset/meta/argument_specs.yml
and defaults/main.yml: these names with the prefix gpu_reset_, and the table of the role's README),
the action's options (plugins/modules/gpu_reset.py) and the Slurm hooks' settings that are options
of the spec (HOOK_SETTINGS); a unit test fails when one of them is stale. The settings are checked
against it (_settings.py); the hook's settings start from its defaults."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import (
    MIN_TIMEOUT_S, holders_argument_spec, reader_argument_spec)
from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.escalation import reset_argument_spec
from ansible_collections.gpuops.nvidia.plugins.module_utils._state.history import (
    HOLD_AFTER_CURES, HOLD_WINDOW_DAYS, MAX_BUDGET, MAX_HOLD_AFTER_CURES, MAX_HOLD_WINDOW_DAYS, REBOOT_BUDGET, RESET_BUDGET)
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import DEFAULT_SIGNALS, MAX_MEMORY_THRESHOLD_MIB
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.performance import MAX_SLOW_FRACTION, probe_module_argument_spec
from ansible_collections.gpuops.nvidia.plugins.module_utils._probe.probe import MIN_PROBE_MIB

PREFIX = 'gpu_reset_'

# What passed() takes from a module's argument spec.
DECLARED = ('type', 'elements', 'choices', 'default')

_HOLDERS = holders_argument_spec()
_READER = reader_argument_spec()
_PROBE = probe_module_argument_spec()
_RESET = reset_argument_spec()


def passed(module_spec, module, name, more=None, **own):
    """An option the sequence passes on to module's option name as it is: the type, elements,
    choices and default of module_spec (that module's argument spec, or the shared part of it
    that declares name), the description of the module's documentation. own: what differs here
    (a default of its own, bounds); more: lines the generated description adds to the module's."""
    option = dict((key, value) for key, value in module_spec[name].items() if key in DECLARED)
    option.update(own)
    option['module'] = (module, name)
    if more:
        option['more'] = more
    return option


SEQUENCE_SPEC = dict(
    devices=passed(_HOLDERS, 'nvidia_device_release', 'devices'),
    gpus=dict(type='list', elements='raw', default=None, description=[
        'Put only these GPUs back (indexes as nvidia-smi numbers them), for example the GPUs of one Slurm job '
        'on a shared node. Only the processes that hold these GPUs are stopped, and only these GPUs are checked, '
        'reset and probed. Not set, every GPU of the host.',
        "Slurm's C(SLURM_JOB_GPUS) are not indexes but places in the node's C(gres.conf); the collection's "
        "Slurm hook maps each through its C(File=) device node's minor number to the GPU of that minor, and "
        'passes these indexes (for a MIG GRES, its instances).',
        'A MIG instance is named V(N:G) (GPU N, its GPU instance G), V(N:G:C) (and compute instance C) or by '
        "its MIG UUID; only its own processes are stopped (those holding its caps node, never a sibling "
        "instance's) and it is judged by its own memory, never reset "
        '(see O(gpuops.nvidia.nvidia_device_release#module:gpus)). A whole GPU with MIG on means every '
        'instance of it.',
    ]),
    backend=passed(_READER, 'nvidia_device_release', 'backend'),
    nvidia_smi_path=passed(_READER, 'nvidia_device_release', 'nvidia_smi_path', more=[
        'Also the nvidia-smi that switches persistence mode and resets the GPUs (O(allow_gpu_reset)).',
    ]),
    host_root=passed(_READER, 'nvidia_device_release', 'host_root'),
    expected_gpus=passed(_READER, 'nvidia_device_release', 'expected_gpus'),
    signals=dict(type='list', elements='str', default=list(DEFAULT_SIGNALS), description=[
        'Signals sent in turn to each holder, with O(grace_period) seconds between them '
        '(O(gpuops.nvidia.nvidia_device_release#module:signals)).',
    ]),
    grace_period=dict(type='float', default=5, bounds=dict(minimum=0), description=[
        'Seconds to wait after each signal for the holders to exit.',
    ]),
    timeout=dict(type='float', default=60, bounds=dict(minimum=MIN_TIMEOUT_S), description=[
        'Seconds the release may take, waiting for the memory to be freed and its GPU reset '
        '(O(allow_gpu_reset)) included. Also the limit for each read of the GPUs.',
    ]),
    memory_threshold_mib=passed(_PROBE, 'nvidia_gpu_probe', 'memory_threshold_mib',
                                bounds=dict(minimum=0, maximum=MAX_MEMORY_THRESHOLD_MIB)),
    extra_protect=passed(_HOLDERS, 'nvidia_device_release', 'extra_protect'),
    lock_file=dict(type='path', default=None, description=[
        'The file two releases on one host take turns on '
        '(O(gpuops.nvidia.nvidia_device_release#module:lock_file)). Not set, the module\'s default, '
        'C(/run/gpuops/nvidia-release.lock) for root.',
    ]),
    clean_query=dict(type='str', default=None, description=[
        'A JMESPath expression that decides whether a host is clean. It is evaluated on the controller, with '
        'the filter P(gpuops.nvidia.json_query#filter), over the facts of M(gpuops.nvidia.nvidia_gpu_facts) '
        '(C(nvidia_gpus), C(nvidia_device_holders), C(nvidia_driver_version), ...) narrowed to O(gpus), and '
        'must give a boolean.',
        'Not set, clean means that every GPU in scope can be read and uses at most O(memory_threshold_mib) '
        'MiB, and that no process that is not protected holds a device node. That is the release module\'s own '
        'test, so the release reads the GPUs first itself, signals nothing on a clean host, and its verdict on '
        'what it reads at its end needs no other module call; the GPUs are read again only when it is not clean.',
        'A query of your own is evaluated on the GPUs read before the release (one more module call per host), '
        'so that it also decides whether anything is released, and on the state the release returns at its end '
        '(O(gpuops.nvidia.nvidia_device_release#module:facts_after)), and must hold there. When it does not '
        'yet, the GPUs are read again, up to four times. Use it to also require, for example, no pending row '
        'remapping (C(health.remapped_rows_pending)) or no Xid error (C(health.xid_events)).',
    ]),
    allow_gpu_reset=dict(type='bool', default=False, description=[
        'Reset the GPUs that need a reset with C(nvidia-smi --gpu-reset -i N) after the release, then check '
        'them again. A GPU needs one when its memory stays held with no process left (orphaned memory), or '
        "when its health calls for a reset - the driver's word (C([GPU requires reset]), a recovery action of "
        "reset), pending remapped rows or retired pages, an Xid since its last cure whose action in NVIDIA's "
        'Xid catalogue is a GPU reset (95, 119, 120 and others). The report\'s C(escalation.reasons) says why '
        'each GPU was reset.',
        'The release, passed this value as O(gpuops.nvidia.nvidia_device_release#module:reset_orphaned), names '
        'those GPUs; then, on that host only, M(gpuops.nvidia.nvidia_device_reset) reads them again and resets '
        'the ones that still need it, within what is left of O(timeout).',
        'Persistence mode is switched off on those GPUs first and switched back on afterwards, also when the '
        'reset fails. On NVSwitch systems the reset then waits until each reset GPU has registered with the '
        'NVLink fabric again (C(escalation.fabric)); one that does not is not clean.',
        'Not attempted while a process that is not protected still holds the GPUs. The reset is refused while '
        "any process (a protected daemon too) has the GPU open; the refusal, in nvidia-smi's words, is the "
        "report's C(escalation.output).",
    ]),
    reload_modules=passed(_RESET, 'nvidia_device_reset', 'reset_reload_modules', more=[
        'Only with O(allow_gpu_reset), for the GPUs whose reset the platform refused.',
    ]),
    hold_after_cures=dict(type='int', default=HOLD_AFTER_CURES, bounds=dict(minimum=1, maximum=MAX_HOLD_AFTER_CURES),
                          description=[
        'A GPU whose fault comes back after this many cures tried (GPU resets that worked, reboots the Slurm '
        'hook asked for) within O(hold_window_days), as its history on the host (C(/var/lib/gpuops)) says, is '
        'not reset or rebooted again - the host fails, naming the GPU, the fault and the cures tried, and the '
        'Slurm hook drains the node for a person with a C(gpu_reset(hold)) reason the health check never '
        'resumes (O(gpuops.nvidia.nvidia_device_release#module:hold_after_cures)).',
        'Once held, a GPU stays held until its history is cleared '
        '(R(the Slurm guide, ansible_collections.gpuops.nvidia.docsite.guide_slurm)).',
    ]),
    hold_window_days=dict(type='float', default=HOLD_WINDOW_DAYS, bounds=dict(above=0, maximum=MAX_HOLD_WINDOW_DAYS),
                          description=[
        'The window, in days, in which O(hold_after_cures) cures and the budgets O(reset_budget) and '
        'O(reboot_budget) are counted.',
    ]),
    reset_budget=dict(type='int', default=RESET_BUDGET, bounds=dict(minimum=1, maximum=MAX_BUDGET), description=[
        'The GPU resets a GPU may be given within O(hold_window_days), those that worked and those that failed '
        '(O(gpuops.nvidia.nvidia_device_release#module:reset_budget)). A GPU that needs a reset once its budget '
        'is spent is not reset again - the host fails naming the GPU, the resets and the budget, and the Slurm '
        'hook drains the node for a person (C(gpu_reset(hold))), as for O(hold_after_cures).',
    ]),
    reboot_budget=dict(type='int', default=REBOOT_BUDGET, bounds=dict(minimum=1, maximum=MAX_BUDGET), description=[
        'The reboots the Slurm hook may ask for per node within O(hold_window_days) (with its reboot setting, '
        'R(the Slurm guide, ansible_collections.gpuops.nvidia.docsite.guide_slurm)), for a GPU or for a hung '
        'driver. Past it the node is drained for a person (C(gpu_reset(hold))) instead, the reboots in the reason.',
    ]),
    stop_units=passed(_RESET, 'nvidia_device_reset', 'reset_stop_units', more=[
        'Only with O(allow_gpu_reset), for the GPUs it resets.',
    ]),
    kernel_log=dict(type='path', default=None, description=[
        "Where to read the kernel's Xid messages from for the GPUs' health (a GPU whose health calls for a "
        'reset, a reboot or a person is not clean) and the reasons to reset, instead of C(journalctl -k) '
        "(journald's kernel transport), then C(dmesg --facility=kern). It names C(/dev/kmsg), or a root-owned "
        'file of its records (O(gpuops.nvidia.nvidia_device_release#module:kernel_log)).',
        'A syslog file such as C(/var/log/kern.log) is refused, as any local user can write a line there that '
        "reads exactly as the kernel's.",
    ]),
    bug_report_dir=passed(_RESET, 'nvidia_device_reset', 'bug_report_dir', more=[
        'The Slurm hook also collects a report there before each reboot it asks for, outside the Prolog\'s time '
        '(not set, in C(/var/lib/gpuops/bug-reports)), and names it in the reboot\'s reason.',
    ]),
    bug_report_timeout=passed(_RESET, 'nvidia_device_reset', 'bug_report_timeout', more=[
        "It also bounds the Slurm hook's report before a reboot.",
    ]),
    assert_clean=dict(type='bool', default=True, description=[
        'Fail a host that is not clean, with a message that names each dirty GPU and why. The host is drained, '
        'and its metrics and report written, before it fails.',
        'V(false) leaves the judgment to the caller, who finds the outcome and the reason in the report (the '
        "role's C(gpu_reset_result)).",
        'Wrong settings fail the task either way, with the report (C(outcome=failed)) and a message naming each '
        'wrong setting, since nothing was read and there is nothing to judge.',
    ]),
    probe=dict(type='bool', default=True, description=[
        'Prove the GPUs judged clean by allocation; a GPU whose probe fails makes the host failed, the CUDA '
        'error in the reason. The release proves the GPUs it released in its own module call '
        '(O(gpuops.nvidia.nvidia_device_release#module:probe)), so the usual path stays one module call; only '
        'when the GPUs are judged clean by another read (a clean query of your own) is '
        'M(gpuops.nvidia.nvidia_gpu_probe) called, one more module call.',
        'V(false) turns the probe off.',
    ]),
    probe_mib=passed(_PROBE, 'nvidia_gpu_probe', 'probe_mib', bounds=dict(minimum=MIN_PROBE_MIB)),
    probe_level=passed(_PROBE, 'nvidia_gpu_probe', 'probe_level', more=[
        'V(performance) runs the probe module after the release, in a module call of its own (the other levels run '
        'in the release\'s call).',
    ]),
    probe_slow_fraction=passed(_PROBE, 'nvidia_gpu_probe', 'slow_fraction',
                               bounds=dict(above=0, maximum=MAX_SLOW_FRACTION)),
    # The probe module's default is fail; a host without the driver's CUDA library is noted here.
    slow_gpu_policy=dict(type='str', choices=['report', 'hold'], default='report', description=[
        'What a GPU that O(probe_level=performance) calls slow (its link below its maximum under load, its '
        "replays growing, a bandwidth more than O(probe_slow_fraction) below its peers') leads to.",
        'V(report) - a warning, the gauges and the GPU\'s history; the host stays clean.',
        'V(hold) - a GPU whose link is the fault is reset once where O(allow_gpu_reset) allows it (a reset '
        'retrains the link) and every GPU probed again; a GPU still slow, or slow for another reason, fails the '
        'host, held for a person with its figures in the reason (the report\'s C(held); the Slurm hook drains '
        'the node with a C(gpu_reset(hold)) reason the health check never resumes).',
    ]),
    probe_missing_library=passed(_PROBE, 'nvidia_gpu_probe', 'missing_library', default='skip', description=[
        'What the probe does on a host without C(libcuda.so.1) '
        '(O(gpuops.nvidia.nvidia_gpu_probe#module:missing_library)) - V(skip) notes it in the report, V(fail) '
        'fails the host.',
    ]),
    probe_cuda_library=passed(_PROBE, 'nvidia_gpu_probe', 'cuda_library'),
    job=dict(type='dict', default=None, description=[
        'The Slurm job the run is for, as O(gpuops.nvidia.nvidia_device_release#module:job) takes it (V(id), '
        'V(uid), V(shared_gpus), V(live_jobs), V(scontrol)); the Slurm hooks set it.',
        "Another live job's processes are never signalled; on a shared GPU only the job's own are, the GPU is "
        'judged for the job alone while another job uses it, and it is not probed.',
    ]),
)

# The default drain command, as the role templates it (the hook builds the same argv itself).
DRAIN_COMMAND = [
    'scontrol', 'update', 'nodename={{ inventory_hostname_short }}', 'state=drain',
    'reason={{ gpu_reset_result.reason | default(none) | gpuops.nvidia.gpu_reset_drain_reason }}',
]

FINISH_SPEC = dict(
    on_failure=dict(type='str', choices=['fail', 'drain'], default='fail', description=[
        'What to do with a host that cannot be made clean. V(fail) fails the host; V(drain) runs '
        'O(drain_command) on the host first, then fails it. A host whose settings are wrong is not drained '
        '(nothing was read there).',
    ]),
    drain_command=dict(type='list', elements='str', default=DRAIN_COMMAND, description=[
        'The command run on a host that cannot be made clean when O(on_failure=drain), as a list of arguments. '
        'It runs over the connection, with the task\'s become and without Python on the host (as '
        'M(ansible.builtin.raw) runs a command), so a host whose Python cannot run the modules is drained too; '
        'every argument is quoted for the shell, so the reason text cannot inject anything.',
        'Given as the variable C(gpu_reset_drain_command), it is templated when it runs, with the report as '
        'C(gpu_reset_result) (C(gpu_reset_result.reason) says why the host is not clean).',
        'The default drains the Slurm node named after C(inventory_hostname_short), with the reason made by '
        'the filter P(gpuops.nvidia.gpu_reset_drain_reason#filter), control characters escaped and cut at 200 '
        'characters (the reason is made of text users choose, such as process names, and C(sinfo -R) prints '
        "it on operators' terminals).",
    ]),
    drain_timeout=dict(type='int', default=60, description=[
        'Seconds the drain command may run; one still running then is stopped (coreutils C(timeout) on the '
        'host), and the reason says that the drain failed.',
    ]),
    # The rule of its values is _brake.max_drained_problem, the one check of the action, the Slurm
    # hook and the role slurm_hooks (the filter gpu_reset_brake_problem).
    max_drained=dict(type='str', default='10%', description=[
        'The fleet brake, past this many nodes out of service with a C(gpu_reset) reason (a number, or a '
        "percentage of the cluster's nodes, V(N%), rounded up, at least 1), a node that is not clean but where "
        'a job can still run is not drained.',
        'Before a node is drained, the nodes C(sinfo) on it shows drained or down with a C(gpu_reset) reason '
        'are counted; past the cap, a node where a job can run (no GPU lost, no memory held) is not drained, and '
        'the report (RV(brake)) and the reason say so. A node where no job can run is drained all the same, the '
        'brake overridden. When C(sinfo) cannot answer, the node is drained as without a brake, and RV(brake) '
        'says why.',
        'A fault that many nodes share (a driver update, a bug in the checks) then cannot drain the whole '
        'cluster. The hosts of one playbook run count and drain one at a time, so that such a fault drains no '
        'more of them than the cap; the action fails a host the brake kept in service all the same. The Slurm '
        'hooks apply the same brake (C(GPU_RESET_MAX_DRAINED)), leaving such a node in service with the reason '
        'in their log.',
    ]),
    report_dir=dict(type='path', default=None, description=[
        'A directory on the controller for one JSON report per host, C(<inventory_hostname>.json), created when '
        'missing, also in check mode. Not set, no report is written. A report that cannot be written fails the '
        'host, saying why.',
        'The host name is escaped with the filter P(gpuops.nvidia.gpu_reset_report_path#filter). Every '
        'character but letters, digits, C(.), C(_) and C(-), and a leading dot, becomes C(%XX), so the report '
        'stays inside the directory (C(../victim) is C(%2E.%2Fvictim.json)). A host whose name cannot be made '
        'a file name fails, saying why.',
    ]),
    textfile_dir=dict(type='path', default=None, description=[
        'The node_exporter textfile collector directory on the host, for C(gpu_reset.prom) - the time of the '
        'last run, its success, its duration and the number of processes signalled, and per GPU its state, the '
        'recovery action it calls for, the memory it holds with no process and how long the run took until it '
        'read free (R(the monitoring guide, ansible_collections.gpuops.nvidia.docsite.guide_monitoring) lists '
        'the gauges). Not in check mode. Not set, nothing is written. Metrics that cannot be written fail the '
        'host, saying why.',
    ]),
)

SETTINGS_SPEC = dict(SEQUENCE_SPEC, **FINISH_SPEC)

# The settings of the Slurm hooks (the role gpuops.nvidia.slurm_hooks) that are options of the
# spec: {option: (the role's variable, the hook's setting in gpu-reset-hook.conf)}. Their default and
# description are the spec's (scripts/gen_settings.py writes them into that role).
HOOK_SETTINGS = {
    'max_drained': ('slurm_hooks_max_drained', 'GPU_RESET_MAX_DRAINED'),
}

# Variables of the playbook reset_gpus.yml and the role's own results, also named gpu_reset_*:
# no typo.
OTHER_VARIABLES = frozenset(PREFIX + name for name in (
    'result', 'become', 'serial', 'max_fail_percentage', 'sliced'))


def defaults(spec=None):
    """{name: default} of spec (SETTINGS_SPEC)."""
    return dict((name, option.get('default')) for name, option in (spec or SETTINGS_SPEC).items())


def known_variables():
    """Every gpu_reset_* variable with a meaning: the settings and OTHER_VARIABLES."""
    return set(PREFIX + name for name in SETTINGS_SPEC) | OTHER_VARIABLES


def unknown_variables(names):
    """The gpu_reset_* names among names that no spec knows (gpu_reset__* are the role's own)."""
    known = known_variables()
    ours = [name for name in names if name.startswith(PREFIX) and not name.startswith(PREFIX + '_')]
    return sorted(name for name in ours if name not in known)


def nearest_variable(name):
    """The known variable that name is most likely a typo of, or None. Compared without the
    prefix, which every name shares."""
    suffixes = sorted(known[len(PREFIX):] for known in known_variables())
    close = difflib.get_close_matches(name[len(PREFIX):], suffixes, n=1)
    return PREFIX + close[0] if close else None
