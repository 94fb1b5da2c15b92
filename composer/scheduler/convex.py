"""Maximal convex partitioning of the supported nodes of a graph, in near-linear time.

Every ``call_function`` node gets an integer *level* such that along every edge the level
never decreases, and it strictly increases on every edge into an unsupported node. A
partition is a connected set of supported nodes of one level (connected through edges
between them). Then:

* a partition is convex: a path that leaves it and comes back stays on one level, so it
  never passes an unsupported node, so every node on it is supported, of that level and
  connected to the partition, hence inside it;
* the graph with every partition collapsed is acyclic: a cycle between partitions would
  again be a path whose levels cannot rise, so the partitions on it would be one.

Levels start "as soon as possible"; a second pass, in reverse topological order of the
groups, lifts each group as late as its successors allow, so that side branches join the
partition they feed instead of forming partitions of their own. Both passes and the
union-find over edges are O((V + E) α(V)). ``torch.fx``'s ``CapabilityBasedPartitioner``
merges pairwise with a reachability check, which is super-quadratic on large graphs.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Sequence

import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase

# Dropping partitions below the minimum size can change the levels of the rest; a few
# re-runs reach the fixed point in practice, after that the small ones are just dropped
# (dropping keeps every other partition convex and the collapsed graph acyclic).
_MAX_REFINEMENTS = 4


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, item: int) -> int:
        parent = self.parent
        root = item
        while parent[root] != root:
            root = parent[root]
        while parent[item] != root:
            parent[item], item = root, parent[item]
        return root

    def union(self, a: int, b: int) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            # The smaller index becomes the root, so groups are named by their first node.
            if root_a < root_b:
                self.parent[root_b] = root_a
            else:
                self.parent[root_a] = root_b


class _Graph:
    """The ``call_function`` nodes of an fx graph as integer adjacency lists."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.nodes = [node for node in graph.nodes if node.op == "call_function"]
        index = {node: i for i, node in enumerate(self.nodes)}
        self.preds: list[list[int]] = [
            [index[p] for p in node.all_input_nodes if p in index] for node in self.nodes
        ]
        self.succs: list[list[int]] = [[] for _ in self.nodes]
        for i, preds in enumerate(self.preds):
            for p in preds:
                self.succs[p].append(i)
        self.is_getitem = [node.target is operator.getitem for node in self.nodes]


def _asap_levels(graph: _Graph, supported: list[bool]) -> list[int]:
    levels = [0] * len(graph.nodes)
    for i, preds in enumerate(graph.preds):
        step = 0 if supported[i] else 1
        level = 0
        for p in preds:
            level = max(level, levels[p] + step)
        levels[i] = level
    return levels


def _groups(graph: _Graph, supported: list[bool], levels: list[int]) -> _UnionFind:
    groups = _UnionFind(len(graph.nodes))
    for i, preds in enumerate(graph.preds):
        if supported[i]:
            for p in preds:
                if supported[p] and levels[p] == levels[i]:
                    groups.union(p, i)
    return groups


def _lift_levels(graph: _Graph, supported: list[bool], levels: list[int]) -> None:
    """Raise each group as far as its successors allow, latest groups first."""
    groups = _groups(graph, supported, levels)
    root = [groups.find(i) for i in range(len(graph.nodes))]
    members: dict[int, list[int]] = {}
    for i, r in enumerate(root):
        members.setdefault(r, []).append(i)
    group_succs: dict[int, set[int]] = {r: set() for r in members}
    in_degree = dict.fromkeys(members, 0)
    for i, succs in enumerate(graph.succs):
        for s in succs:
            if root[s] != root[i] and root[s] not in group_succs[root[i]]:
                group_succs[root[i]].add(root[s])
                in_degree[root[s]] += 1
    ready = deque(r for r, d in in_degree.items() if d == 0)
    order = []
    while ready:
        r = ready.popleft()
        order.append(r)
        for s in group_succs[r]:
            in_degree[s] -= 1
            if in_degree[s] == 0:
                ready.append(s)
    for r in reversed(order):
        slack = None
        for i in members[r]:
            for s in graph.succs[i]:
                if root[s] == r:
                    continue
                room = levels[s] - levels[i] - (0 if supported[s] else 1)
                if slack is None or room < slack:
                    slack = room
        if slack:  # None (a sink group) or 0 (already tight): stays
            for i in members[r]:
                levels[i] += slack


def _propose(graph: _Graph, supported: list[bool]) -> list[list[int]]:
    levels = _asap_levels(graph, supported)
    _lift_levels(graph, supported, levels)
    groups = _groups(graph, supported, levels)
    partitions: dict[int, list[int]] = {}
    for i in range(len(graph.nodes)):
        if supported[i]:
            partitions.setdefault(groups.find(i), []).append(i)
    return list(partitions.values())


def _size(graph: _Graph, members: Sequence[int]) -> int:
    return sum(1 for i in members if not graph.is_getitem[i])


def partition_convex(
    graph_module: torch.fx.GraphModule,
    operator_support: OperatorSupportBase,
    min_size: int = 1,
) -> list[list[torch.fx.Node]]:
    """Group the supported ``call_function`` nodes into maximal convex partitions.

    Takes the same inputs as ``torch.fx``'s ``CapabilityBasedPartitioner``. A ``getitem``
    goes where its producer goes and does not count towards ``min_size``. Every partition is
    convex and the graph stays acyclic with each partition collapsed to one node. Returns
    the partitions in topological order, each as its nodes in topological order.
    """
    submodules = dict(graph_module.named_modules())
    return partition_by_support(
        graph_module.graph,
        lambda node: bool(operator_support.is_node_supported(submodules, node)),
        min_size,
    )


def partition_by_support(
    graph: torch.fx.Graph,
    is_supported: Callable[[torch.fx.Node], bool],
    min_size: int = 1,
) -> list[list[torch.fx.Node]]:
    """:func:`partition_convex` with support given as a predicate on nodes."""
    compute = _Graph(graph)
    supported = [False] * len(compute.nodes)
    for i, node in enumerate(compute.nodes):
        if compute.is_getitem[i]:
            preds = compute.preds[i]
            supported[i] = bool(preds) and supported[preds[0]]
        else:
            supported[i] = is_supported(node)
    for _ in range(_MAX_REFINEMENTS):
        partitions = _propose(compute, supported)
        too_small = [p for p in partitions if _size(compute, p) < min_size]
        if not too_small:
            break
        for members in too_small:
            for i in members:
                supported[i] = False
    kept = [sorted(p) for p in partitions if _size(compute, p) >= min_size]
    kept.sort(key=lambda members: members[0])
    return [[compute.nodes[i] for i in members] for members in kept]
