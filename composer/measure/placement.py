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
from composer.contract.machine import MachineError
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
from composer.run.cpp_runtime import RunnerProgram
from composer.run.piecewise import program_runner
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

    ``hosted``: run every candidate through ``piecewise`` (a stack with CUDA in it, on a
    GPU) instead of the runtime, and time each call there (``composer.measure.hosted_trace``)
    instead of tracing with ETDump. ``plan_candidate`` plans a candidate without lowering;
    given, and with two or more backends, a per-region candidate is searched too
    (composer.measure.region_search). ``never`` is the user's pins, which the config that reproduces the
    choice repeats, as it repeats the runtime's threads where ``threads_set``.

    ``runner``: the C++ runtime ``$COMPOSER_ET_RUNNER`` names, where the programs deploy: every
    candidate is timed there (composer.measure.runner_timing), whole; no per-region search and
    no per-partition traces, which time the programs elsewhere."""
    cached = read_cache(cache_dir, key)
    if cached is not None:
        cached = attrs.evolve(cached, threads_set=threads_set)
        if progress is not None:
            progress(f"placement: measurements from the cache ({cached.chosen.label})")
        return cached, {}
    budget = _Budget(budget_s)
    programs = _Programs(compose_candidate, inputs, runs, hosted, runner, progress)
    listed = _compose_whole_programs(programs, backends, budget)
    searched: RegionSearch | None = None
    if plan_candidate is not None and len(backends) > 1:
        mixed, searched = _search_regions(programs, plan_candidate, backends, budget)
        if mixed is not None:
            listed.append(mixed)
            programs.add(mixed)
    if not programs.composed and programs.failures:
        raise programs.failures[0]
    chosen, measurements = _time_and_choose(programs, listed)
    partitions, traced = partition_times(
        chosen, programs.composed, _traces(programs, chosen, budget)
    )
    choice = Choice(chosen, measurements, cached=False, partitions=partitions, traced=traced,
                    regions=searched, never={b: list(p) for b, p in (never or {}).items()},
                    threads=cpu_threads.current(), threads_set=threads_set)  # fmt: skip
    write_cache(cache_dir, key, choice)
    return choice, programs.composed


@attrs.define
class _Budget:
    """The tune budget's clock, started on a cache miss, before the first candidate composes."""

    seconds: float | None
    started: float = attrs.field(factory=time.perf_counter)

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.started > self.seconds


@attrs.define
class _Programs:
    """The candidates composed so far and the distinct programs they lowered to, each loaded
    where it is timed (``runner``'s C++ runtime, else here); a candidate that failed to
    compose or to run has a note instead."""

    compose_candidate: Callable[[Candidate], Any]
    inputs: Sequence[Any]
    runs: int
    hosted: bool
    runner: str | None
    progress: Callable[[str], None] | None
    composed: dict[Candidate, Any] = attrs.field(factory=dict)
    notes: dict[Candidate, str] = attrs.field(factory=dict)
    same: dict[Candidate, str] = attrs.field(factory=dict)  # candidate -> digest of its program
    loaded: dict[str, Any] = attrs.field(factory=dict)  # digest -> its program, loaded
    # digest -> one warm call, which sets how often it is run
    call_s: dict[str, float] = attrs.field(factory=dict)
    failures: list[ComposerError] = attrs.field(factory=list)

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def add(self, candidate: Candidate) -> None:
        """Compose ``candidate`` and load its program, unless another candidate lowered to the
        same bytes: those are one program, timed once, so that noise cannot rank a program
        against itself."""
        self.say(f"placement: composing {candidate.label}")
        try:
            composition = self.compose_candidate(candidate)
        except MachineError:
            raise  # the machine's, not the candidate's: which wins must not depend on the load
        except ComposerError as error:
            # One order or backend failing to lower (OpenVINO alone keeps a bilinear upsample
            # whole that it cannot take) leaves the others to choose from.
            self.failures.append(error)
            self.notes[candidate] = f"not composed: {first_line(error)}"
            return
        self.composed[candidate] = composition
        if composition.plan.repairs:  # measured as repaired, which the label alone hides
            self.notes[candidate] = "; ".join(
                f"moved: {describe_repair(r)}" for r in composition.plan.repairs
            )
        digest = hashlib.sha256(composition.buffer).hexdigest()
        if digest not in self.loaded:
            try:
                self.loaded[digest] = self._load(composition, digest)
            except ComposerError as error:
                self.notes[candidate] = f"not timed: {first_line(error)}"
                return
        self.same[candidate] = digest

    def _load(self, composition, digest: str):
        if self.runner is not None:
            program = RunnerProgram(self.runner, composition.buffer, composition.data_files)
        else:
            program = program_runner(composition, self.hosted)
        program.run(self.inputs)  # checks the inputs once, outside the timing
        if self.runner is None:  # a runner's call is a process of its own
            self.call_s[digest] = call_seconds(functools.partial(program.run, self.inputs))
        return program

    def runs_of(self, digest: str, count: int) -> int:
        """``count`` calls, or fewer where the program's calls are slow (``runs_within``)."""
        return runs_within(self.call_s[digest], count) if digest in self.call_s else count

    def together(self, digests: Sequence[str]) -> dict[str, Latency]:
        """The programs of ``digests`` timed taking turns, where they deploy."""
        if self.runner is not None:
            return runner_interleaved({d: self.loaded[d] for d in digests}, self.inputs, self.runs)
        calls = {d: self.loaded[d].timed_call(self.inputs) for d in digests}
        return interleaved(calls, {d: self.runs_of(d, self.runs) for d in digests})

    def trace(self, candidate: Candidate, digest: str):
        """``candidate``'s program traced (ETDump; hosted, each call timed) for its
        per-partition times."""
        count = self.runs_of(digest, TRACE_RUNS)
        how = hosted_trace.HostedTrace.timer if self.hosted else ProgramTrace.timer
        self.say(f"placement: tracing {candidate.label}, {count} runs ({how})")
        if self.hosted:
            together = hosted_trace.trace_together(
                {digest: self.loaded[digest]}, self.inputs, count
            )
            return together[digest]
        return trace(self.composed[candidate].buffer, self.inputs, count)


