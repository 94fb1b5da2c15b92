"""Narrowing a wrong delegate to its wrong operators, so that a repair moves only those.

The proof names a delegate that fails to match its subgraph, to run, or to load
(:mod:`composer.run.proof`). Moving its whole partition makes the program right and slow: a
TCN's three dilated convolutions took its GPU partition to the CPU with them. Here the partition
is lowered again with the same backend, holding only some of its operators, and each such
program is judged alone exactly as the proof judged the delegate: on the operands the proof
captured for it, against its subgraph in float64. Delta debugging (Zeller's ``ddmin``) over the
partition's operators finds a smallest set whose removal leaves a delegate that passes; only
the nodes of those operators leave the backend, and the rest stays, in partitions the scheduler
checks convex as before. Where every operator is wrong (a backend off in all it computes), the
smallest such set is all of them, and the whole partition moves, as a repair did before.

Narrowing never decides alone that a program is right: the repaired program is proven whole
again, and a delegate still wrong is narrowed (or moved) in the next round. It stops at its
deadline with the smallest set found so far, which may be the whole partition.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from composer.contract.machine import MachineError
from composer.contract.op_names import op_name
from composer.lower.cache import Store
from composer.registry.discovery import Backend
from composer.run.named_data import stored_blobs
from composer.run.proof import Culprit, Evidence, delegates_failing
from composer.scheduler.plans import Plan

# At most this many lowerings of one partition's subsets: ddmin over k operators needs about
# log(k) of them for one wrong operator and about 2k where all are wrong.
MOST_TRIES = 48


@attrs.frozen
class Narrowing:
    """What narrowing needs besides the culprit: the backends that lower (by ExecuTorch backend
    id) and the partition cache, as the compose that made the program had them."""

    backends: Mapping[str, Backend]
    folder: Any = None  # the cache folder, None: no cache

    def narrowed(self, culprit: Culprit, plan: Plan, deadline: float) -> Culprit:
        """``culprit`` with only the nodes of its wrong operators, where fewer than all of its
        operators make its delegate fail alone; else ``culprit`` as it is."""
        evidence = culprit.evidence
        ops = _ops_in_order(culprit.nodes, plan.node_ops)
        if evidence is None or len(ops) < 2 or culprit.adds_up:
            return culprit
        store = None if self.folder is None else Store(self.folder, "partition")
        tries = _Tries(evidence, plan, self.backends, store, deadline)
        wrong = ddmin(ops, lambda moved: tries.passes_without(ops, moved))
        if len(wrong) == len(ops):
            return culprit
        nodes = tuple(n for n in culprit.nodes if plan.node_ops.get(n) in wrong)
        where = _sources(evidence, nodes)
        said = ", ".join(wrong) + (f" at {where}" if where else "")
        return attrs.evolve(
            culprit,
            nodes=nodes,
            whole=culprit.nodes,
            narrowed=said,
            narrowed_how=f"found in {tries.count} trial lowerings; its other "
            f"{len(culprit.nodes) - len(nodes)} node(s) stay on {culprit.backend}",
        )


def ddmin(items: Sequence[str], fails: Callable[[Sequence[str]], bool]) -> tuple[str, ...]:
    """A 1-minimal subset of ``items`` for which ``fails`` holds, where it holds for all of
    them (Zeller and Hildebrandt's delta debugging): no single item can be taken out of what
    it returns and ``fails`` still hold. ``fails`` answers False for a subset it cannot judge."""
    items = tuple(items)
    chunks = 2
    while len(items) >= 2:
        size = -(-len(items) // chunks)
        parts = [items[i : i + size] for i in range(0, len(items), size)]
        found = next((p for p in parts if fails(p)), None)
        if found is not None:
            items, chunks = found, 2
            continue
        rests = [tuple(x for x in items if x not in p) for p in parts] if len(parts) > 2 else []
        found = next((r for r in rests if fails(r)), None)
        if found is not None:
            items, chunks = found, max(chunks - 1, 2)
            continue
        if chunks >= len(items):
            break
        chunks = min(len(items), chunks * 2)
    return items


@attrs.define
class _Tries:
    """Lowering a subset of one failed partition's operators with its backend and judging it."""

    evidence: Evidence
    plan: Plan
    backends: Mapping[str, Backend]
    store: Store | None
    deadline: float
    count: int = 0
    seen: dict[frozenset[str], bool | None] = attrs.field(factory=dict)

    def passes_without(self, ops: Sequence[str], moved: Sequence[str]) -> bool:
        """Whether the partition's delegate, lowered without the operators ``moved``, runs
        and matches; False where that is not known (it did not lower, or time is up)."""
        kept = frozenset(ops) - set(moved)
        return not kept or self.fails(kept) is False

    def fails(self, ops: frozenset[str]) -> bool | None:
        """Whether ``ops`` alone, lowered with the backend, fail; None where not known."""
        if ops not in self.seen:
            if time.perf_counter() > self.deadline or self.count >= MOST_TRIES:
                return None  # out of time: what was found so far stands
            self.count += 1
            self.seen[ops] = self._judged(ops)
        return self.seen[ops]

    def _judged(self, ops: frozenset[str]) -> bool | None:
        lowered = self.evidence.lowered
        try:
            module, data = _lowered_holding(lowered, ops, self.backends, self.store)
        except MachineError:
            raise
        except Exception:  # noqa: BLE001 - the backend cannot lower these ops alone
            return None
        data = {**self.evidence.data, **data}
        return bool(delegates_failing(module, self.plan, self.evidence.operands, data))


class _Named(OperatorSupportBase):
    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.name in self.names


def _lowered_holding(
    lowered: Any, ops: frozenset[str], backends, store
) -> tuple[torch.fx.GraphModule, dict[str, bytes]]:
    """The subgraph ``lowered`` was made from, with only its nodes of ``ops`` lowered again
    to the same backend (with its compile specs), in convex partitions; the rest left as
    edge ops, which the judge runs as eager does. With it, the named data its new delegates
    store (a backend's weights kept apart from its processed bytes)."""
    from executorch.exir.backend.backend_api import to_backend
    from executorch.exir.backend.partitioner import (
        DelegationSpec,
        Partitioner,
        PartitionResult,
    )
    from executorch.exir.backend.utils import tag_constant_data

    # executorch.exir takes seconds to import, and a program from the cache needs none of it.
    from composer.lower.partition_cache import reusing

    program = copy.deepcopy(lowered.original_module)
    names = {n.name for n in program.graph.nodes if n.op == "call_function" and op_name(n) in ops}
    spec = DelegationSpec(lowered.backend_id, list(lowered.compile_specs))

    class Holding(Partitioner):
        def __init__(self) -> None:
            super().__init__(spec)

        def partition(self, exported) -> PartitionResult:
            module = exported.graph_module
            proposed = CapabilityBasedPartitioner(
                module, _Named(names), allows_single_node_partition=True
            ).propose_partitions()
            tags = {}
            for index, partition in enumerate(proposed):
                tag = f"narrowed_{index}"
                for node in partition.nodes:
                    node.meta["delegation_tag"] = tag
                tags[tag] = spec
            tag_constant_data(exported)
            return PartitionResult(tagged_exported_program=exported, partition_tags=tags)

    with reusing(backends, store):
        made = to_backend(program, Holding())
    module = made.module(check_guards=False)
    module.validate_inputs = False
    return module, _named_data(made.graph_module)


def _named_data(module: torch.nn.Module) -> dict[str, bytes]:
    """The named data the delegates of ``module`` store."""
    found: dict[str, bytes] = {}
    for child in module.children():
        found.update(stored_blobs(getattr(child, "named_data_store_output", None)))
    return found


def _ops_in_order(nodes: Sequence[str], node_ops: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(node_ops[n] for n in nodes if n in node_ops))


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \w+\n\s+(.+)')


def _sources(evidence: Evidence, nodes: Sequence[str]) -> str:
    """Where the user wrote the first of ``nodes``: the innermost frame of its stack trace,
    as ``file.py:37 `code```."""
    wanted = set(nodes)
    for node in evidence.lowered.original_module.graph.nodes:
        trace = node.meta.get("stack_trace") if node.name in wanted else None
        frames = _FRAME.findall(trace or "")
        if frames:
            path, line, code = frames[-1]
            return f"{path.rsplit('/', 1)[-1]}:{line} `{code.strip()[:80]}`"
    return ""
