"""The chosen program's calls matched with its plan: each partition's (or portable node's)
traced time, and what the same nodes cost where another candidate ran them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from composer.measure.candidates import Candidate
from composer.measure.etdump import ProgramTrace
from composer.measure.hosted_trace import HostedTrace
from composer.measure.latency import Latency
from composer.scheduler.measured_placement import TimedAlternative, TimedPartition, TracedCall
from composer.scheduler.plans import PORTABLE, partition_of


@attrs.frozen
class _Unit:
    """A partition of a candidate's plan, or one node of it left to portable kernels."""

    name: str
    backend: str
    nodes: frozenset[str]


def units(plan) -> list[_Unit]:
    """The partitions of ``plan``, then each node it leaves to portable kernels."""

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
    ``composer.measure.hosted_trace.HostedTrace``, which is matched with the plan as it is timed.

    The program's graph lists its calls in the order its instructions run them: a delegate
    call's lowered module keeps the names of the plan nodes it holds. Kernels are matched with
    the plan's portable nodes by order and op, not by name: ``to_executorch`` renames nodes
    (mobilenet's third convolution, on portable kernels, became ``aten_convolution_default``,
    the name of the plan's first, which XNNPACK ran). A kernel that is no plan node (a copy
    ``to_executorch`` inserted) belongs to no unit (name ``None``). Empty when the graph and
    the instructions disagree: better no times than wrong ones.
    """
    from executorch.exir import memory

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
) -> tuple[tuple[TimedPartition, ...], TracedCall | None]:
    """The chosen program's partitions with their traced times, and for each the same nodes as
    other candidates ran them: on another backend, or on portable kernels; then the chosen
    program's call as traced (``None``: it was not)."""
    if chosen not in traces:
        return (), None
    timed = {c: unit_latencies(composed[c], t) for c, t in traces.items()}
    others = [
        (c.label, units(composed[c].plan), timed[c])
        for c in traces
        if c != chosen and composed[c].buffer != composed[chosen].buffer
    ]
    found = tuple(
        TimedPartition(
            unit.name,
            unit.backend,
            len(unit.nodes),
            round(timed[chosen][unit.name].median_us, 2),
            round(timed[chosen][unit.name].p90_us, 2),
            tuple(a.record() for a in _alternatives(unit, others)),
        )
        for unit in units(composed[chosen].plan)
        if unit.name in timed[chosen]
    )
    whole = traces[chosen]
    traced = TracedCall(
        round(whole.execute.median_us, 2),
        round(whole.between_steps_us, 2),
        whole.execute.runs,
        whole.timer,
    )
    return found, traced


@attrs.frozen
class _Alternative:
    """The same nodes as a partition of the chosen program, run elsewhere by another candidate."""

    backend: str  # a backend, or "portable" for ExecuTorch's portable kernels
    candidate: str  # the candidate's label
    latency: Latency
    extra_nodes: int = 0  # nodes that candidate's partition runs beyond these (0: the same)

    def record(self) -> TimedAlternative:
        """As the plan records it, times to 0.01 us."""
        return TimedAlternative(
            self.backend,
            self.candidate,
            round(self.latency.median_us, 2),
            round(self.latency.p90_us, 2),
            self.extra_nodes,
        )


def _alternatives(unit: _Unit, others) -> tuple[_Alternative, ...]:
    """Per other backend, the closest match for ``unit``'s nodes among the other candidates:
    a partition holding them all (fewest extra nodes first), or all of them on portable."""

    best: dict[str, _Alternative] = {}
    for label, their_units, their_times in others:
        options = [
            _Alternative(
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
            options.append(_Alternative(PORTABLE, label, total))
        for option in options:
            kept = best.get(option.backend)
            rank = (option.extra_nodes, option.latency.median_us)
            if kept is None or rank < (kept.extra_nodes, kept.latency.median_us):
                best[option.backend] = option
    return tuple(best.values())
