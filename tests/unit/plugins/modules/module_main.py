# -*- coding: utf-8 -*-
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A module's main() run in-process, as the module tests run it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_main(capsys, module, params):
    """module.main() with params; the JSON it printed, with warning_text: its warnings and what was
    written to stderr (once controller code is imported, as other tests do, ansible-core shows
    module warnings through its display on stderr instead of returning them)."""
    with patch_module_args(params):
        with pytest.raises(SystemExit):
            module.main()
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    result['warning_text'] = json.dumps(result.get('warnings', [])) + captured.err
    return result
