# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Both readers against NVIDIA's real nvidia-smi and libnvidia-ml.so.1, from Debian's non-free
component (bookworm: 535, trixie: 550), on a host with no NVIDIA kernel driver: they must give
the collection's clear "driver not loaded" and "library not found" errors.

Nothing is installed: apt runs with a private configuration (its own sources list naming
non-free, its own state and cache directories) to download the two packages, and dpkg -x
unpacks them under a cache directory keyed by suite and version, so reruns need one
`apt-get update` at most. The mirror is the one this host's own apt sources name.

Skipped, with the reason, when not root, without apt or a Debian mirror in the sources, or when
the mirror cannot be reached; under CI (CI set in the environment) those are failures instead.

NVIDIA's library, run as root, creates the device node /dev/nvidiactl (195, 255) when it finds
none, and leaves it: afterwards the collection would see a node no driver registered. So the
binaries run in a private mount namespace whose /dev is a tmpfs of their own (null, zero, full,
random, urandom), gone when they exit; the host's /dev is left as it was found.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ctypes.util
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.smi import SmiReader, SmiRunner

SUITES = {'bookworm': '535.', 'trixie': '550.'}
PACKAGES = ('nvidia-smi', 'libnvidia-ml1')
KEYRING = '/usr/share/keyrings/debian-archive-keyring.gpg'
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# In the checkout (scripts/test.sh sets XDG_CACHE_HOME to .build/cache), not in ~/.cache.
CACHE = os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.join(REPO, '.build', 'cache'),
                     'gpuops-nvidia', 'real-nvidia')

# Runs "$@" with a /dev of its own: a tmpfs in a private mount namespace, holding the usual
# character devices only.
PRIVATE_DEV = """
set -e
mount -t tmpfs -o mode=0755,nosuid,size=64k gpuops-private-dev /dev
for node in null:3 zero:5 full:7 random:8 urandom:9; do
  mknod -m 0666 "/dev/${node%%:*}" c 1 "${node#*:}"
done
exec "$@"
"""


def private_dev(argv):
    """argv run in a private mount namespace with a /dev of its own (see PRIVATE_DEV)."""
    if not shutil.which('unshare'):
        unavailable('unshare (util-linux) is needed to give the real binaries a /dev of their own')
    return ['unshare', '--mount', '--propagation', 'private', 'bash', '-c', PRIVATE_DEV, 'private-dev'] + list(argv)


def smi_in_private_dev(directory, smi):
    """A program named nvidia-smi in directory that runs the real smi with a /dev of its own."""
    wrapper = os.path.join(str(directory), 'nvidia-smi')
    with open(wrapper, 'w') as handle:
        handle.write('#!/bin/sh\nexec %s "$@"\n' % ' '.join("'%s'" % arg for arg in private_dev([smi])))
    os.chmod(wrapper, 0o755)
    return wrapper


def device_nodes(dev='/dev'):
    """The NVIDIA device nodes in dev."""
    return sorted(name for name in os.listdir(dev) if name.startswith('nvidia'))


@pytest.fixture(autouse=True)
def host_dev_left_as_found():
    """Every test here leaves the host's /dev as it found it."""
    before = device_nodes()
    yield
    assert device_nodes() == before, 'the real NVIDIA binaries changed the host /dev'


def unavailable(reason):
    if os.environ.get('CI'):
        pytest.fail('real NVIDIA binaries are needed in CI: %s' % reason)
    pytest.skip(reason)


def debian_mirror(etc='/etc/apt'):
    """(uri, signed_by) of the first Debian archive this host's apt sources name, or None."""
    files = sorted(glob.glob(os.path.join(etc, 'sources.list.d', '*.sources')))
    files += sorted(glob.glob(os.path.join(etc, 'sources.list.d', '*.list')))
    files.append(os.path.join(etc, 'sources.list'))
    for path in files:
        try:
            with open(path) as f:
                text = f.read()
        except (IOError, OSError):
            continue
        if path.endswith('.sources'):
            for stanza in re.split(r'\n\s*\n', text):
                fields = dict((key.lower(), value.strip()) for key, value in
                              re.findall(r'^([A-Za-z-]+):[ \t]*(.*)$', stanza, re.M))
                suites = fields.get('suites', '').split()
                if fields.get('enabled', 'yes') != 'no' and 'deb' in fields.get('types', '').split() and \
                        any(suite in SUITES or suite.split('-')[0] in SUITES for suite in suites) and \
                        not any(suite.endswith('-security') for suite in suites):
                    return fields['uris'].split()[0], fields.get('signed-by')
        else:
            for line in text.splitlines():
                match = re.match(r'^\s*deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)', line)
                if match and match.group('suite') in SUITES:
                    signed = re.search(r'signed-by=(\S+)', match.group('opts') or '')
                    return match.group('uri'), signed.group(1) if signed else None
    return None


