"""The shipped stacks over the built-in models, each checked against eager."""

from __future__ import annotations

import attrs
import pytest
import torch

import composer
from composer.lower.priority import lower_in_order
from composer.models import zoo
from composer.registry.discovery import default_registry
from composer.registry.resolved import resolve_stack
from composer.registry.stack import Stack
from composer.report.plan_text import summary_table

STACKS = [
    ["tensorrt_stub", "xnnpack"],
    ["xnnpack", "tensorrt_stub"],
    ["xnnpack"],
    ["tensorrt_stub"],
]
MODELS = ["mlp", "cnn", "transformer_block", "cumsum_mlp"]


@pytest.mark.parametrize("stack", STACKS, ids=",".join)
@pytest.mark.parametrize("model_name", MODELS)
def test_stack_matches_eager(model_name, stack):
    model, inputs = zoo.load(model_name)
    composition = composer.compose(model, stack, inputs)
    plan = composition.plan

    assert composition.buffer[4:8] == b"ET12", "an ExecuTorch flatbuffer program"
    assert plan.delegate_calls == len(plan.partitions) > 0
    assert set(plan.node_backends.values()) <= {*stack, "portable"}
    result = composition.verify()
    assert result.ok, result
    if not plan.partitions_of("tensorrt_stub"):
        assert result.executor == "executorch runtime"
    else:
        assert result.executor == "python reference"
        assert "TensorRTStubBackend" in result.reason


@pytest.mark.parametrize("model_name", MODELS)
def test_plan_is_the_composed_plan(model_name):
    model, inputs = zoo.load(model_name)
    planned = composer.plan(model, ["tensorrt_stub", "xnnpack"], inputs)
    composed = composer.compose(model, ["tensorrt_stub", "xnnpack"], inputs).plan
    # Only the compose ran something (here: it could not, the runtime has no TensorRT).
    assert composed.proof == "not run here: the runtime has no TensorRTStubBackend"
    assert planned.to_json() == attrs.evolve(composed, proof="").to_json()


def test_cumsum_falls_back_to_portable_with_reasons():
    model, inputs = zoo.load("cumsum_mlp")
    plan = composer.plan(model, "tensorrt_stub,xnnpack", inputs)
    assert plan.nodes_on("portable") == ["aten_cumsum_default"]
    (fallback,) = plan.fallbacks
    assert dict(fallback.reasons) == {
        "tensorrt_stub": "unsupported op",
        "xnnpack": "not tagged by XnnpackPartitioner",
    }
    assert "fallback aten_cumsum_default (aten.cumsum.default)" in summary_table(plan)


def test_tensorrt_stub_then_xnnpack_counts_device_crossings():
    model, inputs = zoo.load("cumsum_mlp")
    plan = composer.plan(model, ["tensorrt_stub", "xnnpack"], inputs)
    # x -> trt; trt -> cumsum (host); cumsum -> trt; trt -> output.
    assert [p.device for p in plan.partitions] == ["cuda", "cuda"]
    assert plan.crossings == 4


def test_plan_json_has_stable_keys():
    import json

    model, inputs = zoo.load("mlp")
    data = json.loads(composer.plan(model, ["xnnpack"], inputs).to_json())
    assert list(data) == [
        "backends",
        "stand_ins",
        "summary",
        "delegate_calls",
        "crossings",
        "duplicated_constant_bytes",
        "partitions",
        "fallbacks",
        "nodes",
        "edges",
        "libraries",
        "tolerances",
        "placement",
        "proof",
        "repairs",
        "dynamic_dims",
        "quantization",
    ]
    assert data["summary"]["xnnpack"]["partitions"] == 1
    assert (data["proof"], data["repairs"]) == ("", [])  # a plan runs nothing


