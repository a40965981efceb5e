# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The simulator recipe of the guide "The simulator, and Molecule" (docs/docsite/rst/
guide_simulator.rst; README.md links to it), run as a reader would run it (in the checkout,
nothing exported), and what the guide says it prints compared with what it prints. The recipe
works in a directory of its own under ${TMPDIR:-/tmp} and removes it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(REPO, 'docs', 'docsite', 'rst', 'guide_simulator.rst')
SECTION = 'Run the playbook against the simulator\n'
# The lines the guide shows that a run must print too: the GPUs' memory, the summary, the recap.
KEY_LINE_RE = re.compile(r'^(\s+"|\S+\s+: ok=|\d+, \d+ MiB$)')


def code_block(text, language):
    """The first ``.. code-block:: LANGUAGE`` of text, its indentation taken off."""
    match = re.search(r'^\.\. code-block:: %s\n\n((?:[ \t]+[^\n]*\n|\n)+)' % re.escape(language), text, re.M)
    assert match, 'no %s code block in %s' % (language, GUIDE)
    return textwrap.dedent(match.group(1)).strip('\n') + '\n'


def recipe():
    """(the shell block, the printed block) of the guide's simulator recipe."""
    with open(GUIDE) as handle:
        text = handle.read()
    section = text[text.index(SECTION):]
    script = code_block(section, 'bash')
    printed = code_block(section[section.index('It prints'):], 'text')
    return script, printed


def normal(line):
    """A line with its times (1.505 s) and trailing blanks left out."""
    return re.sub(r'[0-9]+\.[0-9]+ s\b', 'N s', line.rstrip())


def test_the_guide_s_shell_blocks_write_only_under_tmpdir():
    """Each of them makes its directory with mktemp -d under ${TMPDIR:-/tmp} and removes it on exit."""
    with open(GUIDE) as handle:
        text = handle.read()
    blocks = re.findall(r'^\.\. code-block:: bash\n\n((?:[ \t]+[^\n]*\n|\n)+)', text, re.M)
    assert blocks and recipe()[0] in [textwrap.dedent(block).strip('\n') + '\n' for block in blocks]
    for block in blocks:
        assert 'mktemp -d "${TMPDIR:-/tmp}/' in block, block
        assert re.search(r"trap '[^']*rm -rf ", block), block
        assert '/tmp/' not in block.replace('${TMPDIR:-/tmp}/', ''), block


def test_simulator_recipe_prints_what_the_guide_shows(tmp_path):
    script, printed = recipe()
    # Nothing that says where the collection is (ANSIBLE_HOME stays: Ansible's own files); the
    # recipe's temporary directory goes under tmp_path.
    env = dict(os.environ, ANSIBLE_NOCOLOR='1', TMPDIR=str(tmp_path))
    for name in ('ANSIBLE_COLLECTIONS_PATH', 'ANSIBLE_CONFIG', 'PYTHONPATH'):
        env.pop(name, None)
    proc = subprocess.run(['bash', '-c', script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = [normal(line) for line in proc.stdout.splitlines()]
    shown = [normal(line) for line in printed.splitlines() if KEY_LINE_RE.match(line)]
    assert len(shown) >= 10
    missing = [line for line in shown if line not in out]
    assert not missing, '%s\n--- the run printed:\n%s' % ('\n'.join(missing), proc.stdout)
    # The trap stopped the simulated hosts and removed their directory.
    assert [name for name in os.listdir(str(tmp_path)) if name.startswith('gpusim.')] == []
