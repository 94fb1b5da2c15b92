"""Checking a composed program: which executor runs it, and how its outputs compare with the
truth beside eager's (composer.run.accuracy).

Executors, best first: the ExecuTorch runtime, when it has every delegate's backend (XNNPACK,
OpenVINO and portable kernels in the pip wheel); ExecuTorch's C++ runner where
``$COMPOSER_ET_RUNNER`` names one; piece by piece (:mod:`composer.run.piecewise`), each
delegate in the runtime its backend's plugin supplies and the rest as the Python reference;
otherwise the Python reference alone, where each delegate runs the subgraph it was made from
(that checks the wiring, not the backend's code).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import torch

from composer.run import cpp_runtime, piecewise, remote
from composer.run.accuracy import (
    Verdict,
    eager_in_precision,
    free_copy,
    holds_nonfinite,
    judge,
    truth,
)
from composer.run.inputs import flat_inputs
from composer.run.runtime import RUNTIME, run_program, runtime_can_run, torch_mismatch
from composer.scheduler.plans import Plan


class Checkable(Protocol):
    """What verify needs of a composed program (a :class:`composer.run.composition.Composition`)."""

    buffer: bytes
    data_files: Mapping[str, bytes]
    plan: Plan
    eager: torch.nn.Module
    example_inputs: tuple

    @property
    def reference(self) -> torch.nn.Module: ...


REFERENCE = "python reference"


@attrs.frozen
class Verification:
    """How the composed program compared with the truth beside eager, and which executor ran
    it."""

    executor: str  # RUNTIME, REFERENCE, piecewise.EXECUTOR or cpp_runtime.EXECUTOR
    verdict: Verdict
    reason: str  # why this executor was chosen
    # piece by piece: where each backend's delegates ran ("TinyBackend in tiny's runtime")
    places: str = ""

    @property
    def ran_in(self) -> str:
        """The executor, and for a program run piece by piece where each delegate ran."""
        return f"{self.executor}: {self.places}" if self.places else self.executor

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    @property
    def max_abs_error(self) -> float:
        return self.verdict.max_abs_error

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "MISMATCH"
        return (
            f"{verdict}: max |composed - eager| = {self.max_abs_error:.3g}; "
            f"{self.verdict.describe()} ({self.executor}; {self.reason})"
        )


@attrs.frozen
class Expected:
    """What a program's outputs on some inputs are judged by: eager's outputs (in the precision
    a backend computes in, where it says so), and the truth beside them."""

    eager: Any
    truth: Any = None
    truth_name: str = ""
    eager_in: str = ""  # "bfloat16": eager run in a backend's lower precision
    steps: int = 0  # integer outputs may differ by this many (quantized programs)
    # the inputs held NaN or inf: what a backend makes of them, where the reference is no
    # number either, is not judged (composer.run.accuracy.judge)
    inputs_nonfinite: bool = False

    def judge(self, outputs: Any) -> Verdict:
        return judge(outputs, self.eager, self.truth, steps=self.steps,
                     truth_name=self.truth_name, eager_in=self.eager_in,
                     inputs_nonfinite=self.inputs_nonfinite)  # fmt: skip


def expected_outputs(composition: Checkable, inputs: Sequence[Any]) -> Expected:
    """Eager's outputs on ``inputs`` and the truth beside them. Raises what eager raises: a
    size eager itself refuses has nothing to compare with."""
    inputs = tuple(inputs)
    eager = eager_outputs(composition, inputs)
    plan = composition.plan
    tolerance = plan.tolerance()
    steps = tolerance.steps if tolerance is not None else 0
    reference, name = truth(composition.eager, inputs)
    # A backend computing in bf16 by design (OpenVINO on CPUs with bf16 units) is held to
    # what eager achieves in bf16, not fp32: the plan says so.
    eager, eager_in = eager_in_precision(composition.eager, inputs, eager, plan.computes_in())
    return Expected(eager, reference, name, eager_in, steps, holds_nonfinite(inputs))


def verify(
    composition: Checkable, inputs: Sequence[Any] | None = None, expected: Expected | None = None
) -> Verification:
    """Run ``composition`` with the best executor here and judge its outputs against the truth
    beside eager's (``expected``, where the caller has them). ``inputs`` are as the model takes
    them, nested or not."""
    inputs = tuple(composition.example_inputs if inputs is None else inputs)
    with torch.no_grad():
        if expected is None:
            expected = expected_outputs(composition, inputs)
        executor, reason, run = _executor(composition)
        actual = run(inputs)
    places = ""
    if executor == piecewise.EXECUTOR:
        places = ", ".join(piecewise.runtimes_here(composition.buffer)[0])
    return Verification(executor, expected.judge(actual), reason, places)


def eager_outputs(composition: Checkable, inputs: Sequence[Any]) -> Any:
    """Eager's outputs on ``inputs``, from a copy of the model: models that update buffers in
    place (a KV cache) start from the state of a freshly loaded program, however often this
    is called."""
    copied = copy.deepcopy(composition.eager)
    try:
        with torch.no_grad():
            return copied(*inputs)
    finally:
        free_copy(copied)


def _executor(composition: Checkable):
    """(executor name, why it was chosen, a function running the program on inputs)."""
    # One method of a program of several (composer.pipeline.methods) says which.
    method = getattr(composition, "method", "forward")
    agent = remote.active()
    if agent is not None:
        # `--runtime HOST:PORT`: the program runs where it deploys, not here.
        there, why, ran_in = agent.can_run(composition.buffer)
        if there:

            def run_there(inputs: Sequence[Any]) -> list:
                buffer, data_files = composition.buffer, composition.data_files
                return agent.run_program(buffer, data_files, flat_inputs(inputs), method)

            return agent.executor(ran_in), why, run_there
    can_run, reason = runtime_can_run(composition.buffer)
    if can_run:
        return (
            RUNTIME,
            reason,
            lambda inputs: run_program(composition.buffer, flat_inputs(inputs), method),
        )
    runner = cpp_runtime.runner_path()
    if runner is not None:
        # ExecuTorch's own runtime, built with the backends it was: the program as it deploys.
        why = f"{reason}; ${cpp_runtime.RUNNER_VARIABLE} names {runner}"
        return (
            cpp_runtime.EXECUTOR,
            why,
            lambda inputs: cpp_runtime.run_program(
                runner,
                composition.buffer,
                composition.data_files,
                flat_inputs(inputs),
                method=method,
            ),
        )
    where, _ = piecewise.runtimes_here(composition.buffer)
    # Piece by piece where a plugin's runtime runs a delegate the ExecuTorch runtime here lacks
    # (or that runtime is not for this torch); a delegate no runtime has runs as its subgraph.
    supplied = any(piecewise.plugin_runtime(b) for b in piecewise.program_backend_ids(
        composition.buffer))  # fmt: skip
    if (supplied or torch_mismatch()) and where:
        unavailable = piecewise.unavailable_runtimes(composition.buffer)
        if not unavailable:
            why = f"{reason}: each delegate ran in its backend's runtime, any other as its subgraph"
            # A fresh module per verify: it holds the loaded delegates and its own buffer state.
            module = piecewise.piecewise_module(composition)
            elsewhere = sorted({name for _, name in module.meta["in_runtime"]})
            if elsewhere:
                why += f" (in {', '.join(elsewhere)})"
            in_python = module.meta["in_python"]
            if in_python:
                why += f" ({len(in_python)} ran as subgraphs: {in_python[0][1]})"
            return piecewise.EXECUTOR, why, lambda inputs: module(*inputs)
        reason = f"{reason}, and {'; '.join(unavailable.values())}"
    return REFERENCE, reason, lambda inputs: copy.deepcopy(composition.reference)(*inputs)
