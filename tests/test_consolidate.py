"""Fewer delegate calls and device crossings than plain priority order, same outputs."""

from __future__ import annotations

import itertools

import pytest
import torch

import composer
from composer.models import zoo
from composer.scheduler.consolidate import islands_to_move
from composer.testing import _lowered_with_stand_ins

DEVICES = {"gpu": "cuda", "dsp": "cuda", "cpu": "cpu", "cpu2": "cpu"}


def test_host_island_between_accelerator_partitions_goes_to_the_accelerator():
    owner = {"a": "gpu", "b": "cpu", "c": "gpu", "d": "portable"}
    edges = [("a", "b"), ("b", "c"), ("c", "d")]
    supported = {"gpu": {"a", "b", "c"}, "cpu": {"b"}}
    assert islands_to_move(owner, supported, edges, DEVICES) == {"b": "gpu"}
    # Not when the surrounding backend cannot take it, nor when it has two neighbours.
    assert islands_to_move(owner, {"gpu": {"a", "c"}, "cpu": {"b"}}, edges, DEVICES) == {}
    owner["c"] = "dsp"
    assert islands_to_move(owner, {"gpu": {"a", "b"}, "dsp": {"b", "c"}}, edges, DEVICES) == {}


def test_islands_stay_where_no_device_round_trip_is_saved():
    edges = [("a", "b"), ("b", "c")]
    # Both backends on the host: the declared order stands.
    owner = {"a": "cpu2", "b": "cpu", "c": "cpu2"}
    assert islands_to_move(owner, {"cpu2": {"a", "b", "c"}, "cpu": {"b"}}, edges, DEVICES) == {}
    # An accelerator island between host partitions stays on the accelerator.
    owner = {"a": "cpu", "b": "gpu", "c": "cpu"}
    assert islands_to_move(owner, {"cpu": {"a", "b", "c"}, "gpu": {"b"}}, edges, DEVICES) == {}
    # One accelerator op between host ops (host -> gpu -> host): the host ops make no trip
    # off the accelerator, so they keep their backend.
    owner = {"a": "cpu", "b": "gpu", "c": "cpu"}
    supported = {"gpu": {"a", "b", "c"}, "cpu": {"a", "c"}}
    assert islands_to_move(owner, supported, [("a", "b"), ("b", "c"), ("a", "c")], DEVICES) == {}


def test_large_islands_keep_their_backend():
    owner = {"a": "gpu", **{f"x{i}": "cpu" for i in range(9)}, "z": "gpu"}
    chain = ["a", *(f"x{i}" for i in range(9)), "z"]
    edges = list(itertools.pairwise(chain))
    assert islands_to_move(owner, {"gpu": set(owner)}, edges, DEVICES) == {}


def test_two_cpu_backends_keep_the_declared_order():
    # Issue: with [openvino, xnnpack] the old rule handed all of openvino's islands to xnnpack.
    model, inputs = zoo.load("transformer_block")
    strict = composer.plan(model, ["openvino", "xnnpack"], inputs, consolidate=False)
    default = composer.plan(model, ["openvino", "xnnpack"], inputs)
    assert default.node_backends == strict.node_backends
    assert default.nodes_on("openvino")


def test_cumsum_mlp_on_xnnpack_cuda_keeps_xnnpack_around_one_cuda_partition():
    model, inputs = zoo.load("cumsum_mlp")
    plan = composer.plan(model, ["xnnpack", "cuda"], inputs)
    assert len(plan.partitions_of("cuda")) == 1
    assert len(plan.nodes_on("xnnpack")) == 4
    assert not any(
        answer.startswith("left to ")
        for answers in plan.decisions.values()
        for _, answer in answers
    )


def planned(model, stack, inputs, **settings):
    """``composer.plan``'s plan, and what the program it lowers to stand-ins computes (both
    from one lowering, as ``composer.plan`` makes them).

    Each stand-in delegate runs the subgraph it was made from, so this checks the wiring of
    the partitions consolidation moved, on any machine (the cuda stacks cannot lower here).
    """
    lowered, plan = _lowered_with_stand_ins(model, stack, inputs, settings)
    with torch.no_grad():
        return plan, lowered.exported_program().module()(*inputs)


@pytest.mark.parametrize(
    ("name", "stack"),
    [
        ("transformer_block", ["xnnpack", "tensorrt_stub"]),
        ("llama_block", ["xnnpack", "tensorrt_stub"]),
        ("gru", ["xnnpack", "tensorrt_stub"]),
        ("transformer_block", ["xnnpack", "cuda"]),
        # CI time (70 s): the slow suite's.
        pytest.param("llama_decoder", ["xnnpack", "cuda"], marks=pytest.mark.slow),
    ],
)
def test_zoo_models_get_fewer_calls_and_crossings_with_the_same_outputs(name, stack):
    model, inputs = zoo.load(name)
    with torch.no_grad():
        expected = model(*inputs)
    plain, plain_outputs = planned(model, stack, inputs, consolidate=False)
    consolidated, outputs = planned(model, stack, inputs)
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


def test_placement_strict_is_plain_priority_order_everywhere(tmp_path, capsys, monkeypatch):
    from composer.cli import main

    model, inputs = zoo.load("transformer_block")
    strict = composer.plan(model, ["xnnpack", "tensorrt_stub"], inputs, placement="strict")
    old = composer.plan(model, ["xnnpack", "tensorrt_stub"], inputs, consolidate=False)
    default = composer.plan(model, ["xnnpack", "tensorrt_stub"], inputs)
    assert strict.node_backends == old.node_backends != default.node_backends
    with pytest.raises(composer.ComposerError, match="placement must be one of priority, strict"):
        composer.plan(model, ["xnnpack"], inputs, placement="fastest")
    argv = ["plan", "zoo:transformer_block", "--backends", "xnnpack,tensorrt_stub"]
    assert main([*argv, "--placement", "strict"]) == 0
    from_flag = capsys.readouterr().out
    assert f"delegate calls: {strict.delegate_calls} " in from_flag
    monkeypatch.chdir(tmp_path)
    (tmp_path / "composer.toml").write_text('placement = "strict"\n')
    assert main(argv) == 0
    assert capsys.readouterr().out == from_flag
    (tmp_path / "composer.toml").write_text('placement = "priority"\nconsolidate = false\n')
    assert main(argv) == 2
    assert "contradict each other" in capsys.readouterr().err
