"""Delegate boundaries a backend's runtime can bind.

Stacked after XNNPACK, OpenVINO used to be handed a partition of nothing but
``_to_dim_order_copy`` nodes: to_edge turns a Python scalar of the model (hardsigmoid's ``+ 3``
and ``/ 6``, an in-place ``add_(1)``) into a 0-d int64 constant and a cast of it to float32;
XNNPACK declines casts that change the dtype, OpenVINO claims every dim-order copy, and the
0-d results left its delegate. ExecuTorch's OpenVINO runtime cannot bind a 0-d tensor, so the
program failed with error 0x1 at its first delegate call. composer now keeps every tensor an
OpenVINO delegate reads or writes to what that runtime binds, and says so in the plan.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec
from composer.contract.errors import PluginError
from composer.contract.hookspecs import hookimpl
from composer.contract.op_names import op_name
from composer.models import zoo
from composer.models.synthetic import AllButCumsum, random_dag
from composer.registry import discovery as registry_module
from composer.report.plan_text import summary_table
from composer.scheduler.boundary import partition_within_boundary
from composer.scheduler.validate import find_tag_cycle

DIM_ORDER_COPY = "dim_order_ops._to_dim_order_copy.default"
ZERO_D = "its output would leave the delegate as a 0-d tensor"


def torchvision():
    from composer.contract.errors import ModelError
    from composer.models import corpus

    try:
        return corpus._library("torchvision")
    except ModelError as error:
        pytest.skip(str(error))


def openvino_fallbacks(plan) -> dict[str, str]:
    """Node -> what openvino answered, for each node left to portable kernels."""
    return {f.node: dict(f.reasons)["openvino"] for f in plan.fallbacks}


def assert_runs_and_matches_eager(composition):
    assert composition.plan.repairs == ()
    result = composition.verify()
    assert result.executor == "executorch runtime", str(result)
    assert result.ok, str(result)


def test_xnnpack_then_openvino_runs_torchvision_mobilenet_v3_as_composed():
    # The stem and first block of torchvision's MobileNetV3 (squeeze-excitation gated by
    # hardsigmoid): the piece of mobilenet_v3_small that left OpenVINO its 18 copies.
    models = torchvision().models
    torch.manual_seed(0)
    model = models.mobilenet_v3_small(weights=None).features[:2].eval()
    inputs = (torch.randn(1, 3, 64, 64),)
    composition = composer.compose(model, ["xnnpack", "openvino"], inputs, cache=False, check=False)
    plan = composition.plan
    assert_runs_and_matches_eager(composition)  # unchecked, unrepaired: it runs as composed
    # The casts of hardsigmoid's scalars stay on portable kernels, and the plan says why.
    assert plan.ops_on("portable") == {DIM_ORDER_COPY: 2}
    assert not plan.partitions_of("openvino")
    for node, why in openvino_fallbacks(plan).items():
        assert plan.node_ops[node] == DIM_ORDER_COPY
        assert why.startswith(f"left out of its partition: {ZERO_D}"), why
    table = summary_table(plan)
    assert "which OpenVINO's runtime cannot bind" in table


class CountsCalls(torch.nn.Module):
    """A buffer updated in place each call; its ``add_(1)`` is a 0-d constant and a cast."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1, 8))
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.linear(x) + self.calls


def test_xnnpack_then_openvino_runs_a_model_that_updates_a_buffer_in_place():
    torch.manual_seed(0)
    composition = composer.compose(
        CountsCalls().eval(),
        ["xnnpack", "openvino"],
        (torch.randn(2, 8),),
        cache=False,
        check=False,
    )
    assert_runs_and_matches_eager(composition)
    assert composition.plan.ops_on("portable") == {DIM_ORDER_COPY: 1}
    (why,) = openvino_fallbacks(composition.plan).values()
    assert ZERO_D in why


class ChannelsLastOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).to(memory_format=torch.channels_last)
        return torch.relu(y) + y


def test_openvino_alone_leaves_channels_last_tensors_outside_its_delegate():
    # OpenVINO's runtime reads and writes a delegate's tensors as contiguous: a channels-last
    # output written by it held the values in the wrong places (max error 3.5, no error).
    torch.manual_seed(0)
    composition = composer.compose(
        ChannelsLastOut().eval(), ["openvino"], (torch.randn(1, 3, 8, 8),), cache=False, check=False
    )
    assert_runs_and_matches_eager(composition)
    assert dict(composition.plan.ops_on("openvino")) == {"aten.convolution.default": 1}
    reasons = openvino_fallbacks(composition.plan)
    assert any("dim order (0, 2, 3, 1)" in why for why in reasons.values()), reasons


