"""Any ExecuTorch partitioner, with composer's guards and convex repair around it."""

from __future__ import annotations

import warnings
from collections import Counter

from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch.export import ExportedProgram

from composer.scheduler.convex import partition_by_color
from composer.scheduler.guards import TAG, foreign_delegate_nodes, tag_constants
from composer.scheduler.partitioner import check_lowerable, clean_foreign_tags, take_tags


class GuardedPartitioner(Partitioner):
    """Runs ``inner`` and cleans what it tagged, warning about every change.

    Tags on earlier delegates, user inputs and the output are removed; a tag whose nodes are
    not convex (or that closes a cycle with another tag) is split into convex parts named
    ``<tag>_<i>``; constants are re-tagged by composer's rule (with the partition that reads
    them; shared by partitions, they stay outside unless ``inner`` asked for them).
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
        asked_constants = {n for n in kept if n.op == "placeholder"}

        parts = partition_by_color(graph, op_tags.get)
        pieces = Counter(tag for tag, _ in parts)
        seen: Counter[str] = Counter()
        partition_tags = {}
        for tag, members in parts:
            name = tag if pieces[tag] == 1 else f"{tag}_{seen[tag]}"
            seen[tag] += 1
            for node in members:
                node.meta[TAG] = name
            partition_tags[name] = result.partition_tags[tag]
        dropped = sorted(set(result.partition_tags) - set(pieces))
        split = sorted(tag for tag, count in pieces.items() if count > 1)
        if split:
            warnings.warn(
                f"{self.who} split tag(s) {', '.join(split)} into convex parts: as tagged they "
                "were not convex or formed a cycle with another tag.",
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
