# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._cure.mig_restore import (
    CI_CREATED_RE, GI_CREATED_RE, MigRestore, gpu_instances, proof_problems, restorable, wanted)
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.mig import smi_read
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiRunner

# NVIDIA's MIG user guide, as tests/gpusim/samples/mig/create_instances.txt keeps it.
CREATED_WITH_C = ('Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.20gb (ID  9)\n'
                  'Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile MIG 3g.20gb (ID  2)\n')
CREATED_CIS = 'Successfully created compute instance on GPU  0 GPU instance ID  1 using profile MIG 1c.3g.20gb (ID  0)\n' * 3


def instance(gi, ci, profile, uuid='MIG-x'):
    return {'gpu_instance_id': gi, 'compute_instance_id': ci, 'profile': profile, 'uuid': uuid}


def fact(*instances, **modes):
    return {'mode_current': modes.get('current', 'enabled'), 'mode_pending': modes.get('pending', 'enabled'),
            'instances': list(instances)}


def test_the_guides_words_are_read():
    assert GI_CREATED_RE.search(CREATED_WITH_C).groups() == ('2', '0', '3g.20gb')
    assert len(CI_CREATED_RE.findall(CREATED_WITH_C)) == 1 and len(CI_CREATED_RE.findall(CREATED_CIS)) == 3


def test_gpu_instances_are_grouped_largest_first_with_their_compute_instances():
    layout = fact(instance(7, 0, '1g.18gb'), instance(1, 0, '1c.3g.71gb'), instance(1, 1, '2c.3g.71gb'),
                  instance(3, 0, '2g.35gb'))
    assert gpu_instances(layout) == [('3g.71gb', [1, 2]), ('2g.35gb', [None]), ('1g.18gb', [None])]
    assert wanted(layout) == [('1g.18gb', '1g.18gb'), ('2g.35gb', '2g.35gb'), ('3g.71gb', '1c.3g.71gb'),
                              ('3g.71gb', '2c.3g.71gb')]


def test_a_profile_not_understood_is_named():
    with pytest.raises(ValueError, match=r"GI 7 CI 0 \(MIG-x\): profile 'weird\\\\x1b' not understood"):
        gpu_instances(fact(instance(7, 0, 'weird\x1b')))


def test_only_a_gpu_whose_mode_stayed_enabled_and_that_has_no_instance_now_is_made_again():
    before = fact(instance(7, 0, '1g.18gb'))
    assert restorable(before, fact()) is None
    assert restorable(before, None) == 'MIG after the reset not read'
    assert restorable(before, fact(current='disabled', pending='disabled')) == 'the MIG mode changed'
    assert restorable(before, fact(instance(9, 0, '1g.18gb'))) == 'MIG instances are there already'
    assert restorable(fact(), fact()) == 'no MIG instance before the reset'


def test_the_layout_is_made_on_the_simulated_driver_and_proven(gpuhost):
    before = gpuhost.mig(4, ['1g.18gb', '2g.35gb'])
    runner = SmiRunner(gpuhost.smi_path)
    gpuhost.mig(4, [])
    made, problems = MigRestore(runner.run, time.monotonic() + 30, time.monotonic).make(4, fact(*[
        instance(dev['gi'], dev['ci'], dev['profile'], dev['uuid']) for dev in before['instances']]))
    assert problems == [] and [name.split()[2] for name in made] == ['2g.35gb', '1g.18gb']
    gpu = [gpu for gpu in gpuhost.state['gpus'] if gpu['index'] == 4][0]
    after, warnings = smi_read(runner.run, [dict(gpu, processes=[])])
    assert warnings == []
    wanted_fact = fact(instance(3, 0, '2g.35gb'), instance(7, 0, '1g.18gb'))
    assert proof_problems(wanted_fact, after[4], {'index': 4, 'minor_number': 4}, 0, gpuhost.root) == []
    missing = fact(instance(3, 0, '2g.35gb'), instance(7, 0, '1g.18gb'), instance(8, 0, '1g.18gb'))
    assert proof_problems(missing, after[4], {'index': 4, 'minor_number': 4}, 0, gpuhost.root) == ['not there: 1g.18gb']


def test_no_time_left_makes_nothing():
    calls = []
    made, problems = MigRestore(lambda args, timeout: calls.append(args), 0.0, lambda: 10.0).make(
        0, fact(instance(7, 0, '1g.18gb')))
    assert (made, calls) == ([], []) and problems == ['GPU instance 1g.18gb not made: no time left']


def test_a_call_that_fails_is_the_layouts_problem_and_a_hung_driver_goes_up():
    from ansible_collections.gpuops.nvidia.plugins.module_utils._common import DriverHung
    from ansible_collections.gpuops.nvidia.plugins.module_utils._run import CommandTimeout

    def timing_out(args, timeout):
        raise CommandTimeout('nvidia-smi mig did not exit within 5 s', ['nvidia-smi', 'mig'], 5)

    made, problems = MigRestore(timing_out, 100.0, lambda: 0.0).make(0, fact(instance(7, 0, '1g.18gb')))
    assert made == [] and problems == ['GPU instance 1g.18gb not made: nvidia-smi mig did not exit within 5 s']

    def hung(args, timeout):
        raise DriverHung('driver_hung: nvidia-smi mig hung in the NVIDIA driver')

    with pytest.raises(DriverHung):
        MigRestore(hung, 100.0, lambda: 0.0).make(0, fact(instance(7, 0, '1g.18gb')))
