"""Per-region placement: cut the graph into regions, time each on every backend, choose by DP.

Measured placement (composer.placement) times whole programs; this module finds the mixes no
order of the stack produces. The steps, each a function here:

1. ``survey``: which backends take each node. Each backend is put first in a strict plan of
   the stack (the stack's edge program is the same in every order: every partitioner keeps
   whole what any backend keeps whole), so it takes every node it supports.
2. ``cut``: regions are intervals of one topological order of the edge program's ops (an
   interval of a topological order is always convex), cut where the set of backends that take
   the nodes changes, long runs split into pieces of at most ``MAX_REGION_NODES``.
3. ``layouts``: the programs that measure them, each composed with node pins (``pins``) in
   strict order and traced with ETDump (hosted, with CUDA in the stack on a GPU: each call
   timed, ``composer.hosted_trace``). Per backend, two in which its regions take turns
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
composer.placement composes the choice and times it against the whole-program candidates.
"""

from __future__ import annotations

import collections
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from composer.plans import PORTABLE
from composer.scheduler.assign import node_pin

MAX_REGION_NODES = 8  # a longer run of nodes the same backends take is cut into pieces
MAX_REGIONS = 40  # more are merged, smallest neighbours first: each is a call to time
# Hosted (CUDA in the stack, on a GPU), each region a layout puts on CUDA is a .so of its own,
# tens of seconds to compile (bench/gpu_mix.py's 32-step RNN then a head: cut into 21 regions,
# the layouts hold 31 CUDA partitions; into 8, 12).
HOSTED_MAX_REGIONS = 8


@attrs.frozen
class Region:
    """An interval of the topological order: its nodes, and where it may run."""

    nodes: tuple[str, ...]
    options: tuple[str, ...]  # the stack's backends that take every node, in order; then portable

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "options": list(self.options)}


def survey(first: Mapping[str, Any]) -> dict[str, frozenset[str]] | None:
    """Per node, where it can run, from ``first``: backend -> the strict plan of the stack
    with that backend first; and ``PORTABLE`` where the runtime has a portable kernel for its
    op (no backend taking it: it runs there in every plan). ``None`` when the plans' nodes
    differ (the orders decompose the model differently, so node names do not carry over)."""
    plans = list(first.values())
    nodes = set(plans[0].node_ops)
    if any(set(p.node_ops) != nodes for p in plans[1:]):
        return None
    kernels = portable_kernels()
    found = {}
    for node, op in plans[0].node_ops.items():
        backends = {b for b, plan in first.items() if plan.node_backends.get(node) == b}
        if not backends or _has_kernel(op, kernels):
            backends.add(PORTABLE)
        found[node] = frozenset(backends)
    return found


def portable_kernels() -> frozenset[str]:
    """The kernels the ExecuTorch runtime here has ("aten::linear.out"): the pip runtime's,
    or under another torch than it is built for, the torch-free runtime's (none where that
    is not installed either)."""
    from composer import torch_free_runtime
    from composer.runtime import torch_mismatch

    if torch_mismatch() is not None:
        return torch_free_runtime.operators()
    from executorch.extension.pybindings import portable_lib

    return frozenset(portable_lib._get_operator_names())


def _has_kernel(op: str, kernels: frozenset[str]) -> bool:
    """Whether an op of the plan (``aten.max_pool2d.default``) has a kernel in ``kernels``.
    ExecuTorch 1.5.1's has none for ``aten.max_pool2d`` (only ``max_pool2d_with_indices``),
    which the stack keeps whole for XNNPACK: a program with it on portable kernels fails in
    ``to_executorch`` ("Missing out variants")."""
    namespace, _, rest = op.partition(".")
    name = rest.rpartition(".")[0]
    if not (namespace and name):
        return True  # not an op name composer makes: no reason to rule it out
    return any(kernel.startswith(f"{namespace}::{name}.") for kernel in kernels)


