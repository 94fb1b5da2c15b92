"""Stacking backends in priority order through ExecuTorch's own ``to_edge_transform_and_lower``,
with composer's partitioners; a clear ComposerError when ExecuTorch fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs
import torch
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.program._program import _default_decomposition_table
from torch.export import ExportedProgram

from composer.contract.backend_spec import BackendSpec, safer_options_change
from composer.contract.errors import ComposerError, PluginError, PreprocessFailed
from composer.contract.machine import failed_twice, machine_error
from composer.lower.compiler_raised import CompilerRaised, said
from composer.lower.export import parameters_written, parameters_written_error
from composer.lower.kernel_gaps import PASSES as KERNEL_GAP_PASSES
from composer.lower.pending_symbols import pending_symbols_set_aside
from composer.lower.runtime_kernels import target_kernels
from composer.lower.size_reads import sizes_per_reader
from composer.lower.widened import widened
from composer.registry.asking import telling
from composer.registry.resolved import ResolvedStack
from composer.scheduler.build import build_plan
from composer.scheduler.dynamic_dims import dynamic_dims
from composer.scheduler.kept_whole import KeptWholeButLeft
from composer.scheduler.origins import origin_name
from composer.scheduler.partitioner import ComposerPartitioner, PartitionRecord, SharedLowering
from composer.scheduler.plans import Plan, describe_dynamic_dims
from composer.scheduler.preserved import unsaid_preservation_warnings
from composer.scheduler.quantized import output_tolerance
from composer.scheduler.schedule import PrioritySchedule


def lower_in_order(
    program: ExportedProgram,
    resolved: ResolvedStack,
    progress: Callable[[str], None] | None = None,
    again: Callable[[], ExportedProgram] | None = None,
) -> tuple[EdgeProgramManager, Plan]:
    """:func:`_lower_in_order`, a plugin slow to answer any question of it named where
    ``progress`` goes: ExecuTorch asks which ops to keep whole before any backend partitions."""
    with telling(progress):
        return _lower_in_order(program, resolved, progress, again)


def _lower_in_order(
    program: ExportedProgram,
    resolved: ResolvedStack,
    progress: Callable[[str], None] | None = None,
    again: Callable[[], ExportedProgram] | None = None,
) -> tuple[EdgeProgramManager, Plan]:
    """Lower ``program`` with ``resolved``'s backends in order (its stand-ins lower to a
    stand-in) and its stack, whose options have their defaults filled in.

    ``again`` gives a program no lowering has touched, equal to ``program``, for a second
    attempt: a backend's lowering may change the program it is given (OpenVINO's deletes
    non-persistent buffers from it). ``None`` lowers ``program`` again, which is safe only
    where every backend lowers to a stand-in."""
    # Which nodes a backend keeps whole but then no backend takes (a pin, a minimum partition
    # size) shows only once the last backend has partitioned the edge program: those that
    # ExecuTorch's own check would refuse are decomposed and the program lowered again. Each
    # attempt decomposes at least one more.
    decomposed: dict[str, dict[str, str]] = {}  # origin -> backend that left it -> why
    gone: set[str] = set()  # their names, which pins may name
    tried: set[str] = set()  # ops decomposed after ExecuTorch's decomposition failed
    while True:
        try:
            return _lower_once(program, resolved, progress, decomposed, gone)
        except DecompositionFailed as failed:
            # An op kept whole for a backend can break ExecuTorch's retrace of the others'
            # decompositions (SDPA kept for cuda after XNNPACK's pass took the
            # clone before a view). Decompose one kept op at a time, the backends after the
            # first first, until the program traces; else the refusal names what was tried.
            op = next((op for op in failed.kept if op not in tried), None)
            if op is None or len(tried) >= MAX_DECOMPOSITION_TRIES:
                raise failed.refusal(tried) from failed
            tried.add(op)
            if again is not None:
                program = again()
            why = f"ExecuTorch's decomposition failed with it kept whole: {failed.happened}"
            for origin in failed.kept[op]:
                decomposed.setdefault(origin, {})[DECOMPOSITION] = why
            if progress is not None:
                progress(f"ExecuTorch's decomposition failed with {op} kept whole "
                         f"({failed.happened}); lowering again with it decomposed")  # fmt: skip
        except KeptWholeButLeft as left:
            if all(origin in decomposed for origin, _ in left.nodes.values()):
                raise
            if again is not None:
                program = again()
            gone |= left.nodes.keys()
            for origin, by_backend in left.nodes.values():
                decomposed.setdefault(origin, {}).update(by_backend)
            if progress is not None:
                progress(f"decomposing {', '.join(sorted(left.nodes))}: kept whole for a "
                         "backend, taken by none; lowering again")  # fmt: skip


def _lower_once(
    program: ExportedProgram,
    resolved: ResolvedStack,
    progress: Callable[[str], None] | None,
    decomposed: Mapping[str, Mapping[str, str]],
    gone: set[str],
) -> tuple[EdgeProgramManager, Plan]:
    backends, registry, stack = list(resolved.backends), resolved.registry, resolved.stack
    stand_ins = resolved.stand_ins
    records: list[PartitionRecord] = []
    lowering = SharedLowering(
        schedule=PrioritySchedule(stack.never, stack.consolidates, gone),
        decomposed=decomposed,
        keep_whole=stack.keep_whole,
        kernels=None if stand_ins >= {b.name for b in backends} else target_kernels(),
    )
    partitioners = [
        ComposerPartitioner(
            backend,
            registry,
            stand_in=backend.name in stand_ins,
            on_partition=records.append,
            options=stack.options.get(backend.name),
            min_partition_size=stack.min_partition_size.get(backend.name),
            progress=progress,
            lowering=lowering,
            # A stand-in checks for its ExecuTorch backend where the backend lowers here.
            check_backend_class=(
                backend.name not in stand_ins or registry.unavailable_reason(backend) is None
            ),
        )
        for backend in backends
    ]
    lowering.seat(partitioners)
    # Inference programs: with autograd on, ExecuTorch's passes trip over in-place
    # buffer updates on tensors that require grad (plain ExecuTorch fails the same way).
    started = time.perf_counter()
    # Read before lowering, which may rewrite the program in place.
    dims, quantization = dynamic_dims(program), output_tolerance(program)
    with torch.no_grad():
        edge = _lower(program, partitioners, records, dims)
    if stack.widen_portable:
        edge, count = widened(edge)
        if progress is not None and count:
            progress(f"{count} op(s) on portable kernels computed in float32")
    if progress is not None:
        progress(f"lowered with {', '.join(b.name for b in backends)} in "
                 f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    lowered = edge.exported_program()
    plan = build_plan(lowered.graph_module, backends, records, stand_ins, lowering.schedule.edges)
    return edge, attrs.evolve(plan, dynamic_dims=dims, quantization=quantization)


def _lower(
    program: ExportedProgram,
    partitioners: list[ComposerPartitioner],
    records: list[PartitionRecord],
    dims: tuple[dict, ...] = (),
) -> EdgeProgramManager:
    try:
        with unsaid_preservation_warnings(), pending_symbols_set_aside([program]):
            return to_edge_transform_and_lower(
                program,
                transform_passes=_transform_passes(partitioners),
                partitioner=partitioners,
                # Backends keep ops whole that the edge dialect's validity check does not know.
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
            )
    except ComposerError:
        raise
    except Exception as error:
        if machine_error(error) is not None:
            # Out of memory or processes around the compiler: the machine's, not the
            # backend's, so no partition moves for it (a compiler's own call was retried).
            raise failed_twice(error, "lowering", retried=False) from error
        failure = _lowering_error(error, partitioners, records, dims, program)
        # A backend's compiler that raised is the backend's failure, and a repair moves its
        # partition; anything else may be a parameter write, which only a retrace shows.
        if not isinstance(error, CompilerRaised):
            written = parameters_written(program)
            if written:
                raise parameters_written_error(written) from error
        raise failure from error


class DecompositionFailed(ComposerError):
    """ExecuTorch's decomposition, before any backend partitioned, failed; ``kept``: the ops
    the stack kept whole that a decomposition would split, each with its nodes' origins, in
    the order to try decomposing them."""

    def __init__(self, message: str, happened: str, kept: Mapping[str, set[str]]) -> None:
        super().__init__(message)
        self.happened, self.kept = happened, dict(kept)

    def refusal(self, tried: set[str]) -> ComposerError:
        if not tried:
            return ComposerError(str(self))
        return ComposerError(
            f"ExecuTorch's to_edge_transform_and_lower failed before any backend partitioned: "
            f"{self.happened}, also with {', '.join(sorted(tried))} decomposed. Compose with "
            "fewer backends (each alone lowers where the stack did not), or report it with the "
            "model (--debug shows the traceback)."
        )


# Each try costs a decomposition of the whole program; the culprit is usually the first.
MAX_DECOMPOSITION_TRIES = 4
DECOMPOSITION = "ExecuTorch's decomposition"  # the key of such a node in ``decomposed``


def _kept_whole(
    partitioners: list[ComposerPartitioner], program: ExportedProgram | None
) -> dict[str, set[str]]:
    """The ops a backend of the stack kept whole that ExecuTorch would otherwise decompose,
    those only a backend after the first asked for first, each with its nodes' origins."""
    if program is None:
        return {}
    table = _default_decomposition_table()
    first = partitioners[0].kept_whole_ops if partitioners else frozenset()
    # What only a later backend keeps whole is what the earlier ones' passes did not expect.
    later = [op for p in partitioners[1:] for op in p.kept_whole_ops if op not in first]
    everything = [op for p in partitioners if p.asked_to_keep for op in p.asked_to_keep[0]]
    ordered = [op for op in dict.fromkeys([*later, *everything]) if op in table]
    kept: dict[str, set[str]] = {}
    for op in ordered:
        origins = {origin_name(n) for n in program.graph.nodes if n.target is op}
        if origins:
            kept[str(op)] = origins
    return kept


