"""One backend's guarded, convex, validated partitioning, as a real ExecuTorch Partitioner."""

from __future__ import annotations

import difflib
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import torch
import torch.fx
from executorch.exir.backend.backend_details import BackendDetails
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.fx.passes.operator_support import OperatorSupportBase

from composer.errors import ComposerWarning, PluginError
from composer.op_names import op_name
from composer.registry import Backend, Registry
from composer.scheduler.convex import partition_by_support
from composer.scheduler.guards import (
    TAG,
    clean_foreign_tags,
    foreign_delegate_nodes,
    tag_constants,
    take_tags,
)
from composer.scheduler.stand_in import STAND_IN_BACKEND_ID, stand_in_compile_specs
from composer.scheduler.validate import check_lowerable, describe_path, find_tag_cycle


@attrs.define
class PartitionRecord:
    """What one backend took in one ``partition`` call, and why it left the rest."""

    backend: Backend
    partitions: list[list[tuple[str, str]]]  # per partition: (node name, op)
    declined: dict[str, str]  # node name -> reason
    duplicated_constant_bytes: int
    edges: list[tuple[str, str]]  # data edges between the ops this backend was shown


@attrs.frozen
class Support:
    """What one backend says it can take in one program, and why it declines the rest."""

    takes: Callable[[torch.fx.Node], bool]
    why_not: Callable[[torch.fx.Node], str]
    compile_specs: list[CompileSpec]  # those of the plugin's native partitioner, if any
    wanted_constants: set[torch.fx.Node]  # constants its native partitioner tagged


def _names_an_op(name: str) -> bool:
    """Whether ``name`` is an op overload as composer names them (``aten.add.Tensor``)."""
    namespace, _, rest = name.partition(".")
    op, _, overload = rest.rpartition(".")
    if not (namespace and op and overload):
        return False
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return overload in packet.overloads()


def _overloads_of(name: str) -> set[str]:
    """``aten.relu.default`` and the other overloads of the op ``name`` starts with."""
    namespace, _, rest = name.partition(".")
    op = rest.split(".")[0]
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return {f"{namespace}.{op}.{overload}" for overload in packet.overloads()}
    except (AttributeError, RuntimeError):
        return set()


def compute_edges(graph: torch.fx.Graph, skip: set[torch.fx.Node]) -> list[tuple[str, str]]:
    """Data edges between ops, a ``getitem`` folded into the op it reads."""

    def source(node: torch.fx.Node) -> torch.fx.Node:
        return node.args[0] if op_name(node) == "getitem" else node

    edges = []
    for node in graph.nodes:
        if node.op != "call_function" or node in skip or op_name(node) == "getitem":
            continue
        for producer in node.all_input_nodes:
            producer = source(producer) if producer.op == "call_function" else producer
            if producer.op == "call_function" and producer not in skip:
                edges.append((producer.name, node.name))
    return list(dict.fromkeys(edges))