def _compose_whole_programs(
    programs: _Programs, backends: Sequence[str], budget: _Budget
) -> list[Candidate]:
    """Compose the whole-program candidates, the declared order and each backend alone first
    and whatever the budget (a budget spent on the others must not leave them out); returns
    them all, those the budget left out with a note."""
    listed = candidates(backends)
    for candidate in sorted(listed, key=lambda c: not always_composed(c, backends)):
        if not always_composed(candidate, backends) and budget.spent():
            programs.notes[candidate] = (
                f"not measured: over the tune budget of {budget.seconds:g} s"
            )
            continue
        programs.add(candidate)
    return listed


def _search_regions(
    programs: _Programs, plan_candidate, backends: Sequence[str], budget: _Budget
) -> tuple[Candidate | None, RegionSearch]:
    """The per-region candidate (``None``: none) and what its search found, or why there was
    no search."""
    if programs.runner is not None:
        whole = f"not searched: candidates are timed whole in {programs.runner}"
        return None, RegionSearch([whole + ", where per-region timing has no counterpart"])
    if budget.spent():
        return None, RegionSearch([f"not searched: over the tune budget of {budget.seconds:g} s"])
    return region_search.search(
        programs.compose_candidate, plan_candidate, backends, programs.inputs,
        over_budget=budget.spent, progress=programs.progress, trace_runs=REGION_RUNS,
        hosted=programs.hosted,
    )  # fmt: skip


def _time_and_choose(
    programs: _Programs, listed: Sequence[Candidate]
) -> tuple[Candidate, tuple[Measurement, ...]]:
    """Every distinct program timed together, and the choice among ``listed``; a choice other
    than the declared order is timed again (``_confirm``) before it stands."""
    if programs.progress is not None:
        runs, loaded = programs.runs, programs.loaded
        slow = fewer_runs((programs.runs_of(d, runs) for d in loaded), runs)
        programs.say(f"placement: timing {len(loaded)} distinct program(s), {runs} runs each{slow}")
    timed = programs.together(list(programs.loaded)) if programs.loaded else {}
    measurements = tuple(
        Measurement(
            candidate,
            programs.composed[candidate].plan.delegate_calls
            if candidate in programs.composed
            else None,
            timed.get(programs.same.get(candidate)),
            programs.notes.get(candidate, ""),
        )
        for candidate in listed
    )
    chosen = choose(measurements)
    if chosen != measurements[0].candidate:
        measurements = _confirm(
            measurements, chosen, programs.same, programs.together, programs.progress
        )
        chosen = choose_confirmed(measurements)
    return chosen, measurements


def _traces(programs: _Programs, chosen: Candidate, budget: _Budget) -> dict[Candidate, Any]:
    """Each composed candidate's trace, for the plan's per-partition times: the chosen
    program's always, the others' within the budget; none where a C++ runner times the
    programs, whose traces would be of another runtime."""
    traces = {}
    for candidate in [chosen, *(c for c in programs.composed if c != chosen)]:
        digest = programs.same.get(candidate)
        if digest is None or digest in traces:
            continue
        if (budget.spent() and candidate != chosen) or programs.runner is not None:
            continue
        traces[digest] = programs.trace(candidate, digest)
    same = programs.same
    return {c: traces[same[c]] for c in programs.composed if traces.get(same.get(c)) is not None}


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
