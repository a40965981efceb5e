# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What each module ships to a host on every call: its AnsiballZ payload, built by ansible-core's
own modify_module (as a task builds it), opened, and counted.

Prints, per module of the collection: the collection's module_utils in the payload (files,
lines, bytes), the whole payload's size as sent (the wrapper with its base64 zip), and, with
--files, the module_utils each one ships. With --compare-with DIR, the same modules of another
checkout (an earlier version) beside them.

Usage: python3 benchmarks/payload.py [--files] [--compare-with DIR] [MODULE]...
Needs ansible-core importable by this Python (the repository's .venv).
"""

from __future__ import absolute_import, division, print_function

import argparse
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UTILS = 'ansible_collections/gpuops/nvidia/plugins/module_utils/'


def collection_root(checkout):
    """A directory holding ansible_collections/gpuops/nvidia -> checkout (made when needed)."""
    root = tempfile.mkdtemp(prefix='gpuops-payload-')
    os.makedirs(os.path.join(root, 'ansible_collections', 'gpuops'))
    os.symlink(os.path.abspath(checkout), os.path.join(root, 'ansible_collections', 'gpuops', 'nvidia'))
    return root


def payload(name, checkout):
    """{utils: {path: (lines, bytes)}, sent: bytes} of module name of checkout, as AnsiballZ builds it."""
    from ansible.executor.module_common import modify_module
    from ansible.template import Templar
    from ansible.parsing.dataloader import DataLoader

    path = os.path.join(checkout, 'plugins', 'modules', name + '.py')
    built = modify_module(module_name='gpuops.nvidia.' + name, module_path=path, module_args={},
                          templar=Templar(loader=DataLoader()),
                          task_vars={'ansible_python_interpreter': '/usr/bin/python3'})
    data = built.b_module_data
    # The zip travels base64-encoded inside the wrapper (its only long run of base64).
    match = re.search(rb'([A-Za-z0-9+/]{1000,}={0,2})', data)
    if match is None:
        return {'utils': {}, 'sent': len(data)}  # a module of no module_utils (the action's docs) is sent as it is
    archive = zipfile.ZipFile(io.BytesIO(base64.b64decode(match.group(1))))
    utils = {}
    for info in archive.infolist():
        if info.filename.startswith(UTILS) and info.filename.endswith('.py'):
            text = archive.read(info)
            utils[info.filename[len(UTILS):]] = (text.count(b'\n'), len(text))
    return {'utils': utils, 'sent': len(data)}


def modules_of(checkout):
    return sorted(entry[:-3] for entry in os.listdir(os.path.join(checkout, 'plugins', 'modules'))
                  if entry.endswith('.py') and not entry.startswith('_'))


def measure(checkout, names):
    root = collection_root(checkout)
    sys.path.insert(0, root)
    os.environ['ANSIBLE_COLLECTIONS_PATH'] = root
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
    finder = _AnsibleCollectionFinder(paths=[root])
    finder._install()
    try:
        return dict((name, payload(name, os.path.join(root, 'ansible_collections', 'gpuops', 'nvidia')))
                    for name in names if name in modules_of(checkout))
    finally:
        finder._remove()
        sys.path.remove(root)
        shutil.rmtree(root, ignore_errors=True)


def line(label, figures):
    if figures is None:
        return '  %-10s -' % label
    utils = figures['utils']
    return '  %-10s module_utils %2d files %6d lines %8d bytes; payload sent %8d bytes' % (
        label, len(utils), sum(lines for lines, dummy in utils.values()),
        sum(size for dummy, size in utils.values()), figures['sent'])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('modules', nargs='*')
    parser.add_argument('--files', action='store_true', help='list the module_utils each module ships')
    parser.add_argument('--compare-with', metavar='DIR', help='another checkout, measured beside this one')
    parser.add_argument('--json-of', metavar='DIR', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json_of:
        # One checkout per process: the collection loader keeps the first one it finds.
        print(json.dumps(measure(args.json_of, args.modules or modules_of(args.json_of))))
        return
    names = args.modules or modules_of(REPO)
    this = measure(REPO, names)
    other = None
    if args.compare_with:
        other = json.loads(subprocess.check_output([sys.executable, os.path.abspath(__file__), '--json-of',
                                                    args.compare_with] + names))
    for name in names:
        print(name)
        print(line('this', this.get(name)))
        if other is not None:
            print(line('compared', other.get(name)))
        if args.files and name in this:
            for path, (lines, size) in sorted(this[name]['utils'].items()):
                print('      %-28s %5d lines' % (path, lines))


if __name__ == '__main__':
    main()
