"""The seed scenarios: what breaks when ExecuTorch partitioners are stacked, through composer."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from plugins_for_tests import CarelessPlugin, GreedyPlugin, TagEverything, is_delegate_call
from plugins_for_tests import registry_with as make_registry
from torch import nn

import composer
from composer.models import zoo
from composer.scheduler.partitioner import ComposerPartitioner

NO_IR_CHECK = EdgeCompileConfig(_check_ir_validity=False)


def lowered_modules(composition):
    graph_module = composition.edge.exported_program().graph_module
    return {
        node.name: getattr(graph_module, node.args[0].target)
        for node in graph_module.graph.nodes
        if is_delegate_call(node)
    }


# (a) ------------------------------------------------------------------------------------


def test_greedy_backend_never_takes_an_earlier_delegate():
    registry = make_registry(GreedyPlugin())
    model, inputs = zoo.load("cumsum_mlp")
    # Plain priority order: consolidation would hand XNNPACK's islands to the greedy backend.
    composition = composer.compose(
        model, ["xnnpack", "greedy"], inputs, registry=registry, consolidate=False
    )

    plan = composition.plan
    assert plan.ops_on("greedy") == {"aten.cumsum.default": 1}
    assert plan.ops_on("xnnpack")["aten.linear.default"] == 2
    assert plan.nodes_on("portable") == []
    for lowered in lowered_modules(composition).values():
        inner = lowered.original_module.graph_module.graph
        assert not any(is_delegate_call(node) for node in inner.nodes), "nested delegate"
    assert sorted(m.backend_id for m in lowered_modules(composition).values()) == [
        "ComposerTestBackend",
        "XnnpackBackend",
        "XnnpackBackend",
    ]
    assert composition.verify().ok


def test_native_partitioner_tagging_a_foreign_delegate_is_guarded_with_a_warning():
    registry = make_registry(CarelessPlugin())
    model, inputs = zoo.load("cumsum_mlp")
    with pytest.warns(UserWarning, match=r"plugin 'careless'.*a delegate of an earlier backend"):
        composition = composer.compose(
            model, ["xnnpack", "careless"], inputs, registry=registry, consolidate=False
        )
    assert composition.plan.ops_on("careless") == {"aten.cumsum.default": 1}
    assert composition.verify().ok


def test_plain_executorch_fails_on_the_same_stack():
    """The failure composer exists to prevent, reproduced without it."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model, inputs = zoo.load("cumsum_mlp")
    program = torch.export.export(model, inputs)
    with pytest.raises(Exception, match="should not be tagged"):
        to_edge_transform_and_lower(
            program, partitioner=[XnnpackPartitioner(), TagEverything()], compile_config=NO_IR_CHECK
        )


# (b) ------------------------------------------------------------------------------------


class TagOpsNotConstants(Partitioner):
    """Like many real partitioners: takes ops (all but cumsum), leaves weights as inputs."""

    def partition(self, exported_program) -> PartitionResult:
        for node in exported_program.graph_module.graph.nodes:
            if node.op == "call_function" and "cumsum" not in str(node.target):
                node.meta["delegation_tag"] = "linear"
        tags = {
            node.meta["delegation_tag"]: DelegationSpec("ComposerTestBackend", [])
            for node in exported_program.graph_module.graph.nodes
            if "delegation_tag" in node.meta
        }
        return PartitionResult(exported_program, tags)


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cumsum(self.fc(x), dim=-1)


def is_not_user_input(node):
    return node.op != "placeholder" or node.name.startswith(("p_", "b_", "c_"))


def test_constant_read_only_by_an_earlier_delegate_stays_untagged():
    registry = make_registry(CarelessPlugin())
    careless = registry.resolve(["careless"])[0]
    model = Linear().eval()
    program = torch.export.export(model, (torch.randn(2, 8),))

    # Without composer: the careless partitioner claims the first delegate and the weight it
    # reads, and ExecuTorch nests one delegate inside the other.
    with torch.no_grad():
        plain = to_edge_transform_and_lower(
            program,
            partitioner=[TagOpsNotConstants(), TagEverything(is_not_user_input)],
            compile_config=NO_IR_CHECK,
        ).exported_program()
    (outer_call,) = [n for n in plain.graph_module.graph.nodes if is_delegate_call(n)]
    nested = getattr(plain.graph_module, outer_call.args[0].target).original_module
    assert any(is_delegate_call(n) for n in nested.graph_module.graph.nodes)
    assert "p_fc_weight" in nested.graph_signature.inputs_to_parameters

    with pytest.warns(UserWarning, match="careless"):
        edge = to_edge_transform_and_lower(
            program,
            partitioner=[TagOpsNotConstants(), ComposerPartitioner(careless, registry)],
            compile_config=NO_IR_CHECK,
        )
    graph_module = edge.exported_program().graph_module
    calls = [node for node in graph_module.graph.nodes if is_delegate_call(node)]
    assert len(calls) == 2
    weight = next(n for n in graph_module.graph.nodes if n.name == "p_fc_weight")
    assert [user.name for user in weight.users] == [calls[0].name], "weight left with delegate 1"
    second = getattr(graph_module, calls[1].args[0].target)
    assert not second.original_module.graph_signature.inputs_to_parameters
    x = torch.randn(2, 8)
    torch.testing.assert_close(edge.exported_program().module()(x), model(x))


# (c) ------------------------------------------------------------------------------------


