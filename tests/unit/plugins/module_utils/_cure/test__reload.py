# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The reload of the driver's kernel modules, on gpusim's /sys/module: no kernel module can be
loaded in a container, so gpusim's rmmod and modprobe (beside its nvidia-smi) stand in for the
kernel's, refusing a module in use as the kernel does."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.reload import CONTAINERS_NOTE, ModuleReload, unload_order, would_reload
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiRunner
from gpusim import modules as sim_modules


def loaded(host):
    return sorted(os.listdir(os.path.join(host.root, 'sys', 'module')))


def idle_gpus(host):
    return [{'index': gpu['index'], 'processes': []} for gpu in host.state['gpus']]


def reload(host, gpus=None, deadline_s=60.0, logged=None):
    reloader = ModuleReload(SmiRunner(host.smi_path), idle_gpus(host) if gpus is None else gpus, [3],
                            time.monotonic() + deadline_s, host.root, host.smi_path,
                            log=(logged if logged is not None else []).append)
    return reloader.run([gpu['index'] for gpu in host.state['gpus']])


def persistence(host):
    return [gpu['persistence_mode'] for gpu in host.state['gpus']]


def test_a_module_goes_before_the_modules_it_holds_and_nvidia_last(gpuhost):
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset')
    gpuhost.load_module('nvidia_peermem')
    # gdrdrv holds nvidia and nvidia_uvm: it comes before nvidia_uvm whatever its name sorts as.
    gpuhost.load_module('gdrdrv')
    sim_modules.insert(gpuhost.paths, 'gdrdrv', 'nvidia_uvm')
    order = unload_order(gpuhost.root)
    assert order[-1] == 'nvidia'
    assert sorted(order) == ['gdrdrv', 'nvidia', 'nvidia_drm', 'nvidia_modeset', 'nvidia_peermem', 'nvidia_uvm']
    assert order.index('nvidia_drm') < order.index('nvidia_modeset') and order.index('gdrdrv') < order.index('nvidia_uvm')


def test_the_reload_unloads_in_order_loads_back_in_reverse_and_the_gpus_come_back(gpuhost):
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset')
    gpuhost.fault('stuck', gpu=3, mib=4096)
    logged = []
    entry = reload(gpuhost, logged=logged)
    assert entry['attempted'] is True and entry['ok'] is True, entry
    assert entry['unloaded'] == ['nvidia_uvm', 'nvidia_drm', 'nvidia_modeset', 'nvidia'] == entry['modules']
    assert entry['loaded'] == ['nvidia', 'nvidia_modeset', 'nvidia_drm', 'nvidia_uvm']
    assert entry['message'] == ('kernel modules nvidia_uvm, nvidia_drm, nvidia_modeset, nvidia unloaded and loaded again; '
                                'device nodes made again: /dev/nvidia-uvm; ' + CONTAINERS_NOTE)
    # modprobe made no node again: nvidia-modprobe did the UVM node, stale after its module's reload.
    assert entry['device_nodes'] == {'made': ['/dev/nvidia-uvm'], 'missing': [], 'gone': []}
    assert os.path.exists(os.path.join(gpuhost.root, 'dev', 'nvidia-uvm'))
    assert entry['flr_refused'] == [3] and entry['stopped_by'] is None
    assert loaded(gpuhost) == ['nvidia', 'nvidia_drm', 'nvidia_modeset', 'nvidia_uvm']
    # A fresh driver: memory freed, persistence mode off, then restored where it was on.
    assert gpuhost.memory_used()[3] == 1
    assert entry['persistence_mode_off'] == list(range(8)) and entry['persistence_mode_restored'] is True
    assert persistence(gpuhost) == ['Enabled'] * 8
    assert any('reloading the kernel modules' in line for line in logged)


def test_a_module_that_will_not_unload_stops_the_reload_and_what_was_unloaded_is_loaded_back(gpuhost):
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset')
    gpuhost.fault('module-in-use', value='nvidia_modeset')
    entry = reload(gpuhost)
    assert entry['attempted'] is True and entry['ok'] is False
    assert entry['unloaded'] == ['nvidia_uvm', 'nvidia_drm'] and entry['loaded'] == ['nvidia_drm', 'nvidia_uvm']
    assert entry['stopped_by'] == 'rmmod nvidia_modeset failed (exit 1): rmmod: ERROR: Module nvidia_modeset is in use'
    assert entry['message'] == ('kernel modules not reloaded: rmmod nvidia_modeset failed (exit 1): rmmod: ERROR: Module '
                                'nvidia_modeset is in use; loaded back: nvidia_drm, nvidia_uvm; device nodes made again: '
                                '/dev/nvidia-uvm; ' + CONTAINERS_NOTE)
    assert loaded(gpuhost) == ['nvidia', 'nvidia_drm', 'nvidia_modeset', 'nvidia_uvm']
    assert sorted(os.listdir(os.path.join(gpuhost.root, 'sys', 'module', 'nvidia_modeset', 'holders'))) == ['nvidia_drm']
    assert persistence(gpuhost) == ['Enabled'] * 8 and entry['persistence_mode_restored'] is True


