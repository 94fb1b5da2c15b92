"""The operators the runtime that will run a program has kernels for, so lowering can leave
undelegated only what that runtime can run.

The pip runtime links ExecuTorch's portable, optimized and custom-op kernels, which cover most
ops ``to_executorch`` gives an out variant, not all (1.5.1 has none for
``_adaptive_avg_pool3d``, ``adaptive_max_pool3d`` or ``avg_pool3d``;
``portable_lib._get_operator_names()`` lists what it has). It answers ``None`` there: the proof
finds a missing kernel when it runs the program. A C++ runtime built with fewer (bench/et_runtime's runner links the portable
kernels alone: no ``aten::linear.out``) says which it has: ``composer_et_runner
--list-kernels``, asked once per build of the runner ``$COMPOSER_ET_RUNNER`` names.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess

from composer.contract import environment

RUNNER_VARIABLE = environment.ET_RUNNER


@functools.cache
def _listed(runner: str, modified: float) -> frozenset[str] | None:
    try:
        done = subprocess.run(
            [runner, "--list-kernels"], check=False, capture_output=True, text=True, timeout=60
        )
    except OSError:
        return None
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return frozenset(json.loads(line).get("kernels", ()))
    return None  # a runner built before --list-kernels: it cannot say


def runner_kernels(runner: str | os.PathLike) -> frozenset[str] | None:
    """The operators ``runner`` has kernels for (``"aten::add.out"``, ...); ``None`` where it
    cannot say."""
    runner = os.fspath(runner)
    try:
        modified = os.path.getmtime(runner)
    except OSError:
        return None
    return _listed(runner, modified)


def target_kernels() -> frozenset[str] | None:
    """The kernels of the runtime composer's proof runs programs in: the runner
    ``$COMPOSER_ET_RUNNER`` names, else the pip runtime (``None``: whatever has an out
    variant)."""
    runner = environment.executable(RUNNER_VARIABLE, environment.RUNNER_HOW)
    return runner_kernels(runner) if runner else None


def kernels_digest(kernels: frozenset[str] | None) -> str:
    """What of the target runtime a cached program depends on."""
    if kernels is None:
        return "pip runtime"
    return hashlib.sha256("\n".join(sorted(kernels)).encode()).hexdigest()[:16]
