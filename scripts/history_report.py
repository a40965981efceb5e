# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Print what GPU history files say, per node and GPU, the worst first (the filter
gpuops.nvidia.gpu_reset_history_report's table, for files already copied off the hosts).

Usage: python3 scripts/history_report.py [NODE=]FILE...
  NODE=FILE names the node of a file; a FILE alone is named by its path. For a fleet, the playbook
  gpuops.nvidia.history_report reads the files on the hosts and prints the same table.
Needs ansible-core and the collection importable (the repository's .venv, with scripts/lib.sh's
link_collection), as any of the collection's code.
"""

from __future__ import absolute_import, division, print_function

import sys

# Bigger than any history the collection writes (100 events for each of 256 GPUs, and the node's).
MAX_BYTES = 64 * 1024 * 1024


def main(argv):
    if not argv or argv[0] in ('-h', '--help'):
        sys.stdout.write(__doc__)
        return 0 if argv else 2
    try:
        from ansible_collections.gpuops.nvidia.plugins.plugin_utils._history_report import Unreadable, lines, report
    except ImportError as exc:
        sys.stderr.write('history_report: cannot import the collection (%s): run it with the Python that has '
                         'ansible-core, the collection on its path (. scripts/lib.sh; link_collection)\n' % exc)
        return 2
    histories = {}
    for argument in argv:
        node, dummy, path = argument.rpartition('=') if '=' in argument else (argument, '', argument)
        try:
            with open(path, 'rb') as handle:
                histories[node] = handle.read(MAX_BYTES).decode('utf-8', 'replace')
        except OSError as exc:
            histories[node] = Unreadable('%s: %s' % (path, exc.strerror))
    sys.stdout.write('\n'.join(lines(report(histories))) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
