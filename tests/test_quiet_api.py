"""The Python API is as quiet as the command line: a first ``composer.compose`` in a fresh
process shows none of torchao's, torch's or upstream FutureWarnings' lines, yet composer's own
warnings; ``debug=True`` lets the upstream lines through; the user's warning filters and
logger levels are theirs again after the call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import composer
from composer.contract import environment

DEBUG_FROM_HERE = "--- debug from here ---"

# One process, two composes: the first quiet, with a pin that names no node (a StalePinWarning,
# composer's own), the second with debug=True. Lowered each time (cache=False): a program read
# from the cache makes no noise to hide.
SCRIPT = f"""
import logging, sys, warnings

import composer, torch
from composer.models import zoo

model, inputs = zoo.load("mlp")
filters, stderr = list(warnings.filters), sys.stderr
levels = [logging.getLogger(n).level for n in ("torchao", "torch.utils._pytree")]
composer.compose(model, "xnnpack", inputs, cache=False,
                 never={{"xnnpack": ["node:no_such_node"]}})
restored = (list(warnings.filters) == filters, sys.stderr is stderr,
            [logging.getLogger(n).level for n in ("torchao", "torch.utils._pytree")] == levels)
print("restored", restored)
print({DEBUG_FROM_HERE!r}, file=sys.stderr, flush=True)
composer.compose(model, "xnnpack", inputs, cache=False, debug=True)
"""

# What upstream libraries print on a first compose: torchao's optional kernels, torch's
# _pytree notice about an enum torchao registers, and FutureWarnings from torch's pytree.
UPSTREAM = ("torchao", "_pytree", "FutureWarning", "DeprecationWarning")


def test_a_first_compose_shows_composers_warnings_and_upstream_lines_only_with_debug():
    env = {k: v for k, v in os.environ.items() if k not in ("COMPOSER_DEBUG", "PYTHONWARNINGS")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "restored (True, True, True)" in done.stdout, done.stdout
    quiet, _, debug = done.stderr.partition(DEBUG_FROM_HERE)
    assert debug, done.stderr
    chatter = [line for line in quiet.splitlines() if any(word in line for word in UPSTREAM)]
    assert chatter == [], quiet
    assert "StalePinWarning" in quiet and "node:no_such_node" in quiet, quiet
    # Nothing else: the warning's line, and the source line Python shows under it.
    others = [ln for ln in quiet.splitlines() if "StalePinWarning" not in ln and ln[:1].strip()]
    assert others == [], quiet
    assert any(word in line for line in debug.splitlines() for word in UPSTREAM), debug


def test_a_bad_composer_debug_is_one_error_naming_it(monkeypatch):
    monkeypatch.setenv(environment.DEBUG, "loud")
    with pytest.raises(composer.ComposerError, match="COMPOSER_DEBUG='loud' is not a switch"):
        composer.available_backends()
