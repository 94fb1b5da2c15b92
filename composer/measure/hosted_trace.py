"""Per-call times of programs run hosted (:mod:`composer.run.piecewise`), where ETDump sees nothing.

The hosted executor runs a composed program's graph in Python: each delegate is one module
call (a CUDA delegate's compiled ``.so``, another backend's delegate in an ExecuTorch
runtime), and what lies between the delegates runs as torch ops. Timing each of those calls
gives what ``composer.measure.latency.trace`` gives for the runtime: every call of the program in
order, matched with the plan's partitions and portable nodes, so that the per-region search
and the plan's per-partition times work on a GPU machine too.

A CUDA delegate's call copies its outputs back to the host, which waits for the GPU: its time
includes the GPU's work and both copies.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.fx

from composer.measure.latency import BLOCK, Latency, runs_each
from composer.scheduler.plans import PORTABLE, partition_of


@attrs.frozen
class HostedTrace:
    """A hosted program's calls in the order they ran: (plan unit or ``None``, where it ran,
    its time), and the whole call, timed the way the candidates are."""

    steps: tuple[tuple[str | None, str, Latency], ...]
    execute: Latency
    timer = "hosted, each call timed in Python"  # what the plan says timed it

    @property
    def between_steps_us(self) -> float:
        """The median call's time outside every timed step: Python's own work."""
        return max(0.0, self.execute.median_us - sum(s[2].median_us for s in self.steps))


class _StepTimer(torch.fx.Interpreter):
    """Runs a hosted module node by node, timing each module and function call."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.seconds: dict[str, list[float]] = {}

    def run_node(self, node: torch.fx.Node) -> Any:
        if node.op not in ("call_module", "call_function") or node.target is operator.getitem:
            return super().run_node(node)
        started = time.perf_counter()
        result = super().run_node(node)
        self.seconds.setdefault(node.name, []).append(time.perf_counter() - started)
        return result


def trace_together(
    programs: Mapping[str, Any],
    inputs: Sequence[Any],
    runs: int | Mapping[str, int],
    block: int = BLOCK,
) -> dict[str, HostedTrace]:
    """Time every call of each ``HostedProgram`` in ``programs``, ``runs`` times (or its own
    number of runs), the programs taking turns in blocks of calls (as
    ``composer.measure.latency.interleaved`` does). The whole call is timed apart, as a plain
    call of the module, so that the interpreter's own cost per node does not count as time
    between the steps."""
    timers = {key: _StepTimer(program.module) for key, program in programs.items()}
    calls = {key: program.timed_call(inputs) for key, program in programs.items()}
    whole: dict[str, list[float]] = {key: [] for key in programs}
    wanted = runs_each(runs, programs)
    arguments = tuple(inputs)
    with torch.no_grad():
        while any(len(whole[key]) < wanted[key] for key in programs):
            for key in programs:
                count = min(block, wanted[key] - len(whole[key]))
                for _ in range(count):
                    timers[key].run(*arguments)
                for _ in range(count):
                    started = time.perf_counter()
                    calls[key]()
                    whole[key].append(time.perf_counter() - started)
    return {
        key: HostedTrace(tuple(_steps(program, timers[key].seconds)), Latency.of(whole[key]))
        for key, program in programs.items()
    }


def _steps(program, seconds: Mapping[str, list[float]]) -> list[tuple[str | None, str, Latency]]:
    """The timed calls of ``program`` (a ``HostedProgram``) matched with its plan: a delegate
    call with the partition whose nodes its lowered module holds, a torch op with the plan's
    portable node of that name; anything else belongs to no unit (name ``None``)."""

    composition = program.composition
    plan = composition.plan
    portable = set(plan.nodes_on(PORTABLE))
    backends = {p.id: p.backend for p in plan.partitions}
    found: list[tuple[str | None, str, Latency]] = []
    for node in program.module.graph.nodes:
        if node.name not in seconds:
            continue
        latency = Latency.of(seconds[node.name])
        lowered = node.meta.get("lowered_module")
        if lowered is not None:
            module = getattr(composition.reference, lowered)
            inside = {n.name for n in module.original_module.graph.nodes}
            unit = partition_of(plan, inside)
            where = backends[unit] if unit else module.backend_id
            found.append((unit, where, latency))
        elif node.name in portable:
            found.append((node.name, PORTABLE, latency))
        else:
            found.append((None, PORTABLE, latency))
    return found
