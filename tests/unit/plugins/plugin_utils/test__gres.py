# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""SLURM_JOB_GPUS through gres.conf to nvidia-smi indexes: the file as Slurm reads it, the
device nodes' minor numbers, the driver's GPUs of a simulated host."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat
import time

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import printable
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._gres import (
    MAX_BYTES, GresError, expand, gpu_files, gres_conf_path, job_gpu_indexes, logical_lines, node_minor,
    shared_gpu_indexes)


def files(text, node='gpu07'):
    return gpu_files(text, node)


@pytest.mark.parametrize('text, names', [
    ('/dev/nvidia[0-3]', ['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia2', '/dev/nvidia3']),
    ('/dev/nvidia[3,1,0-1]', ['/dev/nvidia3', '/dev/nvidia1', '/dev/nvidia0', '/dev/nvidia1']),
    ('/dev/nvidia2,/dev/nvidia0', ['/dev/nvidia2', '/dev/nvidia0']),
    ('gpu[08-10]', ['gpu08', 'gpu09', 'gpu10']),
    ('r[1-2]n[1-2],login', ['r1n1', 'r1n2', 'r2n1', 'r2n2', 'login']),
])
def test_hostlists_expand_in_the_order_written(text, names):
    assert expand(text, 'File') == names


@pytest.mark.parametrize('text, message', [
    ('/dev/nvidia[0-3', 'has an unclosed bracket'),
    ('/dev/nvidia[[0]]', 'has unbalanced or nested brackets'),
    ('/dev/nvidia0]', 'has unbalanced or nested brackets'),
    ('a,,b', 'has an empty name'),
    ('/dev/nvidia[3-1]', r"'\[3-1\]' is not a range of numbers"),
    ('/dev/nvidia[a-b]', r"'\[a-b\]' is not a range of numbers"),
    ('/dev/nvidia[]', r"'\[\]' is not a range of numbers"),
    ('node[0-999999999]', 'names more than 100000'),
    ('n[0-999]m[0-999]', 'names more than 100000'),
])
def test_a_hostlist_that_is_not_one_is_refused_naming_it(text, message):
    started = time.monotonic()
    with pytest.raises(GresError, match=message):
        expand(text, 'File')
    assert time.monotonic() - started < 5  # refused before the names are expanded


def test_comments_continuations_and_blank_lines_are_read_as_slurm_reads_them():
    text = '# GPUs\n\nName=gpu \\\n  File=/dev/nvidia0  # the first\nName=gpu File=/dev/nvidia\\#1\n'
    assert list(logical_lines(text)) == [(3, 'Name=gpu    File=/dev/nvidia0'), (5, 'Name=gpu File=/dev/nvidia#1')]


def test_only_the_nodes_own_gpu_lines_count_in_the_order_of_the_file():
    text = '''AutoDetect=off
NodeName=gpu[01-06] Name=gpu Type=a100 File=/dev/nvidia[0-7] Cores=0-15
NodeName=gpu[07-08],dgx1 Name=gpu Type=h200 File=/dev/nvidia[3,1] Cores=0-7 Links=-1,0
Name=mps Count=200 File=/dev/nvidia[0-1]
NodeName=gpu07 Name=gpu Type=h200 File=/dev/nvidia0,/dev/nvidia2 Flags=nvidia_gpu_env Count=2
NodeName=gpu09 Name=gpu File=/dev/nvidia9
Name=shard Count=8
'''
    assert files(text) == ['/dev/nvidia3', '/dev/nvidia1', '/dev/nvidia0', '/dev/nvidia2']
    assert files(text, 'gpu02') == ['/dev/nvidia%d' % n for n in range(8)]


def test_a_node_of_its_own_may_turn_autodetect_off():
    assert files('AutoDetect=nvml\nNodeName=gpu07 AutoDetect=off\nName=gpu File=/dev/nvidia1\n') == ['/dev/nvidia1']


