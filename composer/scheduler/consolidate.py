"""Fewer device round trips: give a host island between accelerator partitions to the accelerator.

Plain priority order can leave a few ops of a CPU backend between two partitions of an
accelerator backend (an XNNPACK island between CUDA partitions): the data goes to the host and
back for each such island. When every neighbour of an island belongs to one accelerator backend
that can take the whole island, and the island both reads from and feeds that backend, the
island goes to it. Islands whose move would not save a round trip stay where the declared order
puts them: two backends on one device, or an island at the edge of the graph. This works on
node names and owners only; the scheduler then partitions as usual, so convexity is unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ISLAND_LIMIT = 8  # ops; larger islands are worth their own delegate
PORTABLE = "portable"
HOST = "cpu"


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
    devices: Mapping[str, str],
    limit: int = ISLAND_LIMIT,
) -> dict[str, str]:
    """Node -> the backend it should go to instead of ``owner[node]``.

    ``owner`` maps every op to the backend plain priority order gives it (or ``portable``),
    ``supported`` each backend to the ops it can take, ``devices`` each backend to its device.
    """
    neighbours: dict[str, set[str]] = {}
    producers: dict[str, set[str]] = {}
    consumers: dict[str, set[str]] = {}
    for a, b in edges:
        if a in owner and b in owner:
            neighbours.setdefault(a, set()).add(b)
            neighbours.setdefault(b, set()).add(a)
            producers.setdefault(b, set()).add(a)
            consumers.setdefault(a, set()).add(b)
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
            if not _saves_round_trip(component, backend, receiver, devices, producers, consumers):
                continue
            for node in component:
                current[node] = receiver
                moved[node] = receiver
            changed = True
    return {node: backend for node, backend in moved.items() if owner[node] != backend}


def _saves_round_trip(
    island: set[str],
    owner: str,
    receiver: str,
    devices: Mapping[str, str],
    producers: Mapping[str, set[str]],
    consumers: Mapping[str, set[str]],
) -> bool:
    """Whether data leaves ``receiver``'s accelerator for ``island`` and comes back.

    The island's neighbours all belong to ``receiver``: a round trip is a path from the
    receiver into the island and out to the receiver again. An island that only feeds the
    receiver, or only reads from it (one accelerator partition between host ops), has none.
    """
    device = devices.get(receiver, HOST)
    if device == HOST or device == devices.get(owner, HOST):
        return False
    # Island nodes downstream of the receiver: the host work data comes back for.
    reached = [n for n in island if any(p not in island for p in producers.get(n, ()))]
    downstream = set(reached)
    while reached:
        node = reached.pop()
        for user in consumers.get(node, ()):
            if user in island and user not in downstream:
                downstream.add(user)
                reached.append(user)
    return any(c not in island for n in downstream for c in consumers.get(n, ()))
