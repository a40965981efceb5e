# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The collection's artifact for the nodes (plugin_utils/_collection_artifact.py), on trees and
tarballs made here."""

import hashlib
import io
import json
import os
import tarfile

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _collection_artifact as artifact


def installed_tree(root, namespace='gpuops', name='nvidia', version='1.2.3'):
    """An installed copy as ansible-galaxy leaves it: MANIFEST.json, FILES.json and the files."""
    files = {'README.md': b'readme\n', 'roles/slurm_hooks/files/prolog.sh': b'#!/bin/sh\n'}
    entries = [{'name': '.', 'ftype': 'dir'}, {'name': 'roles', 'ftype': 'dir'},
               {'name': 'roles/slurm_hooks', 'ftype': 'dir'}, {'name': 'roles/slurm_hooks/files', 'ftype': 'dir'}]
    for path, data in files.items():
        full = root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data)
        entries.append({'name': path, 'ftype': 'file', 'chksum_type': 'sha256',
                        'chksum_sha256': hashlib.sha256(data).hexdigest(), 'format': 1})
    (root / 'roles/slurm_hooks/files/prolog.sh').chmod(0o755)
    (root / 'FILES.json').write_text(json.dumps({'files': entries, 'format': 1}))
    (root / 'MANIFEST.json').write_text(json.dumps({'collection_info': {
        'namespace': namespace, 'name': name, 'version': version}, 'format': 1}))
    return root


def test_an_installed_copy_is_packed_with_the_files_it_lists(tmp_path):
    root = installed_tree(tmp_path / 'nvidia')
    (root / 'stray.pyc').write_bytes(b'not listed')
    (tmp_path / 'out').mkdir()
    path, version = artifact.artifact(str(root), str(tmp_path / 'out'))
    assert (os.path.basename(path), version) == ('gpuops-nvidia-1.2.3.tar.gz', '1.2.3')
    with tarfile.open(path) as tar:
        members = {member.name: member for member in tar.getmembers()}
        assert list(members) == ['MANIFEST.json', 'FILES.json', 'roles', 'roles/slurm_hooks',
                                 'roles/slurm_hooks/files', 'README.md', 'roles/slurm_hooks/files/prolog.sh']
        assert members['roles/slurm_hooks/files/prolog.sh'].mode == 0o755
        assert members['README.md'].mode == 0o644
        assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
        assert tar.extractfile('README.md').read() == b'readme\n'


def test_the_same_files_pack_to_the_same_bytes(tmp_path):
    """So that copying the artifact to a node again changes nothing."""
    root = installed_tree(tmp_path / 'nvidia')
    digests = []
    for out in ('a', 'b'):
        (tmp_path / out).mkdir()
        os.utime(root / 'README.md', (1000 + len(digests), 1000 + len(digests)))
        path, _version = artifact.artifact(str(root), str(tmp_path / out))
        with open(path, 'rb') as handle:
            digests.append(hashlib.sha256(handle.read()).hexdigest())
    assert digests[0] == digests[1]


def test_a_tarball_of_this_collection_is_used_as_it_is(tmp_path):
    tarball = tmp_path / 'given.tar.gz'
    manifest = json.dumps({'collection_info': {'namespace': 'gpuops', 'name': 'nvidia', 'version': '2.0.0'}}).encode()
    with tarfile.open(str(tarball), 'w:gz') as tar:
        info = tarfile.TarInfo('MANIFEST.json')
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    assert artifact.artifact(str(tarball), str(tmp_path)) == (str(tarball), '2.0.0')


@pytest.mark.parametrize('make, said', [
    (lambda tmp: installed_tree(tmp / 'other', namespace='community', name='general'),
     'is not the collection gpuops.nvidia'),
    (lambda tmp: tmp, 'is neither a collection tarball nor a collection'),
    (lambda tmp: (tmp / 'x.tar.gz').write_bytes(b'not a tarball') and tmp / 'x.tar.gz',
     'is not a collection artifact'),
])
def test_anything_else_is_refused_in_one_line(tmp_path, capsys, make, said):
    source = make(tmp_path)
    (tmp_path / 'out').mkdir()
    assert artifact.main(['--source', str(source), '--output', str(tmp_path / 'out')]) == 1
    err = capsys.readouterr().err
    assert said in err and err.count('\n') == 1, err
    assert os.listdir(str(tmp_path / 'out')) == []
