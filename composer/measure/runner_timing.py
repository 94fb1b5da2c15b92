"""Timing candidates in ExecuTorch's C++ runtime, where ``$COMPOSER_ET_RUNNER`` names one: the
runtime the program deploys to, so that measured placement ranks programs as it will run them.

Hosted timing (``composer.run.piecewise``: CUDA delegates as their .so in libtorch, XNNPACK in
the torch-free runtime, the glue in Python) ranked them otherwise on the H100: for a GRU cell
then a wide head it chose ``cuda,xnnpack``, 440 us in the C++ runtime, where XNNPACK alone takes
176 us (bench/RESULTS.md, "In ExecuTorch's C++ runtime on the H100").

The runner times its own calls (one process a turn: the program loaded, warmed up, then called
``runs`` times), and the candidates take turns, in rounds whose order reverses, as
``latency.interleaved`` has them take turns in one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from composer.measure.latency import Latency, agree
from composer.run.cpp_runtime import RunnerProgram

ROUNDS = 2  # turns of each candidate; the order reverses every other one
WARMUP = 3


def runner_interleaved(
    programs: Mapping[str, RunnerProgram],
    inputs: Sequence[Any],
    runs: int,
    rounds: int = ROUNDS,
    tolerance: float = 0.10,
) -> dict[str, Latency]:
    """Each program's latency over ``runs`` calls in the runner, in ``rounds`` turns each;
    ``settled`` says whether the last two turns' fastest calls agreed within ``tolerance``."""
    names = list(programs)
    times: dict[str, list[float]] = {name: [] for name in names}
    fastest: dict[str, list[float]] = {name: [] for name in names}
    per_round = max(1, runs // rounds)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            seconds = programs[name].report(inputs, per_round, WARMUP)["seconds"]
            times[name] += seconds
            fastest[name].append(min(seconds))
    return {
        name: Latency.of(
            times[name],
            settled=len(fastest[name]) < 2
            or agree(fastest[name][-1], fastest[name][-2], tolerance),
        )
        for name in names
    }