def _before_partitioning(
    cause: BaseException,
    happened: str,
    partitioners: list[ComposerPartitioner],
    dims: tuple[dict, ...],
    program: ExportedProgram | None,
) -> ComposerError:
    """A failure before any backend partitioned: composer's own step's, said so, or
    ExecuTorch's decomposition's, which lowering again with fewer ops kept whole may avoid."""
    own = _composer_step(cause)
    if own is not None:
        return ComposerError(
            f"composer's own step {own} failed while ExecuTorch lowered the program to its edge "
            f"dialect, before any backend partitioned: {happened}{_dims_said(dims)}. This is a "
            "bug in composer; please report it with the model (--debug shows the traceback)."
        )
    return DecompositionFailed(
        f"ExecuTorch's to_edge_transform_and_lower failed before any backend partitioned: "
        f"{happened}{_dims_said(dims)}. Run with --debug (or composer.plan) and report it "
        "with the model.",
        happened,
        _kept_whole(partitioners, program),
    )


def _composer_step(error: BaseException) -> str | None:
    """``module.function`` of the innermost composer code (a pass, a partitioner's hook) in
    ``error``'s traceback below this module, or in those of the errors it was raised from (a
    pass's error reaches here as ExecuTorch's "An error occurred when running the
    'NegativePadAsSlice' pass", raised from it); None where only ExecuTorch and torch ran."""
    package = Path(__file__).resolve().parents[1]
    step, seen = None, set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback = error.__traceback__
        while traceback is not None:
            code = traceback.tb_frame.f_code
            file = Path(code.co_filename).resolve()
            if file.is_relative_to(package) and file != Path(__file__).resolve():
                module = ".".join(file.relative_to(package.parent).with_suffix("").parts)
                step = f"{module}.{code.co_name}"
            traceback = traceback.tb_next
        error = error.__cause__
    return step