class PrivateApt:
    """apt-get and apt-cache with their own sources list, state and cache, for one suite."""

    def __init__(self, directory, uri, suite, signed_by):
        self.directory = directory
        for sub in ('etc/sources.list.d', 'state/lists/partial', 'cache/archives/partial'):
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        with open(os.path.join(directory, 'etc', 'sources.list'), 'w') as f:
            f.write('deb [signed-by=%s] %s %s non-free\n' % (signed_by, uri, suite))
        open(os.path.join(directory, 'state', 'status'), 'a').close()
        self.options = []
        for key, value in (('Dir::Etc::sourcelist', 'etc/sources.list'), ('Dir::Etc::sourceparts', 'etc/sources.list.d'),
                           ('Dir::State', 'state'), ('Dir::State::status', 'state/status'), ('Dir::Cache', 'cache')):
            self.options += ['-o', '%s=%s' % (key, os.path.join(directory, value))]
        self.options += ['-o', 'APT::Sandbox::User=root', '-o', 'Acquire::Languages=none',
                         '-o', 'Acquire::http::Timeout=20', '-o', 'Acquire::Retries=1']

    def run(self, tool, *args, **kwargs):
        return subprocess.run([tool, '-q'] + self.options + list(args), capture_output=True, text=True,
                              timeout=120, check=False, **kwargs)

    def candidate(self, package):
        proc = self.run('apt-cache', 'show', '--no-all-versions', package)
        match = re.search(r'^Version: (\S+)', proc.stdout, re.M)
        return match.group(1) if match else None


