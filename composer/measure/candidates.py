"""The candidates measured placement composes: the declared order (priority and strict), the
other orders, each backend alone; a per-region one carries node pins.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import attrs


@attrs.frozen
class Candidate:
    """An assignment: backends in order, the placement rule, and node pins (a per-region
    choice: ``((backend, ("node:NAME", ...)), ...)``; none for a whole-program candidate)."""

    backends: tuple[str, ...]
    placement: str  # "priority" or "strict"
    pins: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # composer.Stack.keep_whole: the per-region search's programs keep whole what any backend
    # does, so that every order decomposes alike and node names carry over between them.
    keep_whole: str = "priority"

    @property
    def label(self) -> str:
        if self.pins:
            return f"{','.join(self.backends)} (per region)"
        if len(self.backends) == 1:
            return f"{self.backends[0]} alone"
        return f"{','.join(self.backends)} ({self.placement})"

    def never(self, given: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """The pins to compose it with: ``given`` (the user's) for its backends, then its own."""
        merged = {b: list(pins) for b, pins in given.items() if b in self.backends}
        for backend, pins in self.pins:
            merged[backend] = list(dict.fromkeys([*merged.get(backend, ()), *pins]))
        return merged


def candidates(backends: Sequence[str]) -> list[Candidate]:
    """The declared order (priority, strict), the other orders, then each backend alone."""
    declared = tuple(backends)
    found = [Candidate(declared, "priority")]
    if len(declared) > 1:
        found.append(Candidate(declared, "strict"))
        orders = itertools.permutations(declared) if len(declared) <= 3 else ()
        found += [Candidate(order, "priority") for order in orders if order != declared]
        found += [Candidate((name,), "priority") for name in declared]
    return found


def always_composed(candidate: Candidate, backends: Sequence[str]) -> bool:
    """The declared order and each backend alone: composed whatever the tune budget, before
    the rest. Measured placement then never chooses slower than the best single backend, and
    never fails where one alone composes: a budget spent on the declared order's strict twin
    had left the singles out, and the choice to the declared order, at 0.3x the best single
    backend (gpt2 and a llama decoder, ``xnnpack,cuda`` in the C++ runtime on an H200)."""
    whole = not candidate.pins and candidate.placement == "priority"
    return whole and (candidate.backends == tuple(backends) or len(candidate.backends) == 1)
