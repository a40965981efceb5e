# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readings and checks of tests/device/check.sh, on a host with a real NVIDIA GPU.

Standard library only; record_nvml needs nvidia-ml-py (pynvml) and the driver's libnvidia-ml.so.1.
Every command run is saved as NAME.cmd, NAME.stdout, NAME.stderr and NAME.rc, as the captures
in tests/unit/fixtures/real_samples/smi_real_binary are.

Run as a script: ``python3 record.py smi|nvml|host|fields|adhoc|check|memory-used ...`` (see main).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import glob
import json
import os
import platform
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _collection_path():
    """A directory holding ansible_collections/gpuops/nvidia -> this checkout, on sys.path:
    $GPUOPS_COLLECTIONS (check.sh's), else the checkout's own .build/collections."""
    base = os.environ.get('GPUOPS_COLLECTIONS')
    if not base:
        base = os.path.join(REPO, '.build', 'collections')
    link = os.path.join(base, 'ansible_collections', 'gpuops', 'nvidia')
    if os.path.realpath(link) != os.path.realpath(REPO):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        tmp = '%s.%d' % (link, os.getpid())
        os.symlink(REPO, tmp)
        os.replace(tmp, link)
    if base not in sys.path:
        sys.path.insert(0, base)
    return base


def smi_fields():
    """The nvidia-smi fields the collection's reader queries, read from _gpu/smi.py itself."""
    _collection_path()
    from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu import smi as _smi
    return {
        'gpu': [field for field, dummy in _smi.GPU_FIELDS],
        'optional': [field for field, dummy in _smi.OPTIONAL_FIELDS],
        'apps': list(_smi.APP_FIELDS),
        'remapped': ['gpu_bus_id'] + [field for field, dummy in _smi.REMAPPED_ROWS_FIELDS],
    }


def fabric_fields():
    _collection_path()
    from ansible_collections.gpuops.nvidia.plugins.module_utils._cure import fabric as _fabric
    return _fabric.FIELDS


def default_threshold():
    _collection_path()
    from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DEFAULT_MEMORY_THRESHOLD_MIB
    return DEFAULT_MEMORY_THRESHOLD_MIB


def run_saved(out_dir, name, argv, timeout=30, env=None):
    """Run argv, save NAME.cmd/.stdout/.stderr/.rc under out_dir; return (rc, stdout).

    A command that cannot start gets rc 127, one past its timeout rc 124 (as timeout(1) says).
    """
    os.makedirs(out_dir, exist_ok=True)
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, check=False)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except OSError as e:
        rc, stdout, stderr = 127, b'', ('%s\n' % e).encode()
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = 124, e.stdout or b'', (e.stderr or b'') + b'\n[timed out after %ds]\n' % timeout
    base = os.path.join(out_dir, name)
    for suffix, data in (('.cmd', (shlex.join(argv) + '\n').encode()), ('.stdout', stdout),
                         ('.stderr', stderr), ('.rc', b'%d\n' % rc)):
        with open(base + suffix, 'wb') as f:
            f.write(data)
    return rc, stdout.decode('utf-8', 'replace')


def smi_commands(smi_path='nvidia-smi'):
    """(name, argv) of every nvidia-smi call recorded: the reader's queries, whole and field by field."""
    fields = smi_fields()
    csv = '--format=csv,noheader,nounits'
    commands = [
        ('query_gpu_all', [smi_path, '--query-gpu=' + ','.join(fields['gpu'] + fields['optional']), csv]),
        ('query_gpu_base', [smi_path, '--query-gpu=' + ','.join(fields['gpu']), csv]),
        ('query_gpu_all_header', [smi_path, '--query-gpu=' + ','.join(fields['gpu'] + fields['optional']), '--format=csv']),
    ]
    for field in fields['gpu'] + fields['optional'] + ['minor_number']:
        commands.append(('query_gpu_field_' + field.replace('.', '_'), [smi_path, '--query-gpu=' + field, csv]))
    commands += [
        ('query_compute_apps', [smi_path, '--query-compute-apps=' + ','.join(fields['apps']), csv]),
        ('query_compute_apps_header', [smi_path, '--query-compute-apps=' + ','.join(fields['apps']), '--format=csv']),
        ('query_remapped_rows', [smi_path, '--query-remapped-rows=' + ','.join(fields['remapped']), csv]),
        # What the fabric wait after a GPU reset reads (_fabric.FIELDS), as that query asks for it.
        ('query_fabric', [smi_path, fabric_fields(), '--format=csv,noheader']),
        ('q', [smi_path, '-q']),
        ('L', [smi_path, '-L']),
        ('plain', [smi_path]),
    ]
    return commands