def _dims_said(dims: tuple[dict, ...]) -> str:
    # A failure on a dynamic program is often about its dims: say which, as the plan would.
    return f" (the program's dynamic dims: {describe_dynamic_dims(dims)})" if dims else ""


def _transform_passes(partitioners: list[ComposerPartitioner]) -> list:
    """The rewrites before partitioning: the kernel gaps', the first backend's own
    (``composer_rewrites``: ops it declines, in forms it takes), and a size per reader where a
    backend of the stack takes tensors only (``BackendSpec.sizes_from_shapes``)."""
    passes = list(KERNEL_GAP_PASSES)
    if partitioners:
        first = partitioners[0]
        passes.extend(first.registry.rewrites(first.backend, first.options))
    if any(p.backend.spec.sizes_from_shapes for p in partitioners):
        passes.append(sizes_per_reader)
    return passes


def _lowering_error(
    error: Exception,
    partitioners: list[ComposerPartitioner],
    records: list[PartitionRecord],
    dims: tuple[dict, ...] = (),
    program: ExportedProgram | None = None,
) -> ComposerError:
    """Name the backend (and plugin) a failure inside ExecuTorch's lowering belongs to."""
    raised = error if isinstance(error, CompilerRaised) else None
    cause = raised.error if raised is not None else error
    happened = said(cause)
    # ExecuTorch partitions and lowers one partitioner at a time, in list order.
    current = next((p for p in reversed(partitioners) if p.entered), None)
    if current is None:
        return _before_partitioning(cause, happened, partitioners, dims, program)
    return _backend_failed(error, raised, happened, current, records)


