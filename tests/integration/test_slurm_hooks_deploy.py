# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the role slurm_hooks installs on a node, here: its pins against requirements/constraints.txt,
README's playbook (and the Slurm guide's copy of it) against the Molecule scenario that runs it
(extensions/molecule/deploy), the virtual environment's installer on a wheel directory made here,
the collection's artifact installed with ansible-galaxy, and the role's checks of the node's
Python."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(REPO, 'roles', 'slurm_hooks')
INSTALL_VENV = os.path.join(ROLE, 'files', 'install-venv.py')
ARTIFACT = os.path.join(REPO, 'plugins', 'plugin_utils', '_collection_artifact.py')
BIN = os.path.dirname(sys.executable)


def constraints():
    with open(os.path.join(REPO, 'requirements', 'constraints.txt')) as handle:
        return dict(line.strip().split('==') for line in handle if '==' in line)


def load(*path):
    with open(os.path.join(*path)) as handle:
        return yaml.safe_load(handle)


def test_the_role_pins_the_versions_the_collection_is_tested_with():
    pins = constraints()
    defaults = load(ROLE, 'defaults', 'main.yml')
    spec = load(ROLE, 'meta', 'argument_specs.yml')['argument_specs']['main']['options']
    for variable, package in (('slurm_hooks_ansible_core_version', 'ansible-core'),
                              ('slurm_hooks_jmespath_version', 'jmespath'),
                              ('slurm_hooks_nvidia_ml_py_version', 'nvidia-ml-py')):
        assert str(defaults[variable]) == pins[package], variable
        assert str(spec[variable]['default']) == pins[package], variable


def test_every_variable_of_the_defaults_is_documented():
    defaults = load(ROLE, 'defaults', 'main.yml')
    spec = load(ROLE, 'meta', 'argument_specs.yml')['argument_specs']
    assert sorted(defaults) == sorted(spec['main']['options'])
    assert set(spec['slurm_conf']['options']) <= set(defaults)


def readme_playbook():
    with open(os.path.join(REPO, 'README.md')) as handle:
        text = handle.read()
    section = text[text.index('## Slurm'):]
    section = section[:section.index('\n## ', 1)]
    return yaml.safe_load(re.search(r'```yaml\n(.*?)```', section, re.S).group(1))


def guide_playbook():
    """The playbook of the guide "Slurm: the hooks on every GPU node" (its first yaml block)."""
    with open(os.path.join(REPO, 'docs', 'docsite', 'rst', 'guide_slurm.rst')) as handle:
        text = handle.read()
    block = re.search(r'^\.\. code-block:: yaml\n\n((?:[ \t]+[^\n]*\n|\n)+)', text, re.M).group(1)
    return yaml.safe_load(textwrap.dedent(block))


def shape(plays):
    """What each play runs, without its variables."""
    return [(play['gather_facts'], play.get('roles'), [task.get('ansible.builtin.import_role')
                                                       for task in play.get('tasks', [])]) for play in plays]


def test_readme_shows_the_playbook_the_molecule_scenario_runs():
    shown = readme_playbook()
    converge = load(REPO, 'extensions', 'molecule', 'deploy', 'converge.yml')
    assert shape(shown) == shape(converge)
    assert shown[0]['roles'] == ['gpuops.nvidia.slurm_hooks']
    assert shown[1]['tasks'][0]['ansible.builtin.import_role'] == {'name': 'gpuops.nvidia.slurm_hooks',
                                                                   'tasks_from': 'slurm_conf'}


def test_the_slurm_guide_shows_the_playbook_of_the_readme():
    assert guide_playbook() == readme_playbook()


