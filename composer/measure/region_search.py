"""Per-region placement: cut the graph into regions, time each on every backend, choose by DP.

Measured placement (composer.measure.placement) times whole programs; this module finds the mixes no
order of the stack produces. The steps, each a function here:

1. ``survey``: which backends take each node. Each backend is put first in a strict plan of
   the stack (the stack's edge program is the same in every order: every partitioner keeps
   whole what any backend keeps whole), so it takes every node it supports.
2. ``cut``: regions are intervals of one topological order of the edge program's ops (an
   interval of a topological order is always convex), cut where the set of backends that take
   the nodes changes, long runs split into pieces of at most ``MAX_REGION_NODES``.
3. ``layouts``: the programs that measure them, each composed with node pins (``pins``) in
   strict order and traced with ETDump (hosted, with CUDA in the stack on a GPU: each call
   timed, ``composer.measure.hosted_trace``). Per backend, two in which its regions take turns
   with portable kernels (even regions, then odd ones): every region runs once on it as a
   call of its own, and once on portable kernels, with no other backend's threads about.
   Per pair of backends, one in which regions take turns between the two: the crossings,
   timed once. ``costs`` reads every region's time per option, what a call right after one
   of the other backend costs more (on 2 cores, OpenVINO's worker threads still spin when
   XNNPACK's start), and a delegate call's fixed cost per backend. Hosted, regions alternate
   between each pair of backends both ways round instead, not with portable kernels, and at
   most ``HOSTED_MAX_REGIONS`` are cut: each region on CUDA is an .so to compile.
4. ``choose``: a Viterbi pass over the regions in order: a region's time on its option, plus
   a switch cost where consecutive regions change option (and a backend's call after another
   backend's, portable kernels between or not), minus a call's fixed cost where they stay on
   one backend (they become one delegate call).

The choice is written as node pins (``never = {backend: ["node:NAME", ...]}``) with
``placement = "strict"``: that reproduces it without measuring. The sum is an estimate;
composer.measure.placement composes the choice and times it against the whole-program candidates."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from composer.contract.errors import ComposerError, first_line
from composer.measure import etdump, hosted_trace
from composer.measure.candidates import Candidate
from composer.measure.latency import call_seconds, fewer_runs, runs_within
from composer.measure.region_choice import proposal
from composer.measure.region_costs import Costs, costs, on_backends
from composer.measure.region_layouts import layouts, pins
from composer.measure.regions import HOSTED_MAX_REGIONS, MAX_REGIONS, cut, survey, topological_order
from composer.measure.units import unit_steps
from composer.run.piecewise import program_runner
from composer.scheduler.measured_placement import Region, RegionSearch


def search(
    compose_candidate,
    plan_candidate,
    backends: Sequence[str],
    inputs: Sequence[Any],
    *,
    over_budget,
    progress=None,
    trace_runs: int = 50,
    hosted: bool = False,
):
    """Survey, cut, compose and trace the ``layouts``, choose: the per-region candidate (a
    ``placement.Candidate`` with node pins) and what was found, for the plan (a
    ``RegionSearch``, as far as the search went); the candidate is
    ``None`` when there is nothing to choose or the search could not finish. ``hosted``: the
    layouts run as the whole-program candidates do with CUDA in the stack on a GPU
    (``composer.run.piecewise``), each call timed there (``composer.measure.hosted_trace``), not in the
    runtime under ETDump."""
    say = progress or (lambda line: None)
    searching = _Search(
        compose_candidate, plan_candidate, list(backends), inputs, over_budget, say, trace_runs,
        hosted,
    )  # fmt: skip
    try:
        support, regions = searching.regions()
        composed = searching.compose_layouts(regions, support)
        traces = searching.trace_together(composed)
        measured = searching.measured_costs(regions, composed, traces)
        candidate = searching.chosen(regions, support, measured)
    except _NotChosen as why:
        searching.notes.append(str(why))
        candidate = None
    return candidate, RegionSearch(notes=searching.notes, **searching.found)


class _NotChosen(Exception):
    """The search ends here with no candidate; the message is the plan's note saying why."""


@attrs.frozen
class _TimedLayout:
    """One layout, composed and run once: what it measures, its program and its traced calls."""

    what: str
    assignment: tuple[str, ...]
    composition: Any
    runner: Any
    runs: int  # its traced calls: fewer where its calls are slow