def topological_order(nodes: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[str]:
    """``nodes`` in an order that respects ``edges``; it follows a chain while it can (the
    consumer of the node just placed goes next), else the earliest ready node of ``nodes``."""
    rank = {node: i for i, node in enumerate(nodes)}
    users: dict[str, list[str]] = {node: [] for node in nodes}
    waiting = dict.fromkeys(nodes, 0)
    for producer, consumer in dict.fromkeys(edges):
        if producer in rank and consumer in rank and producer != consumer:
            users[producer].append(consumer)
            waiting[consumer] += 1
    ready = {node for node in nodes if waiting[node] == 0}
    order: list[str] = []
    while ready:
        last = order[-1] if order else None
        follow = [u for u in users.get(last, ()) if u in ready] if last else []
        node = min(follow or ready, key=rank.__getitem__)
        ready.discard(node)
        order.append(node)
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.add(user)
    if len(order) != len(nodes):
        raise ValueError("the data edges between the plan's nodes have a cycle")
    return order


def cut(
    order: Sequence[str],
    support: Mapping[str, frozenset[str]],
    backends: Sequence[str],
    max_nodes: int = MAX_REGION_NODES,
    max_regions: int = MAX_REGIONS,
) -> list[Region]:
    """Regions of ``order``: cut where the places that can run the nodes change (``support``:
    backends, and ``PORTABLE``), runs longer than ``max_nodes`` cut evenly, then at most
    ``max_regions`` (smallest neighbours that can run somewhere together merged)."""
    runs: list[list[str]] = []
    for node in order:
        if runs and support[runs[-1][-1]] == support[node]:
            runs[-1].append(node)
        else:
            runs.append([node])
    pieces: list[list[str]] = []
    for run in runs:
        count = math.ceil(len(run) / max_nodes)
        size = math.ceil(len(run) / count)
        pieces += [run[i : i + size] for i in range(0, len(run), size)]
    places = [*backends, PORTABLE]

    def options(piece: Sequence[str]) -> tuple[str, ...]:
        return tuple(p for p in places if all(p in support[n] for n in piece))

    while len(pieces) > max_regions:
        # Merging two neighbours keeps an interval; it runs where both may.
        pairs = [j for j in range(len(pieces) - 1) if options(pieces[j] + pieces[j + 1])]
        if not pairs:
            break
        i = min(pairs, key=lambda j: len(pieces[j]) + len(pieces[j + 1]))
        pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
    return [Region(tuple(piece), options(piece)) for piece in pieces]


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


@attrs.frozen
class Costs:
    """What the layouts measured: each region's time per option, each backend's fixed cost of
    a delegate call, and what a switch from one place to another adds."""

    region_us: tuple[dict[str, float], ...]  # per region: option -> median us
    call_us: dict[str, float]  # per backend: its cheapest delegate call seen
    between_us: float  # the runtime's own time per switch, outside every call
    # (from, to) -> how much slower a call on ``to`` runs right after one on ``from``
    switch_us: dict[tuple[str, str], float] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "region_us": [{k: round(v, 2) for k, v in c.items()} for c in self.region_us],
            "call_us": {k: round(v, 2) for k, v in self.call_us.items()},
            "between_us": round(self.between_us, 2),
            "switch_us": {f"{a}->{b}": round(v, 2) for (a, b), v in self.switch_us.items()},
        }


def costs(
    regions: Sequence[Region],
    programs: Sequence[tuple[tuple[str, ...], Any, Sequence, Any]],
    hosted: bool = False,
) -> Costs:
    """Read ``Costs`` off the ``layouts`` programs: (assignment, plan, ``placement.unit_steps``
    of its trace, the ``ProgramTrace``).

    A delegate call counts as the region's own time where the call before it ran on portable
    kernels or the same backend (kernels are short and single-threaded); right after another
    backend's call it is slower by that pair's switch cost, the mean over such calls of how
    much slower than its regions' own times (the mean: a switch is slow only some of the
    time, when the threads of the call before still spin, and the program pays those times).
    A region's own time comes from a call (or kernels) that holds it alone, where every node
    of it ran on the option it was given. A call that holds several regions (the layout with
    each backend wherever it can) says what merging saves: the regions' own times, less the
    call's, per region beyond the first; that is the backend's fixed cost of a call, saved
    each time two regions become one call (without such a call, its cheapest call seen).

    ``hosted``: a call is its region's own time whatever ran before it. Every hosted call
    starts and ends on the host (a CUDA call copies its inputs in and its outputs out), so a
    switch costs nothing beyond the calls, and no layout alternates with portable kernels.
    """
    from composer.placement import units

    region_of = {node: i for i, region in enumerate(regions) for node in region.nodes}
    own: list[dict[str, list[float]]] = [{} for _ in regions]
    calls: dict[str, list[float]] = {}
    crossed: list[tuple[str, str, float, list[tuple[int, float]]]] = []  # after a switch
    merged: list[tuple[str, float, list[tuple[int, float]]]] = []  # calls of several regions
    between, switches = 0.0, 0
    for assignment, plan, steps, traced in programs:
        nodes_of = {unit.name: unit.nodes for unit in units(plan)}
        places = [where for _name, where, _latency in steps]
        between += traced.between_steps_us
        switches += sum(1 for a, b in itertools.pairwise(places) if a != b)
        as_given = [
            all(plan.node_backends.get(n) == option for n in region.nodes)
            for region, option in zip(regions, assignment)
        ]
        shares: dict[int, float] = {}
        clean: set[int] = set()
        timed: set[str] = set()
        for before, (name, where, latency) in zip(_befores(places), steps):
            if name is None:
                continue
            timed.add(name)
            held = [
                (region_of[n], 1 / len(nodes_of[name])) for n in nodes_of[name] if n in region_of
            ]
            if where != PORTABLE and before not in (PORTABLE, where) and not hosted:
                crossed.append((before, where, latency.median_us, held))
                continue
            if where != PORTABLE:
                calls.setdefault(where, []).append(latency.median_us)
            if len({index for index, _share in held}) > 1:
                merged.append((where, latency.median_us, held))
                continue
            for index, share in held:
                shares[index] = shares.get(index, 0.0) + latency.median_us * share
                clean.add(index)
        untimed = {region_of[n] for u, ns in nodes_of.items() if u not in timed for n in ns
                   if n in region_of}  # fmt: skip
        for index, option in enumerate(assignment):
            if as_given[index] and index in clean and index not in untimed:
                own[index].setdefault(option, []).append(shares[index])
    region_us = tuple({o: statistics.median(v) for o, v in r.items()} for r in own)
    slower: dict[tuple[str, str], list[float]] = {}
    for before, where, median_us, held in crossed:
        expected = _apart(regions, region_us, where, held)
        if expected is not None:
            slower.setdefault((before, where), []).append(median_us - expected)
    saved: dict[str, list[float]] = {}
    for where, median_us, held in merged:
        apart = _apart(regions, region_us, where, held)
        if apart is not None:
            count = len({index for index, _share in held})
            saved.setdefault(where, []).append((apart - median_us) / (count - 1))
    fixed = {backend: min(times) for backend, times in calls.items()}
    fixed.update({backend: max(0.0, statistics.median(v)) for backend, v in saved.items()})
    return Costs(
        _filled(regions, region_us, merged, fixed),
        fixed,
        between / switches if switches else 0.0,
        {pair: max(0.0, statistics.fmean(v)) for pair, v in slower.items()},
    )


