"""A compose that succeeds keeps Inductor's autotuning chatter off the terminal:
the tracebacks it logs for candidate kernels that do not fit, its per-kernel benchmarking
line, and torchao's SyntaxWarnings; ``--debug`` shows them."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest

from composer.contract import quiet

# Inductor prints its benchmarking line from this file; a line compiled under its name is
# what the terminal sees when Inductor prints it.
SELECT_ALGORITHM = os.path.join("site-packages", "torch", "_inductor", "select_algorithm.py")
BENCHMARKING = "SingleProcess AUTOTUNE benchmarking takes 1.56 seconds for 6 choices"


def _autotune_chatter() -> None:
    try:
        raise RuntimeError(
            "OutOfResources: shared memory, Required: 262144, Hardware limit: 232448"
        )
    except RuntimeError:
        logging.getLogger("torch._inductor.select_algorithm").exception(
            "Runtime error during autotuning"
        )
    printer = compile(f"print({BENCHMARKING!r}, file=sys.stderr)", SELECT_ALGORITHM, "exec")
    exec(printer, {"sys": sys})  # noqa: S102 - a print made from Inductor's file name


@pytest.mark.parametrize("debug", [False, True])
def test_inductors_autotuning_chatter_is_shown_only_with_debug(debug, capfd, caplog):
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet.upstream_quieted(debug):
            _autotune_chatter()
            warnings.warn_explicit("invalid escape sequence", SyntaxWarning, "torchao/x.py", 1)
    # Logged records reach every handler (the terminal's, pytest's) or none.
    assert ("OutOfResources" in caplog.text) == debug, caplog.text
    assert (BENCHMARKING in capfd.readouterr().err) == debug
    assert bool(shown) == debug, shown


def test_composers_own_lines_still_show(capfd, caplog):
    with quiet.upstream_quieted(False):
        print("composer: wrote m.pte", file=sys.stderr)
        logging.getLogger("torch.fx.experimental.symbolic_shapes").error("a real error")
    assert "composer: wrote m.pte" in capfd.readouterr().err
    assert "a real error" in caplog.text
