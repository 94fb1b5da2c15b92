"""Fewer delegate calls and device crossings: give small islands to the backend around them.

Plain priority order can leave a few ops of one backend between two partitions of another
(an XNNPACK island between CUDA partitions): every such island costs a delegate call and,
across devices, copies both ways. When every neighbour of an island belongs to one other
backend that can take the whole island, the island goes to that backend. This works on node
names and owners only; the scheduler then partitions as usual, so convexity is unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ISLAND_LIMIT = 8  # ops; larger islands are worth their own delegate
PORTABLE = "portable"


def _components(owner: Mapping[str, str], neighbours: Mapping[str, set[str]]) -> list[set[str]]:
    seen: set[str] = set()
    components = []
    for start in owner:
        if start in seen:
            continue
        component, stack = set(), [start]
        seen.add(start)
        while stack:
            node = stack.pop()
            component.add(node)
            for other in neighbours.get(node, ()):
                if other not in seen and owner.get(other) == owner[start]:
                    seen.add(other)
                    stack.append(other)
        components.append(component)
    return components


def islands_to_move(
    owner: Mapping[str, str],
    supported: Mapping[str, set[str]],
    edges: Iterable[tuple[str, str]],
    limit: int = ISLAND_LIMIT,
) -> dict[str, str]:
    """Node -> the backend it should go to instead of ``owner[node]``.

    ``owner`` maps every op to the backend plain priority order gives it (or ``portable``),
    ``supported`` each backend to the ops it can take.
    """
    neighbours: dict[str, set[str]] = {}
    for a, b in edges:
        if a in owner and b in owner:
            neighbours.setdefault(a, set()).add(b)
            neighbours.setdefault(b, set()).add(a)
    current = dict(owner)
    moved: dict[str, str] = {}
    changed = True
    while changed:  # a move can join two islands of the receiver, which may free another
        changed = False
        for component in _components(current, neighbours):
            backend = current[next(iter(component))]
            if backend == PORTABLE or len(component) > limit:
                continue
            around = {
                current[m] for n in component for m in neighbours.get(n, ()) if m not in component
            }
            if len(around) != 1:
                continue
            (receiver,) = around
            if receiver == PORTABLE or not component <= supported.get(receiver, set()):
                continue
            for node in component:
                current[node] = receiver
                moved[node] = receiver
            changed = True
    return {node: backend for node, backend in moved.items() if owner[node] != backend}
