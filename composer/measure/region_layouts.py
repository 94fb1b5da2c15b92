"""The programs that time the regions (``layouts``), and the node pins that put each region on
its option in a strict plan (``pins``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from composer.scheduler.assign import node_pin
from composer.scheduler.measured_placement import Region
from composer.scheduler.plans import PORTABLE


def layouts(
    regions: Sequence[Region], backends: Sequence[str], hosted: bool = False
) -> list[tuple[str, tuple[str, ...]]]:
    """The programs that time the regions, as (what it times, an option per region): per
    backend, its regions alternating with portable kernels (two programs: even and odd
    regions on it), and all of them on it (neighbours become one call: what that saves);
    per pair of backends, regions alternating between the two.

    ``hosted``: no portable kernels to alternate with (hosted, they are torch ops in Python,
    and a CUDA partition between them failed to emit when they shared its weight), so per
    pair of backends the regions alternate both ways round, and each region runs once on
    each backend as a call of its own."""
    found = []
    for backend in backends:
        if not any(backend in region.options for region in regions):
            continue
        merged = tuple(backend if backend in r.options else _off(r, backend) for r in regions)
        found.append((f"{backend} wherever it can, as few calls as it takes", merged))
        for parity in () if hosted else (0, 1):
            assignment = tuple(
                backend
                if backend in region.options and index % 2 == parity
                else _off(region, backend)
                for index, region in enumerate(regions)
            )
            turn = "even" if parity == 0 else "odd"
            found.append(
                (f"{backend} and portable kernels, {turn} regions on {backend}", assignment)
            )
    for pair in itertools.combinations(backends, 2):
        for one, other in (pair, pair[::-1]) if hosted else (pair,):
            assignment = []
            for index, region in enumerate(regions):
                turn = (one, other) if index % 2 == 0 else (other, one)
                assignment.append(
                    next((b for b in turn if b in region.options), _off(region, None))
                )
            if one in assignment and other in assignment:
                what = f"crossings between {one} and {other}"
                found.append((f"{what}, {one} first" if hosted else what, tuple(assignment)))
    return found


def _off(region: Region, measured: str | None) -> str:
    """Where a region runs in a layout that does not time it: on portable kernels if it can,
    else on another backend than the one the layout times, else on that one."""
    if PORTABLE in region.options:
        return PORTABLE
    return next((o for o in region.options if o != measured), region.options[0])


def pins(
    regions: Sequence[Region],
    assignment: Sequence[str],
    backends: Sequence[str],
    support: Mapping[str, frozenset[str]],
) -> dict[str, tuple[str, ...]]:
    """The node pins that make a strict plan of ``backends`` put each region on its option:
    every node is pinned off each backend before its option that would take it (off all of
    them for portable kernels)."""
    found: dict[str, list[str]] = {}
    for region, option in zip(regions, assignment):
        before = backends if option == PORTABLE else backends[: backends.index(option)]
        for node in region.nodes:
            for backend in before:
                if backend in support[node]:
                    found.setdefault(backend, []).append(node_pin(node))
    return {backend: tuple(found[backend]) for backend in backends if backend in found}