def test_xnnpack_then_openvino_runs_timm_ghostnet_block_as_composed():
    # timm's GhostModule ends in out[:, :out_chs], a full slice: an alias_copy. XNNPACK leaves
    # those, and an OpenVINO delegate of nothing but aliases never wrote its outputs: the
    # program ran and was wrong (ghostnet: max error 0.16).
    from composer.models import corpus

    ghostnet = corpus._library("timm").models.ghostnet
    torch.manual_seed(0)
    model = ghostnet.GhostBottleneck(16, 32, 16).eval()
    inputs = (torch.randn(1, 16, 16, 16),)
    composition = composer.compose(model, ["xnnpack", "openvino"], inputs, cache=False, check=False)
    assert_runs_and_matches_eager(composition)
    plan = composition.plan
    assert plan.ops_on("portable") == {"aten.alias_copy.default": 4}
    for why in openvino_fallbacks(plan).values():
        assert "a delegate input passed through unchanged" in why, why


class Strided(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_strided(x * 2, (4, 4), (1, 4)) + 1


def test_openvino_does_not_claim_as_strided_which_its_preprocess_cannot_convert():
    # A real ConvNeXt failed to lower with OpenVINO for this op (OpConversionFailure: "Couldn't
    # retrieve input stride information"): it goes to portable kernels, and the plan says why.
    composition = composer.compose(
        Strided().eval(), ["openvino"], (torch.randn(4, 4),), cache=False, check=False
    )
    assert_runs_and_matches_eager(composition)
    assert composition.plan.ops_on("portable") == {"aten.as_strided_copy.default": 1}
    (why,) = openvino_fallbacks(composition.plan).values()
    assert "preprocess would raise OpConversionFailure" in why


# ------------------------------------------------------------------ the rule on plain graphs


def tags(partitions) -> dict:
    return {node: f"p{i}" for i, members in enumerate(partitions) for node in members}


def crossings(partitions):
    """(value, reader) pairs where a value enters or leaves a partition."""
    part_of = {node: i for i, members in enumerate(partitions) for node in members}
    for node, index in part_of.items():
        for user in node.users:
            if part_of.get(user) != index:
                yield node, user
        for producer in node.all_input_nodes:
            if part_of.get(producer) != index:
                yield producer, node


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 60),
    seed=st.integers(0, 10**6),
    unsupported=st.floats(0.0, 0.5),
    refused_every=st.integers(2, 6),
)
def test_random_dags_keep_refused_values_inside_and_stay_convex(
    nodes, seed, unsupported, refused_every
):
    graph_module = random_dag(nodes, seed, unsupported)
    graph = graph_module.graph
    support = AllButCumsum()
    calls = [n for n in graph.nodes if n.op == "call_function"]
    refused = {n for i, n in enumerate(calls) if i % refused_every == 0}
    bounded = partition_within_boundary(
        graph,
        lambda node: support.is_node_supported({}, node),
        1,
        lambda node, partition: "refused" if node in refused else None,
        set(),
    )
    assert find_tag_cycle(graph, tags(bounded.partitions)) is None
    assert not [(v.name, u.name) for v, u in crossings(bounded.partitions) if v in refused]
    taken = {n for members in bounded.partitions for n in members}
    supported = {n for n in calls if support.is_node_supported({}, n)}
    # Every supported node is in a partition or left out with a reason, never both.
    assert taken | {n for n in calls if n.name in bounded.left_out} == supported
    assert not {n.name for n in taken} & bounded.left_out.keys()


