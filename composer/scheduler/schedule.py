"""The stack's assignment, decided once for every backend before any of them tags a node
(``PrioritySchedule``), and the data edges between the ops it is decided on.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch
import torch.fx
from torch.export import ExportedProgram

from composer.contract.errors import ComposerWarning, PartitionError
from composer.contract.op_names import op_name
from composer.scheduler.assign import Assignment, assign, warn_about_pins_naming_no_op
from composer.scheduler.partitioner import ComposerPartitioner
from composer.scheduler.support import Support


class PrioritySchedule:
    """The stack's assignment, decided once for every backend before any of them tags a node.

    ExecuTorch builds the edge program inside ``to_edge_transform_and_lower`` and shows it to
    the partitioners only, one after another: the first backend's ``partition()`` is the first
    moment its nodes exist, and it comes before anything is tagged, so the assignment is made
    there. Each later backend is shown the program with the earlier delegates in it; node
    names survive lowering, so an assignment by name holds for it too.
    """

    def __init__(
        self,
        never: Mapping[str, frozenset[str]],
        consolidate: bool,
        decomposed_names: set[str] = frozenset(),
    ) -> None:
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
            # The stack's partitioners, as the lowering that shares this schedule lists them.
            partitioners = [
                p for p in partitioner.listed_with() if isinstance(p, ComposerPartitioner)
            ]
            if not partitioners or partitioner is not partitioners[0] or guarded:
                raise PartitionError(
                    f"backend {partitioner.backend.name!r} partitioned before the first backend "
                    "of the stack, or on a program with delegates in it: ExecuTorch no longer "
                    "lowers in list order. This is a bug in composer; please report it."
                )
            self.assignment = self._decide(partitioners, program, support)
        return self.assignment.withheld_from(partitioner.backend.name)

    def _decide(
        self,
        partitioners: Sequence[ComposerPartitioner],
        program: ExportedProgram,
        first: Support,
    ) -> Assignment:
        graph = program.graph_module.graph
        ops = {
            node.name: op_name(node)
            for node in graph.nodes
            if node.op == "call_function" and op_name(node) != "getitem"
        }
        self.edges = tuple(data_edges(graph))
        order = [p.backend.name for p in partitioners]
        never = {name: self.never[name] for name in order if name in self.never}
        calls = [n for n in graph.nodes if n.op == "call_function"]
        warn_about_pins_naming_no_op(
            never,
            (op_name(n) for n in calls),
            [*(n.name for n in calls), *self.decomposed_names],
        )
        devices = {p.backend.name: p.backend.spec.device for p in partitioners}
        if not self.consolidate:
            return assign(ops, order, never)
        supported = {order[0]: first.names(graph, set())}
        # Each backend is asked again on the program it lowers, so what it would say about
        # this one only feeds the assignment; its warnings come once, from that second ask.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ComposerWarning)
            for partitioner in partitioners[1:]:
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