def record_smi(out_dir, smi_path='nvidia-smi', timeout=30):
    """Record every nvidia-smi call of smi_commands under out_dir; return {name: rc} (also in rc.json)."""
    rcs = {}
    for name, argv in smi_commands(smi_path):
        rcs[name], dummy = run_saved(out_dir, name, argv, timeout=timeout)
    with open(os.path.join(out_dir, 'rc.json'), 'w') as f:
        json.dump(rcs, f, indent=1, sort_keys=True)
    return rcs


def _nvml_call(pynvml, out, key, fn, *args):
    """out[key] = fn(*args), or {'error': str} when NVML refuses; return the value or None."""
    try:
        value = fn(*args)
    except Exception as e:  # NVMLError, or a missing entry point (NVMLError_FunctionNotFound)
        out[key] = {'error': '%s: %s' % (type(e).__name__, e)}
        return None
    if isinstance(value, bytes):
        value = value.decode('utf-8', 'replace')
    out[key] = value
    return value


def _struct(value):
    if value is None:
        return None
    return dict((name, getattr(value, name)) for name, dummy in getattr(value, '_fields_', [])
                if not name.startswith('version') and isinstance(getattr(value, name), int))


def read_nvml():
    """Everything the NVML reader uses, per GPU, as a dict (errors as {'error': ...})."""
    import pynvml
    out = {'pynvml': getattr(pynvml, '__version__', None)}
    pynvml.nvmlInit()
    try:
        _nvml_call(pynvml, out, 'driver_version', pynvml.nvmlSystemGetDriverVersion)
        _nvml_call(pynvml, out, 'nvml_version', pynvml.nvmlSystemGetNVMLVersion)
        _nvml_call(pynvml, out, 'cuda_driver_version', pynvml.nvmlSystemGetCudaDriverVersion)
        count = _nvml_call(pynvml, out, 'count', pynvml.nvmlDeviceGetCount) or 0
        out['gpus'] = []
        for index in range(count):
            gpu = {'index': index}
            out['gpus'].append(gpu)
            handle = _nvml_call(pynvml, gpu, 'handle', pynvml.nvmlDeviceGetHandleByIndex, index)
            gpu.pop('handle', None)
            if handle is None:
                continue
            for key, fn in (('name', pynvml.nvmlDeviceGetName), ('uuid', pynvml.nvmlDeviceGetUUID),
                            ('minor_number', pynvml.nvmlDeviceGetMinorNumber),
                            ('persistence_mode', pynvml.nvmlDeviceGetPersistenceMode)):
                _nvml_call(pynvml, gpu, key, fn, handle)
            pci = _nvml_call(pynvml, gpu, 'pci', pynvml.nvmlDeviceGetPciInfo, handle)
            if pci is not None:
                bus_id = pci.busId
                gpu['pci'] = {'bus_id': bus_id.decode() if isinstance(bus_id, bytes) else bus_id,
                              'pci_device_id': pci.pciDeviceId}
            v1 = _nvml_call(pynvml, gpu, 'memory_v1', pynvml.nvmlDeviceGetMemoryInfo, handle)
            if v1 is not None:
                gpu['memory_v1'] = _struct(v1)
            v2 = _nvml_call(pynvml, gpu, 'memory_v2', pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
            if v2 is not None:
                gpu['memory_v2'] = _struct(v2)
            for key in ('memory_v1', 'memory_v2'):
                if isinstance(gpu[key], dict) and 'used' in gpu[key]:
                    gpu[key + '_mib'] = dict((name, gpu[key][name] // (1024 * 1024)) for name in gpu[key])
            # The driver's GPU Recovery Action, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230): drivers from 565.
            values = _nvml_call(pynvml, gpu, 'recovery_action_field', pynvml.nvmlDeviceGetFieldValues, handle, [230])
            if values is not None:
                gpu['recovery_action_field'] = {'nvml_return': int(values[0].nvmlReturn), 'value': int(values[0].value.uiVal)}
            procs = _nvml_call(pynvml, gpu, 'compute_processes', pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if procs is not None:
                gpu['compute_processes'] = [{'pid': p.pid, 'used_gpu_memory': p.usedGpuMemory} for p in procs]
    finally:
        pynvml.nvmlShutdown()
    return out


def record_nvml(out_dir):
    """Write out_dir/nvml.json (read_nvml, or the error that stopped it); return the dict."""
    os.makedirs(out_dir, exist_ok=True)
    try:
        out = read_nvml()
    except Exception as e:  # no pynvml, no library, driver not loaded: recorded, not raised
        out = {'error': '%s: %s' % (type(e).__name__, e)}
    with open(os.path.join(out_dir, 'nvml.json'), 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    return out


def _read(path):
    try:
        with open(path, 'rb') as f:
            return f.read().decode('utf-8', 'replace')
    except OSError as e:
        return '[%s]' % e


def record_host(out_dir, root='/'):
    """What the host says of its NVIDIA GPUs outside nvidia-smi and NVML, under root; return the dict.

    Writes host.json (everything), and verbatim copies of each /proc/driver/nvidia/gpus/*/information
    as proc_gpus/<bus id>.information. /dev, /sys and /proc/driver (with the driver's version) are
    read under root, as the modules' host_root does; /proc/devices and uname are the running kernel's.
    """
    os.makedirs(out_dir, exist_ok=True)

    def join(*parts):
        return os.path.join(root, *parts)

    out = {'root': root, 'uname': ' '.join(platform.uname()),
           'driver_version': _read(join('proc', 'driver', 'nvidia', 'version')),
           'module_version': _read(join('sys', 'module', 'nvidia', 'version')).strip(),
           'proc_devices_nvidia': [line for line in _read('/proc/devices').splitlines() if 'nvidia' in line],
           'proc_gpus': {}, 'pci_nvidia': {}, 'dev': []}
    info_dir = os.path.join(out_dir, 'proc_gpus')
    for path in sorted(glob.glob(join('proc', 'driver', 'nvidia', 'gpus', '*', 'information'))):
        bus_id = os.path.basename(os.path.dirname(path))
        out['proc_gpus'][bus_id] = _read(path)
        os.makedirs(info_dir, exist_ok=True)
        with open(os.path.join(info_dir, bus_id + '.information'), 'w') as f:
            f.write(out['proc_gpus'][bus_id])
    for path in sorted(glob.glob(join('sys', 'bus', 'pci', 'devices', '*'))):
        if _read(os.path.join(path, 'vendor')).strip() != '0x10de':
            continue
        entry = dict((name, _read(os.path.join(path, name)).strip()) for name in ('vendor', 'device', 'class'))
        driver = os.path.join(path, 'driver')
        entry['driver'] = os.path.basename(os.readlink(driver)) if os.path.islink(driver) else None
        out['pci_nvidia'][os.path.basename(path)] = entry
    for path in sorted(glob.glob(join('dev', 'nvidia*'))):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        kind = 'char' if (st.st_mode & 0o170000) == 0o020000 else 'dir' if os.path.isdir(path) else 'other'
        out['dev'].append({'path': path, 'kind': kind, 'mode': oct(st.st_mode & 0o7777),
                           'major': os.major(st.st_rdev) if kind == 'char' else None,
                           'minor': os.minor(st.st_rdev) if kind == 'char' else None})
    run_saved(out_dir, 'ls_dev_nvidia', ['sh', '-c', 'ls -l "$1"/nvidia*', 'sh', join('dev')])
    run_saved(out_dir, 'uname', ['uname', '-a'])
    with open(os.path.join(out_dir, 'host.json'), 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    return out


def adhoc_result(text):
    """The result of ``ansible HOST -m MODULE`` from its stdout ("localhost | CHANGED => {...}").

    Adds 'failed' from the status word, as tests/adhoc.py does. None when no result is printed.
    """
    status, sep, payload = text.partition(' => ')
    if not sep:
        return None
    try:
        result, dummy = json.JSONDecoder().raw_decode(payload)
    except ValueError:
        return None
    result['failed'] = result.get('failed', False) or 'FAILED' in status or 'UNREACHABLE' in status
    return result


def gpu_entry(facts, index):
    for gpu in (facts or {}).get('ansible_facts', {}).get('nvidia_gpus') or []:
        if gpu.get('index') == index:
            return gpu
    return None


def memory_used(smi_path, index):
    """GPU index's memory.used in MiB as nvidia-smi reads it now, or None."""
    try:
        proc = subprocess.run([smi_path, '--query-gpu=memory.used', '-i', str(index), '--format=csv,noheader,nounits'],
                              capture_output=True, text=True, timeout=30, check=False)
        return int(proc.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def pid_gone(pid):
    """True when no process pid runs (none, or a zombie)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            stat = f.read()
    except OSError:
        return True
    return stat.rpartition(')')[2].split()[0] == 'Z'


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def checks(run_dir, holder_pid, index=0, threshold=None, smi_path='nvidia-smi', compute_holder=True, backend=None):
    """Judge one backend's run: run_dir holds facts_before.json, release.json and facts_after.json.

    Returns [(verdict, name, detail)], verdict PASS, FAIL or SKIP. compute_holder: the holder
    has a CUDA context (a holder that only opens the device files is no compute app, and its
    GPU may read free before the release). backend: the facts must say they were read with it.
    """
    threshold = default_threshold() if threshold is None else threshold
    before, release, after = (_load(os.path.join(run_dir, name + '.json'))
                              for name in ('facts_before', 'release', 'facts_after'))
    results = []

    def check(name, ok, detail, skip=False):
        results.append(('SKIP' if skip else 'PASS' if ok else 'FAIL', name, detail))

    gpu = gpu_entry(before, index)
    check('facts before: GPU %d read' % index, bool(before) and not before.get('failed') and gpu is not None,
          'msg: %s' % (before or {}).get('msg') if not gpu else 'state %s, memory used %s MiB' % (gpu['state'], gpu['memory_used_mib']))
    if backend:
        read_with = (before or {}).get('ansible_facts', {}).get('nvidia_gpu_backend')
        check('facts before: read with backend %s' % backend, read_with == backend, 'nvidia_gpu_backend %s' % read_with)
    pids = [proc.get('pid') for proc in (gpu or {}).get('processes') or []]
    check('facts before: GPU %d not free, holder %d listed' % (index, holder_pid),
          gpu is not None and gpu.get('state') != 'free' and holder_pid in pids,
          'state %s, processes %s' % ((gpu or {}).get('state'), pids), skip=not compute_holder)
    release = release or {}
    signalled = [entry.get('pid') for entry in release.get('signalled') or []]
    if compute_holder:
        check('release: changed and released',
              not release.get('failed') and release.get('changed') is True and release.get('released') is True,
              'failed %s, changed %s, released %s, msg %s' % (
                  release.get('failed'), release.get('changed'), release.get('released'), release.get('msg')))
    else:
        # A GPU a foreign holder keeps open is not released: the message names the holder.
        check('release: unchanged, and not released while holder %d holds GPU %d' % (holder_pid, index),
              release.get('changed') is False and release.get('released') is False
              and 'held by pid %d' % holder_pid in str(release.get('msg')),
              'changed %s, released %s, msg %s' % (release.get('changed'), release.get('released'), release.get('msg')))
    if compute_holder:
        check('release: holder %d signalled' % holder_pid, holder_pid in signalled, 'signalled %s' % signalled)
        check('holder %d gone' % holder_pid, pid_gone(holder_pid), '/proc/%d' % holder_pid)
    else:
        # A root process with the device files open and no CUDA context, that the driver places on
        # no GPU, is no job: the release leaves it alone as a foreign holder.
        foreign = [entry.get('pid') for entry in release.get('foreign_holders') or []]
        check('release: holder %d left alone as a foreign holder' % holder_pid,
              holder_pid in foreign and holder_pid not in signalled and not pid_gone(holder_pid),
              'foreign_holders %s, signalled %s' % (foreign, signalled))
    gpu = gpu_entry(after, index)
    check('facts after: GPU %d free' % index, gpu is not None and gpu.get('state') == 'free' and not gpu.get('processes'),
          'state %s, processes %s' % ((gpu or {}).get('state'), (gpu or {}).get('processes')))
    used = memory_used(smi_path, index)
    check('nvidia-smi: GPU %d memory.used at or below %d MiB' % (index, threshold), used is not None and used <= threshold,
          'memory.used %s MiB' % used)
    return results


PROBE_FIELDS = ('index', 'pci_bus_id', 'ok', 'ms', 'mib', 'released', 'call', 'error_name', 'error_string')


def probe_summary(result):
    """The figures of one probe run: the module's time, each GPU's time and answer."""
    gpus = (result or {}).get('gpus') or []
    times = [gpu['ms'] for gpu in gpus if gpu.get('ms') is not None]
    return {
        'duration_ms': (result or {}).get('duration_ms'),
        'slowest_gpu_ms': max(times) if times else None,
        'gpus': [dict((key, gpu.get(key)) for key in PROBE_FIELDS) for gpu in gpus],
        'msg': (result or {}).get('msg'),
    }


def probe_checks(run_dir, index=0):
    """Judge the probe's two runs in run_dir: free.json (every GPU free: every probe passes and its
    memory is released) and full.json (GPU index nearly full: its probe fails with a CUDA error,
    the other GPUs pass). Writes summary.json beside them; returns [(verdict, name, detail)]."""
    free, full = _load(os.path.join(run_dir, 'free.json')), _load(os.path.join(run_dir, 'full.json'))
    summary = {'free': probe_summary(free), 'full': probe_summary(full)}
    with open(os.path.join(run_dir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    results = []

    def check(name, ok, detail):
        results.append(('PASS' if ok else 'FAIL', name, detail))

    gpus = summary['free']['gpus']
    check('probe, free GPUs: every GPU proven and its probe memory released',
          bool(gpus) and not (free or {}).get('failed') and all(gpu['ok'] and gpu['released'] for gpu in gpus),
          'module %s ms, slowest GPU %s ms, msg %s' % (summary['free']['duration_ms'], summary['free']['slowest_gpu_ms'],
                                                       summary['free']['msg']))
    full_gpus = dict((gpu['index'], gpu) for gpu in summary['full']['gpus'])
    held = full_gpus.get(index) or {}
    check('probe, GPU %d nearly full: fails with a CUDA error' % index,
          held.get('ok') is False and str(held.get('error_name')).startswith('CUDA_ERROR_'),
          '%s at %s (%s)' % (held.get('error_name'), held.get('call'), held.get('error_string')))
    others = [gpu for gpu in full_gpus.values() if gpu['index'] != index]
    check('probe, GPU %d nearly full: the other GPUs still proven' % index,
          all(gpu['ok'] for gpu in others), '%d other GPU(s)' % len(others))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog='record.py', description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('smi', help='record the nvidia-smi calls')
    p.add_argument('out_dir')
    p.add_argument('--smi', default='nvidia-smi')
    p = sub.add_parser('nvml', help='record NVML readings (nvml.json)')
    p.add_argument('out_dir')
    p = sub.add_parser('host', help='record /proc, /sys and /dev of the GPUs')
    p.add_argument('out_dir')
    p.add_argument('--root', default='/')
    sub.add_parser('threshold', help='print the default memory_threshold_mib')
    p = sub.add_parser('adhoc', help='read an ansible ad hoc stdout file, write its result as JSON')
    p.add_argument('stdout_file')
    p.add_argument('json_file')
    p = sub.add_parser('memory-used', help="print a GPU's memory.used in MiB")
    p.add_argument('--smi', default='nvidia-smi')
    p.add_argument('--index', type=int, default=0)
    p = sub.add_parser('check', help='judge one backend run; print PASS/FAIL/SKIP lines; exit 1 on a FAIL')
    p.add_argument('run_dir')
    p.add_argument('--pid', type=int, required=True)
    p.add_argument('--index', type=int, default=0)
    p.add_argument('--smi', default='nvidia-smi')
    p.add_argument('--label', default='')
    p.add_argument('--backend')
    p.add_argument('--no-compute-holder', dest='compute_holder', action='store_false')
    p = sub.add_parser('probe-check', help="judge the probe's runs; write summary.json; exit 1 on a FAIL")
    p.add_argument('run_dir')
    p.add_argument('--index', type=int, default=0)
    args = parser.parse_args(argv)

    if args.cmd == 'smi':
        rcs = record_smi(args.out_dir, args.smi)
        print('nvidia-smi: %d calls recorded in %s (%s)' % (len(rcs), args.out_dir, ', '.join(
            '%s rc %d' % (name, rc) for name, rc in sorted(rcs.items()) if rc != 0) or 'all rc 0'))
    elif args.cmd == 'nvml':
        out = record_nvml(args.out_dir)
        print('NVML: %s' % (out['error'] if 'error' in out else '%s GPU(s), driver %s' % (out.get('count'), out.get('driver_version'))))
    elif args.cmd == 'host':
        out = record_host(args.out_dir, args.root)
        print('host: %d NVIDIA PCI device(s), %d driver GPU entries, %d /dev/nvidia* nodes' % (
            len(out['pci_nvidia']), len(out['proc_gpus']), len(out['dev'])))
    elif args.cmd == 'threshold':
        print(default_threshold())
    elif args.cmd == 'adhoc':
        with open(args.stdout_file, errors='replace') as f:
            result = adhoc_result(f.read())
        with open(args.json_file, 'w') as f:
            json.dump(result, f, indent=1, sort_keys=True)
        return 0 if result is not None else 1
    elif args.cmd == 'memory-used':
        used = memory_used(args.smi, args.index)
        print('' if used is None else used)
        return 0 if used is not None else 1
    elif args.cmd == 'check':
        results = checks(args.run_dir, args.pid, args.index, smi_path=args.smi,
                         compute_holder=args.compute_holder, backend=args.backend)
        for verdict, name, detail in results:
            print('%s %s%s (%s)' % (verdict, args.label, name, detail))
        return 1 if any(verdict == 'FAIL' for verdict, dummy, dummy in results) else 0
    elif args.cmd == 'probe-check':
        results = probe_checks(args.run_dir, args.index)
        for verdict, name, detail in results:
            print('%s %s (%s)' % (verdict, name, detail))
        return 1 if any(verdict == 'FAIL' for verdict, dummy, dummy in results) else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
