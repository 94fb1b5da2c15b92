"""Stacking backends in priority order through ExecuTorch's own lowering, and the plan it yields."""

from __future__ import annotations

import operator
import time
import warnings
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.delegate import executorch_call_delegate
from torch.export import ExportedProgram

from composer.errors import ComposerError, ComposerWarning, PartitionError, PluginError
from composer.op_names import op_name
from composer.plans import PORTABLE, Fallback, Partition, Plan
from composer.registry import Backend, Registry
from composer.scheduler.assign import Assignment, assign, warn_about_pins_naming_no_op
from composer.scheduler.guards import foreign_delegate_nodes
from composer.scheduler.partitioner import ComposerPartitioner, KeptWholeButLeft, PartitionRecord
from composer.scheduler.stand_in import STAND_IN_BACKEND_ID, stand_in_backend_name
from composer.scheduler.support import Support
from composer.stack import Stack

HOST = "cpu"


def lower_stack(
    program: ExportedProgram,
    backends: list[Backend],
    registry: Registry,
    stand_ins: set[str],
    stack: Stack,
    progress: Callable[[str], None] | None = None,
) -> tuple[EdgeProgramManager, Plan]:
    """Lower ``program`` with ``backends`` (``stack``'s, resolved) in order; those in
    ``stand_ins`` lower to a stand-in. ``stack`` has its options' defaults filled in."""
    # Which nodes a backend keeps whole but then no backend takes (a pin, a minimum partition
    # size) shows only once the last backend has partitioned the edge program: those that
    # ExecuTorch's own check would refuse are decomposed and the program lowered again. Each
    # attempt decomposes at least one more.
    decomposed: dict[str, dict[str, str]] = {}  # origin -> backend that left it -> why
    gone: set[str] = set()  # their names, which pins may name
    while True:
        try:
            return _lower_once(
                program, backends, registry, stand_ins, stack, progress, decomposed, gone
            )
        except KeptWholeButLeft as left:
            if all(origin in decomposed for origin, _ in left.nodes.values()):
                raise
            gone |= left.nodes.keys()
            for origin, by_backend in left.nodes.values():
                decomposed.setdefault(origin, {}).update(by_backend)
            if progress is not None:
                progress(f"decomposing {', '.join(sorted(left.nodes))}: kept whole for a "
                         "backend, taken by none; lowering again")  # fmt: skip