@pytest.mark.parametrize('text, message', [
    ('AutoDetect=nvml\n', 'gres.conf line 1: AutoDetect=nvml, so Slurm orders the GPUs itself'),
    ('NodeName=gpu07 AutoDetect=nvml Name=gpu File=/dev/nvidia0\n', 'line 1: AutoDetect=nvml, so'),
    ('Name=gpu Type=a File=/dev/nvidia0\nName=gpu Type=b File=/dev/nvidia1\n', 'GPUs of several types \\(a, b\\)'),
    ('Name=gpu File=/dev/nvidia0\nName=gpu Type=b File=/dev/nvidia1\n', 'GPUs of several types \\(none, b\\)'),
    ('Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap1\n',
     'line 1 gives both File= and MultipleFiles='),
    ('Name=gpu Count=2 MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap1\n', 'line 1: Count=2, but a MultipleFiles= line is one GPU'),
    ('Name=gpu Count=4\n', 'line 1 lists GPUs without File='),
    ('Name=gpu Count=3 File=/dev/nvidia[0-1]\n', 'line 1: Count=3 is not the 2 files of File='),
    ('Name=gpu File=nvidia0\n', "line 1: File 'nvidia0' is not an absolute path"),
    ('NodeName=gpu01 Name=gpu File=/dev/nvidia0\nName=mps Count=100\n', 'no Name=gpu line with File= for gpu07'),
    ('', 'no Name=gpu line with File= for gpu07'),
    ('Name=gpu File=/dev/nvidia0\n\x1b[2J garbage\n', r"line 2: '\\x1b\[2J' is not a parameter=value"),
    ('Name=gpu File=/dev/nvidia0 Fle=/dev/nvidia1\n', "line 1: 'Fle' is not a gres.conf parameter"),
    ('Name=gpu File="/dev/nvidia0"\n', 'is not a parameter=value'),
    ('Name=gpu File=/dev/nvidia0 file=/dev/nvidia1\n', 'line 1 gives file twice'),
    ('Include /etc/slurm/gres.d/gpus.conf\n', 'line 1 includes another file'),
    ('NodeName=gpu07 File=/dev/nvidia0\n', 'line 1 has no Name='),
    ('NodeName=gpu[07 Name=gpu File=/dev/nvidia0\n', 'line 1: NodeName .* has an unclosed bracket'),
    ('Name=gpu File=/dev/nvidia[0-2000]\n', 'more than 1024 GPUs'),
])
def test_what_cannot_be_followed_is_refused_naming_the_line(text, message):
    with pytest.raises(GresError, match=message):
        files(text)


def test_a_huge_gres_conf_is_refused_unread(tmp_path):
    path = tmp_path / 'gres.conf'
    path.write_text('#' * (MAX_BYTES + 1))
    with pytest.raises(GresError, match='is larger than 1048576 bytes'):
        job_gpu_indexes([0], 'gpu07', str(path))


def test_gres_conf_is_found_beside_slurm_conf():
    assert gres_conf_path({'SLURM_CONF': '/run/slurm/conf/slurm.conf'}) == '/run/slurm/conf/gres.conf'
    assert gres_conf_path({}) == '/etc/slurm/gres.conf'


@pytest.fixture
def shuffled(gpuhost_factory, tmp_path):
    """A host whose minors are not its indexes (index i is nvidia(i+4 mod 8)) and a gres.conf that
    lists its device nodes out of order."""
    host = gpuhost_factory(gpus=8, minors=[4, 5, 6, 7, 0, 1, 2, 3])
    path = tmp_path / 'gres.conf'
    path.write_text('NodeName=gpu07 Name=gpu File=%s/dev/nvidia[3,1,0,2,7,6,5,4]\n' % host.root)
    return host, str(path)


def test_a_job_gpu_is_the_gpu_of_its_device_nodes_minor_number(shuffled):
    host, path = shuffled
    # Place 0 is nvidia3: minor 3, index 7; place 4 is nvidia7: minor 7, index 3.
    indexes, note = job_gpu_indexes([0, 4], 'gpu07', path, host.root)
    assert indexes == [3, 7]
    assert note == ('SLURM_JOB_GPUS 0,4: 0 is %s/dev/nvidia3 (minor 3), nvidia-smi GPU 7; 4 is %s/dev/nvidia7 '
                    '(minor 7), nvidia-smi GPU 3' % (host.root, host.root))