def _partitioners_listed_with(partitioner: Partitioner) -> list[Partitioner]:
    """The other partitioners of the running to_edge_transform_and_lower, in list order.

    Used as a drop-in in someone else's list, composer cannot be told what else is listed;
    ExecuTorch 1.5.1 holds the list in a local of the function that asks us (XNNPACK's
    partitioner reads the call stack the same way). Not found: nothing else is listed.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_gen_edge_manager_for_partitioners":
            listed = frame.f_locals.get("partitioners_for_program") or []
            if any(other is partitioner for other in listed):
                return [other for other in listed if other is not partitioner]
            return []
        frame = frame.f_back
    return []


class ComposerPartitioner(Partitioner):
    """Partitions for one backend: guarded, maximal convex, validated before lowering.

    Usable on its own in ``to_edge_transform_and_lower(ep, partitioner=[...])`` next to
    any other ExecuTorch partitioner.
    """

    def __init__(
        self,
        backend: Backend,
        registry: Registry,
        *,
        stand_in: bool = False,
        method_name: str = "forward",
        on_partition: Callable[[PartitionRecord], None] | None = None,
        stack: Sequence[Partitioner] | None = None,
        options: Mapping[str, str] | None = None,
        never: Iterable[str] = (),
        min_partition_size: int | None = None,
        progress: Callable[[str], None] | None = None,
        consolidation: Consolidation | None = None,
    ) -> None:
        self.backend = backend
        self.registry = registry
        self.stand_in = stand_in
        self.method_name = method_name
        self.on_partition = on_partition
        # Every partitioner of the stack, this one included; None: read it from ExecuTorch.
        self.stack = None if stack is None else tuple(stack)
        self.options = dict(options or {})
        self.never = frozenset(never)
        self.min_partition_size = min_partition_size or backend.spec.min_partition_size
        self.progress = progress
        self.consolidation = consolidation
        self._native: Partitioner | None = None
        self._native_asked = False
        self.entered = False  # partition() has been called: its backend is being lowered
        # A stand-in for a backend that can lower here: its ExecuTorch backend must exist too,
        # so that a plan that succeeds means lowering will find it.
        self.check_backend_class = not stand_in
        super().__init__()

    def __repr__(self) -> str:
        return f"ComposerPartitioner({self.backend.name!r})"

    # --- the hooks ExecuTorch calls -------------------------------------------------

    def ops_to_not_decompose(self, ep: ExportedProgram):
        # ExecuTorch decomposes once per partitioner, each time with the full table minus
        # that partitioner's ops: an op one backend keeps whole is decomposed by the pass of
        # any other partitioner, before it as well as after (XNNPACK's linear, split by an
        # earlier backend into permute + addmm, then fails XNNPACK's preprocess on 3-D
        # inputs). So each partitioner keeps whole what any backend of the stack keeps
        # whole, each op under the filter of the backend that asked for it.
        answers = [self._own_ops_to_not_decompose(ep)]
        others = self.stack if self.stack is not None else _partitioners_listed_with(self)
        for other in others:
            if other is self:
                continue
            if isinstance(other, ComposerPartitioner):
                answers.append(other._own_ops_to_not_decompose(ep))
            else:
                answers.append(other.ops_to_not_decompose(ep))
        ops = list(dict.fromkeys(op for listed, _ in answers for op in listed))
        if all(op_filter is None for _, op_filter in answers):
            return (ops, None)
        asked = [(frozenset(listed), op_filter) for listed, op_filter in answers]

        def keep_whole(node: torch.fx.Node) -> bool:
            return any(
                node.target in listed and (op_filter is None or op_filter(node))
                for listed, op_filter in asked
            )

        return (ops, keep_whole)

    def _own_ops_to_not_decompose(self, ep: ExportedProgram):
        ops = self.registry.call(
            "composer_ops_to_not_decompose", self.backend, program=ep, options=self.options
        )
        if ops is not None:
            wrong = next(
                (op for op in ops if not isinstance(op, torch._ops.OpOverload)), None
            ) if isinstance(ops, list | tuple) else ops  # fmt: skip
            if wrong is not None:
                raise PluginError(
                    f"{self._plugin()} returned {wrong!r} from composer_ops_to_not_decompose "
                    f"for backend {self.backend.name!r}; it must return a list of ATen ops "
                    "(torch.ops.aten.linear.default), not names, or None."
                )
            return (list(ops), None)
        native = self._native_partitioner(ep)
        if native is not None:
            return native.ops_to_not_decompose(ep)
        return ([], None)

    def transform_for_pre_decomposition(self, ep: ExportedProgram) -> ExportedProgram:
        native = self._native_partitioner(ep)
        if native is not None:
            return native.transform_for_pre_decomposition(ep)
        return ep

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self.entered = True
        graph = exported_program.graph_module.graph
        self._warn_about_pins_naming_no_op(graph)
        guarded = foreign_delegate_nodes(graph)
        support = self._evaluate_support(exported_program, guarded)
        answer, why_not = support.takes, support.why_not
        native_compile_specs, wanted_constants = support.compile_specs, support.wanted_constants

        declined: dict[str, str] = {}
        moved = (
            self.consolidation.moved_from(self.backend.name, exported_program)
            if self.consolidation is not None
            else {}
        )

        def is_supported(node: torch.fx.Node) -> bool:
            if node in guarded:
                return False
            if self.never and op_name(node) in self.never:
                declined[node.name] = f"pinned off {self.backend.name} by the user"
                return False
            if node.name in moved:
                declined[node.name] = (
                    f"left to {moved[node.name]}: a small island between its partitions, moved "
                    "to save a round trip off its device"
                )
                return False
            ok = answer(node)
            if not ok:
                declined[node.name] = why_not(node)
            return ok

        started = time.perf_counter()
        partitions = partition_by_support(graph, is_supported, self.min_partition_size)
        in_partition = {node for members in partitions for node in members}
        for node in graph.nodes:
            if (
                node.op == "call_function"
                and node not in guarded
                and node not in in_partition
                and node.name not in declined
            ):
                declined[node.name] = f"partition below the minimum size {self.min_partition_size}"

        tags: dict[str, DelegationSpec] = {}
        compile_specs = self._compile_specs(native_compile_specs)
        if partitions and self.check_backend_class:
            self.backend_class()
        for index, members in enumerate(partitions):
            tag = f"{self.backend.name}_{index}"
            for node in members:
                node.meta[TAG] = tag
            tags[tag] = DelegationSpec(self._backend_id(), compile_specs)
        duplicated = tag_constants(exported_program, wanted_constants)
        self._validate(graph)
        if self.progress is not None:
            elapsed = time.perf_counter() - started
            self.progress(
                f"{self.backend.name}: {len(partitions)} partition(s) in {elapsed:.2f} s"
                + ("" if not partitions else ", lowering...")
            )
            for index, members in enumerate(partitions):
                ops = sum(1 for n in members if op_name(n) != "getitem")
                self.progress(f"  {self.backend.name}:{index}  {ops} op(s)")
        if self.on_partition is not None:
            self.on_partition(
                PartitionRecord(
                    self.backend,
                    [[(n.name, op_name(n)) for n in members] for members in partitions],
                    declined,
                    duplicated,
                    compute_edges(graph, guarded),
                )
            )
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def supported_names(self, program: ExportedProgram) -> set[str]:
        """Names of the ops this backend would take in ``program``, ignoring partition sizes."""
        graph = program.graph_module.graph
        guarded = foreign_delegate_nodes(graph)
        # The same checked path as partition(): a plugin breaking the contract gets the same
        # PluginError whether consolidation asks first or partition() does. Warnings about
        # what a native partitioner tagged come once, from partition().
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ComposerWarning)
            support = self._evaluate_support(program, guarded)
        return {
            node.name
            for node in graph.nodes
            if node.op == "call_function"
            and node not in guarded
            and op_name(node) != "getitem"
            and op_name(node) not in self.never
            and support.takes(node)
        }

    def _evaluate_support(self, program: ExportedProgram, guarded: set[torch.fx.Node]) -> Support:
        """What the backend says it can take in ``program``, every answer checked."""
        support = self.registry.call(
            "composer_operator_support", self.backend, program=program, options=self.options
        )
        if support is None:
            tagged, compile_specs, wanted = self._run_native(program, guarded)
            native = type(self._native).__name__
            return Support(lambda node: node in tagged, lambda node: f"not tagged by {native}",
                           compile_specs, wanted)  # fmt: skip
        if not isinstance(support, OperatorSupportBase):
            raise PluginError(
                f"{self._plugin()} returned {type(support).__name__} from "
                "composer_operator_support; it must return a "
                "torch.fx.passes.operator_support.OperatorSupportBase or None."
            )
        submodules = dict(program.graph_module.named_modules())
        explain = getattr(support, "reason_unsupported", None)
        who = f"{self._plugin()}: {type(support).__name__}"

        def takes(node: torch.fx.Node) -> bool:
            try:
                return bool(support.is_node_supported(submodules, node))
            except Exception as error:
                raise PluginError(
                    f"{who}.is_node_supported raised on node {node.name} ({op_name(node)}): "
                    f"{type(error).__name__}: {error}"
                ) from error

        def why_not(node: torch.fx.Node) -> str:
            if explain is None:
                return "unsupported op"
            try:
                reason = explain(node)
            except Exception as error:
                raise PluginError(
                    f"{who}.reason_unsupported raised on node {node.name} ({op_name(node)}): "
                    f"{type(error).__name__}: {error}"
                ) from error
            if reason is not None and not isinstance(reason, str):
                raise PluginError(
                    f"{who}.reason_unsupported returned {type(reason).__name__} for node "
                    f"{node.name}; it must return a string or None."
                )
            return reason or "unsupported op"

        return Support(takes, why_not, [], set())

    def backend_class(self) -> type[BackendDetails]:
        """The ExecuTorch ``BackendDetails`` subclass the backend's spec names."""
        backend_id = self.backend.spec.backend_id
        # ExecuTorch looks a backend up the same way: by name, among the direct subclasses.
        found = [cls for cls in BackendDetails.__subclasses__() if cls.__name__ == backend_id]
        if not found:
            raise PluginError(
                f"{self._plugin()} declares backend {self.backend.name!r} with ExecuTorch "
                f"backend id {backend_id!r}, but no BackendDetails subclass of that name is "
                "imported. The id is the class name of the plugin's BackendDetails subclass; "
                "import that class in the plugin module."
            )
        return found[0]

    def _warn_about_pins_naming_no_op(self, graph: torch.fx.Graph) -> None:
        # A pin is an op name; one with a typo (aten.relu for aten.relu.default) would pin
        # nothing, silently. A real op the model does not use is fine: configs are shared.
        in_program = {op_name(node) for node in graph.nodes if node.op == "call_function"}
        for pin in sorted(self.never - in_program):
            if _names_an_op(pin):
                continue
            close = difflib.get_close_matches(pin, sorted(in_program), n=3)
            close += difflib.get_close_matches(pin, sorted(_overloads_of(pin) - set(close)), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (use aten.NAME.OVERLOAD)"
            warnings.warn(
                f"the pin never {self.backend.name} = {pin!r} names no op{hint}",
                ComposerWarning,
                stacklevel=2,
            )

    def _plugin(self) -> str:
        origin = self.backend.origin
        return f"plugin {origin.name!r} ({origin.distribution})"

    # --- helpers ----------------------------------------------------------------------

    def _backend_id(self) -> str:
        return STAND_IN_BACKEND_ID if self.stand_in else self.backend.spec.backend_id

    def _compile_specs(self, native: list[CompileSpec]) -> list[CompileSpec]:
        # A stand-in for a backend that lowers here still asks the plugin, so that a plan
        # that succeeds means lowering gets the same valid answer.
        if self.stand_in and not self.check_backend_class:
            return stand_in_compile_specs(self.backend.spec)
        specs = self.registry.call(
            "composer_compile_specs",
            self.backend,
            method_name=self.method_name,
            options=self.options,
        )
        if specs is None:
            return stand_in_compile_specs(self.backend.spec) if self.stand_in else list(native)
        if not isinstance(specs, list | tuple) or not all(
            isinstance(s, CompileSpec) for s in specs
        ):
            raise PluginError(
                f"{self._plugin()} returned {specs!r} from composer_compile_specs; it must "
                "return a list of executorch's CompileSpec or None."
            )
        if self.stand_in:
            return stand_in_compile_specs(self.backend.spec)
        return list(specs)

    def _native_partitioner(self, ep: ExportedProgram) -> Partitioner | None:
        if not self._native_asked:
            self._native_asked = True
            native = self.registry.call("composer_partitioner", self.backend, program=ep)
            if native is not None and not isinstance(native, Partitioner):
                raise PluginError(
                    f"plugin {self.backend.origin.name!r} returned {type(native).__name__} from "
                    "composer_partitioner; it must return an ExecuTorch Partitioner or None."
                )
            self._native = native
        return self._native

    def _run_native(self, ep: ExportedProgram, guarded: set[torch.fx.Node]):
        """Run the plugin's own partitioner; keep what it tagged, minus what it must not."""
        native = self._native_partitioner(ep)
        plugin = self.backend.origin.name
        if native is None:
            raise PluginError(
                f"plugin {plugin!r} answers neither composer_operator_support nor "
                f"composer_partitioner for backend {self.backend.name!r}; it must implement one."
            )
        graph = ep.graph_module.graph
        take_tags(graph)
        try:
            result = native.partition(ep)
        except Exception as error:
            raise PluginError(
                f"the partitioner {type(native).__name__} of plugin {plugin!r} raised: "
                f"{type(error).__name__}: {error}"
            ) from error
        tag_of = take_tags(graph)
        who = f"{type(native).__name__} of plugin {plugin!r}"
        kept = clean_foreign_tags(ep, tag_of, guarded, who)
        tagged = {node for node in kept if node.op == "call_function"}
        wanted = {node for node in kept if node.op == "placeholder"}
        native_cycle = find_tag_cycle(graph, {n: t for n, t in kept.items() if n in tagged})
        if native_cycle is not None:
            warnings.warn(
                f"the partitioner {who} tagged a non-convex set (path {describe_path(native_cycle)} leaves a "
                "partition and re-enters it); composer split it into convex partitions.",
                ComposerWarning,
                stacklevel=2,
            )
        specs = [spec.compile_specs for spec in result.partition_tags.values()]
        return tagged, (list(specs[0]) if specs else []), wanted

    def _validate(self, graph: torch.fx.Graph) -> None:
        check_lowerable(graph, f"backend {self.backend.name!r}")


class Consolidation:
    """The island moves for one stack, worked out once on the program before any lowering."""

    def __init__(self, partitioners: Sequence[ComposerPartitioner]) -> None:
        self.partitioners = partitioners
        self.moves: dict[str, str] | None = None  # node -> receiving backend
        self.owner: dict[str, str] = {}

    def moved_from(self, backend: str, program: ExportedProgram) -> dict[str, str]:
        """Nodes priority order gives ``backend`` that go to another backend instead."""
        if self.moves is None:
            self._work_out(program)
        return {
            node: receiver
            for node, receiver in self.moves.items()
            if self.owner.get(node) == backend
        }

    def _work_out(self, program: ExportedProgram) -> None:
        from composer.scheduler.consolidate import PORTABLE, islands_to_move

        graph = program.graph_module.graph
        guarded = foreign_delegate_nodes(graph)
        supported = {p.backend.name: p.supported_names(program) for p in self.partitioners}
        ops = [
            n.name
            for n in graph.nodes
            if n.op == "call_function" and n not in guarded and op_name(n) != "getitem"
        ]
        for name in ops:
            self.owner[name] = next(
                (p.backend.name for p in self.partitioners if name in supported[p.backend.name]),
                PORTABLE,
            )
        devices = {p.backend.name: p.backend.spec.device for p in self.partitioners}
        edges = compute_edges(graph, guarded)
        self.moves = islands_to_move(self.owner, supported, edges, devices)