@attrs.define
class _Search:
    """One search's inputs, and the plan's notes and ``RegionSearch`` fields as far as it goes;
    each step is a method, which raises ``_NotChosen`` where the search ends early."""

    compose_candidate: Callable[[Candidate], Any]
    plan_candidate: Callable[[Candidate], Any]
    backends: list[str]
    inputs: Sequence[Any]
    over_budget: Callable[[], bool]
    say: Callable[[str], None]
    trace_runs: int
    hosted: bool
    notes: list[str] = attrs.field(factory=list)
    found: dict[str, Any] = attrs.field(factory=dict)  # the RegionSearch's fields

    def regions(self) -> tuple[Mapping[str, Any], list[Region]]:
        """Which backends take each node (``survey``), and the regions ``cut`` where that
        changes."""
        backends = self.backends
        self.say(
            f"placement: regions: what each backend takes ({len(backends)} plans, each backend first)"
        )
        try:
            first = {
                backend: self.plan_candidate(
                    Candidate((*backends[i:], *backends[:i]), "strict", keep_whole="any")
                )
                for i, backend in enumerate(backends)
            }
        except ComposerError as error:
            raise _NotChosen(f"not searched: a plan failed: {first_line(error)}") from error
        support = survey(first)
        if support is None:
            raise _NotChosen(
                "not searched: the orders of the stack decompose the model differently"
            )
        declared = first[backends[0]]
        try:
            order = topological_order(list(declared.node_ops), declared.edges)
        except ValueError as error:  # the plan's edges are a DAG; this guards the search only
            raise _NotChosen(f"not searched: {error}") from error
        self.found["max_regions"] = HOSTED_MAX_REGIONS if self.hosted else MAX_REGIONS
        regions = cut(order, support, backends, max_regions=self.found["max_regions"])
        self.found["regions"] = regions
        if len(regions) < 2 or all(len(r.options) == 1 for r in regions):
            raise _NotChosen("nothing to choose per region: the whole-program candidates cover it")
        return support, regions

    def compose_layouts(self, regions: Sequence[Region], support) -> list[_TimedLayout]:
        """The ``layouts`` that measure the regions, composed and run once each, as many as the
        budget allows; one that fails to compose or to run is left out with a note."""
        plans = layouts(regions, self.backends, self.hosted)
        composed = []
        for number, (what, assignment) in enumerate(plans, start=1):
            if self.over_budget():
                self.notes.append(
                    f"stopped after {number - 1} of {len(plans)} programs: over the tune budget"
                )
                break
            self.say(f"placement: regions: composing {number}/{len(plans)}: {what}")
            candidate = _pinned(self.backends, pins(regions, assignment, self.backends, support))
            layout = self._composed_and_run(what, assignment, candidate)
            if layout is not None:
                composed.append(layout)
        return composed

    def _composed_and_run(self, what: str, assignment, candidate: Candidate) -> _TimedLayout | None:
        try:
            composition = self.compose_candidate(candidate)
        except ComposerError as error:
            self.notes.append(f"{what}: not composed: {first_line(error)}")
            return None
        if not self.hosted:
            runnable, why = composition.runtime_can_run()
            if not runnable:
                raise _NotChosen(f"not searched: {why}")
        try:  # once, alone: one program the runtime fails (an OpenVINO delegate did, on
            # llama_block) must not stop the others' tracing
            runner = program_runner(composition, self.hosted)
            runner.run(self.inputs)
            runs = runs_within(
                call_seconds(functools.partial(runner.run, self.inputs)), self.trace_runs
            )
        except (ComposerError, RuntimeError) as error:
            self.notes.append(f"{what}: does not run: {first_line(error)}")
            return None
        return _TimedLayout(what, assignment, composition, runner, runs)

    def trace_together(self, composed: Sequence[_TimedLayout]) -> dict[str, Any]:
        """The layouts traced taking turns (ETDump; hosted, each call timed), by ``what``."""
        how = hosted_trace.HostedTrace.timer if self.hosted else etdump.ProgramTrace.timer
        self.found["timer"] = how
        runs = {layout.what: layout.runs for layout in composed}
        slow = fewer_runs(runs.values(), self.trace_runs)
        self.say(f"placement: regions: tracing {len(composed)} programs together, "
                 f"{self.trace_runs} runs each{slow} ({how})")  # fmt: skip
        try:
            if self.hosted:
                runners = {layout.what: layout.runner for layout in composed}
                return hosted_trace.trace_together(runners, self.inputs, runs)
            buffers = {layout.what: layout.composition.buffer for layout in composed}
            return etdump.trace_together(buffers, self.inputs, runs)
        except (ComposerError, RuntimeError) as error:
            raise _NotChosen(f"not traced: {first_line(error)}") from error

    def measured_costs(
        self, regions: Sequence[Region], composed: Sequence[_TimedLayout], traces: Mapping[str, Any]
    ) -> Costs:
        """The ``costs`` read off every layout whose calls the trace matched."""
        programs = []
        for layout in composed:
            traced = traces[layout.what]
            if traced is None:
                self.notes.append(f"{layout.what}: not traced: its calls cannot be matched")
                continue
            steps = unit_steps(layout.composition, traced)
            programs.append((layout.assignment, layout.composition.plan, steps, traced))
        measured = costs(regions, programs, self.hosted)
        if self.hosted:
            measured = on_backends(measured)
            self.notes.append(
                "hosted: ops outside the delegates ran in Python, not on portable kernels, so "
                "a region a backend takes is placed on a backend"
            )
        self.found.update(measured.rounded())
        return measured

    def chosen(self, regions: Sequence[Region], support, measured: Costs) -> Candidate:
        """The ``proposal`` the costs give, as a candidate with node pins."""
        proposed = proposal(regions, measured)
        if proposed is None:
            raise _NotChosen("no choice: a region was measured on no option")
        assignment, estimate, why = proposed
        if why is not None:
            self.notes.append(why)
        self.found["chosen"] = assignment
        self.found["estimated_us"] = round(estimate, 2)
        counts = ", ".join(f"{o} x{assignment.count(o)}" for o in dict.fromkeys(assignment))
        self.say(
            f"placement: regions: chose {counts} by dynamic programming, estimated {estimate:.1f} us"
        )
        candidate = _pinned(self.backends, pins(regions, assignment, self.backends, support))
        if not candidate.pins:
            raise _NotChosen("the per-region choice is the declared order, strict")
        return candidate


def _pinned(backends: Sequence[str], table: Mapping[str, Sequence[str]]):

    return Candidate(
        tuple(backends),
        "strict",
        tuple((b, tuple(p)) for b, p in table.items()),
        keep_whole="any",
    )
