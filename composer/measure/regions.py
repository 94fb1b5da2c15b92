"""The regions of per-region placement: which backends take each node (``survey``), and
intervals of one topological order cut where that changes (``cut``); an interval of a
topological order is always convex.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from composer.run import torch_free_runtime
from composer.run.runtime import torch_mismatch
from composer.scheduler.measured_placement import Region
from composer.scheduler.plans import PORTABLE

MAX_REGION_NODES = 8  # a longer run of nodes the same backends take is cut into pieces


MAX_REGIONS = 40  # more are merged, smallest neighbours first: each is a call to time


# Hosted (CUDA in the stack, on a GPU), each region a layout puts on CUDA is a .so of its own,
# tens of seconds to compile (bench/gpu/gpu_mix.py's 32-step RNN then a head: cut into 21 regions,
# the layouts hold 31 CUDA partitions; into 8, 12).
HOSTED_MAX_REGIONS = 8


def survey(first: Mapping[str, Any]) -> dict[str, frozenset[str]] | None:
    """Per node, where it can run, from ``first``: backend -> the strict plan of the stack
    with that backend first; and ``PORTABLE`` where the runtime has a portable kernel for its
    op (no backend taking it: it runs there in every plan). ``None`` when the plans' nodes
    differ (the orders decompose the model differently, so node names do not carry over)."""
    plans = list(first.values())
    nodes = set(plans[0].node_ops)
    if any(set(p.node_ops) != nodes for p in plans[1:]):
        return None
    kernels = portable_kernels()
    found = {}
    for node, op in plans[0].node_ops.items():
        backends = {b for b, plan in first.items() if plan.node_backends.get(node) == b}
        if not backends or _has_kernel(op, kernels):
            backends.add(PORTABLE)
        found[node] = frozenset(backends)
    return found


def portable_kernels() -> frozenset[str]:
    """The kernels the ExecuTorch runtime here has ("aten::linear.out"): the pip runtime's,
    or under another torch than it is built for, the torch-free runtime's (none where that
    is not installed either)."""

    if torch_mismatch() is not None:
        return torch_free_runtime.operators()
    from executorch.extension.pybindings import portable_lib

    return frozenset(portable_lib._get_operator_names())


def _has_kernel(op: str, kernels: frozenset[str]) -> bool:
    """Whether an op of the plan (``aten.max_pool2d.default``) has a kernel in ``kernels``.
    ExecuTorch 1.5.1's has none for ``aten.max_pool2d`` (only ``max_pool2d_with_indices``),
    which the stack keeps whole for XNNPACK: a program with it on portable kernels fails in
    ``to_executorch`` ("Missing out variants")."""
    namespace, _, rest = op.partition(".")
    name = rest.rpartition(".")[0]
    if not (namespace and name):
        return True  # not an op name composer makes: no reason to rule it out
    return any(kernel.startswith(f"{namespace}::{name}.") for kernel in kernels)


def topological_order(nodes: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[str]:
    """``nodes`` in an order that respects ``edges``; it follows a chain while it can (the
    consumer of the node just placed goes next), else the earliest ready node of ``nodes``."""
    rank = {node: i for i, node in enumerate(nodes)}
    users: dict[str, list[str]] = {node: [] for node in nodes}
    waiting = dict.fromkeys(nodes, 0)
    for producer, consumer in dict.fromkeys(edges):
        if producer in rank and consumer in rank and producer != consumer:
            users[producer].append(consumer)
            waiting[consumer] += 1
    ready = {node for node in nodes if waiting[node] == 0}
    order: list[str] = []
    while ready:
        last = order[-1] if order else None
        follow = [u for u in users.get(last, ()) if u in ready] if last else []
        node = min(follow or ready, key=rank.__getitem__)
        ready.discard(node)
        order.append(node)
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.add(user)
    if len(order) != len(nodes):
        raise ValueError("the data edges between the plan's nodes have a cycle")
    return order


def cut(
    order: Sequence[str],
    support: Mapping[str, frozenset[str]],
    backends: Sequence[str],
    max_nodes: int = MAX_REGION_NODES,
    max_regions: int = MAX_REGIONS,
) -> list[Region]:
    """Regions of ``order``: cut where the places that can run the nodes change (``support``:
    backends, and ``PORTABLE``), runs longer than ``max_nodes`` cut evenly, then at most
    ``max_regions`` (smallest neighbours that can run somewhere together merged)."""
    runs: list[list[str]] = []
    for node in order:
        if runs and support[runs[-1][-1]] == support[node]:
            runs[-1].append(node)
        else:
            runs.append([node])
    pieces: list[list[str]] = []
    for run in runs:
        count = math.ceil(len(run) / max_nodes)
        size = math.ceil(len(run) / count)
        pieces += [run[i : i + size] for i in range(0, len(run), size)]
    places = [*backends, PORTABLE]

    def options(piece: Sequence[str]) -> tuple[str, ...]:
        return tuple(p for p in places if all(p in support[n] for n in piece))

    while len(pieces) > max_regions:
        # Merging two neighbours keeps an interval; it runs where both may.
        pairs = [j for j in range(len(pieces) - 1) if options(pieces[j] + pieces[j + 1])]
        if not pairs:
            break
        i = min(pairs, key=lambda j: len(pieces[j]) + len(pieces[j + 1]))
        pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
    return [Region(tuple(piece), options(piece)) for piece in pieces]
