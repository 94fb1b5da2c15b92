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
    programs = {",".join(composition.plan.backends): composition}
    notes = []
    if len(composition.plan.backends) > 1:
        for name in composition.plan.backends:
            single = compose_single(name)
            runnable, why = single.runtime_can_run()
            if runnable or runner is not None:
                programs[f"{name} alone"] = single
            else:
                notes.append(f"{name} alone: not timed, {why}")
    loaded, in_runner, errors, calls = {}, {}, {}, {}
    for label, program in programs.items():
        runnable, why = program.runtime_can_run()
        if runnable:
            loaded[label] = LoadedProgram(program.buffer)
            outputs = loaded[label].run(inputs)
        elif runner is not None:
            try:
                in_runner[label] = RunnerProgram(runner, program.buffer, program.data_files)
                outputs = in_runner[label].run(inputs)
            except ComposerError as error:
                in_runner.pop(label, None)
                notes.append(f"{label}: not timed, {first_line(error)}")
                continue
        else:
            notes.append(f"{label}: not timed, {why}")
            continue
        _ok, errors[label] = compare(outputs, expected)
        calls[label] = program.plan.delegate_calls
    candidates = {"eager": lambda: eager(*inputs)}
    candidates.update({label: program.timed_call(inputs) for label, program in loaded.items()})
    # The program asked for and eager get every call; a backend alone, added for comparison,
    # as many as fit in two seconds (XNNPACK alone on timm's nf_resnet26: 0.72 s a call).
    counts = {label: runs for label in candidates}
    for label in loaded:
        if label.endswith(" alone"):
            counts[label] = runs_within(call_seconds(candidates[label]), runs)
            if counts[label] < runs:
                notes.append(
                    f"{label}: timed {counts[label]} calls, as many as fit in "
                    f"{latency.SECONDS_PER_PROGRAM:g} s (at least {latency.LEAST_RUNS})"
                )
    with torch.no_grad():
        timed = interleaved(candidates, counts)
    if in_runner:
        timed.update(runner_interleaved(in_runner, inputs, runs))
        notes += [f"{label}: timed in the {cpp_runtime.EXECUTOR} ({runner})" for label in in_runner]
    rows = [ProgramLatency("eager", None, timed["eager"])]
    rows += [
        ProgramLatency(label, calls[label], timed[label], errors[label])
        for label in programs
        if label in timed
    ]
    return rows, notes