def test_tensorrt_stub_blob_describes_its_subgraph():
    import json

    from executorch.exir._serialize._program import deserialize_pte_binary

    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, ["tensorrt_stub"], inputs)
    program = deserialize_pte_binary(composition.buffer).program
    (delegate,) = program.execution_plan[0].delegates
    assert delegate.id == "TensorRTStubBackend"
    blob = json.loads(program.backend_delegate_data[delegate.processed.index].data)
    assert blob["format"] == "composer.tensorrt_stub/1"
    assert blob["inputs"] == [{"shape": [4, 16], "dtype": "float32"}]
    assert blob["outputs"] == [{"shape": [4, 8], "dtype": "float32"}]
    assert blob["ops"].count("aten.addmm.default") == 3


def test_ops_an_earlier_backend_keeps_whole_stay_whole_for_later_backends():
    """Plain ExecuTorch re-decomposes XNNPACK's aten.linear when another partitioner follows."""
    model, inputs = zoo.load("transformer_block")
    alone = composer.plan(model, ["xnnpack"], inputs)
    stacked = composer.compose(model, ["xnnpack", "tensorrt_stub"], inputs, consolidate=False)
    assert alone.ops_on("xnnpack")["aten.linear.default"] == 4
    assert stacked.plan.ops_on("xnnpack")["aten.linear.default"] == 4
    assert stacked.plan.partitions_of("tensorrt_stub")
    assert stacked.verify().ok


def test_plan_says_where_each_node_runs_and_which_edges_cross_devices():
    model, inputs = zoo.load("transformer_block")
    plan = composer.plan(model, ["xnnpack", "tensorrt_stub"], inputs, placement="strict")
    trt = plan.partitions_of("tensorrt_stub")[0].nodes[0]
    assert plan.device_of(trt) == "cuda" == plan.device_of_backend("tensorrt_stub")
    assert plan.device_of(plan.nodes_on("xnnpack")[0]) == "cpu"
    assert (
        plan.device_of(plan.nodes_on("portable")[0]) == "cpu" == plan.device_of_backend("portable")
    )
    crossing = plan.crossing_edges()
    assert crossing and all(plan.device_of(a) != plan.device_of(b) for a, b in crossing)
    assert set(crossing) < set(plan.edges)
    cpu_only = composer.plan(model, ["xnnpack"], inputs)
    assert cpu_only.crossing_edges() == []


@pytest.mark.parametrize(
    ("stack", "consolidate", "runs"),
    [
        (["xnnpack"], True, 1),
        (["xnnpack", "tensorrt_stub"], True, 1),
        # Listed second, XNNPACK is asked once for the assignment, on the program before any
        # lowering, and once on the program it lowers, which holds the earlier delegates.
        (["tensorrt_stub", "xnnpack"], True, 2),
        (["tensorrt_stub", "xnnpack"], False, 1),
    ],
    ids=["alone", "first", "second", "second-no-consolidation"],
)
def test_a_native_partitioner_runs_once_per_program_it_is_asked_about(
    monkeypatch, stack, consolidate, runs
):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    calls = []
    partition = XnnpackPartitioner.partition

    def counted(self, exported_program):
        calls.append(exported_program)
        return partition(self, exported_program)

    monkeypatch.setattr(XnnpackPartitioner, "partition", counted)
    placement = "priority" if consolidate else "strict"
    plan = lowered_plan("llama_block", Stack(stack, placement=placement))
    assert plan.partitions_of("xnnpack")
    assert len(calls) == runs


def lowered_plan(model_name, stack: Stack):
    """The plan of ``lower_in_order`` itself, every backend a stand-in: no cache, no placement."""
    model, inputs = zoo.load(model_name)
    program = torch.export.export(model, inputs, strict=False)
    resolved = resolve_stack(stack, default_registry(), must_lower_here=False)
    return lower_in_order(program, resolved.planned())[1]


def test_plan_edges_include_those_inside_a_delegate():
    plan = lowered_plan("mlp", Stack(["xnnpack"]))
    assert plan.delegate_calls == 1
    assert ("aten_linear_default", "aten_relu_default") in plan.edges
