"""The check that a set of tags can be lowered: every tag convex, the collapsed graph acyclic.

Collapse each tag to one node. If the result is a DAG, every tag is convex (a path that left
a tag and came back would be a cycle through it) and fusing the tags one after another, as
ExecuTorch does, never meets "Invalid partition, found dependency cycles". One Kahn pass,
O(V + E).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping

import torch.fx

from composer.contract.errors import PartitionError
from composer.scheduler.guards import TAG


def find_tag_cycle(
    graph: torch.fx.Graph, tag_of: Mapping[torch.fx.Node, str]
) -> list[torch.fx.Node] | None:
    """Return a path of nodes that leaves a tag and comes back, or ``None`` if there is none.

    The path starts and ends in tagged nodes; every step is a data edge of ``graph``.
    """
    group_of: dict[torch.fx.Node, object] = {}
    for node in graph.nodes:
        group_of[node] = tag_of.get(node, node)
    # Witness edges let the error name real nodes, not groups.
    succs: dict[object, dict[object, tuple[torch.fx.Node, torch.fx.Node]]] = {}
    in_degree: dict[object, int] = {}
    for group in group_of.values():
        succs.setdefault(group, {})
        in_degree.setdefault(group, 0)
    for node in graph.nodes:
        source = group_of[node]
        for user in node.users:
            target = group_of[user]
            if target != source and target not in succs[source]:
                succs[source][target] = (node, user)
                in_degree[target] += 1
    ready = deque(g for g, d in in_degree.items() if d == 0)
    while ready:
        group = ready.popleft()
        for target in succs[group]:
            in_degree[target] -= 1
            if in_degree[target] == 0:
                ready.append(target)
        del in_degree[group]
    if not in_degree:
        return None
    return _cycle_path(succs, set(in_degree))


def _cycle_path(succs, remaining: set) -> list[torch.fx.Node]:
    # Every group left after Kahn has a predecessor that is also left, so walking
    # backwards from any of them must revisit one: that closes a cycle.
    preds: dict[object, tuple[object, tuple[torch.fx.Node, torch.fx.Node]]] = {}
    for source, targets in succs.items():
        if source in remaining:
            for target, witness in targets.items():
                if target in remaining and target not in preds:
                    preds[target] = (source, witness)
    start = next(iter(remaining))
    seen: dict[object, int] = {}
    walk = [start]
    while walk[-1] not in seen:
        seen[walk[-1]] = len(walk) - 1
        walk.append(preds[walk[-1]][0])
    cycle = walk[seen[walk[-1]] : -1]
    cycle.reverse()  # now forwards: cycle[i] -> cycle[i + 1], and the last back to the first
    # Start at a tag (a DAG's own nodes cannot form a cycle, so one is on it): the path then
    # reads "leaves the tag here ... re-enters it there".
    start = next(i for i, group in enumerate(cycle) if not isinstance(group, torch.fx.Node))
    cycle = cycle[start:] + cycle[:start] + [cycle[start]]
    path: list[torch.fx.Node] = []
    for source, target in itertools.pairwise(cycle):
        edge = succs[source][target]
        for node in edge:
            if not path or path[-1] is not node:
                path.append(node)
    return path


def describe_path(path: list[torch.fx.Node]) -> str:
    return " -> ".join(node.name for node in path)


def check_lowerable(graph: torch.fx.Graph, who: str) -> None:
    """Raise ``PartitionError`` if a tag in ``graph`` is not convex or closes a cycle."""
    # Tagged constants and submodules are sources: they cannot close a cycle, and a
    # constant with readers outside its tag is duplicated by ExecuTorch, not fused.
    tag_of = {
        node: node.meta[TAG]
        for node in graph.nodes
        if node.op == "call_function" and node.meta.get(TAG)
    }
    path = find_tag_cycle(graph, tag_of)
    if path is not None:
        tag = next((tag_of[n] for n in path if n in tag_of), "?")
        raise PartitionError(
            f"{who}: partition {tag!r} is not convex or closes a cycle with another partition "
            f"(path {describe_path(path)}); refusing to lower. This is a bug in composer or in "
            "the plugin; please report it with the model."
        )
