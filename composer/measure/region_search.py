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
from collections.abc import Mapping, Sequence
from typing import Any

from composer.contract.errors import ComposerError, first_line
from composer.measure import etdump, hosted_trace
from composer.measure.candidates import Candidate
from composer.measure.latency import call_seconds, fewer_runs, runs_within
from composer.measure.region_choice import proposal
from composer.measure.region_costs import costs, on_backends
from composer.measure.region_layouts import layouts, pins
from composer.measure.regions import HOSTED_MAX_REGIONS, MAX_REGIONS, cut, survey, topological_order
from composer.measure.units import unit_steps
from composer.run.aoti_host import program_runner
from composer.scheduler.measured_placement import RegionSearch


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
    (``composer.run.aoti_host``), each call timed there (``composer.measure.hosted_trace``), not in the
    runtime under ETDump."""

    say = progress or (lambda line: None)
    backends = list(backends)
    notes: list[str] = []
    found: dict[str, Any] = {}  # the RegionSearch's fields, as far as the search goes

    def searched() -> RegionSearch:
        return RegionSearch(notes=notes, **found)

    say(f"placement: regions: what each backend takes ({len(backends)} plans, each backend first)")
    try:
        first = {
            backend: plan_candidate(
                Candidate((*backends[i:], *backends[:i]), "strict", keep_whole="any")
            )
            for i, backend in enumerate(backends)
        }
    except ComposerError as error:
        notes.append(f"not searched: a plan failed: {first_line(error)}")
        return None, searched()
    support = survey(first)
    if support is None:
        notes.append("not searched: the orders of the stack decompose the model differently")
        return None, searched()
    declared = first[backends[0]]
    try:
        order = topological_order(list(declared.node_ops), declared.edges)
    except ValueError as error:  # the plan's edges are a DAG; this guards the search only
        notes.append(f"not searched: {error}")
        return None, searched()
    found["max_regions"] = HOSTED_MAX_REGIONS if hosted else MAX_REGIONS
    regions = cut(order, support, backends, max_regions=found["max_regions"])
    found["regions"] = regions
    if len(regions) < 2 or all(len(r.options) == 1 for r in regions):
        notes.append("nothing to choose per region: the whole-program candidates cover it")
        return None, searched()
    plans = layouts(regions, backends, hosted)
    composed = []
    runs: dict[str, int] = {}  # a layout's traced calls: fewer where its calls are slow
    for number, (what, assignment) in enumerate(plans, start=1):
        if over_budget():
            notes.append(
                f"stopped after {number - 1} of {len(plans)} programs: over the tune budget"
            )
            break
        say(f"placement: regions: composing {number}/{len(plans)}: {what}")
        candidate = _pinned(backends, pins(regions, assignment, backends, support))
        try:
            composition = compose_candidate(candidate)
        except ComposerError as error:
            notes.append(f"{what}: not composed: {first_line(error)}")
            continue
        if not hosted:
            runnable, why = composition.runtime_can_run()
            if not runnable:
                notes.append(f"not searched: {why}")
                return None, searched()
        try:  # once, alone: one program the runtime fails (an OpenVINO delegate did, on
            # llama_block) must not stop the others' tracing
            runner = program_runner(composition, hosted)
            runner.run(inputs)
            runs[what] = runs_within(
                call_seconds(functools.partial(runner.run, inputs)), trace_runs
            )
        except (ComposerError, RuntimeError) as error:
            notes.append(f"{what}: does not run: {first_line(error)}")
            continue
        composed.append((what, assignment, composition, runner))
    how = hosted_trace.HostedTrace.timer if hosted else etdump.ProgramTrace.timer
    found["timer"] = how
    slow = fewer_runs(runs.values(), trace_runs)
    say(f"placement: regions: tracing {len(composed)} programs together, {trace_runs} runs each"
        f"{slow} ({how})")  # fmt: skip
    try:
        if hosted:
            runners = {what: runner for what, _a, _c, runner in composed}
            traces = hosted_trace.trace_together(runners, inputs, runs)
        else:
            buffers = {what: c.buffer for what, _a, c, _r in composed}
            traces = etdump.trace_together(buffers, inputs, runs)
    except (ComposerError, RuntimeError) as error:
        notes.append(f"not traced: {first_line(error)}")
        return None, searched()
    programs = []
    for what, assignment, composition, _runner in composed:
        traced = traces[what]
        if traced is None:
            notes.append(f"{what}: not traced: its calls cannot be matched")
            continue
        programs.append((assignment, composition.plan, unit_steps(composition, traced), traced))
    measured = costs(regions, programs, hosted)
    if hosted:
        measured = on_backends(measured)
        notes.append(
            "hosted: ops outside the delegates ran in Python, not on portable kernels, so "
            "a region a backend takes is placed on a backend"
        )
    found.update(measured.rounded())
    proposed = proposal(regions, measured)
    if proposed is None:
        notes.append("no choice: a region was measured on no option")
        return None, searched()
    assignment, estimate, why = proposed
    if why is not None:
        notes.append(why)
    found["chosen"] = assignment
    found["estimated_us"] = round(estimate, 2)
    counts = ", ".join(f"{o} x{assignment.count(o)}" for o in dict.fromkeys(assignment))
    say(f"placement: regions: chose {counts} by dynamic programming, estimated {estimate:.1f} us")
    candidate = _pinned(backends, pins(regions, assignment, backends, support))
    if not candidate.pins:
        notes.append("the per-region choice is the declared order, strict")
        return None, searched()
    return candidate, searched()


def _pinned(backends: Sequence[str], table: Mapping[str, Sequence[str]]):

    return Candidate(
        tuple(backends),
        "strict",
        tuple((b, tuple(p)) for b, p in table.items()),
        keep_whole="any",
    )