def small_graph():
    """x -> relu -> [scalar] -> add(relu2(x), scalar) -> out; ``scalar`` is a 0-d stand-in."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    table = graph.placeholder("table")  # a constant
    first = graph.call_function(torch.relu, (x,))
    scalar = graph.call_function(torch.sum, (first,))
    second = graph.call_function(torch.sigmoid, (x,))
    total = graph.call_function(torch.add, (second, scalar))
    scaled = graph.call_function(torch.mul, (total, table))
    graph.output((scaled,))
    node = {"x": x, "table": table, "relu": first, "sum": scalar, "sigmoid": second}
    node.update({"add": total, "mul": scaled})
    return graph, node


def test_a_refused_value_pulls_its_producer_and_readers_out_of_the_partition():
    graph, node = small_graph()
    # Everything but sum is taken: sum's output would enter the partition, so add, which
    # reads it, is left out; add's output then leaves (refused too: the mul reading it goes).
    refused = {node["sum"], node["add"]}
    bounded = partition_within_boundary(
        graph,
        lambda n: n is not node["sum"],
        1,
        lambda n, partition: "refused" if n in refused else None,
        set(),
    )
    kept = {n for members in bounded.partitions for n in members}
    assert kept == {node["relu"], node["sigmoid"]}
    name = {n: n.name for n in node.values()}
    assert bounded.left_out == {
        name[node["add"]]: f"it would read {name[node['sum']]} into the delegate as refused",
        name[node["mul"]]: f"it would read {name[node['add']]} into the delegate as refused",
    }


def test_a_refused_constant_joins_the_partition_that_reads_it():
    graph, node = small_graph()
    bounded = partition_within_boundary(
        graph,
        lambda n: True,
        1,
        lambda n, partition: "refused" if n is node["table"] else None,
        {node["table"]},
    )
    assert bounded.constants == {node["table"]}
    assert bounded.left_out == {}
    # Not movable (a mutated buffer): its reader is left out instead.
    kept_out = partition_within_boundary(
        graph,
        lambda n: True,
        1,
        lambda n, partition: "refused" if n is node["table"] else None,
        set(),
    )
    assert set(kept_out.left_out) == {node["mul"].name}


def test_a_chain_that_passes_a_delegate_input_through_is_left_out_whole():
    from composer.plugins.openvino.support import passes_through

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    outside = graph.call_function(torch.ops.aten.relu.default, (x,))
    first = graph.call_function(torch.ops.aten.alias_copy.default, (outside,))
    second = graph.call_function(torch.ops.aten.alias_copy.default, (first,))
    computed = graph.call_function(torch.ops.aten.exp.default, (outside,))
    graph.output((second, computed))
    bounded = partition_within_boundary(
        graph,
        lambda n: n is not outside,
        1,
        lambda n, part: "passed through" if n in part and passes_through(n, part) else None,
        set(),
    )
    assert [[n.name for n in members] for members in bounded.partitions] == [[computed.name]]
    assert bounded.left_out == {
        second.name: "its output would leave the delegate as passed through",
        first.name: "its output would leave the delegate as passed through",
    }


def test_a_getitem_carrying_a_refused_value_leaves_its_op_out():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pair = graph.call_function(torch.sort, (x,))
    values = graph.call_function(operator.getitem, (pair, 0))
    indices = graph.call_function(operator.getitem, (pair, 1))
    out = graph.call_function(torch.relu, (values,))
    graph.output((out, indices))
    bounded = partition_within_boundary(
        graph, lambda n: True, 1, lambda n, p: "refused" if n is indices else None, set()
    )
    kept = {n.name for members in bounded.partitions for n in members}
    assert kept == {"relu"}
    assert bounded.left_out == {"sort": "its output would leave the delegate as refused"}


# ------------------------------------------------------------------ the plugin contract


class TakesReluAndLinear(OperatorSupportBase):
    def is_node_supported(self, submodules, node) -> bool:
        return op_name(node) in ("aten.relu.default", "aten.linear.default")


class NumericBoundary(TakesReluAndLinear):
    def reason_unsupported_at_boundary(self, node, partition):
        return 42


class BoundaryPlugin:
    def __init__(self, support) -> None:
        self.spec = BackendSpec("boundary", "ComposerTestBackend")
        self.support = support

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return self.support()


def test_a_boundary_reason_that_is_not_a_string_is_a_plugin_error(monkeypatch):
    monkeypatch.setattr(registry_module, "_default", registry_with(BoundaryPlugin(NumericBoundary)))
    model, inputs = zoo.load("mlp")
    with pytest.raises(PluginError, match=(
        r"plugin 'boundary' \(composer-test-boundary\): NumericBoundary"
        r"\.reason_unsupported_at_boundary returned 42 for node \w+; it must return a string "
        "or None."
    )):  # fmt: skip
        composer.plan(model, ["boundary"], inputs, cache=False)


class ShiftedWindowMask(torch.nn.Module):
    """Swin's attention mask: regions of a zero tensor filled with a running count, each a
    0-d lifted constant that a clone reads."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros((4, 4))
        for count, rows in enumerate((slice(0, 1), slice(1, 3), slice(3, None))):
            mask[rows, :] = count
        return torch.relu(x * 2 + mask)


def test_a_constant_xnnpack_s_partitioner_leaves_out_reaches_its_delegate_as_an_input():
    # Plain ExecuTorch hands XNNPACK the 0-d constants as delegate inputs and runs; baked
    # into XNNPACK's blobs, as composer did for a constant one partition alone reads, every
    # delegate call failed at run time (torchvision's swin_t alike).
    torch.manual_seed(0)
    composition = composer.compose(
        ShiftedWindowMask(), "xnnpack", (torch.randn(4, 4),), cache=False
    )
    assert composition.plan.repairs == ()
    assert composition.plan.proof.startswith("ran and matched eager")
    assert composition.plan.nodes_on("xnnpack")