def _filled(regions, region_us, merged, fixed) -> tuple[dict[str, float], ...]:
    """``region_us`` with the regions that never ran alone on a backend (both neighbours can
    run only there, as cnn's convolutions between max pools XNNPACK alone takes) estimated
    from a call that held them: its time and the calls it saved, less the other regions' own
    times, shared by node count."""
    guesses: list[dict[str, list[float]]] = [{} for _ in regions]
    for where, median_us, held in merged:
        counts = collections.Counter(index for index, _share in held)
        missing = [i for i in counts if where not in region_us[i]]
        if not missing:
            continue
        known = sum(region_us[i][where] * n / len(regions[i].nodes)
                    for i, n in counts.items() if i not in missing)  # fmt: skip
        left = max(0.0, median_us + (len(counts) - 1) * fixed.get(where, 0.0) - known)
        nodes = sum(counts[i] for i in missing)
        for i in missing:
            guesses[i].setdefault(where, []).append(left * counts[i] / nodes)
    return tuple(
        {**times, **{o: statistics.median(v) for o, v in guesses[i].items()}}
        for i, times in enumerate(region_us)
    )


def _apart(regions, region_us, where: str, held: list[tuple[int, float]]) -> float | None:
    """What the regions (or parts of regions) one call ``held`` cost as calls of their own on
    ``where``; ``None`` if one of them was not timed there alone."""
    if not held:
        return None
    counts = collections.Counter(index for index, _share in held)
    alone = [region_us[index].get(where) for index in counts]
    if None in alone:
        return None
    return sum(a * n / len(regions[i].nodes) for a, (i, n) in zip(alone, counts.items()))


def _befores(places: Sequence[str]) -> list[str]:
    """The place of the call before each call; the program runs in a loop, so the first call
    comes after the last one."""
    return [places[index - 1] for index in range(len(places))]


def on_backends(measured: Costs) -> Costs:
    """``measured`` without the portable option of the regions a backend takes. Hosted
    (``composer.aoti_host``), what lies outside the delegates runs as torch ops in Python:
    its time says nothing of the portable kernels the program would run them on (on the
    H100 machine, cumsum_mlp all in Python beat every backend, with no delegate at all)."""
    return attrs.evolve(
        measured,
        region_us=tuple(
            {o: t for o, t in times.items() if o != PORTABLE} or times
            for times in measured.region_us
        ),
    )