def test_unsupported_op_splits_supported_ops_into_convex_partitions():
    model, inputs = zoo.load("cumsum_mlp")
    composition = composer.compose(model, ["tensorrt_stub"], inputs)
    plan = composition.plan
    assert len(plan.partitions_of("tensorrt_stub")) == 2
    assert [f.op for f in plan.fallbacks] == ["aten.cumsum.default"]
    assert dict(plan.fallbacks[0].reasons) == {"tensorrt_stub": "unsupported op"}
    assert composition.verify().ok


def test_native_partitioner_with_a_non_convex_tag_is_split_not_crashed():
    not_cumsum = lambda n: n.op == "call_function" and "cumsum" not in str(n.target)
    program = torch.export.export(*zoo.load("cumsum_mlp"))
    with pytest.raises(AssertionError, match="dependency cycles"):
        to_edge_transform_and_lower(
            program, partitioner=[TagEverything(not_cumsum)], compile_config=NO_IR_CHECK
        )

    registry = make_registry(CarelessPlugin("onetag", op_filter=not_cumsum))
    model, inputs = zoo.load("cumsum_mlp")
    with pytest.warns(UserWarning, match=r"plugin 'onetag'.*non-convex.*split"):
        composition = composer.compose(model, ["onetag"], inputs, registry=registry)
    assert len(composition.plan.partitions_of("onetag")) == 2
    assert composition.verify().ok


# (d) ------------------------------------------------------------------------------------


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return torch.cond(y.sum() > 0, lambda t: torch.relu(t) * 2, lambda t: torch.tanh(t), (y,))


def test_cond_branches_go_with_their_cond_op():
    registry = make_registry(GreedyPlugin())
    model = Branchy().eval()
    composition = composer.compose(model, ["greedy"], (torch.randn(2, 8),), registry=registry)
    plan = composition.plan
    assert plan.ops_on("greedy")["higher_order.cond"] == 1
    assert len(plan.partitions) == 1
    (lowered,) = lowered_modules(composition).values()
    inner = lowered.original_module.graph_module
    branches = [n for n in inner.graph.nodes if n.op == "get_attr"]
    assert len(branches) == 2, "both branch submodules moved into the delegate"
    outer = composition.edge.exported_program().graph_module.graph
    assert not [n for n in outer.nodes if n.op == "get_attr" and "branch" in n.name]
    for sign in (1.0, -1.0):
        x = torch.full((2, 8), sign)
        result = composition.verify((x,))
        assert result.ok, result


# (e) ------------------------------------------------------------------------------------


class TiedWeight(nn.Module):
    """One weight read by a linear and by an op only portable kernels run (cumsum)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return nn.functional.linear(x, self.weight) + torch.cumsum(self.weight, 0)[0]


def test_shared_constant_is_shared_by_operator_support_backends():
    model = TiedWeight().eval()
    composition = composer.compose(model, ["tensorrt_stub"], (torch.randn(4, 16),))
    assert composition.plan.duplicated_constant_bytes == 0
    outer = composition.edge.exported_program()
    assert "weight" in outer.state_dict, "kept outside, passed to the delegate as an input"
    assert composition.verify().ok


def test_shared_constant_is_duplicated_for_xnnpack_and_counted():
    model = TiedWeight().eval()
    composition = composer.compose(model, ["xnnpack"], (torch.randn(4, 16),))
    assert composition.plan.duplicated_constant_bytes == 16 * 16 * 4
    result = composition.verify()
    assert result.executor == "executorch runtime"
    assert result.ok, result


# (f) ------------------------------------------------------------------------------------


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.unused = nn.Parameter(torch.randn(3))
        self.register_buffer("unused_buffer", torch.zeros(5))

    def forward(self, x):
        return torch.relu(self.fc(x))


@pytest.mark.parametrize("stack", [["tensorrt_stub", "xnnpack"], ["xnnpack"], ["greedy"]])
def test_unused_buffer_stays_outside_every_delegate(stack):
    # to_edge drops the unused parameter before any partitioner runs; the unused buffer
    # reaches them as a constant placeholder without users, which no partition may claim
    # (tagged, it would move into the delegate that never reads it).
    registry = make_registry(GreedyPlugin())
    composition = composer.compose(WithUnused(), stack, (torch.randn(2, 8),), registry=registry)
    program = composition.edge.exported_program()
    assert "unused_buffer" in program.graph_signature.inputs_to_buffers.values()
    for lowered in lowered_modules(composition).values():
        inner = lowered.original_module.graph_signature
        assert "unused_buffer" not in inner.inputs_to_buffers.values()
    assert composition.plan.delegate_calls == 1
    assert composition.verify().ok


# (g) ------------------------------------------------------------------------------------


class Accumulator(nn.Module):
    """A buffer updated in place on every call (as a KV cache is)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("total", torch.zeros(2, 8))

    def forward(self, x):
        y = torch.relu(self.fc(x))
        self.total.add_(y)
        return y * 2 + self.total


@pytest.mark.parametrize("stack", [["tensorrt_stub"], ["xnnpack"], ["greedy"]])
def test_mutated_buffer_stays_out_of_every_partition(stack):
    registry = make_registry(GreedyPlugin())
    composition = composer.compose(Accumulator(), stack, (torch.randn(2, 8),), registry=registry)
    program = composition.edge.exported_program()
    assert program.graph_signature.buffers_to_mutate, "the mutation is still the program's"
    for lowered in lowered_modules(composition).values():
        inner = lowered.original_module.graph_signature
        assert "total" not in inner.inputs_to_buffers.values()
        assert not inner.buffers_to_mutate
    result = composition.verify()
    assert result.ok, result
