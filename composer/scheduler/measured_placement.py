"""A measured placement as the plan records it (``plan.placement``): every candidate and its
time, the chosen program's partitions traced, the per-region search, and the configuration
that reproduces the choice. ``to_dict``/``from_dict`` write and read the JSON keys these had
when they were dicts (composer.measure builds them; composer.report renders them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

# What timed the partitions and regions of a plan that does not say (made before hosted
# timing): composer.measure.etdump.ProgramTrace.timer.
ETDUMP = "ExecuTorch's event tracer, ETDump"


def _strings(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


def _pins(value: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    return {backend: tuple(pins) for backend, pins in value.items()}


@attrs.frozen
class TimedCandidate:
    """One candidate composition and how it did: its delegate calls and times (``None``: not
    timed, ``note`` says why), and its time in the second round if it was a finalist."""

    candidate: str  # its label: "openvino,xnnpack (priority)", "xnnpack alone"
    backends: tuple[str, ...] = attrs.field(converter=_strings)
    placement: str  # "priority" or "strict"
    pins: dict[str, tuple[str, ...]] = attrs.field(converter=_pins)  # a per-region one's
    keep_whole: str
    delegate_calls: int | None
    median_us: float | None
    p90_us: float | None
    best_us: float | None  # the fastest call (the choice is by median)
    note: str
    confirmed_median_us: float | None = None
    confirmed_best_us: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "backends": list(self.backends),
            "placement": self.placement,
            "pins": {backend: list(pins) for backend, pins in self.pins.items()},
            "keep_whole": self.keep_whole,
            "delegate_calls": self.delegate_calls,
            "median_us": self.median_us,
            "p90_us": self.p90_us,
            "best_us": self.best_us,
            "note": self.note,
            "confirmed_median_us": self.confirmed_median_us,
            "confirmed_best_us": self.confirmed_best_us,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimedCandidate:
        return cls(
            data["candidate"], data["backends"], data["placement"], data.get("pins", {}),
            data.get("keep_whole", "priority"), data["delegate_calls"], data["median_us"],
            data["p90_us"], data.get("best_us"), data["note"], data.get("confirmed_median_us"),
            data.get("confirmed_best_us"),
        )  # fmt: skip


@attrs.frozen
class TimedAlternative:
    """The nodes of a partition of the chosen program as another candidate ran them."""

    backend: str  # a backend, or "portable" for ExecuTorch's portable kernels
    candidate: str  # the candidate's label
    median_us: float
    p90_us: float
    extra_nodes: int = 0  # nodes that candidate's partition runs beyond these (0: the same)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "candidate": self.candidate,
            "median_us": self.median_us,
            "p90_us": self.p90_us,
            "extra_nodes": self.extra_nodes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimedAlternative:
        return cls(
            data["backend"], data["candidate"], data["median_us"], data["p90_us"],
            data.get("extra_nodes", 0),
        )  # fmt: skip


@attrs.frozen
class TimedPartition:
    """What one partition of the chosen program cost, traced; a node left to portable kernels
    counts as a partition of its own, named after the node."""

    partition: str  # the plan's partition id ("xnnpack:0"), or the portable node's name
    backend: str
    nodes: int
    median_us: float
    p90_us: float
    alternatives: tuple[TimedAlternative, ...] = attrs.field(default=(), converter=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "backend": self.backend,
            "nodes": self.nodes,
            "median_us": self.median_us,
            "p90_us": self.p90_us,
            "alternatives": [a.to_dict() for a in self.alternatives],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimedPartition:
        return cls(
            data["partition"], data["backend"], data["nodes"], data["median_us"], data["p90_us"],
            tuple(TimedAlternative.from_dict(a) for a in data.get("alternatives", ())),
        )  # fmt: skip


@attrs.frozen
class TracedCall:
    """The chosen program's call, traced: the whole call, and the part of it outside its
    delegate and kernel calls."""

    execute_median_us: float
    between_calls_us: float
    runs: int
    timer: str | None = None  # what traced it; None in plans made before hosted timing

    @property
    def timed_by(self) -> str:
        return self.timer or ETDUMP

    def to_dict(self) -> dict[str, Any]:
        data = {
            "execute_median_us": self.execute_median_us,
            "between_calls_us": self.between_calls_us,
            "runs": self.runs,
        }
        if self.timer is not None:
            data["timer"] = self.timer
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TracedCall:
        return cls(
            data["execute_median_us"], data["between_calls_us"], data["runs"], data.get("timer")
        )


@attrs.frozen
class Region:
    """An interval of a topological order of the program's ops: its nodes, and where it may
    run (the stack's backends that take every node, in order; then portable)."""

    nodes: tuple[str, ...] = attrs.field(converter=_strings)
    options: tuple[str, ...] = attrs.field(converter=_strings)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "options": list(self.options)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Region:
        return cls(data["nodes"], data["options"])


def _switches(value: Mapping[Any, float]) -> dict[tuple[str, str], float]:
    return {tuple(pair.split("->", 1)) if isinstance(pair, str) else tuple(pair): us
            for pair, us in value.items()}  # fmt: skip


def _optional(converter):
    return lambda value: None if value is None else converter(value)


@attrs.frozen
class RegionSearch:
    """The per-region search (composer.measure.region_search) as far as it went: its notes,
    the regions, their times per option, what a call and a switch cost, the option chosen per
    region and the estimate. ``None``: the search did not get that far (the key is absent)."""

    notes: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    max_regions: int | None = None
    regions: tuple[Region, ...] | None = attrs.field(default=None, converter=_optional(tuple))
    timer: str | None = None
    # per region: option -> median us
    region_us: tuple[dict[str, float], ...] | None = attrs.field(
        default=None, converter=_optional(tuple)
    )
    call_us: dict[str, float] | None = None  # per backend: a delegate call's fixed cost
    between_us: float | None = None  # the runtime's own time per switch, outside every call
    # (from, to) -> how much slower a call on ``to`` runs right after one on ``from``
    switch_us: dict[tuple[str, str], float] | None = attrs.field(
        default=None, converter=_optional(_switches)
    )
    chosen: tuple[str, ...] | None = attrs.field(default=None, converter=_optional(tuple))
    estimated_us: float | None = None

    @property
    def timed_by(self) -> str:
        return self.timer or ETDUMP

    def to_dict(self) -> dict[str, Any]:
        found = {
            "notes": list(self.notes),
            "max_regions": self.max_regions,
            "regions": None if self.regions is None else [r.to_dict() for r in self.regions],
            "timer": self.timer,
            "region_us": None if self.region_us is None else [dict(t) for t in self.region_us],
            "call_us": None if self.call_us is None else dict(self.call_us),
            "between_us": self.between_us,
            "switch_us": None
            if self.switch_us is None
            else {f"{a}->{b}": us for (a, b), us in self.switch_us.items()},
            "chosen": None if self.chosen is None else list(self.chosen),
            "estimated_us": self.estimated_us,
        }
        return {key: value for key, value in found.items() if value is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegionSearch:
        regions = data.get("regions")
        return cls(
            data.get("notes", ()),
            data.get("max_regions"),
            None if regions is None else tuple(Region.from_dict(r) for r in regions),
            data.get("timer"),
            data.get("region_us"),
            data.get("call_us"),
            data.get("between_us"),
            data.get("switch_us"),
            data.get("chosen"),
            data.get("estimated_us"),
        )


@attrs.frozen
class Placement:
    """How a measured placement chose (``plan.placement``; ``None`` on a plan not measured):
    every candidate with its times, the chosen one, the chosen program's partitions traced,
    the per-region search, and the lines of composer.toml that reproduce the choice."""

    chosen: str  # the chosen candidate's label
    cached: bool  # the measurements came from the cache
    candidates: tuple[TimedCandidate, ...] = attrs.field(converter=tuple)
    config: str  # composer.toml's lines that reproduce the choice without measuring
    partitions: tuple[TimedPartition, ...] = attrs.field(default=(), converter=tuple)
    traced: TracedCall | None = None  # None: the chosen program was not traced
    regions: RegionSearch | None = None  # None: not searched (one backend)
    never: dict[str, tuple[str, ...]] = attrs.field(factory=dict, converter=_pins)  # user's pins
    threads: int | None = None  # XNNPACK's threads in the runtime while measuring
    threads_set: bool = False  # whether the user set them (the config then repeats them)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "measured",  # the only mode a plan records a placement for
            "chosen": self.chosen,
            "cached": self.cached,
            "candidates": [c.to_dict() for c in self.candidates],
            "config": self.config,
            "partitions": [p.to_dict() for p in self.partitions],
            "traced": {} if self.traced is None else self.traced.to_dict(),
            "regions": {} if self.regions is None else self.regions.to_dict(),
            "never": {backend: list(pins) for backend, pins in self.never.items()},
            "threads": self.threads,
            "threads_set": self.threads_set,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement | None:
        """The placement of a plan's JSON; ``None`` for ``{}`` (not measured). Keys this
        record does not hold (the cache's ``runs``) are left to the caller."""
        if not data:
            return None
        traced, regions = data.get("traced"), data.get("regions")
        return cls(
            chosen=data["chosen"],
            cached=data["cached"],
            candidates=tuple(TimedCandidate.from_dict(c) for c in data["candidates"]),
            config=data.get("config", ""),
            partitions=tuple(TimedPartition.from_dict(p) for p in data.get("partitions", ())),
            traced=TracedCall.from_dict(traced) if traced else None,
            regions=RegionSearch.from_dict(regions) if regions else None,
            never=data.get("never", {}),
            threads=data.get("threads"),
            threads_set=bool(data.get("threads_set", False)),
        )

    def timed_partition(self, unit: str) -> TimedPartition | None:
        """The traced time of the partition (or portable node) named ``unit``, if traced."""
        return next((t for t in self.partitions if t.partition == unit), None)
