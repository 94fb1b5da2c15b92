"""composer's partitioner against torch.fx's CapabilityBasedPartitioner, and the cycle check."""

from __future__ import annotations

import itertools
import operator

import pytest
import torch
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from composer.models.synthetic import (
    AllButCumsum,
    chain_with_residuals,
    random_dag,
    transformer_like,
    wide_branching,
)
from composer.models.zoo import ZOO, load
from composer.scheduler.convex import partition_convex
from composer.scheduler.validate import find_tag_cycle


def anchor_count(graph_module) -> int:
    partitioner = CapabilityBasedPartitioner(
        graph_module, AllButCumsum(), allows_single_node_partition=True
    )
    return len(partitioner.propose_partitions())


def tags(partitions) -> dict:
    return {node: f"p{i}" for i, members in enumerate(partitions) for node in members}


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 80),
    seed=st.integers(0, 10**6),
    unsupported=st.floats(0.0, 0.6),
    fan_in=st.integers(1, 4),
)
def test_random_dags_convex_acyclic_complete_and_never_more_than_the_anchor(
    nodes, seed, unsupported, fan_in
):
    graph_module = random_dag(nodes, seed, unsupported, fan_in)
    partitions = partition_convex(graph_module, AllButCumsum())
    assert find_tag_cycle(graph_module.graph, tags(partitions)) is None
    supported = {n for n in graph_module.graph.nodes if AllButCumsum().is_node_supported({}, n)}
    assert {n for members in partitions for n in members} == supported
    assert len(partitions) <= anchor_count(graph_module)


@pytest.mark.parametrize(
    "build",
    [
        lambda: chain_with_residuals(300, island_every=7),
        lambda: chain_with_residuals(300, island_every=200),
        lambda: chain_with_residuals(300),
        lambda: wide_branching(300, island_every=7),
        lambda: transformer_like(300, island_every=7),
    ],
    ids=["chain/7", "chain/200", "chain", "wide/7", "transformer/7"],
)
def test_shapes_need_no_more_partitions_than_the_anchor(build):
    graph_module = build()
    partitions = partition_convex(graph_module, AllButCumsum())
    assert find_tag_cycle(graph_module.graph, tags(partitions)) is None
    assert len(partitions) <= anchor_count(graph_module)


def test_min_size_drops_small_partitions_and_stays_convex():
    graph_module = chain_with_residuals(200, island_every=4)
    everything = partition_convex(graph_module, AllButCumsum(), min_size=1)
    large = partition_convex(graph_module, AllButCumsum(), min_size=4)
    assert any(len(p) < 4 for p in everything)
    assert large and all(
        len([n for n in p if n.target is not operator.getitem]) >= 4 for p in large
    )
    assert find_tag_cycle(graph_module.graph, tags(large)) is None


def test_getitem_goes_with_its_producer_and_does_not_count():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pair = graph.call_function(torch.sort, (x,))
    values = graph.call_function(operator.getitem, (pair, 0))
    indices = graph.call_function(operator.getitem, (pair, 1))
    graph.output((graph.call_function(torch.relu, (values,)), indices))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    (partition,) = partition_convex(graph_module, AllButCumsum(), min_size=2)
    assert [n.name for n in partition] == ["sort", "getitem", "getitem_1", "relu"]
    assert partition_convex(graph_module, AllButCumsum(), min_size=3) == []


def test_getitems_stay_with_a_multi_output_producer_whose_consumers_sit_at_other_stages():
    # One getitem of the split feeds the stage after the cumsum (already supported there),
    # the other feeds the first stage: moving the first getitem up to its consumer's stage
    # would leave the split's partition returning the whole list.
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    before = graph.call_function(torch.relu, (x,))
    after = graph.call_function(torch.relu, (graph.call_function(torch.cumsum, (before, 0)),))
    parts = graph.call_function(torch.split, (x, 2))
    first = graph.call_function(operator.getitem, (parts, 0))
    second = graph.call_function(operator.getitem, (parts, 1))
    unused = graph.call_function(operator.getitem, (parts, 2))
    joined = graph.call_function(torch.add, (after, first))
    graph.output((joined, graph.call_function(torch.relu, (second,)), unused))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    partitions = partition_convex(graph_module, AllButCumsum())
    assert find_tag_cycle(graph_module.graph, tags(partitions)) is None
    partition_of = tags(partitions)
    getitems = [n for n in graph.nodes if n.target is operator.getitem]
    assert len(getitems) == 3
    for getitem in getitems:
        assert partition_of[getitem] == partition_of[getitem.args[0]]


def test_a_multi_output_op_joins_its_consumers_stage_with_all_its_getitems():
    # The split of a placeholder (a weight's) is read only after the cumsum: the split and
    # both getitems move up together into that stage, not left behind in the first.
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    w = graph.placeholder("w")
    before = graph.call_function(torch.relu, (x,))
    after = graph.call_function(torch.relu, (graph.call_function(torch.cumsum, (before, 0)),))
    parts = graph.call_function(torch.split, (w, 2))
    first = graph.call_function(operator.getitem, (parts, 0))
    second = graph.call_function(operator.getitem, (parts, 1))
    graph.output(
        graph.call_function(torch.add, (graph.call_function(torch.add, (after, first)), second))
    )
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    first_stage, second_stage = partition_convex(graph_module, AllButCumsum())
    assert [n.name for n in first_stage] == ["relu"]
    assert [n.name for n in second_stage] == [
        "relu_1",
        "split",
        "getitem",
        "getitem_1",
        "add",
        "add_1",
    ]


def test_cycle_check_names_the_path_out_and_back():
    graph_module = chain_with_residuals(6, island_every=2)
    nodes = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    # One tag over everything supported: the unsupported cumsum sits between its parts.
    one_tag = {n: "everything" for n in nodes if n.target is not torch.cumsum}
    path = find_tag_cycle(graph_module.graph, one_tag)
    assert path is not None
    assert path[0] in one_tag and path[-1] in one_tag
    assert any(n.target is torch.cumsum for n in path)
    for a, b in itertools.pairwise(path):
        assert b in a.users or one_tag.get(a) == one_tag.get(b)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_edge_programs_need_no_more_partitions_than_the_anchor(name):
    from executorch.exir import EdgeCompileConfig, to_edge

    from composer.plugins.tensorrt_stub.support import TensorRTOperatorSupport

    model, inputs = load(name)
    with torch.no_grad():
        program = to_edge(
            torch.export.export(model, inputs),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        ).exported_program()
    support = TensorRTOperatorSupport()
    ours = partition_convex(program.graph_module, support)
    theirs = CapabilityBasedPartitioner(
        program.graph_module, support, allows_single_node_partition=True
    ).propose_partitions()
    assert len(ours) <= len(theirs)
    partition_of = tags(ours)
    for node, tag in partition_of.items():
        if node.target is operator.getitem:
            assert partition_of.get(node.args[0]) == tag
