"""Measured placement's choice: what each candidate measured, and which one is kept (the
declared order unless another beats it by more than ``MARGIN``, in both rounds).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import attrs

from composer.measure.candidates import Candidate
from composer.measure.latency import Latency
from composer.scheduler.measured_placement import (
    Placement,
    RegionSearch,
    TimedCandidate,
    TimedPartition,
    TracedCall,
)

MARGIN = 0.05  # a candidate must beat the declared order by this much to replace it


@attrs.frozen
class Measurement:
    """How one candidate did: its delegate calls and latency, or why it was not timed."""

    candidate: Candidate
    delegate_calls: int | None = None
    latency: Latency | None = None
    note: str = ""
    confirmed: Latency | None = None  # its time in the second round, if it was a finalist

    def record(self) -> TimedCandidate:
        """As the plan records it, times to 0.01 us."""
        return TimedCandidate(
            self.candidate.label,
            self.candidate.backends,
            self.candidate.placement,
            dict(self.candidate.pins),
            self.candidate.keep_whole,
            self.delegate_calls,
            None if self.latency is None else round(self.latency.median_us, 2),
            None if self.latency is None else round(self.latency.p90_us, 2),
            # The fastest call, on which interleaved's rounds settle (the choice is by median).
            _rounded(None if self.latency is None else self.latency.best_us),
            self.note,
            None if self.confirmed is None else round(self.confirmed.median_us, 2),
            _rounded(None if self.confirmed is None else self.confirmed.best_us),
        )


@attrs.frozen
class Choice:
    """The candidate kept, every measurement, and whether they came from the cache."""

    chosen: Candidate
    measurements: tuple[Measurement, ...]
    cached: bool
    partitions: tuple[TimedPartition, ...] = ()  # the chosen program's, traced
    # the chosen program's traced call: whole, and outside its delegate and kernel calls
    traced: TracedCall | None = None
    # the per-region search: regions, their times per option, the choice
    # (composer.measure.region_search); None: not searched
    regions: RegionSearch | None = None
    never: dict[str, list[str]] = attrs.field(factory=dict)  # the user's pins
    threads: int | None = None  # XNNPACK's threads in the runtime while measuring
    threads_set: bool = False  # whether the user set them (the config then repeats them)

    def placement(self) -> Placement:
        """The choice as the plan records it (``plan.placement``)."""
        return Placement(
            chosen=self.chosen.label,
            cached=self.cached,
            candidates=tuple(m.record() for m in self.measurements),
            config=self.config_toml(),
            partitions=self.partitions,
            traced=self.traced,
            regions=self.regions,
            never=self.never,
            threads=self.threads,
            threads_set=self.threads_set,
        )

    def config_toml(self) -> str:
        """The lines of composer.toml that reproduce the choice without measuring: the
        backends, the placement, the threads the user set, how ops are kept whole (a per-region
        choice's pins name nodes of the model decomposed as ``keep_whole = "any"`` does), and the
        pins (the user's, and a per-region choice's)."""
        backends = ", ".join(f'"{name}"' for name in self.chosen.backends)
        lines = [f"backends = [{backends}]", f'placement = "{self.chosen.placement}"']
        if self.threads_set and self.threads is not None:
            lines.append(f"threads = {self.threads}")
        if self.chosen.keep_whole != "priority":
            lines.append(f'keep_whole = "{self.chosen.keep_whole}"')
        never = {b: pins for b, pins in self.chosen.never(self.never).items() if pins}
        if never:
            lines.append("[never]")
            lines += [
                f"{b} = [{', '.join(json.dumps(p) for p in pins)}]" for b, pins in never.items()
            ]
        return "\n".join(lines) + "\n"


def choose(measurements: Sequence[Measurement]) -> Candidate:
    """The fastest timed candidate by median; the declared order unless beaten by more than
    MARGIN, and a per-region one only if it beats every whole-program candidate by more than
    MARGIN. Not by the fastest call (``Latency.rank_us``): a mixed XNNPACK/OpenVINO program
    of unet had a lucky fastest call (271 us) below OpenVINO alone's (288 us), while its
    median was 397 against 316 and 664 against 305 in the second round."""
    timed = [m for m in measurements if m.latency is not None]
    if not timed:
        return measurements[0].candidate
    whole = [m.latency.median_us for m in timed if not m.candidate.pins]
    if whole:
        timed = [
            m
            for m in timed
            if not m.candidate.pins or m.latency.median_us * (1 + MARGIN) < min(whole)
        ]
    fastest = min(timed, key=lambda m: m.latency.median_us)
    declared = measurements[0]
    if declared.latency is not None and (
        declared.latency.median_us <= fastest.latency.median_us * (1 + MARGIN)
    ):
        return declared.candidate
    return fastest.candidate


def choose_confirmed(measurements: Sequence[Measurement]) -> Candidate:
    """The choice after the second round. A switch from the declared order must beat it, by
    more than MARGIN, in both rounds (a per-region candidate: every whole finalist too); of
    those that do, the one whose faster round is fastest. Load on a shared machine only slows
    a round: on llama_block a round that took xnnpack alone from 38 to 65 us would have
    chosen OpenVINO alone (62 and 61 us), 0.66x of it, by the second round alone."""
    declared = measurements[0]
    if declared.latency is None or declared.confirmed is None:
        return choose([attrs.evolve(m, latency=m.confirmed) for m in measurements])
    finalists = [m for m in measurements if m.latency is not None and m.confirmed is not None]

    def wins(m: Measurement, time_of: Callable[[Measurement], Latency]) -> bool:
        rivals = [declared]
        if m.candidate.pins:
            rivals += [w for w in finalists if not w.candidate.pins]
        return time_of(m).median_us * (1 + MARGIN) < min(time_of(r).median_us for r in rivals)

    winners = [
        m
        for m in finalists
        if m is not declared and wins(m, lambda x: x.latency) and wins(m, lambda x: x.confirmed)
    ]
    if not winners:
        return declared.candidate
    best = min(winners, key=lambda m: min(m.latency.median_us, m.confirmed.median_us))
    return best.candidate


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
