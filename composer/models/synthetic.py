"""Synthetic fx graphs of chosen shapes, for partitioner benchmarks and property tests.

Nodes are ``call_function`` nodes over torch functions; ``torch.cumsum`` plays the op no
backend supports, so ``island_every=k`` makes every k-th op an unsupported island.
"""

from __future__ import annotations

import random

import torch
import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase

UNSUPPORTED = torch.cumsum
_SUPPORTED = (torch.relu, torch.tanh, torch.sigmoid, torch.neg)


class AllButCumsum(OperatorSupportBase):
    """Every ``call_function`` node except ``torch.cumsum``."""

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target is not UNSUPPORTED


class _Builder:
    def __init__(self, island_every: int | None) -> None:
        self.graph = torch.fx.Graph()
        self.island_every = island_every
        self.count = 0

    def unary(self, value: torch.fx.Node) -> torch.fx.Node:
        self.count += 1
        if self.island_every and self.count % self.island_every == 0:
            return self.graph.call_function(UNSUPPORTED, (value, 0))
        return self.graph.call_function(_SUPPORTED[self.count % len(_SUPPORTED)], (value,))

    def add(self, a: torch.fx.Node, b: torch.fx.Node) -> torch.fx.Node:
        self.count += 1
        return self.graph.call_function(torch.add, (a, b))

    def finish(self, *outputs: torch.fx.Node) -> torch.fx.GraphModule:
        self.graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        return torch.fx.GraphModule(torch.nn.Module(), self.graph)


def chain_with_residuals(nodes: int, island_every: int | None = None) -> torch.fx.GraphModule:
    """A chain where every third op adds back the value from three ops earlier."""
    builder = _Builder(island_every)
    value = builder.graph.placeholder("x")
    history = [value]
    while builder.count < nodes:
        value = builder.unary(value)
        history.append(value)
        if len(history) % 3 == 0:
            value = builder.add(value, history[-3])
            history.append(value)
    return builder.finish(value)


def wide_branching(
    nodes: int, width: int = 8, island_every: int | None = None
) -> torch.fx.GraphModule:
    """Layers that fan out into ``width`` parallel short branches and sum them back."""
    builder = _Builder(island_every)
    value = builder.graph.placeholder("x")
    while builder.count < nodes:
        branches = [builder.unary(builder.unary(value)) for _ in range(width)]
        total = branches[0]
        for branch in branches[1:]:
            total = builder.add(total, branch)
        value = total
    return builder.finish(value)


def transformer_like(nodes: int, island_every: int | None = None) -> torch.fx.GraphModule:
    """Blocks of three parallel projections, a mixing step, an MLP and two residuals."""
    builder = _Builder(island_every)
    value = builder.graph.placeholder("x")
    while builder.count < nodes:
        q, k, v = (builder.unary(value) for _ in range(3))
        mixed = builder.unary(builder.add(builder.add(q, k), v))
        value = builder.add(value, builder.unary(mixed))
        hidden = builder.unary(builder.unary(value))
        value = builder.add(value, builder.unary(hidden))
    return builder.finish(value)


def random_dag(
    nodes: int, seed: int, unsupported_fraction: float = 0.2, max_fan_in: int = 3
) -> torch.fx.GraphModule:
    """A random DAG: each node reads 1..max_fan_in earlier values; some are unsupported."""
    rng = random.Random(seed)
    graph = torch.fx.Graph()
    values = [graph.placeholder("x"), graph.placeholder("y")]
    for _ in range(nodes):
        fan_in = rng.randint(1, max_fan_in)
        args = [values[rng.randrange(len(values))] for _ in range(fan_in)]
        value = args[0]
        if rng.random() < unsupported_fraction:
            value = graph.call_function(UNSUPPORTED, (value, 0))
        else:
            value = graph.call_function(_SUPPORTED[rng.randrange(len(_SUPPORTED))], (value,))
        for other in args[1:]:
            value = graph.call_function(torch.add, (value, other))
        values.append(value)
    used = {user for value in values for user in value.users}
    sinks = [v for v in values[2:] if v not in used] or values[-1:]
    graph.output(tuple(sinks))
    return torch.fx.GraphModule(torch.nn.Module(), graph)