def make_wheel(directory, name, version):
    """A pure-Python wheel of one empty module, as pip installs it."""
    dist = '%s-%s.dist-info' % (name.replace('-', '_'), version)
    path = os.path.join(str(directory), '%s-%s-py3-none-any.whl' % (name.replace('-', '_'), version))
    with zipfile.ZipFile(path, 'w') as wheel:
        wheel.writestr('%s.py' % name.replace('-', '_'), '')
        wheel.writestr(dist + '/METADATA', 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' % (name, version))
        wheel.writestr(dist + '/WHEEL', 'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
        wheel.writestr(dist + '/RECORD', '')
    return path


def install_venv(*args):
    return subprocess.run([sys.executable, INSTALL_VENV] + list(args), capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_virtual_environment_is_installed_from_a_wheel_directory_once(tmp_path):
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    make_wheel(wheels, 'gpuops-fake', '1.0')
    make_wheel(wheels, 'gpuops-fake', '2.0')
    venv = str(tmp_path / 'venv')
    checked = install_venv('--venv', venv, '--require', 'gpuops-fake==1.0', '--find-links', str(wheels), '--check')
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)['changed'] is True and not os.path.exists(venv)
    first = install_venv('--venv', venv, '--require', 'gpuops-fake==1.0', '--find-links', str(wheels))
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {'changed': True, 'installed': {'gpuops-fake': '1.0'}}
    again = install_venv('--venv', venv, '--require', 'gpuops-fake==1.0', '--find-links', str(wheels))
    assert json.loads(again.stdout) == {'changed': False, 'installed': {'gpuops-fake': '1.0'}}
    pinned = install_venv('--venv', venv, '--require', 'gpuops-fake==2.0', '--find-links', str(wheels))
    assert json.loads(pinned.stdout) == {'changed': True, 'installed': {'gpuops-fake': '2.0'}}


def test_a_version_the_wheels_lack_fails_in_one_line(tmp_path):
    wheels = tmp_path / 'wheels'
    wheels.mkdir()
    make_wheel(wheels, 'gpuops-fake', '1.0')
    proc = install_venv('--venv', str(tmp_path / 'venv'), '--require', 'gpuops-fake==3.0', '--find-links', str(wheels))
    assert proc.returncode == 1
    assert proc.stderr.startswith('pip install in %s failed (rc 1): ' % (tmp_path / 'venv'))
    assert 'gpuops-fake==3.0' in proc.stderr and proc.stderr.count('\n') == 1, proc.stderr


def test_the_artifact_of_this_checkout_installs_with_ansible_galaxy(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    made = subprocess.run([sys.executable, ARTIFACT, '--source', REPO, '--output', str(out)], capture_output=True,
                          text=True, timeout=300, check=True)
    tarball = json.loads(made.stdout)['artifact']
    # As the role runs it on a node: nothing else on the path that has the collection.
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / 'ansible-home'), ANSIBLE_COLLECTIONS_PATH=str(tmp_path / 'c'))
    env.pop('PYTHONPATH', None)
    subprocess.run([os.path.join(BIN, 'ansible-galaxy'), 'collection', 'install', '--offline', '--force', '-p',
                    str(tmp_path / 'c'), tarball], capture_output=True, text=True, timeout=300, check=True, env=env,
                   cwd=str(tmp_path))
    installed = tmp_path / 'c' / 'ansible_collections' / 'gpuops' / 'nvidia'
    assert os.access(str(installed / 'roles' / 'slurm_hooks' / 'files' / 'prolog.sh'), os.X_OK)
    assert not (installed / 'tests').exists() and not (installed / '.git').exists()
    # The installed copy packs again to the same bytes (the node's artifact does not change).
    again = tmp_path / 'again'
    again.mkdir()
    repacked = json.loads(subprocess.run([sys.executable, ARTIFACT, '--source', str(installed), '--output',
                                          str(again)], capture_output=True, text=True, check=True).stdout)['artifact']
    with open(tarball, 'rb') as first, open(repacked, 'rb') as second:
        assert first.read() == second.read()


DEPLOY = """\
- name: Install the hooks
  hosts: localhost
  gather_facts: false
  roles:
    - gpuops.nvidia.slurm_hooks
"""


def run_role(tmp_path, **role_vars):
    playbook = tmp_path / 'deploy.yml'
    playbook.write_text(DEPLOY)
    values = dict(slurm_hooks_dir=str(tmp_path / 'hooks'), slurm_hooks_venv=str(tmp_path / 'venv'),
                  slurm_hooks_log=str(tmp_path / 'hook.log'))
    values.update(role_vars)
    (tmp_path / 'vars.json').write_text(json.dumps(values))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_HOME=str(tmp_path / 'ansible-home'))
    return subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', 'localhost,', '-c', 'local', str(playbook),
                           '-e', '@%s' % (tmp_path / 'vars.json')], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_a_python_too_old_for_the_pinned_ansible_core_is_named(tmp_path):
    old = tmp_path / 'python3.9'
    old.write_text('#!/bin/sh\necho 3.9.18\n')
    old.chmod(0o755)
    proc = run_role(tmp_path, slurm_hooks_python_interpreter=str(old))
    assert proc.returncode == 2
    assert ('slurm_hooks_python_interpreter %s is Python 3.9.18; ansible-core 2.19.14 needs Python 3.11 or newer: '
            'set slurm_hooks_python_interpreter to one (EL8, EL9: dnf install python3.11, then /usr/bin/python3.11)'
            % old) in proc.stdout, proc.stdout
    assert not (tmp_path / 'venv').exists() and not (tmp_path / 'hooks').exists()


