"""The Plan read off a lowered program: which backend took each node, the partitions, the
fallbacks and why, delegate calls and device crossings.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.fx
from executorch.exir.delegate import executorch_call_delegate

from composer.contract.op_names import op_name
from composer.registry.discovery import Backend
from composer.scheduler.guards import foreign_delegate_nodes
from composer.scheduler.partitioner import PartitionRecord
from composer.scheduler.plans import PORTABLE, Fallback, Partition, Plan
from composer.scheduler.stand_in import STAND_IN_BACKEND_ID, stand_in_backend_name

HOST = "cpu"


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
        for index, (members, state) in enumerate(zip(record.partitions, record.state, strict=True)):
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
                    state=tuple(state),
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
