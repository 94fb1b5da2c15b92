"""Convex partitioning of a graph's supported nodes: as few partitions as possible, in O(V + E).

Every ``call_function`` node gets a *level*: the largest number of steps from a supported
node into an unsupported one on any path that reaches it. Levels never decrease along an
edge and rise on every supported -> unsupported edge. The partitions are the supported
nodes grouped by level. Then:

* each partition is convex: a path that leaves it and comes back cannot rise, so it meets
  no unsupported node, so every node on it is supported and of that level: inside;
* the graph with every partition collapsed is acyclic, by the same argument on a cycle;
* with ``min_size`` 1, no valid partitioning has fewer partitions: a path that goes
  supported node, unsupported node(s), supported node, ... forces a new partition at every
  such step, and the deepest supported node's level counts exactly those steps on its
  longest path. A larger ``min_size`` drops the partitions below it and re-runs on what is
  left; the result keeps the two properties above but is not proven minimal.

Levels start as soon as possible; a backward pass then moves a node up into its consumers'
stage where that stage already holds its color (a weight's transpose joins the matmul that
reads it), which keeps every property above and never adds a partition. A multi-output op
and its getitems move as one, so a getitem always shares its producer's level and partition.

A partition may hold several unconnected pieces (as ``torch.fx``'s
``CapabilityBasedPartitioner`` also makes): one delegate call instead of several. That
partitioner merges pairwise with a reachability check per merge, which is super-quadratic
on large graphs; this is one pass in topological order.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Sequence

import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase

# Dropping partitions below the minimum size changes the levels of the rest; a few re-runs
# reach the fixed point in practice, after that the small ones are just dropped (dropping a
# partition keeps every other one convex and the collapsed graph acyclic).
_MAX_REFINEMENTS = 4


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


def _levels(graph: _Graph, colors: list[Hashable | None]) -> list[int]:
    levels = [0] * len(graph.nodes)
    for i, preds in enumerate(graph.preds):
        level = 0
        for p in preds:
            # Leaving a colored node for one of another color (or none) starts a new stage.
            level = max(level, levels[p] + _step(colors, p, i))
        levels[i] = level
    return levels


def _step(colors: list[Hashable | None], source: int, target: int) -> int:
    return 1 if colors[source] is not None and colors[source] != colors[target] else 0


def _join_consumers(graph: _Graph, colors: list[Hashable | None], levels: list[int]) -> None:
    """Move a node up to its consumers' stage when that stage already has its color.

    Stages as soon as possible put a node that only reads constants (a weight's permute) in
    the first stage, away from the op that uses it. Any assignment that keeps the level rules
    is as convex as the first, and moving only into stages already in use never adds a
    partition.

    A multi-output op moves with all its getitems or not at all: a getitem in another
    partition than its producer makes the producer's partition return the whole list, which
    backends cannot plan memory for. The unit's target is the lowest its outside consumers
    allow, so the level rules hold on every edge out of it; pinning the getitems instead
    would also pin their producer (a weight's split) in the first stage.
    """
    occupied: dict[tuple[int, Hashable], int] = {}
    for i, color in enumerate(colors):
        if color is not None:
            key = (levels[i], color)
            occupied[key] = occupied.get(key, 0) + 1
    for i in range(len(graph.nodes) - 1, -1, -1):
        color = colors[i]
        # A colored getitem always has its producer here, which moves it.
        if color is None or graph.is_getitem[i]:
            continue
        unit = _with_getitems(graph, i)
        # Every getitem a member feeds is in the unit, so the rest are outside consumers.
        targets = [
            levels[s] - _step(colors, m, s)
            for m in unit
            for s in graph.succs[m]
            if not graph.is_getitem[s]
        ]
        if not targets:
            continue
        target = min(targets)
        if target > levels[i] and occupied.get((target, color)):
            occupied[(levels[i], color)] -= len(unit)
            occupied[(target, color)] += len(unit)
            for m in unit:
                levels[m] = target


def _with_getitems(graph: _Graph, i: int) -> list[int]:
    """Node ``i`` and the getitems that read it, and those that read them (nested tuples)."""
    unit = [i]
    for member in unit:
        unit.extend(s for s in graph.succs[member] if graph.is_getitem[s])
    return unit


def _propose(graph: _Graph, colors: list[Hashable | None]) -> list[list[int]]:
    levels = _levels(graph, colors)
    _join_consumers(graph, colors, levels)
    partitions: dict[tuple[int, Hashable], list[int]] = {}
    for i, color in enumerate(colors):
        if color is not None:
            partitions.setdefault((levels[i], color), []).append(i)
    return list(partitions.values())


def _size(graph: _Graph, members: Sequence[int]) -> int:
    return sum(1 for i in members if not graph.is_getitem[i])


def partition_convex(
    graph_module: torch.fx.GraphModule,
    operator_support: OperatorSupportBase,
    min_size: int = 1,
) -> list[list[torch.fx.Node]]:
    """Group the supported ``call_function`` nodes into as few convex partitions as possible.

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
    return [
        members
        for _color, members in partition_by_color(
            graph, lambda node: True if is_supported(node) else None, min_size
        )
    ]


def partition_by_color(
    graph: torch.fx.Graph,
    color_of: Callable[[torch.fx.Node], Hashable | None],
    min_size: int = 1,
) -> list[tuple[Hashable, list[torch.fx.Node]]]:
    """Split nodes of each color (``None``: no color) into convex, mutually acyclic parts.

    With one color this is :func:`partition_convex`. With several (the tags another
    partitioner chose), every part keeps one color, every part is convex, and collapsing
    all parts of all colors leaves the graph acyclic: the same stage argument, with a new
    stage on every edge out of a colored node into a node of another color.
    """
    compute = _Graph(graph)
    colors: list[Hashable | None] = [None] * len(compute.nodes)
    for i, node in enumerate(compute.nodes):
        if compute.is_getitem[i]:
            preds = compute.preds[i]
            colors[i] = colors[preds[0]] if preds else None
        else:
            colors[i] = color_of(node)
    for _ in range(_MAX_REFINEMENTS):
        partitions = _propose(compute, colors)
        too_small = [p for p in partitions if _size(compute, p) < min_size]
        if not too_small:
            break
        for members in too_small:
            for i in members:
                colors[i] = None
    kept = [sorted(p) for p in partitions if _size(compute, p) >= min_size]
    kept.sort(key=lambda members: members[0])
    return [(colors[members[0]], [compute.nodes[i] for i in members]) for members in kept]