def fetch(suite):
    """{'version', 'smi', 'lib_dir'}: the suite's nvidia-smi and libnvidia-ml.so.1, unpacked."""
    if os.geteuid() != 0:
        unavailable('fetching the real NVIDIA packages with a private apt configuration needs root')
    if not (shutil.which('apt-get') and shutil.which('apt-cache') and shutil.which('dpkg')):
        unavailable('apt-get, apt-cache or dpkg is not installed')
    mirror = debian_mirror()
    if mirror is None:
        unavailable('no Debian archive in /etc/apt/sources.list(.d): nowhere to fetch nvidia-smi from')
    uri, signed_by = mirror
    signed_by = signed_by or KEYRING
    apt = PrivateApt(os.path.join(CACHE, suite, 'apt'), uri, suite, signed_by)
    update = apt.run('apt-get', 'update')
    versions = dict((package, apt.candidate(package)) for package in PACKAGES)
    if not all(versions.values()):
        cached = sorted(glob.glob(os.path.join(CACHE, suite, SUITES[suite] + '*', 'done')))
        if cached:
            # Offline: the last version unpacked will do.
            return _unpacked(os.path.dirname(cached[-1]))
        unavailable('apt-get update against %s %s non-free failed: %s' % (
            uri, suite, (update.stderr.strip() or update.stdout.strip())[-300:]))
    version = versions['nvidia-smi']
    target = os.path.join(CACHE, suite, version)
    if not os.path.exists(os.path.join(target, 'done')):
        work = tempfile.mkdtemp(dir=os.path.join(CACHE, suite))
        try:
            proc = apt.run('apt-get', 'download', *['%s=%s' % item for item in sorted(versions.items())], cwd=work)
            debs = glob.glob(os.path.join(work, '*.deb'))
            if proc.returncode != 0 or len(debs) != len(PACKAGES):
                unavailable('apt-get download failed: %s' % proc.stderr.strip()[-300:])
            for deb in debs:
                subprocess.run(['dpkg', '-x', deb, os.path.join(work, 'root')], check=True, timeout=60)
            with open(os.path.join(work, 'done'), 'w') as f:
                json.dump(versions, f)
            shutil.rmtree(target, ignore_errors=True)
            os.rename(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return _unpacked(target)


def _unpacked(target):
    found = {}
    for directory, dummy, names in os.walk(os.path.join(target, 'root')):
        for name in names:
            if name == 'nvidia-smi' and os.access(os.path.join(directory, name), os.X_OK):
                found['smi'] = os.path.join(directory, name)
            elif name == 'libnvidia-ml.so.1':
                found['lib_dir'] = directory
    assert set(found) == {'smi', 'lib_dir'}, 'the packages did not hold nvidia-smi and libnvidia-ml.so.1: %s' % found
    with open(os.path.join(target, 'done')) as f:
        found['version'] = json.load(f)['nvidia-smi']
    return found


@pytest.fixture(scope='module', params=sorted(SUITES))
def real_nvidia(request):
    return dict(fetch(request.param), suite=request.param)


def test_the_mirror_comes_from_the_hosts_sources(tmp_path):
    (tmp_path / 'sources.list.d').mkdir()
    (tmp_path / 'sources.list.d' / 'debian.sources').write_text(
        'Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n'
        'Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n'
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n')
    (tmp_path / 'sources.list.d' / 'other.list.disabled').write_text('deb http://elsewhere.example/ bookworm main\n')
    assert debian_mirror(str(tmp_path)) == ('http://mirror.example/debian', '/usr/share/keyrings/debian-archive-keyring.gpg')
    (tmp_path / 'sources.list.d' / 'debian.sources').unlink()
    (tmp_path / 'sources.list').write_text('# old style\ndeb [arch=amd64] http://old.example/debian trixie main\n')
    assert debian_mirror(str(tmp_path)) == ('http://old.example/debian', None)


def test_private_dev_keeps_what_is_made_there_from_the_host(tmp_path):
    if os.geteuid() != 0:
        pytest.skip('mounting a /dev of its own needs root')
    marker = 'nvidia-gpuops-test-%d' % os.getpid()
    proc = subprocess.run(private_dev(['sh', '-c', 'mknod -m 0666 /dev/%s c 195 255 && ls /dev' % marker]),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == sorted(['full', marker, 'null', 'random', 'urandom', 'zero'])
    assert not os.path.exists('/dev/' + marker)


def test_nvidia_smi_reader_says_the_driver_is_not_loaded(real_nvidia, monkeypatch, tmp_path):
    assert real_nvidia['version'].startswith(SUITES[real_nvidia['suite']])
    monkeypatch.setenv('LD_LIBRARY_PATH', real_nvidia['lib_dir'])
    with pytest.raises(GpuopsError) as info:
        SmiReader(SmiRunner(smi_in_private_dev(tmp_path, real_nvidia['smi']))).read()
    assert str(info.value).startswith(
        "nvidia-smi exited with 9 (the NVIDIA driver is not loaded): NVIDIA-SMI has failed because it "
        "couldn't communicate with the NVIDIA driver.")


def test_nvidia_smi_reader_says_the_library_is_missing(real_nvidia, monkeypatch, tmp_path):
    if ctypes.util.find_library('nvidia-ml'):
        pytest.skip('this host has a libnvidia-ml of its own')
    monkeypatch.delenv('LD_LIBRARY_PATH', raising=False)
    with pytest.raises(GpuopsError) as info:
        SmiReader(SmiRunner(smi_in_private_dev(tmp_path, real_nvidia['smi']))).read()
    assert str(info.value).startswith(
        "nvidia-smi exited with 12 (the NVML shared library could not be found or loaded): NVIDIA-SMI "
        "couldn't find libnvidia-ml.so library in your system.")


NVML_PROBE = '''
import sys
from ansible_collections.gpuops.nvidia.plugins.module_utils._common import GpuopsError
from ansible_collections.gpuops.nvidia.plugins.module_utils._gpu.nvml import NvmlReader
try:
    NvmlReader(10.0).open()
except GpuopsError as exc:
    print(exc)
    sys.exit(0)
print('NVML opened')
sys.exit(1)
'''


@pytest.mark.parametrize('with_library, expected', [
    (True, 'NVML could not be initialised (error 9, the NVIDIA driver is not loaded): Driver Not Loaded'),
    (False, 'NVML could not be initialised (error 12, the NVML shared library could not be found or loaded)'),
])
def test_nvml_reader_through_nvidia_ml_py(real_nvidia, with_library, expected):
    pytest.importorskip('pynvml')
    if not with_library and ctypes.util.find_library('nvidia-ml'):
        pytest.skip('this host has a libnvidia-ml of its own')
    env = dict(os.environ)
    env.pop('LD_LIBRARY_PATH', None)
    if with_library:
        env['LD_LIBRARY_PATH'] = real_nvidia['lib_dir']
    collections = os.path.join(REPO, '.build', 'collections')
    env['PYTHONPATH'] = collections + os.pathsep + env.get('PYTHONPATH', '')
    proc = subprocess.run(private_dev([sys.executable, '-c', NVML_PROBE]), capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().startswith(expected)