def test_a_character_device_is_named_by_its_minor_number_not_its_name(tmp_path):
    if os.geteuid() != 0:
        pytest.skip('mknod needs root')
    path = str(tmp_path / 'nvidia0')
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(195, 6))
    assert node_minor(path) == 6
    other = str(tmp_path / 'nvidia1')
    os.mknod(other, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    with pytest.raises(GresError, match='is a character device of major 1'):
        node_minor(other)


@pytest.mark.parametrize('gres, message', [
    ('Name=gpu File={root}/dev/nvidia3\n', 'Slurm gave the job GPU 4, but .* lists 1 GPUs for gpu07 \\(0-0\\)'),
    ('Name=gpu File={root}/dev/nvidia[0-3,9]\n', "gres.conf's {root}/dev/nvidia9 cannot be read \\(No such file"),
    ('Name=gpu File={root}/dev/nvidia[0-4]\n', None),
    ('Name=gpu File={root}/dev/nvidia[0-3],{root}/dev/nvidiactl\n', "nvidiactl is not a GPU's device node"),
    ('Name=gpu File={root}/dev/nvidia[0-3],{root}/etc/passwd\n', 'is not named like an NVIDIA device node'),
])
def test_a_device_node_that_is_no_gpus_is_refused(gpuhost_factory, tmp_path, gres, message):
    host = gpuhost_factory(gpus=4)
    os.makedirs(os.path.join(host.root, 'etc'), exist_ok=True)
    open(os.path.join(host.root, 'etc', 'passwd'), 'w').close()
    open(os.path.join(host.root, 'dev', 'nvidia4'), 'w').close()
    path = tmp_path / 'gres.conf'
    path.write_text(gres.format(root=host.root))
    message = (message or 'minor number 4, which no GPU the driver attached has \\(minor numbers 0, 1, 2, 3\\)')
    with pytest.raises(GresError, match=message.format(root=host.root)):
        job_gpu_indexes([4], 'gpu07', str(path), host.root)


def test_without_the_drivers_entries_gpu_n_is_dev_nvidia_n_as_the_release_takes_it(shuffled, tmp_path):
    # A container without /proc/driver/nvidia: the release stops the holders of /dev/nvidiaN for
    # GPU N, so the job's node (nvidia3, place 0) is released as GPU 3.
    host, path = shuffled
    indexes, note = job_gpu_indexes([0], 'gpu07', path, str(tmp_path))
    assert indexes == [3]
    assert note.endswith('(%s/proc/driver/nvidia/gpus cannot be read: GPU N taken to be /dev/nvidiaN, as the release '
                         'takes it)' % tmp_path)


def test_no_gres_conf_is_an_error_naming_it(tmp_path):
    with pytest.raises(GresError, match='cannot read %s/gres.conf \\(No such file or directory\\)' % tmp_path):
        job_gpu_indexes([0], 'gpu07', str(tmp_path / 'gres.conf'))


@pytest.mark.parametrize('lines, shared', [
    # gres/shard on both GPUs of the node: what Slurm's shards share, by device node.
    (['Name=shard Count=8 File={root}/dev/nvidia3', 'Name=shard Count=8 File={root}/dev/nvidia1'], [5, 7]),
    (['Name=mps Count=100 File={root}/dev/nvidia1'], [5]),
    # Without File= Slurm spreads the shares over every GPU of the node.
    (['Name=shard Count=16'], [0, 1, 2, 3, 4, 5, 6, 7]),
    (['NodeName=other Name=shard Count=16'], []),
    ([], []),
])
def test_the_gpus_slurm_shares_are_those_of_its_shard_and_mps_lines(shuffled, lines, shared):
    host, path = shuffled
    with open(path, 'a') as handle:
        handle.write(''.join(line.format(root=host.root) + '\n' for line in lines))
    # nvidia3 is minor 3, index 7; nvidia1 is minor 1, index 5.
    assert shared_gpu_indexes('gpu07', path, host.root) == shared


def test_a_shared_gpu_that_is_no_gpu_of_the_host_is_refused(shuffled):
    host, path = shuffled
    with open(path, 'a') as handle:
        handle.write('Name=shard Count=8 File=%s/dev/nvidia-uvm\n' % host.root)
    with pytest.raises(GresError, match="nvidia-uvm is not a GPU's device node"):
        shared_gpu_indexes('gpu07', path, host.root)


@pytest.fixture
def mig_host(gpuhost_factory, tmp_path):
    """GPU index 1 (minor 0) split in two 1g instances, GI 7 and GI 8; GPU index 0 is minor 1, whole."""
    host = gpuhost_factory(gpus=2, minors=[1, 0])
    host.mig(1, ['1g.18gb', '1g.18gb'])
    return host, tmp_path / 'gres.conf'


def caps(host, gi, ci=None):
    from gpusim.mig import ci_minor, gi_minor
    return '%s/dev/nvidia-caps/nvidia-cap%d' % (host.root, gi_minor(0, gi) if ci is None else ci_minor(0, gi, ci))


def test_a_mig_gres_is_its_instance_by_the_minors_of_its_caps_nodes(mig_host):
    host, path = mig_host
    # As Slurm's AutoDetect=nvml writes them (the GPU's node, the GI's and the CI's caps nodes), after a whole GPU.
    lines = ['Name=gpu Type=1g.18gb File=%s/dev/nvidia1\n' % host.root]
    lines += ['Name=gpu Type=1g.18gb MultipleFiles=%s/dev/nvidia0,%s,%s\n' % (host.root, caps(host, gi), caps(host, gi, 0)) for gi in (8, 7)]
    path.write_text(''.join(lines))
    assert job_gpu_indexes([1], 'gpu07', str(path), host.root)[0] == ['1:8:0']
    indexes, note = job_gpu_indexes([0, 2], 'gpu07', str(path), host.root)
    assert indexes == [0, '1:7:0']
    # The note names the files in at most 300 characters: a long temporary directory (a pytest-xdist
    # worker's) cuts the three paths short.
    named = printable('%s/dev/nvidia0,%s,%s' % (host.root, caps(host, 7), caps(host, 7, 0)), 300)
    assert note.endswith('2 is %s (GPU minor 0), MIG instance 1:7:0' % named), note


def test_a_gres_of_a_gpu_instances_node_alone_is_the_gpu_instance(mig_host):
    host, path = mig_host
    # As sites write it from the GI's access file (samples/mig/capabilities_access.txt), and a File= caps node.
    path.write_text('Name=gpu MultipleFiles=%s/dev/nvidia0,%s\nName=gpu File=%s\n' % (host.root, caps(host, 7), caps(host, 8)))
    assert job_gpu_indexes([0, 1], 'gpu07', str(path), host.root)[0] == ['1:7', '1:8']


@pytest.mark.parametrize('files, message', [
    ('{root}/dev/nvidia1,{gi7}', 'name no one MIG instance of one GPU'),
    ('{gi7},{gi8}', 'name no one MIG instance of one GPU'),
    ('{root}/dev/nvidia-caps/nvidia-cap999', 'caps minor 999, is no MIG instance'),
    ('{root}/dev/nvidia-caps/nvidia-cap1000', 'nvidia-cap1000 cannot be read'),
    ('{root}/dev/nvidia0,{root}/etc/passwd', 'is not named like an NVIDIA device node'),
])
def test_a_mig_gres_that_names_no_one_instance_is_refused(mig_host, files, message):
    host, path = mig_host
    os.makedirs(os.path.join(host.root, 'etc'), exist_ok=True)
    open(os.path.join(host.root, 'etc', 'passwd'), 'w').close()
    open(os.path.join(host.root, 'dev', 'nvidia-caps', 'nvidia-cap999'), 'w').close()
    named = files.format(root=host.root, gi7=caps(host, 7), gi8=caps(host, 8))
    path.write_text('Name=gpu MultipleFiles=%s,%s\n' % (named, caps(host, 7, 0)))
    with pytest.raises(GresError, match=message):
        job_gpu_indexes([0], 'gpu07', str(path), host.root)
