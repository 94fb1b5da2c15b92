"""Measured placement: time whole-program candidates in the runtime here, keep the fastest.

The candidates are the stack in the declared order (priority, and strict), the other orders of
its backends, and each backend alone: every one is a real composition, run in the ExecuTorch
runtime and timed together (``composer.measure.latency.interleaved``), so the choice is never slower
than the best single backend, within the noise of one run. The declared order wins unless
another candidate is faster by more than ``MARGIN``, in that round and again in a second one
where the finalists (the declared order, the winner, each backend alone) are timed anew: on a
shared machine a burst of load can reverse one round. Measurements are cached by program,
stack, candidates, library versions and machine, so a second run times nothing. The choice
is plain configuration (``backends`` and ``placement``), which reproduces it anywhere without
measuring.

With two or more backends, one more candidate is searched per region (composer.measure.region_search): the
graph is cut into regions, each region is timed on every backend that takes it and on portable
kernels, and dynamic programming picks a mix that no order of the stack may produce. That
candidate is written as node pins (``never = {backend: ["node:NAME"]}``, ``placement =
"strict"``), timed with the others, and kept only if it beats every whole-program candidate by
more than ``MARGIN`` (in both rounds): it is a guess from parts, the others are measured whole.
Each distinct program is then traced (ETDump; hosted, each call timed), so the plan says
what every partition of the chosen program cost and, where another candidate ran the same
nodes elsewhere, what they cost there."""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from composer.contract.errors import ComposerError, first_line
from composer.measure import hosted_trace, region_search
from composer.measure.candidates import Candidate, always_composed, candidates
from composer.measure.choice import Choice, Measurement, choose, choose_confirmed
from composer.measure.etdump import ProgramTrace, trace
from composer.measure.latency import (
    Latency,
    call_seconds,
    fewer_runs,
    interleaved,
    runs_within,
)
from composer.measure.placement_cache import read_cache, write_cache
from composer.measure.runner_timing import runner_interleaved
from composer.measure.units import partition_times
from composer.run import cpu_threads
from composer.run.aoti_host import program_runner
from composer.run.cpp_runtime import RunnerProgram
from composer.scheduler.measured_placement import RegionSearch
from composer.scheduler.plans import describe_repair

RUNS = 100


TRACE_RUNS = 30  # calls per program under ETDump, for the per-partition times


