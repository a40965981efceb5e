# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE and should only be used by this collection. Breaking
# changes can occur at any time.

"""The collection as an artifact that ansible-galaxy installs on a node, made on the controller
by the role slurm_hooks from the copy that is running (or a given tarball):

    python _collection_artifact.py --source ROOT_OR_TARBALL --output DIR

- a tarball (ansible-galaxy collection build's): checked to be gpuops.nvidia, used as it is;
- an installed copy (MANIFEST.json, FILES.json): its files as FILES.json lists them, packed;
- a source tree (galaxy.yml): built with ansible-galaxy collection build (build_ignore decides
  what goes in), then packed the same way.

The packed artifact is the same bytes for the same files (members in FILES.json's order, owner
root, no time stamps), so that copying it to a node again changes nothing. Prints one JSON
line (artifact, version); an error is one line on stderr, status 1. Standard library only: it
runs with the controller's Python, by path, before the collection is importable anywhere."""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

NAMESPACE, NAME = 'gpuops', 'nvidia'


class ArtifactError(Exception):
    """What stops the artifact, in one line for the operator."""


def collection_info(manifest, where):
    """MANIFEST.json's collection_info, checked to be this collection."""
    info = manifest.get('collection_info') if isinstance(manifest, dict) else None
    if not isinstance(info, dict) or (info.get('namespace'), info.get('name')) != (NAMESPACE, NAME):
        raise ArtifactError('%s is not the collection %s.%s' % (where, NAMESPACE, NAME))
    return info


def from_tarball(path):
    """A given artifact: its version, once its MANIFEST.json says it is this collection."""
    try:
        with tarfile.open(path, 'r:gz') as tar:
            manifest = json.load(tar.extractfile('MANIFEST.json'))
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise ArtifactError('%s is not a collection artifact (ansible-galaxy collection build): %s' % (path, exc))
    return path, collection_info(manifest, path)['version']


def read_json(path):
    try:
        with open(path, 'rb') as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise ArtifactError('cannot read %s: %s' % (path, exc))


def member(root, name):
    """The tar entry of root/name: owner root, a mode of 0644 or 0755, no time (ansible-galaxy
    writes each file anew, and a build dates MANIFEST.json and FILES.json with its own time)."""
    path = os.path.join(root, name)
    info = tarfile.TarInfo(name)
    stat = os.lstat(path)
    if os.path.isdir(path):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif os.path.isfile(path) and not os.path.islink(path):
        info.size, info.mode = stat.st_size, 0o755 if stat.st_mode & 0o100 else 0o644
    else:
        raise ArtifactError('%s is neither a file nor a directory' % path)
    return info


def pack(root, output):
    """root (MANIFEST.json, FILES.json and the files FILES.json lists) as output/NS-NAME-VERSION.tar.gz."""
    info = collection_info(read_json(os.path.join(root, 'MANIFEST.json')), os.path.join(root, 'MANIFEST.json'))
    files = read_json(os.path.join(root, 'FILES.json')).get('files', [])
    names = ['MANIFEST.json', 'FILES.json'] + [entry['name'] for entry in files if entry.get('name') not in ('.', '')]
    artifact = os.path.join(output, '%s-%s-%s.tar.gz' % (NAMESPACE, NAME, info['version']))
    with open(artifact, 'wb') as raw, gzip.GzipFile(filename='', mode='wb', fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode='w', format=tarfile.GNU_FORMAT) as tar:
        for name in names:
            entry = member(root, name)
            if entry.isdir():
                tar.addfile(entry)
                continue
            with open(os.path.join(root, name), 'rb') as handle:
                tar.addfile(entry, handle)
    return artifact, info['version']


def build(root, output):
    """A source tree, built by ansible-galaxy (the Python running this one's), unpacked and packed."""
    work = tempfile.mkdtemp(prefix='gpuops-build-', dir=output)
    try:
        proc = subprocess.run([sys.executable, '-m', 'ansible.cli.galaxy', 'collection', 'build', '--force',
                               '--output-path', work, root], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=300, check=False)
        built = [name for name in os.listdir(work) if name.endswith('.tar.gz')]
        if proc.returncode != 0 or len(built) != 1:
            lines = proc.stdout.strip().splitlines() or ['no output']
            raise ArtifactError('ansible-galaxy collection build %s failed: %s' % (root, lines[-1]))
        tree = os.path.join(work, 'tree')
        with tarfile.open(os.path.join(work, built[0]), 'r:gz') as tar:
            extract(tar, tree)
        return pack(tree, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extract(tar, tree):
    # The data filter (Python 3.12, and later 3.8-3.11 releases) refuses links and paths that leave tree.
    if hasattr(tarfile, 'data_filter'):
        tar.extractall(tree, filter='data')
    else:
        tar.extractall(tree)


def artifact(source, output):
    """(path, version) of the artifact for source: a tarball, an installed copy or a source tree."""
    if os.path.isfile(source):
        return from_tarball(source)
    if os.path.isfile(os.path.join(source, 'MANIFEST.json')):
        return pack(source, output)
    if os.path.isfile(os.path.join(source, 'galaxy.yml')):
        return build(source, output)
    raise ArtifactError('%s is neither a collection tarball nor a collection (no MANIFEST.json, no galaxy.yml)'
                        % source)


def main(argv=None):
    parser = argparse.ArgumentParser(description='the collection as an artifact for ansible-galaxy on a node')
    parser.add_argument('--source', required=True)
    parser.add_argument('--output', required=True)
    args = parser.parse_args(argv)
    try:
        path, version = artifact(os.path.abspath(args.source), os.path.abspath(args.output))
    except ArtifactError as exc:
        sys.stderr.write('%s\n' % exc)
        return 1
    print(json.dumps({'artifact': path, 'version': version}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
