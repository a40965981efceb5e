# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What Slurm's files and commands say on a simulated node, for the Slurm hook's tests: the lines
of gres.conf, and scontrol show node."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def identity_gres_conf(host):
    """A gres.conf line for the simulated host's GPUs in the order of their indexes."""
    return 'Name=gpu File=%s\n' % ','.join(host.dev_path(index) for index in range(len(host.memory_used())))


SHOW_NODE = '''NodeName=gpu07 Arch=x86_64 CoresPerSocket=2
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.57
   OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC Debian
   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
{reason}
'''


def show_node(state='IDLE+DRAIN', reason='gpu_reset: GPU 3: 4096 MiB held with no process left [root@2026-12-01T11:59:46]'):
    return SHOW_NODE.format(state=state, reason='   Reason=' + reason if reason else '')
