"""Plain ExecuTorch beside a composed program: the same backends' own partitioners listed in one
``to_edge_transform_and_lower``, as an ExecuTorch user writes it, run at every size composer's
proof ran at and judged by the same rule (``composer lower --beside-plain``).

It answers a user's first question: what does composer give that the list does not?
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.export import ExportedProgram

from composer.contract.backend_spec import Tolerance
from composer.contract.native_log import NativeLog
from composer.lower.compiler_raised import said
from composer.lower.export import untouched_copies
from composer.registry.discovery import Registry
from composer.registry.resolved import ResolvedStack
from composer.run.composition import Composition
from composer.run.inputs import sizes_to_prove
from composer.run.runtime import program_backend_ids
from composer.run.verification import expected_outputs, verify
from composer.scheduler.plans import loosest_tolerance, precision_of


@attrs.frozen
class PlainOutcome:
    """What plain ExecuTorch's list made of the model: the partitioners, and either why it
    wrote nothing or how its program did at each size (label -> None where right, else what
    went wrong)."""

    partitioners: tuple[str, ...]
    failed: str | None = None
    sizes: tuple[tuple[str, str | None], ...] = ()

    @property
    def wrong(self) -> list[tuple[str, str]]:
        return [(label, why) for label, why in self.sizes if why is not None]

    def describe(self) -> str:
        listed = f"plain ExecuTorch, [{', '.join(self.partitioners)}]"
        if self.failed is not None:
            return f"{listed}: failed, nothing written: {self.failed}"
        if not self.wrong:
            return f"{listed}: right at {_sizes(len(self.sizes))} too"
        label, why = self.wrong[0]
        return (
            f"{listed}: WRONG at {len(self.wrong)} of {_sizes(len(self.sizes))} (at {label}: {why})"
        )


def _sizes(count: int) -> str:
    return "the example" if count == 1 else f"{count} sizes"


@attrs.frozen
class _PlainPlan:
    """What judging plain's program needs of a plan: the tolerances of the backends it has
    delegates of (OpenVINO computing in bf16 on a CPU with bf16 units is held to eager in
    bf16, as in composer's own proof), and a quantized model's allowance."""

    tolerances: Mapping[str, Tolerance]
    quantization: Tolerance | None

    def tolerance(self) -> Tolerance | None:
        return loosest_tolerance(self.tolerances, self.quantization)

    def computes_in(self) -> str | None:
        return precision_of(self.tolerance())


@attrs.frozen
class _PlainProgram:
    """Plain's program, checked as composer's is (``composer.run.verification.Checkable``)."""

    buffer: bytes
    plan: _PlainPlan
    eager: torch.nn.Module
    example_inputs: tuple
    reference: torch.nn.Module
    data_files: dict[str, bytes] = attrs.field(factory=dict)


def beside_plain(
    composition: Composition, program: ExportedProgram, resolved: ResolvedStack
) -> PlainOutcome:
    """Lower ``program`` with ``resolved``'s backends' own partitioners, in its order, and run
    the program at every size ``composition`` was proven at."""
    copies = untouched_copies(program)
    fresh = copies() if copies is not None else program
    partitioners = _partitioners(resolved.registry, resolved.backends, fresh, composition)
    names = tuple(type(p).__name__ for p in partitioners)
    if len(partitioners) < len(resolved.backends):
        return PlainOutcome(names, failed="ExecuTorch has no partitioner for some of the backends")
    try:
        buffer, data_files = _lowered(fresh, partitioners)
    except Exception as error:  # noqa: BLE001 - plain's failure is what this reports
        return PlainOutcome(names, failed=said(error))
    delegated = program_backend_ids(buffer)
    tolerances = {
        backend.name: tolerance
        for backend in resolved.backends
        if backend.spec.backend_id in delegated
        and (tolerance := composition.plan.tolerances.get(backend.name)) is not None
    }
    plain = _PlainProgram(
        buffer, _PlainPlan(tolerances, composition.plan.quantization), composition.eager,
        composition.example_inputs, composition.reference, data_files,
    )  # fmt: skip
    sizes = sizes_to_prove(composition.example_inputs, composition.plan.dynamic_dims)
    return PlainOutcome(names, sizes=tuple((label, _judged(plain, x)) for label, x in sizes))


def _partitioners(
    registry: Registry, backends: Sequence[Any], program: ExportedProgram, composition: Composition
) -> list:
    """Each backend's partitioners as ExecuTorch's own backend test suite lowers it alone (the
    user's partitioner for it), else the plugin's own partitioner."""
    made: list = []
    for backend in backends:
        suite = _suite_partitioners(backend.name, composition.example_inputs)
        own = registry.partitioner(backend, program) if suite is None else None
        made.extend(suite if suite is not None else [own] if own is not None else [])
    return made


@functools.cache
def _suite_flows() -> dict[str, Any]:
    # Importing every backend's tester logs (and coremltools warns of) each that cannot load
    # here, and OpenVINO's imports pytorch_tokenizers, whose C++ part logs on fd 2 as it loads
    # (on a cache hit composer has not imported it yet): not the user's business while
    # composer reads two partitioners.
    logging.disable(logging.WARNING)
    try:
        with NativeLog().capture():
            from executorch.backends.test.suite.flow import all_flows

            return all_flows()
    finally:
        logging.disable(logging.NOTSET)


def _suite_partitioners(name: str, inputs: tuple) -> list | None:
    from executorch.backends.test.harness.stages import StageType

    flow = _suite_flows().get(name)
    if flow is None or flow.quantize:
        return None
    # The tester is made only to read its lowering stage's partitioners: no stage runs, so
    # the module it holds is never called (the user's may be an ExportedProgram).
    tester = flow.tester_factory(torch.nn.Identity(), inputs)
    return list(tester._get_default_stage(StageType.TO_EDGE_TRANSFORM_AND_LOWER).partitioners)


def _lowered(program: ExportedProgram, partitioners: list) -> tuple[bytes, dict[str, bytes]]:
    from executorch.exir import to_edge_transform_and_lower

    # OpenVINO's partitioner prints each op it does not support: composer's own lowering keeps
    # that off the terminal, and so does this one.
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        edge = to_edge_transform_and_lower(program, partitioner=partitioners)
        written = edge.to_executorch()
        return written.buffer, {n: bytes(c) for n, c in (written._tensor_data or {}).items()}


def _judged(plain: _PlainProgram, inputs: tuple) -> str | None:
    """None where plain's program is right on ``inputs``, else what it did."""
    try:
        result = verify(plain, inputs, expected_outputs(plain, inputs))
    except Exception as error:  # noqa: BLE001 - a run-time failure is plain's result
        return f"failed at run time: {said(error)}"
    if result.ok:
        return None
    return f"max |plain - eager| = {result.max_abs_error:.3g}; {result.verdict.describe()}"
