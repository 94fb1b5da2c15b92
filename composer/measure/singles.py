"""A composed program beside each backend of its stack alone, timed together in the runtime
(``composer lower --bench``); a program the pip runtime cannot run (a Vulkan or CUDA delegate)
is timed in ExecuTorch's C++ runtime where ``$COMPOSER_ET_RUNNER`` names one, the programs
there taking turns among themselves.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from composer.contract.errors import ComposerError, first_line
from composer.measure import latency
from composer.measure.latency import Latency, call_seconds, interleaved, runs_within
from composer.measure.runner_timing import runner_interleaved
from composer.run import cpp_runtime
from composer.run.compare import compare
from composer.run.cpp_runtime import RunnerProgram
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
    runner = cpp_runtime.runner_path()
    notes: list[str] = []
    programs = _with_singles(composition, compose_single, runner, notes)
    loaded = _load(programs, inputs, expected, runner, notes)
    candidates = {"eager": lambda: eager(*inputs)}
    candidates.update({label: program.timed_call(inputs) for label, program in loaded.here.items()})
    counts = _counts(candidates, loaded.here, runs, notes)
    with torch.no_grad():
        timed = interleaved(candidates, counts)
    if loaded.in_runner:
        timed.update(runner_interleaved(loaded.in_runner, inputs, runs))
        notes += [
            f"{label}: timed in the {cpp_runtime.EXECUTOR} ({runner})" for label in loaded.in_runner
        ]
    rows = [ProgramLatency("eager", None, timed["eager"])]
    rows += [
        ProgramLatency(label, loaded.calls[label], timed[label], loaded.errors[label])
        for label in programs
        if label in timed
    ]
    return rows, notes


def _with_singles(composition, compose_single, runner: str | None, notes: list[str]) -> dict:
    """The programs to time by label: the composition, and each of its backends alone where
    a runtime here can run it (else a note says why not)."""
    programs = {",".join(composition.plan.backends): composition}
    if len(composition.plan.backends) > 1:
        for name in composition.plan.backends:
            single = compose_single(name)
            runnable, why = single.runtime_can_run()
            if runnable or runner is not None:
                programs[f"{name} alone"] = single
            else:
                notes.append(f"{name} alone: not timed, {why}")
    return programs


@attrs.define
class _Loaded:
    """The programs loaded to time, in the pip runtime (``here``) or the C++ runtime, with
    each one's delegate calls and its error against eager."""

    here: dict[str, LoadedProgram] = attrs.field(factory=dict)
    in_runner: dict[str, RunnerProgram] = attrs.field(factory=dict)
    errors: dict[str, float | None] = attrs.field(factory=dict)
    calls: dict[str, int] = attrs.field(factory=dict)


def _load(programs: dict, inputs, expected, runner: str | None, notes: list[str]) -> _Loaded:
    """Load each program where it runs (the pip runtime, else the C++ runtime) and run it once
    against eager's outputs; one that runs nowhere gets a note instead."""
    loaded = _Loaded()
    for label, program in programs.items():
        runnable, why = program.runtime_can_run()
        if runnable:
            loaded.here[label] = LoadedProgram(program.buffer)
            outputs = loaded.here[label].run(inputs)
        elif runner is not None:
            try:
                loaded.in_runner[label] = RunnerProgram(runner, program.buffer, program.data_files)
                outputs = loaded.in_runner[label].run(inputs)
            except ComposerError as error:
                loaded.in_runner.pop(label, None)
                notes.append(f"{label}: not timed, {first_line(error)}")
                continue
        else:
            notes.append(f"{label}: not timed, {why}")
            continue
        _ok, loaded.errors[label] = compare(outputs, expected)
        loaded.calls[label] = program.plan.delegate_calls
    return loaded


def _counts(candidates, here, runs: int, notes: list[str]) -> dict[str, int]:
    """Calls to time per candidate, with a note for each backend alone timed fewer."""
    # The program asked for and eager get every call; a backend alone, added for comparison,
    # as many as fit in two seconds (XNNPACK alone on timm's nf_resnet26: 0.72 s a call).
    counts = {label: runs for label in candidates}
    for label in here:
        if label.endswith(" alone"):
            counts[label] = runs_within(call_seconds(candidates[label]), runs)
            if counts[label] < runs:
                notes.append(
                    f"{label}: timed {counts[label]} calls, as many as fit in "
                    f"{latency.SECONDS_PER_PROGRAM:g} s (at least {latency.LEAST_RUNS})"
                )
    return counts
