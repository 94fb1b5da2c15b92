"""A composed program beside each backend of its stack alone, timed together in the runtime
(``composer lower --bench``).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from composer.measure.latency import Latency, interleaved
from composer.run.compare import compare
from composer.run.runtime import LoadedProgram


@attrs.frozen
class ProgramLatency:
    """One row of a latency comparison: a program, its delegate calls, its time and error."""

    program: str  # "eager", "xnnpack,openvino", "xnnpack alone"
    delegate_calls: int | None  # None for eager
    latency: Latency
    max_abs_error: float | None = None


def compare_with_singles(
    composition, compose_single: Callable[[str], object], runs: int
) -> tuple[list[ProgramLatency], list[str]]:
    """The composed program beside eager and beside each of its backends alone, interleaved.

    ``compose_single(name)`` composes the same model with that one backend. Returns the rows
    and a note for each program that could not be timed (a backend the runtime lacks).
    """
    import copy

    import torch

    inputs = composition.example_inputs
    eager = copy.deepcopy(composition.eager)
    with torch.no_grad():
        expected = eager(*inputs)
    programs = {",".join(composition.plan.backends): composition}
    notes = []
    if len(composition.plan.backends) > 1:
        for name in composition.plan.backends:
            single = compose_single(name)
            runnable, why = single.runtime_can_run()
            if runnable:
                programs[f"{name} alone"] = single
            else:
                notes.append(f"{name} alone: not timed, {why}")
    loaded, errors, calls = {}, {}, {}
    for label, program in programs.items():
        runnable, why = program.runtime_can_run()
        if not runnable:
            notes.append(f"{label}: not timed, {why}")
            continue
        loaded[label] = LoadedProgram(program.buffer)
        _ok, errors[label] = compare(loaded[label].run(inputs), expected)
        calls[label] = program.plan.delegate_calls
    candidates = {"eager": lambda: eager(*inputs)}
    candidates.update({label: program.timed_call(inputs) for label, program in loaded.items()})
    with torch.no_grad():
        timed = interleaved(candidates, runs)
    rows = [ProgramLatency("eager", None, timed["eager"])]
    rows += [ProgramLatency(label, calls[label], timed[label], errors[label]) for label in loaded]
    return rows, notes
