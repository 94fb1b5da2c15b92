"""The cost model of per-region placement, read off the traced layouts: each region's time per
option, a delegate call's fixed cost per backend, and what a switch between backends adds.
"""

from __future__ import annotations

import collections
import itertools
import statistics
from collections.abc import Sequence
from typing import Any

import attrs

from composer.measure.units import units
from composer.scheduler.measured_placement import Region
from composer.scheduler.plans import PORTABLE


@attrs.frozen
class Costs:
    """What the layouts measured: each region's time per option, each backend's fixed cost of
    a delegate call, and what a switch from one place to another adds."""

    region_us: tuple[dict[str, float], ...]  # per region: option -> median us
    call_us: dict[str, float]  # per backend: its cheapest delegate call seen
    between_us: float  # the runtime's own time per switch, outside every call
    # (from, to) -> how much slower a call on ``to`` runs right after one on ``from``
    switch_us: dict[tuple[str, str], float] = attrs.field(factory=dict)

    def rounded(self) -> dict[str, Any]:
        """These costs to 0.01 us, as the plan's ``RegionSearch`` holds them (by field)."""
        return {
            "region_us": tuple({k: round(v, 2) for k, v in c.items()} for c in self.region_us),
            "call_us": {k: round(v, 2) for k, v in self.call_us.items()},
            "between_us": round(self.between_us, 2),
            "switch_us": {pair: round(v, 2) for pair, v in self.switch_us.items()},
        }


def costs(
    regions: Sequence[Region],
    programs: Sequence[tuple[tuple[str, ...], Any, Sequence, Any]],
    hosted: bool = False,
) -> Costs:
    """Read ``Costs`` off the ``layouts`` programs: (assignment, plan, ``placement.unit_steps``
    of its trace, the ``ProgramTrace``).

    A delegate call counts as the region's own time where the call before it ran on portable
    kernels or the same backend (kernels are short and single-threaded); right after another
    backend's call it is slower by that pair's switch cost, the mean over such calls of how
    much slower than its regions' own times (the mean: a switch is slow only some of the
    time, when the threads of the call before still spin, and the program pays those times).
    A region's own time comes from a call (or kernels) that holds it alone, where every node
    of it ran on the option it was given. A call that holds several regions (the layout with
    each backend wherever it can) says what merging saves: the regions' own times, less the
    call's, per region beyond the first; that is the backend's fixed cost of a call, saved
    each time two regions become one call (without such a call, its cheapest call seen).

    ``hosted``: a call is its region's own time whatever ran before it. Every hosted call
    starts and ends on the host (a CUDA call copies its inputs in and its outputs out), so a
    switch costs nothing beyond the calls, and no layout alternates with portable kernels.
    """
    calls = _Calls(regions, hosted)
    for assignment, plan, steps, traced in programs:
        calls.read(assignment, plan, steps, traced)
    region_us = tuple({o: statistics.median(v) for o, v in r.items()} for r in calls.own)
    fixed = _fixed_costs(regions, region_us, calls.backend_us, calls.merged)
    return Costs(
        _filled(regions, region_us, calls.merged, fixed),
        fixed,
        calls.between_us / calls.switches if calls.switches else 0.0,
        _switch_costs(regions, region_us, calls.crossed),
    )


@attrs.define
class _Calls:
    """The layouts' traced calls, sorted by what each can tell (``costs`` says how)."""

    regions: Sequence[Region]
    hosted: bool
    region_of: dict[str, int] = attrs.field(init=False)  # node -> its region's index
    own: list[dict[str, list[float]]] = attrs.field(init=False)  # per region: option -> times
    backend_us: dict[str, list[float]] = attrs.field(factory=dict)  # per backend: its calls
    # calls right after another backend's: (before, where, median us, regions held)
    crossed: list[tuple[str, str, float, list[tuple[int, float]]]] = attrs.field(factory=list)
    # calls of several regions: (where, median us, regions held)
    merged: list[tuple[str, float, list[tuple[int, float]]]] = attrs.field(factory=list)
    between_us: float = 0.0
    switches: int = 0

    def __attrs_post_init__(self) -> None:
        self.region_of = {node: i for i, region in enumerate(self.regions) for node in region.nodes}
        self.own = [{} for _ in self.regions]

    def read(self, assignment, plan, steps, traced) -> None:
        """One layout's calls; its regions' own times where each region was placed as given,
        timed whole, and held alone by its calls."""
        nodes_of = {unit.name: unit.nodes for unit in units(plan)}
        places = [where for _name, where, _latency in steps]
        self.between_us += traced.between_steps_us
        self.switches += sum(1 for a, b in itertools.pairwise(places) if a != b)
        as_given = [
            all(plan.node_backends.get(n) == option for n in region.nodes)
            for region, option in zip(self.regions, assignment)
        ]
        shares, clean, timed = self._shares(nodes_of, places, steps)
        untimed = {self.region_of[n] for u, ns in nodes_of.items() if u not in timed for n in ns
                   if n in self.region_of}  # fmt: skip
        for index, option in enumerate(assignment):
            if as_given[index] and index in clean and index not in untimed:
                self.own[index].setdefault(option, []).append(shares[index])

    def _shares(self, nodes_of, places, steps) -> tuple[dict[int, float], set[int], set[str]]:
        """Each region's share of the calls that hold it alone (by node count), the regions
        those calls cover, and the calls timed; a call after a switch or of several regions is
        kept aside for the switch and merge costs."""
        shares: dict[int, float] = {}
        clean: set[int] = set()
        timed: set[str] = set()
        for before, (name, where, latency) in zip(_befores(places), steps):
            if name is None:
                continue
            timed.add(name)
            held = [
                (self.region_of[n], 1 / len(nodes_of[name]))
                for n in nodes_of[name]
                if n in self.region_of
            ]
            if where != PORTABLE and before not in (PORTABLE, where) and not self.hosted:
                self.crossed.append((before, where, latency.median_us, held))
                continue
            if where != PORTABLE:
                self.backend_us.setdefault(where, []).append(latency.median_us)
            if len({index for index, _share in held}) > 1:
                self.merged.append((where, latency.median_us, held))
                continue
            for index, share in held:
                shares[index] = shares.get(index, 0.0) + latency.median_us * share
                clean.add(index)
        return shares, clean, timed