def choose(
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
    """What the search proposes: the cheapest assignment by ``choose``, its estimate, and a
    note when it is not that. Every region on one backend is that backend alone, which
    measured placement times whole anyway; the cheapest mix is proposed instead, since the
    estimate is a sum of parts (on the H100, bench/gpu_mix.py's 64-step RNN then a head with
    XNNPACK on 16 threads: CUDA everywhere estimated 731 us, the best mix 739; timed whole,
    the recurrence on XNNPACK and the head on CUDA ran in 534 us, CUDA alone in 626)."""
    chosen = choose(regions, measured)
    if chosen is None:
        return None
    assignment, estimate = chosen
    single = set(assignment)
    if len(single) > 1 or PORTABLE in single:
        return assignment, estimate, None
    mix = choose(regions, measured, mixed=True)
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
    ``placement.Candidate`` with node pins) and what was found, for the plan; the candidate is
    ``None`` when there is nothing to choose or the search could not finish. ``hosted``: the
    layouts run as the whole-program candidates do with CUDA in the stack on a GPU
    (``composer.aoti_host``), each call timed there (``composer.hosted_trace``), not in the
    runtime under ETDump."""
    from composer import hosted_trace, latency
    from composer.aoti_host import program_runner
    from composer.errors import ComposerError
    from composer.placement import Candidate, unit_steps

    say = progress or (lambda line: None)
    backends = list(backends)
    notes: list[str] = []
    found: dict[str, Any] = {"notes": notes}
    say(f"placement: regions: what each backend takes ({len(backends)} plans, each backend first)")
    try:
        first = {
            backend: plan_candidate(Candidate((*backends[i:], *backends[:i]), "strict"))
            for i, backend in enumerate(backends)
        }
    except ComposerError as error:
        notes.append(f"not searched: a plan failed: {_first_line(error)}")
        return None, found
    support = survey(first)
    if support is None:
        notes.append("not searched: the orders of the stack decompose the model differently")
        return None, found
    declared = first[backends[0]]
    try:
        order = topological_order(list(declared.node_ops), declared.edges)
    except ValueError as error:  # the plan's edges are a DAG; this guards the search only
        notes.append(f"not searched: {error}")
        return None, found
    found["max_regions"] = HOSTED_MAX_REGIONS if hosted else MAX_REGIONS
    regions = cut(order, support, backends, max_regions=found["max_regions"])
    found["regions"] = [r.to_dict() for r in regions]
    if len(regions) < 2 or all(len(r.options) == 1 for r in regions):
        notes.append("nothing to choose per region: the whole-program candidates cover it")
        return None, found
    plans = layouts(regions, backends, hosted)
    composed = []
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
            notes.append(f"{what}: not composed: {_first_line(error)}")
            continue
        if not hosted:
            runnable, why = composition.runtime_can_run()
            if not runnable:
                notes.append(f"not searched: {why}")
                return None, found
        try:  # once, alone: one program the runtime fails (an OpenVINO delegate did, on
            # llama_block) must not stop the others' tracing
            runner = program_runner(composition, hosted)
            runner.run(inputs)
        except (ComposerError, RuntimeError) as error:
            notes.append(f"{what}: does not run: {_first_line(error)}")
            continue
        composed.append((what, assignment, composition, runner))
    how = hosted_trace.HostedTrace.timer if hosted else latency.ProgramTrace.timer
    found["timer"] = how
    say(f"placement: regions: tracing {len(composed)} programs together, {trace_runs} runs each "
        f"({how})")  # fmt: skip
    try:
        if hosted:
            runners = {what: runner for what, _a, _c, runner in composed}
            traces = hosted_trace.trace_together(runners, inputs, trace_runs)
        else:
            buffers = {what: c.buffer for what, _a, c, _r in composed}
            traces = latency.trace_together(buffers, inputs, trace_runs)
    except (ComposerError, RuntimeError) as error:
        notes.append(f"not traced: {_first_line(error)}")
        return None, found
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
    found.update(measured.to_dict())
    proposed = proposal(regions, measured)
    if proposed is None:
        notes.append("no choice: a region was measured on no option")
        return None, found
    assignment, estimate, why = proposed
    if why is not None:
        notes.append(why)
    found["chosen"] = list(assignment)
    found["estimated_us"] = round(estimate, 2)
    counts = ", ".join(f"{o} x{assignment.count(o)}" for o in dict.fromkeys(assignment))
    say(f"placement: regions: chose {counts} by dynamic programming, estimated {estimate:.1f} us")
    candidate = _pinned(backends, pins(regions, assignment, backends, support))
    if not candidate.pins:
        notes.append("the per-region choice is the declared order, strict")
        return None, found
    return candidate, found


def _pinned(backends: Sequence[str], table: Mapping[str, Sequence[str]]):
    from composer.placement import Candidate

    return Candidate(tuple(backends), "strict", tuple((b, tuple(p)) for b, p in table.items()))


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