def _backend_failed(
    error: Exception,
    raised: CompilerRaised | None,
    happened: str,
    current: ComposerPartitioner,
    records: list[PartitionRecord],
) -> ComposerError:
    """A failure while ``current``'s backend lowered: its stand-in's (composer's bug), its
    plugin's ``preprocess`` answering wrong, or its compiler's, which moves partitions."""
    origin = current.backend.origin
    who = f"plugin {origin.name!r} ({origin.distribution}): backend {current.backend.name!r}"
    if current.stand_in:
        return ComposerError(
            f"{who}: lowering its partitions to composer's stand-in failed: {happened}. This is "
            "a bug in composer; please report it with the model."
        )
    backend_class = current.backend_class()
    handed = next((r.partitions for r in reversed(records) if r.backend is current.backend), [])
    if isinstance(error, AttributeError) and "processed_bytes" in str(error):
        return PluginError(
            f"{who} failed to lower: {backend_class.__name__}.preprocess must return "
            f"executorch's PreprocessResult(processed_bytes=...) ({happened})"
        )
    raiser = (
        f"{backend_class.__name__}.preprocess"
        if raised is not None
        else f"ExecuTorch's lowering for {backend_class.__name__}"
    )
    message = f"{who} failed to lower: {raiser} raised {happened}"
    if not handed:
        return PluginError(message)
    return _partitions_failed(message, happened, raised, current.backend.name,
                              current.backend.spec, handed)  # fmt: skip


def _partitions_failed(
    message: str,
    happened: str,
    raised: CompilerRaised | None,
    backend: str,
    spec: BackendSpec,
    handed: list[list[tuple[str, str]]],
) -> PreprocessFailed:
    """The partitions of ``handed`` that move down the stack: those the compiler raised on,
    where composer knows them, else every one."""
    ops = {name: op for partition in handed for name, op in partition}
    everything = {name: name for name in ops}

    def safer(failed: Iterable[str]) -> dict[str, str]:
        # options that cannot change the failed partitions would only compile them all again
        changes = safer_options_change(spec.safer_for, (ops[n] for n in failed))
        return dict(spec.safer_options) if changes else {}

    if raised is not None and raised.nodes.keys() <= everything.keys():
        # What composer handed the compiler when it raised.
        return PreprocessFailed(
            message,
            backend,
            tuple(raised.nodes),
            raised.nodes,
            tuple((tuple(nodes), said(failed)) for nodes, failed in raised.failures),
            safer(raised.nodes),
        )
    # ExecuTorch's own lowering raised, around the compiler: every partition handed over
    # moves, and the repaired program is proven again (the plan's repairs say so).
    unknown = f"(in one of its {len(handed)} partition(s), not known which: all move)"
    return PreprocessFailed(
        f"{message} {unknown}",
        backend,
        tuple(everything),
        everything,
        ((tuple(everything), f"{happened} {unknown}"),),
        safer(everything),
    )
