"""Measured placement: time whole-program candidates in the runtime here, keep the fastest.

The candidates are the stack in the declared order (priority, and strict), the other orders of
its backends, and each backend alone: every one is a real composition, run in the ExecuTorch
runtime and timed together (``composer.latency.interleaved``), so the choice is never slower
than the best single backend, within the noise of one run. The declared order wins unless
another candidate is faster by more than ``MARGIN``, in that round and again in a second one
where the finalists (the declared order, the winner, each backend alone) are timed anew: on a
shared machine a burst of load can reverse one round. Measurements are cached by program,
stack, candidates, library versions and machine, so a second run times nothing. The choice
is plain configuration (``backends`` and ``placement``), which reproduces it anywhere without
measuring.

With two or more backends, one more candidate is searched per region (composer.regions): the
graph is cut into regions, each region is timed on every backend that takes it and on portable
kernels, and dynamic programming picks a mix that no order of the stack may produce. That
candidate is written as node pins (``never = {backend: ["node:NAME"]}``, ``placement =
"strict"``), timed with the others, and kept only if it beats every whole-program candidate by
more than ``MARGIN`` (in both rounds): it is a guess from parts, the others are measured whole.
Each distinct program is then traced (ETDump; hosted, each call timed), so the plan says
what every partition of the chosen program cost and, where another candidate ran the same
nodes elsewhere, what they cost there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from composer import cpu_threads
from composer.latency import Latency, ProgramTrace, interleaved, trace

MARGIN = 0.05  # a candidate must beat the declared order by this much to replace it
RUNS = 100
TRACE_RUNS = 30  # calls per program under ETDump, for the per-partition times
REGION_RUNS = 50  # calls per program of the per-region search, traced taking turns
VERSIONED = ("executorch-composer", "executorch", "torch", "openvino")


@attrs.frozen
class Candidate:
    """An assignment: backends in order, the placement rule, and node pins (a per-region
    choice: ``((backend, ("node:NAME", ...)), ...)``; none for a whole-program candidate)."""

    backends: tuple[str, ...]
    placement: str  # "priority" or "strict"
    pins: tuple[tuple[str, tuple[str, ...]], ...] = ()

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


@attrs.frozen
class Measurement:
    """How one candidate did: its delegate calls and latency, or why it was not timed."""

    candidate: Candidate
    delegate_calls: int | None = None
    latency: Latency | None = None
    note: str = ""
    confirmed: Latency | None = None  # its time in the second round, if it was a finalist

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.label,
            "backends": list(self.candidate.backends),
            "placement": self.candidate.placement,
            "pins": {backend: list(pins) for backend, pins in self.candidate.pins},
            "delegate_calls": self.delegate_calls,
            "median_us": None if self.latency is None else round(self.latency.median_us, 2),
            "p90_us": None if self.latency is None else round(self.latency.p90_us, 2),
            # The fastest call, on which interleaved's rounds settle (the choice is by median).
            "best_us": _rounded(None if self.latency is None else self.latency.best_us),
            "note": self.note,
            "confirmed_median_us": (
                None if self.confirmed is None else round(self.confirmed.median_us, 2)
            ),
            "confirmed_best_us": _rounded(
                None if self.confirmed is None else self.confirmed.best_us
            ),
        }


@attrs.frozen
class Alternative:
    """The same nodes as a partition of the chosen program, run elsewhere by another candidate."""

    backend: str  # a backend, or "portable" for ExecuTorch's portable kernels
    candidate: str  # the candidate's label
    latency: Latency
    extra_nodes: int = 0  # nodes that candidate's partition runs beyond these (0: the same)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "candidate": self.candidate,
            "median_us": round(self.latency.median_us, 2),
            "p90_us": round(self.latency.p90_us, 2),
            "extra_nodes": self.extra_nodes,
        }


@attrs.frozen
class PartitionTime:
    """What one partition of the chosen program cost, traced; a node left to portable kernels
    counts as a partition of its own, named after the node."""

    partition: str  # the plan's partition id ("xnnpack:0"), or the portable node's name
    backend: str
    nodes: int
    latency: Latency
    alternatives: tuple[Alternative, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "backend": self.backend,
            "nodes": self.nodes,
            "median_us": round(self.latency.median_us, 2),
            "p90_us": round(self.latency.p90_us, 2),
            "alternatives": [a.to_dict() for a in self.alternatives],
        }


@attrs.frozen
class Choice:
    """The candidate kept, every measurement, and whether they came from the cache."""

    chosen: Candidate
    measurements: tuple[Measurement, ...]
    cached: bool
    partitions: tuple[PartitionTime, ...] = ()  # the chosen program's, traced
    # the chosen program's traced call: whole, and outside its delegate and kernel calls
    traced: dict[str, float] = attrs.field(factory=dict)
    # the per-region search: regions, their times per option, the choice (composer.regions)
    regions: dict[str, Any] = attrs.field(factory=dict)
    never: dict[str, list[str]] = attrs.field(factory=dict)  # the user's pins
    threads: int | None = None  # XNNPACK's threads in the runtime while measuring
    threads_set: bool = False  # whether the user set them (the config then repeats them)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "measured",
            "chosen": self.chosen.label,
            "cached": self.cached,
            "candidates": [m.to_dict() for m in self.measurements],
            "config": self.config_toml(),
            "partitions": [p.to_dict() for p in self.partitions],
            "traced": dict(self.traced),
            "regions": dict(self.regions),
            "never": {b: list(p) for b, p in self.never.items()},
            "threads": self.threads,
            "threads_set": self.threads_set,
        }

    def config_toml(self) -> str:
        """The lines of composer.toml that reproduce the choice without measuring: the
        backends, the placement, the threads the user set, and the pins (the user's, and a
        per-region choice's)."""
        backends = ", ".join(f'"{name}"' for name in self.chosen.backends)
        lines = [f"backends = [{backends}]", f'placement = "{self.chosen.placement}"']
        if self.threads_set and self.threads is not None:
            lines.append(f"threads = {self.threads}")
        never = {b: pins for b, pins in self.chosen.never(self.never).items() if pins}
        if never:
            lines.append("[never]")
            lines += [
                f"{b} = [{', '.join(json.dumps(p) for p in pins)}]" for b, pins in never.items()
            ]
        return "\n".join(lines) + "\n"


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


def measure(
    compose_candidate: Callable[[Candidate], Any],
    backends: Sequence[str],
    inputs: Sequence[Any],
    *,
    key: str | None,
    runs: int = RUNS,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    cache_dir: Path | None = None,
    hosted: bool = False,
    plan_candidate: Callable[[Candidate], Any] | None = None,
    never: Mapping[str, Sequence[str]] | None = None,
    threads_set: bool = False,
) -> tuple[Choice, dict[Candidate, Any]]:
    """Compose and time every candidate (cached by ``key``); returns the choice and the
    compositions it made (none when the cache answered).

    ``hosted``: run every candidate through ``aoti_host`` (a stack with CUDA in it, on a
    GPU) instead of the runtime, and time each call there (``composer.hosted_trace``)
    instead of tracing with ETDump. ``plan_candidate`` plans a candidate without lowering;
    given, and with two or more backends, a per-region candidate is searched too
    (composer.regions). ``never`` is the user's pins, which the config that reproduces the
    choice repeats, as it repeats the runtime's threads where ``threads_set``."""
    # These import torch, which the paths that only read a plan skip.
    from composer import hosted_trace, regions
    from composer.aoti_host import program_runner
    from composer.errors import ComposerError

    cached = _read_cache(cache_dir, key)
    if cached is not None:
        cached = attrs.evolve(cached, threads_set=threads_set)
        if progress is not None:
            progress(f"placement: measurements from the cache ({cached.chosen.label})")
        return cached, {}
    started = time.perf_counter()

    def over_budget() -> bool:
        return budget_s is not None and time.perf_counter() - started > budget_s

    composed: dict[Candidate, Any] = {}
    notes: dict[Candidate, str] = {}
    same: dict[Candidate, str] = {}  # candidate -> digest of its program
    loaded = {}
    failures: list[ComposerError] = []

    def compose_and_load(candidate: Candidate) -> None:
        if progress is not None:
            progress(f"placement: composing {candidate.label}")
        try:
            composition = compose_candidate(candidate)
        except ComposerError as error:
            # One order or backend failing to lower (OpenVINO alone keeps a bilinear upsample
            # whole that it cannot take) leaves the others to choose from.
            failures.append(error)
            notes[candidate] = f"not composed: {_first_line(error)}"
            return
        composed[candidate] = composition
        # Candidates that lower to the same bytes are one program: timed once, so that noise
        # cannot rank a program against itself.
        digest = hashlib.sha256(composition.buffer).hexdigest()
        if digest not in loaded:
            try:
                program = program_runner(composition, hosted)
                program.run(inputs)  # checks the inputs once, outside the timing
            except ComposerError as error:
                notes[candidate] = f"not timed: {_first_line(error)}"
                return
            loaded[digest] = program
        same[candidate] = digest

    listed = candidates(backends)
    for index, candidate in enumerate(listed):
        if index and over_budget():
            notes[candidate] = f"not measured: over the tune budget of {budget_s:g} s"
            continue
        compose_and_load(candidate)
    searched: dict[str, Any] = {}
    if plan_candidate is not None and len(backends) > 1:
        if over_budget():
            searched = {"notes": [f"not searched: over the tune budget of {budget_s:g} s"]}
        else:
            mixed, searched = regions.search(
                compose_candidate, plan_candidate, backends, inputs,
                over_budget=over_budget, progress=progress, trace_runs=REGION_RUNS,
                hosted=hosted,
            )  # fmt: skip
            if mixed is not None:
                listed.append(mixed)
                compose_and_load(mixed)
    if not composed and failures:
        raise failures[0]
    if progress is not None:
        progress(f"placement: timing {len(loaded)} distinct program(s), {runs} runs each")
    timed = (
        interleaved({d: p.timed_call(inputs) for d, p in loaded.items()}, runs) if loaded else {}
    )
    measurements = tuple(
        Measurement(
            candidate,
            composed[candidate].plan.delegate_calls if candidate in composed else None,
            timed.get(same.get(candidate)),
            notes.get(candidate, ""),
        )
        for candidate in listed
    )
    chosen = choose(measurements)
    if chosen != measurements[0].candidate:
        measurements = _confirm(measurements, chosen, same, loaded, inputs, runs, progress)
        chosen = choose_confirmed(measurements)
    traces = {}
    for candidate in [chosen, *(c for c in composed if c != chosen)]:
        digest = same.get(candidate)
        if digest is None or digest in traces:
            continue
        if over_budget() and candidate != chosen:
            continue
        if progress is not None:
            how = hosted_trace.HostedTrace.timer if hosted else ProgramTrace.timer
            progress(f"placement: tracing {candidate.label}, {TRACE_RUNS} runs ({how})")
        if hosted:
            traces[digest] = hosted_trace.trace_together(
                {digest: loaded[digest]}, inputs, TRACE_RUNS
            )[digest]
        else:
            traces[digest] = trace(composed[candidate].buffer, inputs, TRACE_RUNS)
    by_candidate = {c: traces[same[c]] for c in composed if traces.get(same.get(c)) is not None}
    partitions, traced = partition_times(chosen, composed, by_candidate)
    choice = Choice(chosen, measurements, cached=False, partitions=partitions, traced=traced,
                    regions=searched, never={b: list(p) for b, p in (never or {}).items()},
                    threads=cpu_threads.current(), threads_set=threads_set)  # fmt: skip
    _write_cache(cache_dir, key, choice)
    return choice, composed


def _confirm(measurements, chosen, same, loaded, inputs, runs, progress):
    """The measurements with a second round for the finalists: the declared order, the winner
    and each backend alone, timed together again. On a shared machine one round's winner by
    a few percent is often the next round's loser; a switch away from the declared order must
    win both rounds."""
    singles = [m.candidate for m in measurements if len(m.candidate.backends) == 1]
    finalists = [measurements[0].candidate, chosen, *singles]
    if chosen.pins:
        # A per-region choice must beat the best whole program again, whichever it was.
        whole = [m for m in measurements if m.latency is not None and not m.candidate.pins]
        finalists += [min(whole, key=lambda m: m.latency.median_us).candidate] if whole else []
    digests = list(dict.fromkeys(same[c] for c in finalists if c in same))
    if progress is not None:
        progress(f"placement: confirming {chosen.label}, {len(digests)} program(s) again")
    again = interleaved({d: loaded[d].timed_call(inputs) for d in digests}, runs)
    return tuple(
        attrs.evolve(m, confirmed=again[same[m.candidate]])
        if m.candidate in finalists and m.candidate in same
        else m
        for m in measurements
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@attrs.frozen
class _Unit:
    """A partition of a candidate's plan, or one node of it left to portable kernels."""

    name: str
    backend: str
    nodes: frozenset[str]


def units(plan) -> list[_Unit]:
    """The partitions of ``plan``, then each node it leaves to portable kernels."""
    from composer.plans import PORTABLE

    found = [_Unit(p.id, p.backend, frozenset(p.nodes)) for p in plan.partitions]
    found += [_Unit(n, PORTABLE, frozenset((n,))) for n in plan.nodes_on(PORTABLE)]
    return found


def unit_latencies(composition, traced: ProgramTrace) -> dict[str, Latency]:
    """Each unit's traced time: a partition's delegate call, a portable node's kernel call
    (see ``unit_steps``)."""
    return {name: latency for name, _where, latency in unit_steps(composition, traced) if name}


def unit_steps(composition, traced) -> list[tuple[str | None, str, Latency]]:
    """The traced calls in the order they run: (unit name, where it runs, latency).

    ``traced`` is a ``ProgramTrace`` of the runtime (ETDump), or a
    ``composer.hosted_trace.HostedTrace``, which is matched with the plan as it is timed.

    The program's graph lists its calls in the order its instructions run them: a delegate
    call's lowered module keeps the names of the plan nodes it holds. Kernels are matched with
    the plan's portable nodes by order and op, not by name: ``to_executorch`` renames nodes
    (mobilenet's third convolution, on portable kernels, became ``aten_convolution_default``,
    the name of the plan's first, which XNNPACK ran). A kernel that is no plan node (a copy
    ``to_executorch`` inserted) belongs to no unit (name ``None``). Empty when the graph and
    the instructions disagree: better no times than wrong ones.
    """
    from executorch.exir import memory

    from composer.hosted_trace import HostedTrace
    from composer.plans import PORTABLE

    if isinstance(traced, HostedTrace):  # matched with the plan as it was timed
        return list(traced.steps)

    graph = composition.program.exported_program().graph_module
    nodes = [
        n
        for n in graph.graph.nodes
        if n.op == "call_function" and getattr(n.target, "__name__", "") not in ("getitem", "alloc")
    ]
    # A view_copy left to portable kernels becomes memory.view, which the emitter turns into
    # an alias of its input: no instruction runs, so it is timed as nothing.
    calls = [node for node in nodes if node.target is not memory.view]
    kinds = ["delegate" if _is_delegate_call(n) else "kernel" for n in calls]
    if kinds != [step.kind for step in traced.steps]:
        return []
    plan = composition.plan
    backend_of = {p.id: p.backend for p in plan.partitions}
    pending = [n for n in plan.nodes_on(PORTABLE)]  # in graph order, as build_plan lists them
    steps = iter(traced.steps)
    free = Latency(0.0, 0.0, traced.execute.runs)
    found: list[tuple[str | None, str, Latency]] = []
    for node in nodes:
        if node.target is memory.view:
            name = _next_portable(pending, plan.node_ops, "view")
            if name is not None:
                found.append((name, PORTABLE, free))
            continue
        step = next(steps)
        if step.kind == "delegate":
            lowered = getattr(graph, node.args[0].target)
            unit = partition_of(plan, {n.name for n in lowered.original_module.graph.nodes})
            found.append((unit, backend_of[unit] if unit else step.name, step.latency))
        else:
            base = getattr(node.target, "__name__", "").split(".")[0]
            found.append((_next_portable(pending, plan.node_ops, base), PORTABLE, step.latency))
    return found


def partition_of(plan, inside: set[str]) -> str | None:
    """The partition of ``plan`` that shares the most nodes with a lowered module whose graph
    has the nodes ``inside`` (a delegate keeps the names of the plan nodes it holds);
    ``None`` where it shares none."""
    best = max(plan.partitions, key=lambda p: len(inside.intersection(p.nodes)), default=None)
    return best.id if best is not None and inside.intersection(best.nodes) else None


def _next_portable(pending: list[str], ops: Mapping[str, str], kernel: str) -> str | None:
    """The plan's next portable node (of the next few) whose op the kernel ``kernel`` runs
    (``convolution`` for ``aten.convolution.default``, ``view`` for ``aten.view_copy``);
    taken off ``pending`` with the ones it passed. ``None``: an inserted kernel."""
    for index, name in enumerate(pending[:4]):
        parts = ops[name].split(".")
        op = parts[1] if len(parts) >= 3 else ops[name]
        if op in (kernel, f"{kernel}_copy"):
            del pending[: index + 1]
            return name
    return None


def _is_delegate_call(node) -> bool:
    return getattr(node.target, "__name__", "") == "executorch_call_delegate"


def partition_times(
    chosen: Candidate, composed: Mapping[Candidate, Any], traces: Mapping[Candidate, ProgramTrace]
) -> tuple[tuple[PartitionTime, ...], dict[str, float]]:
    """The chosen program's partitions with their traced times, and for each the same nodes as
    other candidates ran them: on another backend, or on portable kernels."""
    if chosen not in traces:
        return (), {}
    timed = {c: unit_latencies(composed[c], t) for c, t in traces.items()}
    others = [
        (c.label, units(composed[c].plan), timed[c])
        for c in traces
        if c != chosen and composed[c].buffer != composed[chosen].buffer
    ]
    found = tuple(
        PartitionTime(
            unit.name,
            unit.backend,
            len(unit.nodes),
            timed[chosen][unit.name],
            _alternatives(unit, others),
        )
        for unit in units(composed[chosen].plan)
        if unit.name in timed[chosen]
    )
    whole = traces[chosen]
    traced = {
        "execute_median_us": round(whole.execute.median_us, 2),
        "between_calls_us": round(whole.between_steps_us, 2),
        "runs": whole.execute.runs,
        "timer": whole.timer,
    }
    return found, traced


def _alternatives(unit: _Unit, others) -> tuple[Alternative, ...]:
    """Per other backend, the closest match for ``unit``'s nodes among the other candidates:
    a partition holding them all (fewest extra nodes first), or all of them on portable."""
    from composer.plans import PORTABLE

    best: dict[str, Alternative] = {}
    for label, their_units, their_times in others:
        options = [
            Alternative(
                other.backend, label, their_times[other.name], len(other.nodes - unit.nodes)
            )
            for other in their_units
            if other.backend not in (unit.backend, PORTABLE)
            and unit.nodes <= other.nodes
            and other.name in their_times
        ]
        portable = [u.name for u in their_units if u.backend == PORTABLE and u.nodes <= unit.nodes]
        if (
            unit.backend != PORTABLE
            and len(portable) == len(unit.nodes)
            and all(name in their_times for name in portable)
        ):
            # A median of sums is not the sum of medians; close enough to rank kernels by.
            kernels = [their_times[name] for name in portable]
            total = Latency(sum(k.median_us for k in kernels), sum(k.p90_us for k in kernels),
                            kernels[0].runs)  # fmt: skip
            options.append(Alternative(PORTABLE, label, total))
        for option in options:
            kept = best.get(option.backend)
            rank = (option.extra_nodes, option.latency.median_us)
            if kept is None or rank < (kept.extra_nodes, kept.latency.median_us):
                best[option.backend] = option
    return tuple(best.values())


def cache_key(
    program, backends: Sequence[str], settings: Mapping[str, Any], runs: int
) -> str | None:
    """What a measurement depends on: the program (graph and weights), the stack, the runs,
    the versions of what compiles and runs it, and the machine. None: not to be cached."""
    import torch

    from composer.fingerprint import Unfingerprintable, digest, program_digest, versions

    try:
        program_part = program_digest(program)
    except Unfingerprintable:
        return None
    libraries = {}
    for distribution in VERSIONED:
        try:
            libraries[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            libraries[distribution] = None
    facts = {
        "backends": list(backends),
        "settings": {k: _plain(v) for k, v in sorted(settings.items())},
        "runs": runs,
        "search": "whole programs, then per region",  # what a cached choice was chosen among
        "versions": libraries,
        "machine": [platform.machine(), platform.processor(), os.cpu_count()],
        "threads": torch.get_num_threads(),
        "runtime_threads": cpu_threads.current(),
    }
    return digest(versions(), program_part, json.dumps(facts, sort_keys=True))[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple | set | frozenset):
        return sorted(_plain(v) for v in value)
    return value


def _read_cache(folder: Path | None, key: str | None) -> Choice | None:
    if folder is None or key is None:
        return None
    path = folder / "placement" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        measurements = tuple(
            Measurement(
                Candidate(
                    tuple(item["backends"]),
                    item["placement"],
                    tuple((b, tuple(p)) for b, p in item.get("pins", {}).items()),
                ),
                item["delegate_calls"],
                None
                if item["median_us"] is None
                else Latency(item["median_us"], item["p90_us"], data["runs"], item.get("best_us")),
                item["note"],
                None
                if item.get("confirmed_median_us") is None
                else Latency(
                    item["confirmed_median_us"],
                    item["confirmed_median_us"],
                    data["runs"],
                    item.get("confirmed_best_us"),
                ),
            )
            for item in data["candidates"]
        )
        # The choice as made, which a second round may have changed: not recomputed.
        chosen = next(m.candidate for m in measurements if m.candidate.label == data["chosen"])
        runs = data["traced"].get("runs", 0)  # no runs: the chosen program was not traced
        partitions = tuple(
            PartitionTime(
                item["partition"],
                item["backend"],
                item["nodes"],
                Latency(item["median_us"], item["p90_us"], runs),
                tuple(
                    Alternative(
                        a["backend"],
                        a["candidate"],
                        Latency(a["median_us"], a["p90_us"], runs),
                        a["extra_nodes"],
                    )
                    for a in item["alternatives"]
                ),
            )
            for item in data["partitions"]
        )
        traced = dict(data["traced"])
        searched = dict(data.get("regions", {}))
        never = {b: list(p) for b, p in data.get("never", {}).items()}
        threads, threads_set = data.get("threads"), bool(data.get("threads_set"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None  # no entry, or one this version cannot read: measure again
    return Choice(
        chosen, measurements, True, partitions, traced, searched, never, threads, threads_set
    )


def _write_cache(folder: Path | None, key: str | None, choice: Choice) -> None:
    if folder is None or key is None:
        return
    from composer.atomic import write_all

    target = folder / "placement" / f"{key}.json"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        runs = next((m.latency.runs for m in choice.measurements if m.latency), 0)
        data = {**choice.to_dict(), "runs": runs}
        write_all({target: (json.dumps(data, indent=2) + "\n").encode()})
    except Exception:  # noqa: BLE001 - a cache that cannot be written only costs a re-measure
        return
