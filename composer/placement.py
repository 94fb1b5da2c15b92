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

This chooses among whole programs, not per region: a mix of backends per part of the graph
that no order produces is not tried. Each distinct program is then traced (ETDump), so the plan
says what every partition of the chosen program cost and, where another candidate ran the same
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

from composer.latency import Latency, ProgramTrace, interleaved, trace

MARGIN = 0.05  # a candidate must beat the declared order by this much to replace it
RUNS = 100
TRACE_RUNS = 30  # calls per program under ETDump, for the per-partition times
VERSIONED = ("executorch-composer", "executorch", "torch", "openvino")


@attrs.frozen
class Candidate:
    """A whole-program assignment: backends in order and the placement rule."""

    backends: tuple[str, ...]
    placement: str  # "priority" or "strict"

    @property
    def label(self) -> str:
        if len(self.backends) == 1:
            return f"{self.backends[0]} alone"
        return f"{','.join(self.backends)} ({self.placement})"


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
            "delegate_calls": self.delegate_calls,
            "median_us": None if self.latency is None else round(self.latency.median_us, 2),
            "p90_us": None if self.latency is None else round(self.latency.p90_us, 2),
            "note": self.note,
            "confirmed_median_us": (
                None if self.confirmed is None else round(self.confirmed.median_us, 2)
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "measured",
            "chosen": self.chosen.label,
            "cached": self.cached,
            "candidates": [m.to_dict() for m in self.measurements],
            "config": self.config_toml(),
            "partitions": [p.to_dict() for p in self.partitions],
            "traced": dict(self.traced),
        }

    def config_toml(self) -> str:
        """The lines of composer.toml that reproduce the choice without measuring."""
        backends = ", ".join(f'"{name}"' for name in self.chosen.backends)
        return f'backends = [{backends}]\nplacement = "{self.chosen.placement}"\n'


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
    """The fastest timed candidate; the declared order unless beaten by more than MARGIN."""
    timed = [m for m in measurements if m.latency is not None]
    if not timed:
        return measurements[0].candidate
    fastest = min(timed, key=lambda m: m.latency.median_us)
    declared = measurements[0]
    if declared.latency is not None and (
        declared.latency.median_us <= fastest.latency.median_us * (1 + MARGIN)
    ):
        return declared.candidate
    return fastest.candidate


def choose_confirmed(measurements: Sequence[Measurement]) -> Candidate:
    """The choice by the second round's times: only the finalists, the declared order first."""
    return choose([attrs.evolve(m, latency=m.confirmed) for m in measurements])


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
) -> tuple[Choice, dict[Candidate, Any]]:
    """Compose and time every candidate (cached by ``key``); returns the choice and the
    compositions it made (none when the cache answered). ``hosted``: run every candidate
    through ``aoti_host`` (a stack with CUDA in it, on a GPU) instead of the runtime."""
    from composer.aoti_host import program_runner
    from composer.errors import ComposerError

    cached = _read_cache(cache_dir, key)
    if cached is not None:
        if progress is not None:
            progress(f"placement: measurements from the cache ({cached.chosen.label})")
        return cached, {}
    started = time.perf_counter()
    composed: dict[Candidate, Any] = {}
    notes: dict[Candidate, str] = {}
    same: dict[Candidate, str] = {}  # candidate -> digest of its program
    loaded = {}
    failures: list[ComposerError] = []
    for index, candidate in enumerate(candidates(backends)):
        if index and budget_s is not None and time.perf_counter() - started > budget_s:
            notes[candidate] = f"not measured: over the tune budget of {budget_s:g} s"
            continue
        if progress is not None:
            progress(f"placement: composing {candidate.label}")
        try:
            composition = compose_candidate(candidate)
        except ComposerError as error:
            # One order or backend failing to lower (OpenVINO alone keeps a bilinear upsample
            # whole that it cannot take) leaves the others to choose from.
            failures.append(error)
            notes[candidate] = f"not composed: {_first_line(error)}"
            continue
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
                continue
            loaded[digest] = program
        same[candidate] = digest
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
        for candidate in candidates(backends)
    )
    chosen = choose(measurements)
    if chosen != measurements[0].candidate:
        measurements = _confirm(measurements, chosen, same, loaded, inputs, runs, progress)
        chosen = choose_confirmed(measurements)
    traces = {}
    for candidate in [chosen, *(c for c in composed if c != chosen)]:
        digest = same.get(candidate)
        over = budget_s is not None and time.perf_counter() - started > budget_s
        if hosted or digest is None or digest in traces or (over and candidate != chosen):
            continue  # ETDump traces what the runtime runs
        if progress is not None:
            progress(f"placement: tracing {candidate.label}, {TRACE_RUNS} runs (ETDump)")
        traces[digest] = trace(composed[candidate].buffer, inputs, TRACE_RUNS)
    by_candidate = {c: traces[same[c]] for c in composed if traces.get(same.get(c)) is not None}
    partitions, traced = partition_times(chosen, composed, by_candidate)
    choice = Choice(chosen, measurements, cached=False, partitions=partitions, traced=traced)
    _write_cache(cache_dir, key, choice)
    return choice, composed


def _confirm(measurements, chosen, same, loaded, inputs, runs, progress):
    """The measurements with a second round for the finalists: the declared order, the winner
    and each backend alone, timed together again. On a shared machine one round's winner by
    a few percent is often the next round's loser; a switch away from the declared order must
    win both rounds."""
    singles = [m.candidate for m in measurements if len(m.candidate.backends) == 1]
    finalists = [measurements[0].candidate, chosen, *singles]
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
    """Each unit's traced time: a partition's delegate call, a portable node's kernel call.

    The program's graph lists its calls in the order its instructions run them (a delegate
    call's lowered module keeps the names of the plan nodes it holds); a kernel that is no
    plan node (a copy ``to_executorch`` inserted) belongs to no unit.
    """
    graph = composition.program.exported_program().graph_module
    calls = [
        node
        for node in graph.graph.nodes
        if node.op == "call_function"
        and getattr(node.target, "__name__", "") not in ("getitem", "alloc")
    ]
    kinds = ["delegate" if _is_delegate_call(n) else "kernel" for n in calls]
    if kinds != [step.kind for step in traced.steps]:
        return {}  # the graph and the instructions disagree: better no times than wrong ones
    plan = composition.plan
    partitions = {p.id: set(p.nodes) for p in plan.partitions}
    found: dict[str, Latency] = {}
    for node, step in zip(calls, traced.steps):
        if step.kind == "delegate":
            lowered = getattr(graph, node.args[0].target)
            inside = {n.name for n in lowered.original_module.graph.nodes}
            best = max(partitions, key=lambda p: len(partitions[p] & inside), default=None)
            if best is not None and partitions[best] & inside:
                found[best] = step.latency
        elif plan.node_backends.get(node.name) == "portable":
            found[node.name] = step.latency
    return found


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
        "versions": libraries,
        "machine": [platform.machine(), platform.processor(), os.cpu_count()],
        "threads": torch.get_num_threads(),
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
                Candidate(tuple(item["backends"]), item["placement"]),
                item["delegate_calls"],
                None
                if item["median_us"] is None
                else Latency(item["median_us"], item["p90_us"], data["runs"]),
                item["note"],
                None
                if item.get("confirmed_median_us") is None
                else Latency(
                    item["confirmed_median_us"], item["confirmed_median_us"], data["runs"]
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
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None  # no entry, or one this version cannot read: measure again
    return Choice(chosen, measurements, True, partitions, traced)


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
