"""Any ExecuTorch partitioner, with composer's guards and convex repair around it."""

from __future__ import annotations

import operator
import warnings
from collections import Counter
from collections.abc import Mapping

import torch.fx
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram

from composer.scheduler.convex import partition_by_color
from composer.scheduler.guards import (
    TAG,
    clean_foreign_tags,
    foreign_delegate_nodes,
    tag_constants,
    take_tags,
)
from composer.scheduler.validate import check_lowerable, describe_path, find_tag_cycle


class GuardedPartitioner(Partitioner):
    """Runs ``inner`` and cleans what it tagged, warning about every change.

    Tags on earlier delegates, user inputs and the output are removed; a tag whose nodes are
    not convex, or that closes a cycle with another tag, is split into convex parts named
    ``<tag>_<i>`` (any other tag stays whole, unconnected pieces and all); constants are
    re-tagged by composer's rule (with the partition that reads them; shared by partitions,
    they stay outside unless ``inner`` asked for them).
    """

    def __init__(self, inner: Partitioner) -> None:
        super().__init__(getattr(inner, "spec", {}))
        self.inner = inner
        self.who = f"composer.guard({type(inner).__name__})"

    def __repr__(self) -> str:
        return f"guard({self.inner!r})"

    def ops_to_not_decompose(self, ep: ExportedProgram):
        return self.inner.ops_to_not_decompose(ep)

    def transform_for_pre_decomposition(self, ep: ExportedProgram) -> ExportedProgram:
        return self.inner.transform_for_pre_decomposition(ep)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        result = self.inner.partition(exported_program)
        program = result.tagged_exported_program
        graph = program.graph_module.graph
        guarded = foreign_delegate_nodes(graph)
        kept = clean_foreign_tags(program, take_tags(graph), guarded, self.who)
        op_tags = {n: t for n, t in kept.items() if n.op == "call_function"}
        for node in graph.nodes:
            # A getitem belongs with the multi-output op it reads, tagged or not by ``inner``.
            if node.target is operator.getitem and node.args[0] in op_tags:
                op_tags[node] = op_tags[node.args[0]]
        asked_constants = {n for n in kept if n.op == "placeholder"}

        parts, broken = convex_parts(graph, op_tags)
        partition_tags = {}
        for name, tag, members in parts:
            for node in members:
                node.meta[TAG] = name
            partition_tags[name] = result.partition_tags[tag]
        dropped = sorted(set(result.partition_tags) - {tag for _, tag, _ in parts})
        for tag, reason in broken.items():
            count = sum(1 for _, t, _ in parts if t == tag)
            warnings.warn(
                f"{self.who} split tag {tag} into {count} convex parts: as tagged it {reason}.",
                stacklevel=2,
            )
        if dropped:
            warnings.warn(f"{self.who} dropped empty tag(s) {', '.join(dropped)}.", stacklevel=2)

        tag_constants(program, asked_constants)
        untagged = sorted(n.name for n in asked_constants if n.users and n.meta.get(TAG) is None)
        if untagged:
            warnings.warn(
                f"{self.who} left constant(s) {', '.join(untagged)} outside every delegate: "
                "no op of theirs is in the partition that claimed them.",
                stacklevel=2,
            )
        check_lowerable(graph, self.who)
        return PartitionResult(tagged_exported_program=program, partition_tags=partition_tags)


def convex_parts(
    graph: torch.fx.Graph, tag_of: Mapping[torch.fx.Node, str]
) -> tuple[list[tuple[str, str, list[torch.fx.Node]]], dict[str, str]]:
    """Split only the tags that cannot be lowered as tagged; keep every other tag whole.

    Returns ``(name, tag, nodes)`` per part and, for each tag split, why.
    """
    # A tag of unconnected pieces is fine: ExecuTorch fuses it into one delegate. What fails
    # is a path that leaves a tag and re-enters it, directly or through other tags.
    broken: dict[str, str] = {}
    pieces: list[tuple[str, list[torch.fx.Node]]] = []
    while path := find_tag_cycle(graph, _groups(tag_of, broken, pieces)):
        # The pieces of every tag split, with untagged nodes, form no cycle (the guarantee of
        # partition_by_color), so a tag still whole is on the path: each round splits one.
        whole = list(
            dict.fromkeys(tag_of[n] for n in path if n in tag_of and tag_of[n] not in broken)
        )
        if not whole:
            break  # cannot happen; check_lowerable then names the path
        reasons = {tag: _not_convex(graph, tag_of, tag) for tag in whole}
        tag = next((t for t in whole if reasons[t]), whole[0])
        broken[tag] = (
            reasons[tag] or f"formed a cycle with another tag (path {describe_path(path)})"
        )
        pieces = partition_by_color(graph, tag_of.get) if not pieces else pieces
    counts = Counter(tag for tag, _ in pieces if tag in broken)
    parts = [
        (tag, tag, [n for n in tag_of if tag_of[n] == tag])
        for tag in dict.fromkeys(tag_of.values())
        if tag not in broken
    ]
    seen: Counter[str] = Counter()
    for tag, members in pieces:
        if tag in broken:
            parts.append((tag if counts[tag] == 1 else f"{tag}_{seen[tag]}", tag, members))
            seen[tag] += 1
    return parts, {tag: why for tag, why in broken.items() if counts[tag] > 1}


def _groups(tag_of, broken, pieces) -> dict[torch.fx.Node, object]:
    """Each node's group for the cycle check: its tag, or its piece where the tag is split."""
    group_of: dict[torch.fx.Node, object] = {n: t for n, t in tag_of.items() if t not in broken}
    for index, (tag, members) in enumerate(pieces):
        if tag in broken:
            group_of.update((node, index) for node in members)
    return group_of


def _not_convex(graph: torch.fx.Graph, tag_of: Mapping[torch.fx.Node, str], tag: str) -> str:
    path = find_tag_cycle(graph, {n: t for n, t in tag_of.items() if t == tag})
    return f"was not convex (path {describe_path(path)} leaves it and comes back)" if path else ""
