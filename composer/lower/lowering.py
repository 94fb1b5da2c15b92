"""Lowering a resolved stack into an ExecuTorch program: partitions reused from the cache,
``to_executorch``, and what lowering made besides the bytes (``Lowered``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import torch
from torch.export import ExportedProgram

from composer.contract.errors import ComposerError
from composer.contract.op_names import op_name
from composer.lower.cache import Store
from composer.lower.double_scales import doubled_scales
from composer.lower.serializable_outputs import outputs_made_serializable
from composer.registry.resolved import ResolvedStack
from composer.scheduler.plans import QUANTIZED_OPS, Plan

if TYPE_CHECKING:
    from executorch.exir import EdgeProgramManager, ExecutorchProgramManager


def with_backend_facts(plan: Plan, resolved) -> Plan:
    """The plan with what each backend declared about tolerances and its compiler library."""
    return attrs.evolve(
        plan,
        tolerances={b.name: b.spec.tolerance for b in resolved if b.spec.tolerance is not None},
        libraries={b.name: b.spec.library for b in resolved if b.spec.library},
        safer_options={b.name: dict(b.spec.safer_options) for b in resolved
                       if b.spec.safer_options},
        safer_for={b.name: b.spec.safer_for for b in resolved if b.spec.safer_for},
    )  # fmt: skip


@attrs.frozen
class Lowered:
    """What lowering made besides the bytes: ExecuTorch's program managers and the reference."""

    buffer: bytes
    data_files: dict[str, bytes]
    plan: Plan
    program: ExecutorchProgramManager
    edge: EdgeProgramManager
    reference: torch.nn.Module
    # Every partition came from the cache or went into it: lowering again gives these bytes
    # (AOTInductor's autotuning alone would not).
    repeatable: bool = False
    # The lowered edge program as it was before to_executorch, which rewrites it in place;
    # kept only inside ``keeping_unwritten``.
    unwritten: ExportedProgram | None = None


_KEEP_UNWRITTEN: ContextVar[bool] = ContextVar("keep_unwritten", default=False)


@contextlib.contextmanager
def keeping_unwritten() -> Iterator[None]:
    """Lowerings inside keep a copy of their edge program from before ``to_executorch``
    (``Lowered.unwritten``): a method composed and proven alone goes into a program of several
    methods as it is, not lowered a second time."""
    token = _KEEP_UNWRITTEN.set(True)
    try:
        yield
    finally:
        _KEEP_UNWRITTEN.reset(token)


def lower_program(
    program,
    resolved: ResolvedStack,
    progress,
    folder: Path | None,
    jobs: int,
    again: Callable[[], ExportedProgram] | None = None,
) -> Lowered:
    """Lower ``program`` with the resolved stack, reusing lowered partitions from ``folder``
    (``None``: no cache), ``jobs`` processes lowering them; ``again`` as for ``lower_in_order``."""
    edge, result, repeatable = lower_edge(program, resolved, progress, folder, jobs, again)
    # Built before to_executorch, which rewrites the edge program in place (buffer copies).
    reference = edge.exported_program().module()
    unwritten = copy.deepcopy(edge.exported_program()) if _KEEP_UNWRITTEN.get() else None
    executorch_program, data_files = written(edge, f"after lowering with {list(result.backends)}")
    return Lowered(
        buffer=executorch_program.buffer,
        data_files=data_files,
        plan=result,
        program=executorch_program,
        edge=edge,
        reference=reference,
        repeatable=repeatable,
        unwritten=unwritten,
    )


def written(edge: EdgeProgramManager, when: str) -> tuple[ExecutorchProgramManager, dict]:
    """``edge.to_executorch()`` and its .ptd data files; a failure is a ComposerError saying
    ``when`` it happened."""
    if _left_quantized(edge):
        _load_quantized_kernels()
        for method in edge.methods:
            doubled_scales(edge.exported_program(method))
    for method in edge.methods:
        outputs_made_serializable(edge.exported_program(method))
    try:
        with torch.no_grad():
            program = edge.to_executorch()
    except Exception as error:
        raise ComposerError(
            f"to_executorch failed {when}: {type(error).__name__}: {error}"
            + _portable_quantize_hint(edge, error)
        ) from error
    # ExecutorchProgramManager exposes the .ptd data only as a private attribute.
    return program, {name: bytes(cord) for name, cord in (program._tensor_data or {}).items()}


def _left_quantized(edge: EdgeProgramManager) -> list[str]:
    """The quantize/dequantize nodes no delegate took, which portable kernels are to run."""
    return [
        node.name
        for method in edge.methods
        for node in edge.exported_program(method).graph.nodes
        if node.op == "call_function" and op_name(node).startswith(QUANTIZED_OPS)
    ]


@functools.cache
def _load_quantized_kernels() -> None:
    """ExecuTorch's portable kernels for ``quantized_decomposed`` ops, as its docs have users
    load them: the runtime has the kernels, but ``to_executorch`` finds their out variants
    only once this library registered them ("Missing out variants" otherwise). Arm's
    quantizer loads it too, so without this a program lowered beside it would differ."""
    import executorch.kernels.quantized  # noqa: F401  (loads libquantized_ops_aot_lib)


def _portable_quantize_hint(edge: EdgeProgramManager, error: Exception) -> str:
    """What to do when quantize/dequantize nodes were left to portable kernels that have no
    out variant for them (torchao's ops; ``quantized_decomposed``'s where ExecuTorch's
    quantized kernels library did not load): no backend of the stack took the quantized ops
    they wrap."""
    if "Missing out variants" not in str(error) or not any(
        namespace.rstrip(".") + "::" in str(error) for namespace in QUANTIZED_OPS
    ):
        return ""
    left = _left_quantized(edge)
    shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
    return (
        f". No backend of the stack took the quantize/dequantize nodes {shown}, and ExecuTorch's "
        "portable kernels cannot run them: put a backend that takes this quantization (xnnpack "
        "for XNNPACKQuantizer's) in the stack, or quantize the model for the stack "
        "(composer.quantize)."
    )


def lower_edge(
    program,
    resolved: ResolvedStack,
    progress,
    folder: Path | None,
    jobs: int,
    again: Callable[[], ExportedProgram] | None = None,
) -> tuple[EdgeProgramManager, Plan, bool]:
    """The lowered edge program before ``to_executorch``, its plan, and whether every
    partition came from the cache or went into it (lowering again gives the same bytes)."""
    # executorch.exir takes seconds to import, and a program from the cache needs none of it.
    from composer.lower.partition_cache import reusing
    from composer.lower.priority import lower_in_order

    lowering = resolved.lowering_backends()
    store = None if folder is None else Store(folder, "partition")
    # A compiler's report (Vela prints its network summary) is a log: on stdout it would run
    # into what composer writes there, `composer lower`'s table or `plan --json`.
    with reusing(lowering, store, progress, jobs) as reuse, contextlib.redirect_stdout(sys.stderr):
        edge, result = lower_in_order(program, resolved, progress, again)
    return (
        edge,
        with_backend_facts(result, resolved.backends),
        store is not None and reuse.unstored == 0,
    )