def _lower_once(
    program: ExportedProgram,
    backends: list[Backend],
    registry: Registry,
    stand_ins: set[str],
    stack: Stack,
    progress: Callable[[str], None] | None,
    decomposed: Mapping[str, Mapping[str, str]],
    gone: set[str],
) -> tuple[EdgeProgramManager, Plan]:
    records: list[PartitionRecord] = []
    partitioners = [
        ComposerPartitioner(
            backend,
            registry,
            stand_in=backend.name in stand_ins,
            on_partition=records.append,
            options=stack.options.get(backend.name),
            min_partition_size=stack.min_partition_size.get(backend.name),
            progress=progress,
        )
        for backend in backends
    ]
    schedule = StackSchedule(partitioners, stack.never, stack.consolidates, gone)
    for partitioner in partitioners:
        partitioner.stack = tuple(partitioners)
        partitioner.schedule = schedule
        partitioner.decomposed = decomposed
        if partitioner.stand_in:
            partitioner.check_backend_class = (
                registry.unavailable_reason(partitioner.backend) is None
            )
    # Inference programs: with autograd on, ExecuTorch's passes trip over in-place
    # buffer updates on tensors that require grad (plain ExecuTorch fails the same way).
    started = time.perf_counter()
    with torch.no_grad():
        edge = _lower(program, partitioners)
    if progress is not None:
        progress(f"lowered with {', '.join(b.name for b in backends)} in "
                 f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    plan = build_plan(
        edge.exported_program().graph_module, backends, records, stand_ins, schedule.edges
    )
    return edge, plan


class StackSchedule:
    """The stack's assignment, decided once for every backend before any of them tags a node.

    ExecuTorch builds the edge program inside ``to_edge_transform_and_lower`` and shows it to
    the partitioners only, one after another: the first backend's ``partition()`` is the first
    moment its nodes exist, and it comes before anything is tagged, so the assignment is made
    there. Each later backend is shown the program with the earlier delegates in it; node
    names survive lowering, so an assignment by name holds for it too.
    """

    def __init__(
        self,
        partitioners: Sequence[ComposerPartitioner],
        never: Mapping[str, frozenset[str]],
        consolidate: bool,
        decomposed_names: set[str] = frozenset(),
    ) -> None:
        self.partitioners = tuple(partitioners)
        # Nodes an earlier attempt had and decomposed: a pin naming one still names a node.
        self.decomposed_names = frozenset(decomposed_names)
        self.never = never
        self.consolidate = consolidate
        self.assignment: Assignment | None = None
        # Data edges between the ops, for the plan: the lowered program no longer has the
        # edges inside its delegates, so they are read off the program before lowering.
        self.edges: tuple[tuple[str, str], ...] = ()

    def withheld_from(
        self,
        partitioner: ComposerPartitioner,
        program: ExportedProgram,
        guarded: set[torch.fx.Node],
        support: Support,
    ) -> Mapping[str, str]:
        """Node names ``partitioner`` must not take in ``program``, each with the reason."""
        if self.assignment is None:
            if partitioner is not self.partitioners[0] or guarded:
                raise PartitionError(
                    f"backend {partitioner.backend.name!r} partitioned before the first backend "
                    "of the stack, or on a program with delegates in it: ExecuTorch no longer "
                    "lowers in list order. This is a bug in composer; please report it."
                )
            self.assignment = self._decide(program, support)
        return self.assignment.withheld_from(partitioner.backend.name)

    def _decide(self, program: ExportedProgram, first: Support) -> Assignment:
        graph = program.graph_module.graph
        ops = {
            node.name: op_name(node)
            for node in graph.nodes
            if node.op == "call_function" and op_name(node) != "getitem"
        }
        self.edges = tuple(data_edges(graph))
        order = [p.backend.name for p in self.partitioners]
        never = {name: self.never[name] for name in order if name in self.never}
        calls = [n for n in graph.nodes if n.op == "call_function"]
        warn_about_pins_naming_no_op(
            never,
            (op_name(n) for n in calls),
            [*(n.name for n in calls), *self.decomposed_names],
        )
        devices = {p.backend.name: p.backend.spec.device for p in self.partitioners}
        if not self.consolidate:
            return assign(ops, order, never)
        supported = {order[0]: first.names(graph, set())}
        # Each backend is asked again on the program it lowers, so what it would say about
        # this one only feeds the assignment; its warnings come once, from that second ask.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ComposerWarning)
            for partitioner in self.partitioners[1:]:
                answer = partitioner.support(program, set())
                supported[partitioner.backend.name] = answer.names(graph, set())
        return assign(ops, order, never, supported, self.edges, devices)


def data_edges(graph: torch.fx.Graph) -> list[tuple[str, str]]:
    """Data edges between ops, a ``getitem`` folded into the op it reads."""

    def source(node: torch.fx.Node) -> torch.fx.Node:
        return node.args[0] if op_name(node) == "getitem" else node

    edges = []
    for node in graph.nodes:
        if node.op != "call_function" or op_name(node) == "getitem":
            continue
        for producer in node.all_input_nodes:
            producer = source(producer) if producer.op == "call_function" else producer
            if producer.op == "call_function":
                edges.append((producer.name, node.name))
    return list(dict.fromkeys(edges))


def _lower(program: ExportedProgram, partitioners: list[ComposerPartitioner]) -> EdgeProgramManager:
    try:
        return to_edge_transform_and_lower(
            program,
            partitioner=partitioners,
            # Backends keep ops whole that the edge dialect's validity check does not know.
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    except ComposerError:
        raise
    except Exception as error:
        raise _lowering_error(error, partitioners) from error


def _lowering_error(error: Exception, partitioners: list[ComposerPartitioner]) -> ComposerError:
    """Name the backend (and plugin) a failure inside ExecuTorch's lowering belongs to."""
    happened = f"{type(error).__name__}: {_first_line(error)}"
    # ExecuTorch partitions and lowers one partitioner at a time, in list order.
    current = next((p for p in reversed(partitioners) if p.entered), None)
    if current is None:
        return ComposerError(
            f"ExecuTorch's to_edge_transform_and_lower failed before any backend partitioned: "
            f"{happened}. Run with --debug (or composer.plan) and report it with the model."
        )
    origin = current.backend.origin
    who = f"plugin {origin.name!r} ({origin.distribution}): backend {current.backend.name!r}"
    if current.stand_in:
        return ComposerError(
            f"{who}: lowering its partitions to composer's stand-in failed: {happened}. This is "
            "a bug in composer; please report it with the model."
        )
    backend_class = current.backend_class()
    preprocess = getattr(backend_class.preprocess, "__func__", backend_class.preprocess)
    frames = _traceback_codes(error)
    if getattr(preprocess, "__code__", None) in frames:
        return PluginError(
            f"{who} failed to lower: {backend_class.__name__}.preprocess raised {happened}"
        )
    if isinstance(error, AttributeError) and "processed_bytes" in str(error):
        return PluginError(
            f"{who} failed to lower: {backend_class.__name__}.preprocess must return "
            f"executorch's PreprocessResult(processed_bytes=...) ({happened})"
        )
    return PluginError(f"{who} failed to lower: {happened}")


def _traceback_codes(error: BaseException | None) -> set:
    """The code objects of every frame the error (and the errors it chains) went through."""
    codes = set()
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback = error.__traceback__
        while traceback is not None:
            codes.add(traceback.tb_frame.f_code)
            traceback = traceback.tb_next
        error = error.__cause__ or error.__context__
    return codes


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _delegate_device(
    graph_module: torch.fx.GraphModule, call: torch.fx.Node, backends: list[Backend]
) -> tuple[str, str]:
    lowered = getattr(graph_module, call.args[0].target)
    if lowered.backend_id == STAND_IN_BACKEND_ID:
        name = stand_in_backend_name(lowered.compile_specs)
        spec = next(b.spec for b in backends if b.name == name)
    else:
        spec = next((b.spec for b in backends if b.spec.backend_id == lowered.backend_id), None)
        if spec is None:  # a delegate composer did not make (an ExecuTorch partitioner's)
            return lowered.backend_id, HOST
    return spec.name, spec.device


def count_crossings(graph_module: torch.fx.GraphModule, backends: list[Backend]) -> int:
    """Data edges whose two ends run on different devices (graph inputs and outputs: host)."""
    device: dict[torch.fx.Node, str] = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target is executorch_call_delegate:
            device[node] = _delegate_device(graph_module, node, backends)[1]
        elif node.target is operator.getitem and node.args[0].target is executorch_call_delegate:
            device[node] = device[node.args[0]]
        else:
            device[node] = HOST
    return sum(
        1
        for node in graph_module.graph.nodes
        if node.op in ("placeholder", "call_function")  # get_attr: a module, not data
        for user in node.users
        if device[node] != device[user]
    )


def build_plan(
    graph_module: torch.fx.GraphModule,
    backends: list[Backend],
    records: list[PartitionRecord],
    stand_ins: set[str],
    edges: Sequence[tuple[str, str]] = (),
) -> Plan:
    """Assemble the plan from what each backend took and the final lowered graph."""
    node_backends: dict[str, str] = {}
    node_ops: dict[str, str] = {}
    partitions = []
    for record in records:
        name = record.backend.name
        for index, members in enumerate(record.partitions):
            real = [(node, op) for node, op in members if op != "getitem"]
            for node, op in real:
                node_backends[node] = name
                node_ops[node] = op
            partitions.append(
                Partition(
                    # As the progress lines and the delegation tags number them.
                    id=f"{name}:{index}",
                    backend=name,
                    device=record.backend.spec.device,
                    nodes=tuple(node for node, _ in real),
                    ops=tuple(op for _, op in real),
                )
            )
    guarded = foreign_delegate_nodes(graph_module.graph)
    portable = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node in guarded or op_name(node) == "getitem":
            continue
        node_backends[node.name] = PORTABLE
        node_ops[node.name] = op_name(node)
        portable.append(node.name)
    decisions = _decisions(node_backends, partitions, records)
    # A node no backend took: what each answered is its reason for falling back.
    fallbacks = [Fallback(name, node_ops[name], decisions[name]) for name in portable]
    delegate_calls = sum(
        1
        for node in graph_module.graph.nodes
        if node.op == "call_function" and node.target is executorch_call_delegate
    )
    return Plan(
        backends=tuple(b.name for b in backends),
        node_backends=node_backends,
        node_ops=node_ops,
        partitions=tuple(partitions),
        fallbacks=tuple(fallbacks),
        delegate_calls=delegate_calls,
        crossings=count_crossings(graph_module, backends),
        duplicated_constant_bytes=sum(r.duplicated_constant_bytes for r in records),
        stand_ins=tuple(b.name for b in backends if b.name in stand_ins),
        decisions=decisions,
        edges=tuple((a, b) for a, b in edges if a in node_backends and b in node_backends),
    )


def _decisions(
    node_backends: dict[str, str], partitions: list[Partition], records: list[PartitionRecord]
) -> dict[str, tuple[tuple[str, str], ...]]:
    taken = {node: p for p in partitions for node in p.nodes}
    decisions = {}
    for node in node_backends:
        answers = []
        for record in records:
            name = record.backend.name
            partition = taken.get(node)
            if partition is not None and partition.backend == name:
                answers.append((name, f"took it (partition {partition.id})"))
            elif partition is not None and any(b == partition.backend for b, _ in answers):
                answers.append((name, f"not offered: already lowered by {partition.backend}"))
            else:
                answers.append((name, record.declined.get(node, "not offered")))
        decisions[node] = tuple(answers)
    return decisions