def _switch_costs(regions, region_us, crossed) -> dict[tuple[str, str], float]:
    """Per (from, to): the mean of how much slower the calls on ``to`` right after one on
    ``from`` ran than their regions' own times (never below 0)."""
    slower: dict[tuple[str, str], list[float]] = {}
    for before, where, median_us, held in crossed:
        expected = _apart(regions, region_us, where, held)
        if expected is not None:
            slower.setdefault((before, where), []).append(median_us - expected)
    return {pair: max(0.0, statistics.fmean(v)) for pair, v in slower.items()}


def _fixed_costs(regions, region_us, backend_us, merged) -> dict[str, float]:
    """Per backend: a delegate call's fixed cost, what merging regions into one call saved,
    else its cheapest call seen."""
    saved: dict[str, list[float]] = {}
    for where, median_us, held in merged:
        apart = _apart(regions, region_us, where, held)
        if apart is not None:
            count = len({index for index, _share in held})
            saved.setdefault(where, []).append((apart - median_us) / (count - 1))
    fixed = {backend: min(times) for backend, times in backend_us.items()}
    fixed.update({backend: max(0.0, statistics.median(v)) for backend, v in saved.items()})
    return fixed


def _filled(regions, region_us, merged, fixed) -> tuple[dict[str, float], ...]:
    """``region_us`` with the regions that never ran alone on a backend (both neighbours can
    run only there, as cnn's convolutions between max pools XNNPACK alone takes) estimated
    from a call that held them: its time and the calls it saved, less the other regions' own
    times, shared by node count."""
    guesses: list[dict[str, list[float]]] = [{} for _ in regions]
    for where, median_us, held in merged:
        counts = collections.Counter(index for index, _share in held)
        missing = [i for i in counts if where not in region_us[i]]
        if not missing:
            continue
        known = sum(region_us[i][where] * n / len(regions[i].nodes)
                    for i, n in counts.items() if i not in missing)  # fmt: skip
        left = max(0.0, median_us + (len(counts) - 1) * fixed.get(where, 0.0) - known)
        nodes = sum(counts[i] for i in missing)
        for i in missing:
            guesses[i].setdefault(where, []).append(left * counts[i] / nodes)
    return tuple(
        {**times, **{o: statistics.median(v) for o, v in guesses[i].items()}}
        for i, times in enumerate(region_us)
    )


def _apart(regions, region_us, where: str, held: list[tuple[int, float]]) -> float | None:
    """What the regions (or parts of regions) one call ``held`` cost as calls of their own on
    ``where``; ``None`` if one of them was not timed there alone."""
    if not held:
        return None
    counts = collections.Counter(index for index, _share in held)
    alone = [region_us[index].get(where) for index in counts]
    if None in alone:
        return None
    return sum(a * n / len(regions[i].nodes) for a, (i, n) in zip(alone, counts.items()))


def _befores(places: Sequence[str]) -> list[str]:
    """The place of the call before each call; the program runs in a loop, so the first call
    comes after the last one."""
    return [places[index - 1] for index in range(len(places))]


def on_backends(measured: Costs) -> Costs:
    """``measured`` without the portable option of the regions a backend takes. Hosted
    (``composer.run.piecewise``), what lies outside the delegates runs as torch ops in Python:
    its time says nothing of the portable kernels the program would run them on (on the
    H100 machine, cumsum_mlp all in Python beat every backend, with no delegate at all)."""
    return attrs.evolve(
        measured,
        region_us=tuple(
            {o: t for o, t in times.items() if o != PORTABLE} or times
            for times in measured.region_us
        ),
    )