def test_a_busy_gpu_a_module_in_use_or_a_node_held_refuses_the_reload_before_anything_is_done(gpuhost, spawn):
    gpus = idle_gpus(gpuhost)
    gpus[5]['processes'] = [{'pid': 4242}]
    entry = reload(gpuhost, gpus=gpus)
    assert entry['attempted'] is False and entry['unloaded'] == []
    assert entry['message'] == 'kernel modules not reloaded: every GPU of the host must be idle, and GPU 5 (pid 4242) is not'
    gpuhost.load_module('nvidia_drm', holds='nvidia_modeset', refcnt=1)
    assert reload(gpuhost)['message'] == 'kernel modules not reloaded: kernel modules in use: nvidia_drm (used by 1)'
    sim_modules.insert(gpuhost.paths, 'nvidia_drm', 'nvidia_modeset', refcnt=0)
    holder = spawn([gpuhost.paths.ctl_dev], name='monitor')
    entry = reload(gpuhost)
    assert entry['message'] == "kernel modules not reloaded: processes hold the driver's device nodes: pid %d (monitor)" % holder.pid
    assert loaded(gpuhost) == ['nvidia', 'nvidia_drm', 'nvidia_modeset', 'nvidia_uvm']
    assert persistence(gpuhost) == ['Enabled'] * 8 and entry['persistence_mode_off'] == []


def test_no_reload_is_started_without_the_time_for_it(gpuhost):
    entry = reload(gpuhost, deadline_s=2.0)
    assert entry['attempted'] is False
    assert entry['message'] == 'kernel modules not reloaded: less than 10 s of the timeout left for it (raise timeout)'
    assert loaded(gpuhost) == ['nvidia', 'nvidia_modeset', 'nvidia_uvm']


def test_check_mode_says_what_would_be_reloaded(gpuhost):
    entry = would_reload(idle_gpus(gpuhost), 'the platform refuses the GPU reset (FLR)', gpuhost.root)
    assert entry['attempted'] is False and entry['ok'] is None and entry['unloaded'] == []
    assert entry['message'] == ('check mode: if the platform refuses the GPU reset (FLR), the kernel modules nvidia_modeset, '
                                'nvidia_uvm, nvidia would be unloaded and loaded again')


def test_nothing_is_unloaded_when_modprobe_could_not_load_it_back(gpuhost):
    modprobe = os.path.join(gpuhost.paths.bin, 'modprobe')
    os.chmod(modprobe, 0o644)
    entry = reload(gpuhost)
    assert entry['attempted'] is False and entry['unloaded'] == []
    assert entry['message'] == "kernel modules not reloaded: modprobe at %r is not executable (mode 0644)" % modprobe
    assert loaded(gpuhost) == ['nvidia', 'nvidia_modeset', 'nvidia_uvm']


def test_without_nvidia_modprobe_the_nodes_a_reload_leaves_stale_are_named_and_the_reload_is_not_ok(gpuhost, tmp_path):
    os.unlink(os.path.join(gpuhost.root, 'bin', 'nvidia-modprobe'))
    entry = reload(gpuhost)
    assert entry['attempted'] is True and entry['ok'] is False
    assert entry['device_nodes'] == {'made': [], 'missing': ['/dev/nvidia-uvm'], 'gone': []}
    assert 'device nodes not made again after the reload: /dev/nvidia-uvm' in entry['message']


def test_the_mig_capability_nodes_are_made_again_from_their_procfs_files(gpuhost, tmp_path):
    """The MIG config and monitor capabilities outlive a reload: their nodes are made again. The
    instances the reload ended (a driver loaded again has none) have no capability left: their
    nodes are said gone, not missing."""
    instance = gpuhost.mig(2, ['3g.71gb'])['instances'][0]
    caps = sorted(os.listdir(os.path.join(gpuhost.root, 'dev', 'nvidia-caps')))
    entry = reload(gpuhost)
    assert entry['ok'] is True, entry['message']
    left = sorted(os.listdir(os.path.join(gpuhost.root, 'dev', 'nvidia-caps')))
    assert left == ['nvidia-cap1', 'nvidia-cap2'] and set(left) < set(caps), caps
    nodes = entry['device_nodes']
    assert nodes['made'] == ['/dev/nvidia-uvm', '/dev/nvidia-caps/nvidia-cap1', '/dev/nvidia-caps/nvidia-cap2']
    assert sorted(nodes['gone']) == sorted('/dev/nvidia-caps/' + name for name in set(caps) - set(left)) and not nodes['missing']
    assert 'MIG instances gone with the reload' in entry['message'] and instance['uuid']
