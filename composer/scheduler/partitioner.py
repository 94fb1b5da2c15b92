"""One backend's slice of the stack, as a real ExecuTorch Partitioner: tag, constants, check."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs
import torch
import torch.fx
from executorch.exir.backend.backend_details import BackendDetails
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram

from composer.contract.errors import PluginError
from composer.contract.op_names import op_name
from composer.registry.answers import plugin_label
from composer.registry.asking import counting, telling
from composer.registry.discovery import Backend, Registry
from composer.scheduler.boundary import CONSTANTS_ONLY, partition_within_boundary, reading_an_input
from composer.scheduler.guards import (
    TAG,
    constant_placeholders,
    foreign_delegate_nodes,
    mutated_buffer_placeholders,
    tag_constants,
    tag_state,
)
from composer.scheduler.kept_whole import KeptWholeButLeft, kept_whole_but_left
from composer.scheduler.origins import origin_name
from composer.scheduler.pieces import PieceProbes, decomposable
from composer.scheduler.quant_chains import chains_kept_with_their_ops, reads_quantized_values
from composer.scheduler.stand_in import STAND_IN_BACKEND_ID, stand_in_compile_specs
from composer.scheduler.support import Support, evaluate_support
from composer.scheduler.validate import check_lowerable


@attrs.define
class PartitionRecord:
    """What one backend took in one ``partition`` call, and why it left the rest."""

    backend: Backend
    partitions: list[list[tuple[str, str]]]  # per partition: (node name, op)
    declined: dict[str, str]  # node name -> reason
    duplicated_constant_bytes: int
    # per partition: the mutated buffers its delegate owns (BackendSpec.keeps_state)
    state: list[list[str]]


class Schedule(Protocol):
    """The stack's assignment, as a backend's partitioner reads its own part of it."""

    never: Mapping[str, frozenset[str]]  # backend -> ops and node names it must not take

    def withheld_from(
        self,
        partitioner: ComposerPartitioner,
        program: ExportedProgram,
        guarded: set[torch.fx.Node],
        support: Support,
    ) -> Mapping[str, str]:
        """Node names ``partitioner`` must not take in ``program``, each with the reason."""


@attrs.define(eq=False, on_setattr=attrs.setters.frozen)
class SharedLowering:
    """What the partitioners of one lowering share, given to each when it is made.

    Made in two steps, because each partitioner reads the others through it: made with the
    settings below and given to each partitioner, then ``seat``ed with them, once. The
    settings are frozen; the partitioners are readable only once seated."""

    # The stack's assignment: what each backend must leave to others (None: nothing).
    schedule: Schedule | None = None
    # Nodes to decompose although a backend asks to keep their op whole, as a
    # KeptWholeButLeft of an earlier attempt named them: origin_name -> the backend that
    # left the node -> why.
    decomposed: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)
    # composer.Stack.keep_whole: "priority" asks backends ahead for the pieces, "any" not.
    keep_whole: str = "priority"
    # The operators the runtime that will run the program has kernels for (None: any with
    # an out variant): what is kept whole and left must be among them.
    kernels: frozenset[str] | None = None
    # Set once, by ``seat``: the one field not frozen, for the partitioners are made after.
    _seated: tuple[Partitioner, ...] | None = attrs.field(
        default=None, init=False, on_setattr=attrs.setters.NO_OP
    )

    def seat(self, partitioners: Sequence[Partitioner]) -> None:
        """Name the partitioners lowered together, in list order; once, after they are made."""
        if self._seated is not None:
            raise RuntimeError(
                f"this lowering's partitioners are seated already ({self._seated!r}); a "
                "lowering seats its partitioners once. This is a bug in composer."
            )
        self._seated = tuple(partitioners)

    @property
    def seated(self) -> bool:
        """Whether ``seat`` has named this lowering's partitioners."""
        return self._seated is not None

    @property
    def partitioners(self) -> tuple[Partitioner, ...]:
        """The partitioners lowered together, in list order (``seat`` named them)."""
        if self._seated is None:
            raise RuntimeError(
                "this lowering's partitioners were read before they were seated; whoever "
                "makes them calls seat() once they exist. This is a bug in composer."
            )
        return self._seated


def _asked_after_a_composer_backend(op: object, asked) -> bool:
    """Whether a composer backend comes ahead of every backend that keeps ``op`` whole."""
    for partitioner, listed, _ in asked:
        if op in listed:
            return False
        if isinstance(partitioner, ComposerPartitioner):
            return True
    return False


