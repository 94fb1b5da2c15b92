"""Timing candidates in ExecuTorch's C++ runtime, where ``$COMPOSER_ET_RUNNER`` names one: the
runtime the program deploys to, so that measured placement ranks programs as it will run them.

Hosted timing (``composer.run.aoti_host``: CUDA delegates as their .so in libtorch, XNNPACK in
the torch-free runtime, the glue in Python) ranked them otherwise on the H100: for a GRU cell
then a wide head it chose ``cuda,xnnpack``, 440 us in the C++ runtime, where XNNPACK alone takes
176 us (bench/RESULTS.md, "In ExecuTorch's C++ runtime on the H100").

The runner times its own calls (one process a turn: the program loaded, warmed up, then called
``runs`` times), and the candidates take turns, in rounds whose order reverses, as
``latency.interleaved`` has them take turns in one process.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from composer.contract.errors import ComposerError
from composer.lower.atomic import ptd_name
from composer.measure.latency import Latency, agree
from composer.run import cpp_runtime

ROUNDS = 2  # turns of each candidate; the order reverses every other one
WARMUP = 3


class RunnerProgram:
    """A composition written where the runner can load it (a folder kept while this lives)."""

    def __init__(self, runner: str, composition: Any) -> None:
        self.runner = runner
        self._folder = tempfile.TemporaryDirectory(prefix="composer_timed_")
        self.pte = os.path.join(self._folder.name, "program.pte")
        with open(self.pte, "wb") as out:
            out.write(composition.buffer)
        self.data_files = []
        for name, data in composition.data_files.items():
            self.data_files.append(os.path.join(self._folder.name, ptd_name(name)))
            with open(self.data_files[-1], "wb") as out:
                out.write(data)

    def times(self, inputs: Sequence[Any], calls: int, warmup: int = WARMUP) -> list[float]:
        """Seconds of each of ``calls`` calls, after ``warmup``, in a freshly loaded program;
        ComposerError where the runner fails."""
        try:
            report = cpp_runtime.run_pte_detailed(
                self.runner, self.pte, self.data_files, list(inputs), repeats=calls,
                warmup=warmup,
            )  # fmt: skip
        except cpp_runtime.RunnerError as error:
            raise ComposerError(
                f"{cpp_runtime.EXECUTOR} ({self.runner}) failed: {error}"
            ) from error
        return list(report["seconds"])

    def run(self, inputs: Sequence[Any]) -> None:
        """One call: whether it runs here, outside the timing."""
        self.times(inputs, 1, warmup=0)


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
            seconds = programs[name].times(inputs, per_round)
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
