# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The hook's virtual environment on a node, run there by the role slurm_hooks (the script
module) with the node's own Python:

    install-venv.py --venv DIR --require NAME==VERSION... [--find-links DIR | --index-url URL] [--check]

Creates the virtual environment when it is not there, and installs each requirement whose
installed version is not the pinned one (nothing when all are). A Python without ensurepip
(Debian and Ubuntu without python3-venv) gets a virtual environment without pip, and pip from
the wheel directory. Prints one JSON line: changed, and the versions installed; an error is one
line on stderr, status 1. --check says what would change and changes nothing."""

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys

# The versions of the requirements installed in the virtual environment, by their names.
READ_VERSIONS = '''
import json, sys
from importlib import metadata
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
'''


class InstallError(Exception):
    """What stops the install, in one line for the operator."""


def parse_args(argv):
    parser = argparse.ArgumentParser(description='the gpu_reset hook\'s virtual environment')
    parser.add_argument('--venv', required=True)
    parser.add_argument('--require', action='append', default=[], help='NAME==VERSION')
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--find-links', help='a directory of wheels: no index is asked')
    source.add_argument('--index-url')
    parser.add_argument('--check', action='store_true')
    return parser.parse_args(argv)


def pins(requirements):
    """{name: version} of NAME==VERSION requirements."""
    wanted = {}
    for requirement in requirements:
        name, sep, version = requirement.partition('==')
        if not sep or not name or not version:
            raise InstallError('requirement %r is not NAME==VERSION' % requirement)
        wanted[name.strip()] = version.strip()
    return wanted


def run(argv, what):
    """Run argv; its last line of output in the error when it fails."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError('%s failed: %s' % (what, exc))
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise InstallError('%s failed (rc %d): %s' % (what, proc.returncode, lines[-1] if lines else 'no output'))
    return proc.stdout


def venv_python(venv):
    return os.path.join(venv, 'bin', 'python')


def create(venv, find_links):
    """The virtual environment, with pip from ensurepip or, without it, from the wheel directory."""
    if importlib.util.find_spec('ensurepip') is not None:
        run([sys.executable, '-m', 'venv', venv], 'creating the virtual environment %s' % venv)
        return
    wheel = pip_wheel(find_links)
    run([sys.executable, '-m', 'venv', '--without-pip', venv], 'creating the virtual environment %s' % venv)
    # A wheel is a zip that Python runs: pip installs itself from its own wheel, offline.
    run([venv_python(venv), os.path.join(wheel, 'pip'), 'install', '--quiet', '--disable-pip-version-check',
         '--no-index', '--find-links', find_links, 'pip'], 'installing pip from %s' % wheel)


def pip_wheel(find_links):
    """The newest pip wheel of find_links, for a Python without ensurepip."""
    wheels = sorted(glob.glob(os.path.join(find_links, 'pip-*.whl'))) if find_links else []
    if not wheels:
        raise InstallError(
            '%s has no ensurepip to put pip into a virtual environment: install python3-venv (Debian, Ubuntu), or '
            'give a wheel directory with a pip wheel (slurm_hooks_pip_wheels)' % sys.executable)
    return wheels[-1]


def installed(venv, names):
    """{name: version or None} in the virtual environment."""
    return json.loads(run([venv_python(venv), '-c', READ_VERSIONS] + list(names),
                          'reading the packages of %s' % venv))


def install(venv, wanted, args):
    argv = [venv_python(venv), '-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--no-input']
    if args.find_links:
        argv += ['--no-index', '--find-links', args.find_links]
    elif args.index_url:
        argv += ['--index-url', args.index_url]
    argv += ['%s==%s' % item for item in sorted(wanted.items())]
    run(argv, 'pip install in %s' % venv)


def main(argv=None):
    args = parse_args(argv)
    try:
        wanted = pins(args.require)
        result = ensure(args, wanted)
    except InstallError as exc:
        sys.stderr.write('%s\n' % exc)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


def ensure(args, wanted):
    """The virtual environment with the pinned versions: what changed (or would, with --check)."""
    venv = os.path.abspath(args.venv)
    if not os.path.exists(venv_python(venv)):
        if args.check:
            return {'changed': True, 'created': True, 'installed': {}}
        create(venv, args.find_links)
    found = installed(venv, wanted)
    missing = dict((name, version) for name, version in wanted.items() if found.get(name) != version)
    if missing and not args.check:
        install(venv, missing, args)
        found = installed(venv, wanted)
        wrong = sorted(name for name in wanted if found.get(name) != wanted[name])
        if wrong:
            raise InstallError('after pip install, %s has %s' % (venv, ', '.join(
                '%s %s (not %s)' % (name, found.get(name), wanted[name]) for name in wrong)))
    return {'changed': bool(missing), 'installed': found}


if __name__ == '__main__':
    sys.exit(main())