class ComposerPartitioner(Partitioner):
    """Partitions for one backend: guarded, maximal convex, validated before lowering.

    Usable on its own in ``to_edge_transform_and_lower(ep, partitioner=[...])`` next to
    any other ExecuTorch partitioner; in a stack, ``lowering`` (shared by the stack's
    partitioners) says what it must leave to others.
    """

    def __init__(
        self,
        backend: Backend,
        registry: Registry,
        *,
        stand_in: bool = False,
        method_name: str = "forward",
        on_partition: Callable[[PartitionRecord], None] | None = None,
        options: Mapping[str, str] | None = None,
        min_partition_size: int | None = None,
        progress: Callable[[str], None] | None = None,
        lowering: SharedLowering | None = None,
        check_backend_class: bool | None = None,
    ) -> None:
        self.backend = backend
        self.registry = registry
        self.stand_in = stand_in
        self.method_name = method_name
        self.on_partition = on_partition
        self.options = dict(options or {})
        self.min_partition_size = min_partition_size or backend.spec.min_partition_size
        self.progress = progress
        self.lowering = lowering if lowering is not None else SharedLowering()
        self._native: Partitioner | None = None
        self._native_asked = False
        self.entered = False  # partition() has been called: its backend is being lowered
        self.kept_whole_ops: frozenset[object] = frozenset()  # what this backend last asked for
        self.declined: Mapping[str, str] = {}  # node name -> why, from its last partition()
        self._pieces: PieceProbes | None = None
        # Seconds its plugin took answering before partition() (which ops to keep whole, and
        # the probes of them): counted in its partitioning's time, where the wait shows.
        self._answering = 0.0
        # (ops, filter): this partitioner's last answer to ops_to_not_decompose
        self.asked_to_keep: tuple[list[object], Callable | None] | None = None
        # Whether its ExecuTorch backend must exist: a real backend's, and a stand-in's for a
        # backend that can lower here, so that a plan that succeeds means lowering will find
        # it (None: only a real backend's).
        self.check_backend_class = (
            not stand_in if check_backend_class is None else check_backend_class
        )
        super().__init__()

    def __repr__(self) -> str:
        return f"ComposerPartitioner({self.backend.name!r})"

    def listed_with(self) -> Sequence[Partitioner]:
        """The partitioners of the list this one is lowered in (itself may be among them)."""
        return self._seated_with()

    def _seated_with(self) -> Sequence[Partitioner]:
        # Made without a shared lowering, or before one seated it: it is lowered alone, or in
        # a list composer was not told about.
        return self.lowering.partitioners if self.lowering.seated else (self,)

    # --- the hooks ExecuTorch calls -------------------------------------------------

    def ops_to_not_decompose(self, ep: ExportedProgram):
        ops, keep_whole = self._stack_ops_to_not_decompose(ep)
        if keep_whole is not None and not self.entered and not self._decomposes_first():
            # The first composer partitioner's pass already decomposed what the stack does
            # not keep whole (its answer is this one). Listing the ops still present, with no
            # filter, keeps them and lets ExecuTorch skip retracing the program; a filter costs
            # two full retraces per partitioner (3.4 s of resnet18's 15.8 s compose).
            present = {node.target for node in ep.graph.nodes if node.op == "call_function"}
            ops, keep_whole = [op for op in ops if op in present], None
        # What the decomposition keeps whole: asked again of the edge program, a plugin
        # listing the ATen ops it finds (the AOTInductor ones) would list none of it.
        self.asked_to_keep = (ops, keep_whole)
        return (ops, keep_whole)

    def _decomposes_first(self) -> bool:
        """Whether this is the first composer partitioner ExecuTorch decomposes for."""
        first = next((p for p in self.listed_with() if isinstance(p, ComposerPartitioner)), self)
        return first is self

    def _stack_ops_to_not_decompose(self, ep: ExportedProgram, record: bool = True):
        # ``record``: each partitioner keeps its answer as ``kept_whole_ops`` (what the
        # reasons of a node left whole name).
        # ExecuTorch decomposes once per partitioner, each time with the full table minus
        # that partitioner's ops: an op one backend keeps whole is decomposed by the pass of
        # any other partitioner, before it as well as after (XNNPACK's linear, split by an
        # earlier backend into permute + addmm, then fails XNNPACK's preprocess on 3-D
        # inputs). So each partitioner keeps whole what any backend of the stack keeps
        # whole, each op under the filter of the backend that asked for it.
        # ... except where a backend ahead of the first that asked takes the pieces and not
        # the whole (composer.scheduler.pieces): the priority order gives it the node.
        listed_with = list(self.listed_with())
        together = listed_with if any(p is self for p in listed_with) else [self, *listed_with]
        answers = [
            p._own_ops_to_not_decompose(ep, record)
            if isinstance(p, ComposerPartitioner)
            else p.ops_to_not_decompose(ep)
            for p in together
        ]
        ops = list(dict.fromkeys(op for listed, _ in answers for op in listed))
        asked = [
            (p, frozenset(listed), op_filter)
            for p, (listed, op_filter) in zip(together, answers, strict=True)
        ]
        probing = {
            op
            for op in ops
            if self.lowering.keep_whole == "priority"
            and op in decomposable()
            and _asked_after_a_composer_backend(op, asked)
        }
        decomposed = self.lowering.decomposed
        if not decomposed and not probing and all(f is None for _, _, f in asked):
            return (ops, None)

        def keep_whole(node: torch.fx.Node) -> bool:
            if decomposed and origin_name(node) in decomposed:
                return False
            first = next(
                (
                    i
                    for i, (_, listed, op_filter) in enumerate(asked)
                    if node.target in listed and (op_filter is None or op_filter(node))
                ),
                None,
            )
            if first is None:
                return False
            if node.target not in probing:
                return True
            return not any(
                p.prefers_pieces_of(node, ep)
                for p, _, _ in asked[:first]
                if isinstance(p, ComposerPartitioner)
            )

        return (ops, keep_whole)

    def prefers_pieces_of(self, node: torch.fx.Node, program: ExportedProgram) -> bool:
        """Whether this backend declines ``node`` (of the ATen ``program``) whole but would
        take every op it decomposes into, pins included."""
        pins = getattr(self.lowering.schedule, "never", {}).get(self.backend.name, frozenset())

        def pinned(op: str) -> bool:
            # A node pin names an edge node (node:aten_linear_default_3), which does not exist
            # yet: any pin on a node of the op keeps the whole op off this backend, as before
            # the probes; so does one on a node of a piece (a repair pins the pieces).
            edge_name = "node:" + op.replace(".", "_")
            return op in pins or any(pin.startswith(edge_name) for pin in pins)

        if pinned(op_name(node)):
            return False
        if reads_quantized_values(node):
            # A quantized op's pieces lose its quantization chains to the backend that takes
            # the op whole (chains_kept_with_their_ops), so no backend would take them.
            return False
        if self._pieces is None:
            self._pieces = PieceProbes(lambda probe: self.support(probe, set()),
                                       self.kept_whole_ops)  # fmt: skip
        with counting() as clock:
            try:
                return self._pieces.prefers_pieces(node, program, pinned)
            finally:
                self._answering += clock.seconds

    def _own_ops_to_not_decompose(self, ep: ExportedProgram, record: bool = True):
        with counting() as clock:
            try:
                return self._asked_ops_to_not_decompose(ep, record)
            finally:
                self._answering += clock.seconds

    def _asked_ops_to_not_decompose(self, ep: ExportedProgram, record: bool):
        ops = self.registry.ops_to_not_decompose(self.backend, ep, self.options)
        if ops is not None:
            answer = (ops, None)
        else:
            native = self._native_partitioner(ep)
            answer = native.ops_to_not_decompose(ep) if native is not None else ([], None)
        if record:
            self.kept_whole_ops = frozenset(answer[0])
        return answer

    def transform_for_pre_decomposition(self, ep: ExportedProgram) -> ExportedProgram:
        native = self._native_partitioner(ep)
        if native is not None:
            return native.transform_for_pre_decomposition(ep)
        return ep

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        # A plugin slow to answer is named where this compose's progress goes.
        with telling(self.progress):
            return self._partition(exported_program)

    def _partition(self, exported_program: ExportedProgram) -> PartitionResult:
        self.entered = True
        started = time.perf_counter()  # the plugin's time to answer is the partitioning's
        graph = exported_program.graph_module.graph
        guarded = foreign_delegate_nodes(graph)
        support = self.support(exported_program, guarded)
        declined: dict[str, str] = {}  # node name -> why this backend does not take it
        constants = constant_placeholders(exported_program)
        taken = self._taken(exported_program, guarded, support, constants, declined)
        partitions, joined = self._partitions(
            exported_program, taken, guarded, support, constants, declined
        )
        in_partition = {node for members in partitions for node in members}
        joined = {c for c in joined if any(user in in_partition for user in c.users)}
        for node in graph.nodes:
            if (
                node.op == "call_function"
                and node not in guarded
                and node not in in_partition
                and node.name not in declined
            ):
                declined[node.name] = f"partition below the minimum size {self.min_partition_size}"
        self.declined = declined
        left_whole = self._kept_whole_but_left(exported_program, guarded | in_partition)
        if left_whole:
            raise KeptWholeButLeft(left_whole)
        tags = self._tagged(partitions, support)
        duplicated = tag_constants(
            exported_program,
            support.wanted_constants | joined,
            only_wanted=support.native,
        )
        owned = tag_state(exported_program, set(tags)) if self.backend.spec.keeps_state else {}
        check_lowerable(graph, f"backend {self.backend.name!r}")
        answering, self._answering = self._answering, 0.0
        self._report(partitions, time.perf_counter() - started + answering)
        if self.on_partition is not None:
            self.on_partition(
                PartitionRecord(
                    self.backend,
                    [[(n.name, op_name(n)) for n in members] for members in partitions],
                    declined,
                    duplicated,
                    [owned.get(tag, []) for tag in tags],
                )
            )
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def _taken(
        self,
        program: ExportedProgram,
        guarded: set[torch.fx.Node],
        support: Support,
        constants: Mapping[torch.fx.Node, str],
        declined: dict[str, str],
    ) -> set[torch.fx.Node]:
        """The nodes this backend takes: offered to it (not guarded, not withheld by the
        stack's schedule or an earlier attempt), supported, and with their quantization
        chains; why it leaves each other node goes into ``declined``."""
        schedule = self.lowering.schedule
        withheld = (
            schedule.withheld_from(self, program, guarded, support) if schedule is not None else {}
        )

        def is_offered_and_taken(node: torch.fx.Node) -> bool:
            if node in guarded:
                return False
            reason = withheld.get(node.name) or self._left_before(node)
            if reason is not None:
                declined[node.name] = reason
                return False
            if not support.takes(node):
                declined[node.name] = support.why_not(node)
                return False
            return True

        graph = program.graph_module.graph
        taken = {n for n in graph.nodes if n.op == "call_function" and is_offered_and_taken(n)}
        for node, why in chains_kept_with_their_ops(graph, taken, constants).items():
            declined[node.name] = why
        return taken

    def _partitions(
        self,
        program: ExportedProgram,
        taken: set[torch.fx.Node],
        guarded: set[torch.fx.Node],
        support: Support,
        constants: Mapping[torch.fx.Node, str],
        declined: dict[str, str],
    ) -> tuple[list[list[torch.fx.Node]], set[torch.fx.Node]]:
        """The maximal convex partitions of ``taken`` this backend accepts at their boundaries,
        and the constants they take in; why each node left out is goes into ``declined``."""
        bounded = partition_within_boundary(
            program.graph_module.graph,
            taken.__contains__,
            self.min_partition_size,
            support.refuses_at_boundary,
            (
                self._movable_constants(program, guarded)
                if support.refuses_at_boundary is not None
                else set()
            ),
        )
        partitions, joined = bounded.partitions, bounded.constants
        for name, why in bounded.left_out.items():
            declined[name] = f"left out of its partition: {why}"
        if self.backend.spec.needs_a_runtime_input:
            partitions, dropped = reading_an_input(partitions, constants)
            for node in dropped:
                declined[node.name] = f"left out: {CONSTANTS_ONLY}"
        return partitions, joined

    def _tagged(
        self, partitions: list[list[torch.fx.Node]], support: Support
    ) -> dict[str, DelegationSpec]:
        """Each partition's nodes tagged for this backend, and what each tag delegates to."""
        tags: dict[str, DelegationSpec] = {}
        compile_specs = self._compile_specs(support.compile_specs)
        if partitions and self.check_backend_class:
            self.backend_class()
        for index, members in enumerate(partitions):
            tag = f"{self.backend.name}_{index}"
            for node in members:
                node.meta[TAG] = tag
            tags[tag] = DelegationSpec(self._backend_id(), compile_specs)
        return tags

    def support(self, program: ExportedProgram, guarded: set[torch.fx.Node]) -> Support:
        """What this backend says it can take in ``program`` (``guarded``: never offered)."""
        return evaluate_support(
            self.backend,
            self.registry,
            program,
            guarded,
            options=self.options,
            native=lambda: self._native_partitioner(program),
        )

    def backend_class(self) -> type[BackendDetails]:
        """The ExecuTorch ``BackendDetails`` subclass the backend's spec names."""
        backend_id = self.backend.spec.backend_id
        # ExecuTorch looks a backend up the same way: by name, among the direct subclasses.
        found = [cls for cls in BackendDetails.__subclasses__() if cls.__name__ == backend_id]
        if not found:
            raise PluginError(
                f"{plugin_label(self.backend)} declares backend {self.backend.name!r} with "
                f"ExecuTorch backend id {backend_id!r}, but no BackendDetails subclass of that "
                "name is imported. The id is the class name of the plugin's BackendDetails "
                "subclass; import that class in the plugin module."
            )
        return found[0]

    # --- helpers ----------------------------------------------------------------------

    @staticmethod
    def _movable_constants(
        program: ExportedProgram, guarded: set[torch.fx.Node]
    ) -> set[torch.fx.Node]:
        """Constants a partition may take in (duplicated where others read them too) rather
        than receive across its boundary: not mutated, and read by no earlier delegate."""
        mutated = mutated_buffer_placeholders(program)
        return {
            node
            for node in constant_placeholders(program)
            if node not in mutated and not any(user in guarded for user in node.users)
        }

    def _left_before(self, node: torch.fx.Node) -> str | None:
        # What this backend left whole it leaves in pieces too: a pin on a node holds for
        # what it decomposes into, and pieces need not pass the minimum size the whole failed.
        left = self.lowering.decomposed.get(origin_name(node), {})
        return left.get(self.backend.name)

    def _kept_whole_but_left(
        self, program: ExportedProgram, taken: set[torch.fx.Node]
    ) -> dict[str, tuple[str, dict[str, str]]]:
        """Once the last backend has partitioned: the nodes ExecuTorch will refuse, left
        undecomposed for a backend and taken by none (``kept_whole.kept_whole_but_left``)."""
        # Only the last backend knows: a node one backend leaves, a later one may take whole.
        listed = self._seated_with()
        if self is not listed[-1]:
            return {}
        composers = [p for p in listed if isinstance(p, ComposerPartitioner)]
        keepers = [(p.backend.name, p.kept_whole_ops, p.declined) for p in composers]
        # ExecuTorch's check after lowering asks every partitioner again, of the lowered edge
        # program; asked so, a plugin that lists the ATen ops it finds (the AOTInductor ones)
        # lists only nodes made after the edge dialect: not an answer to keep for the reasons.
        ops, op_filter = self._stack_ops_to_not_decompose(program, record=False)
        # What the decomposition kept whole: to_executorch refuses what of it has no kernel.
        kept = self.asked_to_keep[0] if self.asked_to_keep is not None else ops
        return kept_whole_but_left(
            program, taken, ops, op_filter, keepers, kept, self.lowering.kernels
        )

    def _report(self, partitions: list[list[torch.fx.Node]], elapsed: float) -> None:
        if self.progress is None:
            return
        self.progress(
            f"{self.backend.name}: {len(partitions)} partition(s) in {elapsed:.2f} s"
            + ("" if not partitions else ", lowering...")
        )
        for index, members in enumerate(partitions):
            ops = sum(1 for n in members if op_name(n) != "getitem")
            self.progress(f"  {self.backend.name}:{index}  {ops} op(s)")

    def _backend_id(self) -> str:
        return STAND_IN_BACKEND_ID if self.stand_in else self.backend.spec.backend_id

    def _compile_specs(self, native: list[CompileSpec]) -> list[CompileSpec]:
        # A stand-in for a backend that lowers here still asks the plugin, so that a plan
        # that succeeds means lowering gets the same valid answer.
        if self.stand_in and not self.check_backend_class:
            return stand_in_compile_specs(self.backend.spec)
        specs = self.registry.compile_specs(self.backend, self.method_name, self.options)
        if specs is None:
            return stand_in_compile_specs(self.backend.spec) if self.stand_in else list(native)
        if self.stand_in:
            return stand_in_compile_specs(self.backend.spec)
        return specs

    def _native_partitioner(self, ep: ExportedProgram) -> Partitioner | None:
        if not self._native_asked:
            self._native_asked = True
            self._native = self.registry.partitioner(self.backend, ep)
        return self._native
