"""The per-region choice: dynamic programming over the regions in order, charging crossings,
over the program's loop (``cheapest_path``), and what the search proposes (``proposal``).
"""

from __future__ import annotations

from collections.abc import Sequence

from composer.measure.region_costs import Costs
from composer.scheduler.measured_placement import Region
from composer.scheduler.plans import PORTABLE


def cheapest_path(
    regions: Sequence[Region], measured: Costs, mixed: bool = False
) -> tuple[tuple[str, ...], float] | None:
    """The cheapest option per region by dynamic programming over the regions in order, and
    its estimated time; ``None`` if some region was measured on no option. ``mixed``: the
    cheapest that uses two options or more (``None`` if there is none).

    A state is the option of the region before and the backend of the last delegate call: a
    call on backend b after one on backend a pays a's switch cost to b even with portable
    kernels between them (they are too short for a's threads to stop spinning). The program
    runs in a loop, so its first call comes after its last: each backend (or none) is tried
    as the last call's, and only paths that end as they began are kept. The state also
    carries the first region's option and whether the path has left it, for ``mixed``.
    """
    if any(not times for times in measured.region_us[: len(regions)]) or not regions:
        return None
    backends = sorted({o for times in measured.region_us for o in times if o != PORTABLE})
    found: list[tuple[float, tuple[str, ...]]] = []
    State = tuple[str | None, str | None, str | None, bool]  # before, last, first, left it
    for start in [None, *backends]:
        states: dict[State, tuple[float, tuple[str, ...]]] = {(None, start, None, False): (0.0, ())}
        for index in range(len(regions)):
            step: dict[State, tuple[float, tuple[str, ...]]] = {}
            for option, alone in measured.region_us[index].items():
                for (before, last, first, left), (total, path) in states.items():
                    extra, after = _step(measured, before, last, option, alone)
                    way = (total + extra, (*path, option))
                    key = (option, after, first or option, left or option != (first or option))
                    if key not in step or way < step[key]:
                        step[key] = way
            states = step
        found += [
            way
            for (_before, last, _first, left), way in states.items()
            if last == start and (left or not mixed)
        ]
    if not found:
        return None
    total, path = min(found)
    return path, total


def proposal(
    regions: Sequence[Region], measured: Costs
) -> tuple[tuple[str, ...], float, str | None] | None:
    """What the search proposes: the cheapest assignment by ``cheapest_path``, its estimate, and a
    note when it is not that. Every region on one backend is that backend alone, which
    measured placement times whole anyway; the cheapest mix is proposed instead, since the
    estimate is a sum of parts (on the H100, bench/gpu/gpu_mix.py's 64-step RNN then a head with
    XNNPACK on 16 threads: CUDA everywhere estimated 731 us, the best mix 739; timed whole,
    the recurrence on XNNPACK and the head on CUDA ran in 534 us, CUDA alone in 626)."""
    chosen = cheapest_path(regions, measured)
    if chosen is None:
        return None
    assignment, estimate = chosen
    single = set(assignment)
    if len(single) > 1 or PORTABLE in single:
        return assignment, estimate, None
    mix = cheapest_path(regions, measured, mixed=True)
    if mix is None:
        return assignment, estimate, None
    note = (
        f"the cheapest estimate puts every region on {assignment[0]} ({estimate:.1f} us), "
        f"which {assignment[0]} alone is, timed whole; proposed the cheapest mix instead "
        f"({mix[1]:.1f} us)"
    )
    return mix[0], mix[1], note


def _step(measured: Costs, before: str | None, last: str | None, option: str, alone: float):
    """What running a region on ``option`` adds after ``before`` (the region before's option)
    and ``last`` (the last delegate call's backend); and the last backend after it."""
    if option == PORTABLE:
        switch = measured.between_us if before not in (None, PORTABLE) else 0.0
        return alone + switch, last
    if before == option:
        # One delegate call instead of two: its fixed cost is paid once.
        return max(0.0, alone - measured.call_us.get(option, 0.0)), option
    switch = measured.between_us if before is not None else 0.0
    if last is not None and last != option:
        switch += measured.switch_us.get((last, option), 0.0)
    return alone + switch, option
