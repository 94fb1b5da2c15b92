"""Fewer delegate calls and device crossings than plain priority order, same outputs."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch

import composer
from composer import zoo
from composer.scheduler.consolidate import islands_to_move


def test_island_between_partitions_of_one_backend_goes_to_it():
    owner = {"a": "gpu", "b": "cpu", "c": "gpu", "d": "portable"}
    edges = [("a", "b"), ("b", "c"), ("c", "d")]
    assert islands_to_move(owner, {"gpu": {"a", "b", "c"}, "cpu": {"b"}}, edges) == {"b": "gpu"}
    # Not when the surrounding backend cannot take it, nor when it has two neighbours.
    assert islands_to_move(owner, {"gpu": {"a", "c"}, "cpu": {"b"}}, edges) == {}
    owner["c"] = "dsp"
    assert islands_to_move(owner, {"gpu": {"a", "b"}, "dsp": {"b", "c"}}, edges) == {}


def test_large_islands_keep_their_backend():
    owner = {"a": "gpu", **{f"x{i}": "cpu" for i in range(9)}, "z": "gpu"}
    chain = ["a", *(f"x{i}" for i in range(9)), "z"]
    edges = list(itertools.pairwise(chain))
    assert islands_to_move(owner, {"gpu": set(owner)}, edges) == {}


def planned(monkeypatch, model, stack, inputs, **settings):
    """``composer.plan``, and what the program it lowered to stand-ins computes.

    Each stand-in delegate runs the subgraph it was made from, so this checks the wiring of
    the partitions consolidation moved, on any machine (the cuda stacks cannot lower here).
    """
    compose_module = importlib.import_module("composer.compose")
    lowered = []
    lower_stack = compose_module.lower_stack

    def keep_program(*args, **kwargs):
        edge, plan = lower_stack(*args, **kwargs)
        lowered.append(edge)
        return edge, plan

    monkeypatch.setattr(compose_module, "lower_stack", keep_program)
    plan = composer.plan(model, stack, inputs, **settings)
    with torch.no_grad():
        return plan, lowered[-1].exported_program().module()(*inputs)


@pytest.mark.parametrize(
    ("name", "stack"),
    [
        ("transformer_block", ["xnnpack", "tensorrt_stub"]),
        ("llama_block", ["xnnpack", "tensorrt_stub"]),
        ("gru", ["xnnpack", "tensorrt_stub"]),
        ("transformer_block", ["xnnpack", "cuda"]),
        ("llama_decoder", ["xnnpack", "cuda"]),
    ],
)
def test_zoo_models_get_fewer_calls_and_crossings_with_the_same_outputs(monkeypatch, name, stack):
    model, inputs = zoo.load(name)
    with torch.no_grad():
        expected = model(*inputs)
    plain, plain_outputs = planned(monkeypatch, model, stack, inputs, consolidate=False)
    consolidated, outputs = planned(monkeypatch, model, stack, inputs)
    assert consolidated.delegate_calls < plain.delegate_calls
    assert consolidated.crossings <= plain.crossings
    moved = [
        node
        for node, answers in consolidated.decisions.items()
        if any(answer.startswith("left to ") for _, answer in answers)
    ]
    assert moved, "the plan says which nodes were handed over and why"
    torch.testing.assert_close(plain_outputs, expected)
    torch.testing.assert_close(outputs, expected)
    if "cuda" not in stack:
        result = composer.compose(model, stack, inputs).verify()
        assert result.ok, result