REGION_RUNS = 50  # calls per program of the per-region search, traced taking turns


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
    runner: str | None = None,
) -> tuple[Choice, dict[Candidate, Any]]:
    """Compose and time every candidate (cached by ``key``); returns the choice and the
    compositions it made (none when the cache answered).

    ``hosted``: run every candidate through ``aoti_host`` (a stack with CUDA in it, on a
    GPU) instead of the runtime, and time each call there (``composer.measure.hosted_trace``)
    instead of tracing with ETDump. ``plan_candidate`` plans a candidate without lowering;
    given, and with two or more backends, a per-region candidate is searched too
    (composer.measure.region_search). ``never`` is the user's pins, which the config that reproduces the
    choice repeats, as it repeats the runtime's threads where ``threads_set``.

    ``runner``: the C++ runtime ``$COMPOSER_ET_RUNNER`` names, where the programs deploy: every
    candidate is timed there (composer.measure.runner_timing), whole; no per-region search and
    no per-partition traces, which time the programs elsewhere."""
    # These import torch, which the paths that only read a plan skip.

    cached = read_cache(cache_dir, key)
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
    call_s: dict[str, float] = {}  # digest -> one warm call, which sets how often it is run
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
            notes[candidate] = f"not composed: {first_line(error)}"
            return
        composed[candidate] = composition
        if composition.plan.repairs:  # measured as repaired, which the label alone hides
            notes[candidate] = "; ".join(
                f"moved: {describe_repair(r)}" for r in composition.plan.repairs
            )
        # Candidates that lower to the same bytes are one program: timed once, so that noise
        # cannot rank a program against itself.
        digest = hashlib.sha256(composition.buffer).hexdigest()
        if digest not in loaded:
            try:
                if runner is not None:
                    program = RunnerProgram(runner, composition.buffer, composition.data_files)
                else:
                    program = program_runner(composition, hosted)
                program.run(inputs)  # checks the inputs once, outside the timing
                if runner is None:  # a runner's call is a process of its own
                    call_s[digest] = call_seconds(functools.partial(program.run, inputs))
            except ComposerError as error:
                notes[candidate] = f"not timed: {first_line(error)}"
                return
            loaded[digest] = program
        same[candidate] = digest

    listed = candidates(backends)
    for candidate in sorted(listed, key=lambda c: not always_composed(c, backends)):
        if not always_composed(candidate, backends) and over_budget():
            notes[candidate] = f"not measured: over the tune budget of {budget_s:g} s"
            continue
        compose_and_load(candidate)
    searched: RegionSearch | None = None
    if plan_candidate is not None and len(backends) > 1:
        if runner is not None:
            whole = f"not searched: candidates are timed whole in {runner}"
            searched = RegionSearch([whole + ", where per-region timing has no counterpart"])
        elif over_budget():
            searched = RegionSearch([f"not searched: over the tune budget of {budget_s:g} s"])
        else:
            mixed, searched = region_search.search(
                compose_candidate, plan_candidate, backends, inputs,
                over_budget=over_budget, progress=progress, trace_runs=REGION_RUNS,
                hosted=hosted,
            )  # fmt: skip
            if mixed is not None:
                listed.append(mixed)
                compose_and_load(mixed)
    if not composed and failures:
        raise failures[0]

    def runs_of(digest: str, count: int) -> int:
        return runs_within(call_s[digest], count) if digest in call_s else count

    if progress is not None:
        slow = fewer_runs((runs_of(d, runs) for d in loaded), runs)
        progress(f"placement: timing {len(loaded)} distinct program(s), {runs} runs each{slow}")

    def together(digests: Sequence[str]) -> dict[str, Latency]:
        if runner is not None:
            return runner_interleaved({d: loaded[d] for d in digests}, inputs, runs)
        calls = {d: loaded[d].timed_call(inputs) for d in digests}
        return interleaved(calls, {d: runs_of(d, runs) for d in digests})

    timed = together(list(loaded)) if loaded else {}
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
        measurements = _confirm(measurements, chosen, same, together, progress)
        chosen = choose_confirmed(measurements)
    traces = {}
    for candidate in [chosen, *(c for c in composed if c != chosen)]:
        digest = same.get(candidate)
        if digest is None or digest in traces:
            continue
        if (over_budget() and candidate != chosen) or runner is not None:
            continue
        count = runs_of(digest, TRACE_RUNS)
        if progress is not None:
            how = hosted_trace.HostedTrace.timer if hosted else ProgramTrace.timer
            progress(f"placement: tracing {candidate.label}, {count} runs ({how})")
        if hosted:
            together_traced = hosted_trace.trace_together({digest: loaded[digest]}, inputs, count)
            traces[digest] = together_traced[digest]
        else:
            traces[digest] = trace(composed[candidate].buffer, inputs, count)
    by_candidate = {c: traces[same[c]] for c in composed if traces.get(same.get(c)) is not None}
    partitions, traced = partition_times(chosen, composed, by_candidate)
    choice = Choice(chosen, measurements, cached=False, partitions=partitions, traced=traced,
                    regions=searched, never={b: list(p) for b, p in (never or {}).items()},
                    threads=cpu_threads.current(), threads_set=threads_set)  # fmt: skip
    write_cache(cache_dir, key, choice)
    return choice, composed


def _confirm(measurements, chosen, same, together, progress):
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
    again = together(digests)
    return tuple(
        attrs.evolve(m, confirmed=again[same[m.candidate]])
        if m.candidate in finalists and m.candidate in same
        else m
        for m in measurements
    )
