"""Hypothesis strategies for random models and random backend stacks.

    import composer
    from hypothesis import given
    from composer.models.strategies import models, stacks
    from composer.testing import check_convex

    @given(model=models(), stack=stacks(["tensorrt_stub", "xnnpack"]))
    def test_composes(model, stack):
        try:
            composition = composer.compose(model, stack, model.example_inputs)
        except composer.PartitionError:
            raise  # composer refusing its own partitions is a bug in composer, not an answer
        except composer.ComposerError:
            return  # a clear error about the model or a backend
        check_convex(composition.plan, composition.edge)
        assert composition.verify().ok

A drawn model is a ``RandomModel``: an ``nn.Module`` that runs a random DAG over a list of ops
(with fan-in and fan-out), and its example inputs as ``model.example_inputs``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from torch import nn

# Ops on one or two same-shaped tensors. cumsum is the op no shipped backend takes.
UNARY = ("relu", "tanh", "sigmoid", "neg", "cumsum", "linear", "softmax", "exp")
BINARY = ("add", "mul", "sub")


class RandomModel(nn.Module):
    """Runs ``steps``: each (op, input indices) reads earlier values and appends its output."""

    def __init__(
        self, steps: Sequence[tuple[str, tuple[int, ...]]], shape: tuple[int, int], inputs: int
    ) -> None:
        super().__init__()
        self.steps = list(steps)
        self.inputs = inputs
        features = shape[-1]
        self.linears = nn.ModuleList(
            nn.Linear(features, features) for op, _ in self.steps if op == "linear"
        )
        generator = torch.Generator().manual_seed(len(self.steps) * 7919 + features)
        self.example_inputs = tuple(torch.randn(*shape, generator=generator) for _ in range(inputs))
        for parameter in self.parameters():
            with torch.no_grad():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)

    def forward(self, *inputs):
        values = list(inputs)
        used = set()
        linears = iter(self.linears)
        for op, args in self.steps:
            operands = [values[i] for i in args]
            used.update(args)
            if op in BINARY:
                result = getattr(torch, op)(operands[0], operands[1])
            elif op == "linear":
                result = next(linears)(operands[0])
            elif op == "cumsum":
                result = torch.cumsum(operands[0], dim=-1)
            elif op == "softmax":
                result = torch.softmax(operands[0], dim=-1)
            elif op == "exp":
                result = torch.exp(operands[0].clamp(max=4))
            else:
                result = getattr(torch, op)(operands[0])
            values.append(result)
        # Every value nobody read is an output, so no op is dead code.
        outputs = [v for i, v in enumerate(values) if i >= self.inputs and i not in used]
        return tuple(outputs) if len(outputs) > 1 else outputs[0]

    def __repr__(self) -> str:
        return f"RandomModel(steps={self.steps}, shape={tuple(self.example_inputs[0].shape)})"


@st.composite
def models(draw, max_steps: int = 12, ops: Sequence[str] = UNARY + BINARY) -> RandomModel:
    """A random DAG model: 1-2 inputs, up to ``max_steps`` ops, shapes within small limits."""
    inputs = draw(st.integers(1, 2))
    shape = (draw(st.integers(1, 4)), draw(st.integers(2, 12)))
    steps = []
    for index in range(draw(st.integers(1, max_steps))):
        available = inputs + index
        op = draw(st.sampled_from(list(ops)))
        arity = 2 if op in BINARY else 1
        # Prefer recent values (chains) but reach back for fan-out and skip connections.
        args = tuple(
            draw(st.integers(max(0, available - 4), available - 1) | st.integers(0, available - 1))
            for _ in range(arity)
        )
        steps.append((op, args))
    return RandomModel(steps, shape, inputs)


def stacks(backends: Sequence[str], min_size: int = 1) -> st.SearchStrategy[list[str]]:
    """A random priority list: some of ``backends``, each at most once, in random order."""
    return st.lists(
        st.sampled_from(list(backends)), min_size=min_size, max_size=len(backends), unique=True
    )
