"""What may cross a delegate's boundary: partitions whose inputs and outputs the backend's
runtime can bind.

ExecuTorch hands a delegate its inputs and outputs as plain tensors, and a backend's runtime
may not bind every tensor an edge program has. OpenVINO's (ExecuTorch 1.5.1,
``backends/openvino/runtime/OpenvinoBackend.cpp``, ``create_ov_tensor``) describes each one
to OpenVINO by its sizes alone: a 0-d tensor fails there (``ov_shape_create`` takes rank 1
or more) and the delegate fails with error 0x1 at run time, and a tensor in another dim order
than contiguous (channels last) is read or written as if it were contiguous; and an output
that is a delegate input passed through unchanged (an alias or a clone of it) is never
written, nor is an output of dynamic size resized (it keeps its upper bound's shape). Inside
a delegate none of this matters. So whether a node may go to such a backend depends on where
its partition ends, which is decided here, not by per-node support.

A backend's support object says which tensors it refuses at a partition's boundary
(``reason_unsupported_at_boundary(node, partition) -> str | None``: ``node`` produces the
tensor, ``partition`` holds the nodes of the delegate it would enter or leave). Partitions are
formed as usual (convex, as few as possible); then every tensor that would cross a
partition's boundary is asked about: a refused constant (parameter, buffer or lifted
constant; not a mutated buffer) joins the partition that reads it, duplicated where others
read it too; a node whose refused output would leave its partition, or that would read a
refused tensor from outside it, is left out of the partition, and the partitions are formed
again, until no refused tensor crosses. Leaving nodes out only removes nodes from the
supported set, so each round keeps every property of :func:`partition_by_support`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Container

import attrs
import torch.fx

from composer.scheduler.convex import partition_by_support

# Why a tensor (given as the node that produces it) cannot enter or leave the delegate made of
# the partition's nodes (the second argument), or None if it can.
BoundaryCheck = Callable[[torch.fx.Node, Container[torch.fx.Node]], str | None]


@attrs.frozen
class BoundedPartitions:
    """Partitions no refused tensor crosses, what was left out of them, and why."""

    partitions: list[list[torch.fx.Node]]
    left_out: dict[str, str]  # node name -> why it was left out of its partition
    constants: set[torch.fx.Node]  # refused constants that join the partition reading them


def partition_within_boundary(
    graph: torch.fx.Graph,
    is_taken: Callable[[torch.fx.Node], bool],
    min_size: int,
    refuses: BoundaryCheck | None,
    movable_constants: set[torch.fx.Node],
) -> BoundedPartitions:
    """:func:`partition_by_support`, then nodes left out until no tensor ``refuses`` names
    crosses a partition's boundary (``movable_constants``: those that may join a partition)."""
    left_out: dict[torch.fx.Node, str] = {}
    taken: dict[torch.fx.Node, bool] = {}  # each node asked once, however many rounds

    def still_taken(node: torch.fx.Node) -> bool:
        if node not in taken:
            taken[node] = is_taken(node)
        return taken[node] and node not in left_out

    while True:
        partitions = partition_by_support(graph, still_taken, min_size)
        if refuses is None:
            return BoundedPartitions(partitions, {}, set())
        more, constants = _refused_crossings(partitions, refuses, movable_constants)
        if not more:
            names = {node.name: why for node, why in left_out.items()}
            return BoundedPartitions(partitions, names, constants)
        left_out.update(more)


def _refused_crossings(
    partitions: list[list[torch.fx.Node]],
    refuses: BoundaryCheck,
    movable_constants: set[torch.fx.Node],
) -> tuple[dict[torch.fx.Node, str], set[torch.fx.Node]]:
    """The nodes to leave out so that no refused tensor crosses, and the refused constants
    that can join the partition instead."""
    part_of = {node: index for index, members in enumerate(partitions) for node in members}
    left_out: dict[torch.fx.Node, str] = {}
    constants: set[torch.fx.Node] = set()
    inside = [_Inside(index, part_of, left_out) for index in range(len(partitions))]

    def refused(value: torch.fx.Node, index: int) -> str | None:
        return refuses(value, inside[index])

    def leave_out(node: torch.fx.Node, why: str) -> None:
        pending = [(node, why)]
        while pending:
            node, why = pending.pop()
            # A getitem goes where the op it reads goes: it is that op that is left out.
            if node.target is operator.getitem and node.args[0] in part_of:
                node = node.args[0]
            if node in left_out:
                continue
            index = part_of[node]
            left_out[node] = why
            # Left out, it is outside for its neighbours in the partition: what it read from
            # them now leaves the partition, and what it gives them now enters it.
            for producer in node.all_input_nodes:
                if producer in inside[index] and (reason := refused(producer, index)):
                    pending.append((producer, _leaves(reason)))
            for value in _values(node):
                for user in value.users:
                    if user in inside[index] and (reason := refused(value, index)):
                        pending.append((user, _reads(value, reason)))

    for index, members in enumerate(partitions):
        for node in members:
            if node not in inside[index]:
                continue
            leaves = any(user not in inside[index] for user in node.users)
            if leaves and (reason := refused(node, index)):
                leave_out(node, _leaves(reason))
                continue
            for producer in node.all_input_nodes:
                if producer in inside[index] or not (reason := refused(producer, index)):
                    continue
                if producer in movable_constants:
                    constants.add(producer)
                else:
                    leave_out(node, _reads(producer, reason))
                    break
    return left_out, constants


class _Inside:
    """The nodes of partition ``index`` still in it: a ``Container`` for the boundary check."""

    def __init__(
        self, index: int, part_of: dict[torch.fx.Node, int], left_out: dict[torch.fx.Node, str]
    ) -> None:
        self.index = index
        self.part_of = part_of
        self.left_out = left_out

    def __contains__(self, node: object) -> bool:
        if isinstance(node, torch.fx.Node) and node.target is operator.getitem:
            node = node.args[0]  # a getitem is where the op it reads is
        return self.part_of.get(node) == self.index and node not in self.left_out


def _values(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes that carry what ``node`` computes: itself, and the getitems of its outputs."""
    return [node, *(user for user in node.users if user.target is operator.getitem)]


def _leaves(why: str) -> str:
    return f"its output would leave the delegate as {why}"


def _reads(value: torch.fx.Node, why: str) -> str:
    return f"it would read {value.name} into the delegate as {why}"


CONSTANTS_ONLY = (
    "its partition would read only constants: the backend compiles a delegate that reads no "
    "input for the wrong device (BackendSpec.needs_a_runtime_input)"
)


def reading_an_input(
    partitions: list[list[torch.fx.Node]], constants: Container[torch.fx.Node]
) -> tuple[list[list[torch.fx.Node]], list[torch.fx.Node]]:
    """The partitions that read a tensor other than ``constants`` (an input, or what is
    computed outside them), and the nodes of the others, which are left out whole: dropping a
    partition keeps the rest convex."""
    kept: list[list[torch.fx.Node]] = []
    dropped: list[torch.fx.Node] = []
    for members in partitions:
        inside = set(members)
        reads = {p for node in members for p in node.all_input_nodes if p not in inside}
        if all(p in constants for p in reads):
            dropped.extend(members)
        else:
            kept.append(members)
    return kept, dropped