def test_an_existing_python_that_cannot_import_the_collection_is_named(tmp_path):
    proc = run_role(tmp_path, slurm_hooks_install_runtime=False, slurm_hooks_python=sys.executable,
                    slurm_hooks_collections_path=str(tmp_path / 'nowhere'))
    assert proc.returncode == 2
    assert ("the hook's Python %s cannot import the collection gpuops.nvidia from %s: ModuleNotFoundError"
            % (sys.executable, tmp_path / 'nowhere')) in proc.stdout, proc.stdout
    assert not (tmp_path / 'hooks').exists()


def test_a_fleet_brake_the_hook_would_refuse_is_refused_by_the_role_in_the_hook_s_words(tmp_path):
    """The role checks slurm_hooks_max_drained and slurm_hooks_max_drain_rate by the rule the hook's
    runner checks them by (_brake.py, through the filter gpu_reset_brake_problem), before installing anything."""
    proc = run_role(tmp_path, slurm_hooks_max_drained='10 %')
    assert proc.returncode == 2
    assert "slurm_hooks_max_drained: '10 %' is neither a number of nodes nor a percentage (N%)" in proc.stdout, proc.stdout
    proc = run_role(tmp_path, slurm_hooks_max_drain_rate='0/10m')
    assert proc.returncode == 2
    assert "slurm_hooks_max_drain_rate: '0/10m' must be at least 1 node within 1 s to 7 days" in proc.stdout, proc.stdout
    assert not (tmp_path / 'venv').exists() and not (tmp_path / 'hooks').exists()


SLURM_CONF_PLAYBOOK = '''
- name: Write the slurm.conf lines of the hooks
  hosts: all
  gather_facts: false
  tasks:
    - name: The lines
      ansible.builtin.include_role:
        name: gpuops.nvidia.slurm_hooks
        tasks_from: slurm_conf
'''


@pytest.mark.parametrize('version, split', [('25.05.2', True), ('slurm 26.05.0', True), ('24.11.5', False),
                                            ('slurm-wlm 22.05.8', False)])
def test_slurm_25_05_and_later_also_get_prolog_and_epilog_timeouts(tmp_path, version, split):
    """PrologTimeout and EpilogTimeout take precedence over PrologEpilogTimeout where set (Slurm 25.05
    and later): the lines set them too, to the same seconds; earlier releases do not know them."""
    playbook = tmp_path / 'lines.yml'
    playbook.write_text(SLURM_CONF_PLAYBOOK)
    lines = tmp_path / 'slurm-hooks.conf'
    (tmp_path / 'vars.json').write_text(json.dumps(dict(
        slurm_hooks_dir=str(tmp_path / 'hooks'), slurm_hooks_slurm_conf=str(lines), slurm_hooks_slurm_version=version,
        slurm_hooks_scontrol=shutil.which('false'), slurm_hooks_prolog_epilog_timeout=150)))
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', ANSIBLE_LOCALHOST_WARNING='0', ANSIBLE_INVENTORY_UNPARSED_WARNING='0',
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_HOME=str(tmp_path / 'ansible-home'))
    proc = subprocess.run([os.path.join(BIN, 'ansible-playbook'), '-i', 'localhost,', '-c', 'local', str(playbook),
                           '-e', '@%s' % (tmp_path / 'vars.json')], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = dict(re.findall(r'(?m)^([A-Za-z]+)=(.*)$', lines.read_text()))
    assert written['PrologEpilogTimeout'] == written['BatchStartTimeout'] == '150'
    assert (written.get('PrologTimeout'), written.get('EpilogTimeout')) == (('150', '150') if split else (None, None))
