"""An op a later backend keeps whole goes to a backend ahead of it that takes its pieces."""

from __future__ import annotations

import pytest
import torch
from eager_check import assert_runs_like_eager

import composer
from composer.contract.op_names import op_name
from composer.scheduler import pieces as pieces_module
from composer.scheduler.pieces import PieceProbes
from composer.scheduler.support import Support


class LinearAndPool(torch.nn.Module):
    """A linear on 3-D input and a max pool: XNNPACK keeps both whole (``linear``,
    ``max_pool2d``); OpenVINO takes neither whole but both in pieces (permute and matmul,
    ``max_pool2d_with_indices``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.linear = torch.nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(torch.relu(self.conv(x)))  # 1x8x4x4
        tokens = y.flatten(2).transpose(1, 2)  # 1x16x8
        return torch.relu(self.linear(tokens))


def _inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8),)


def test_openvino_ahead_of_xnnpack_takes_the_linear_and_the_pool_in_pieces():
    pytest.importorskip("openvino")
    composition = composer.compose(LinearAndPool().eval(), ["openvino", "xnnpack"], _inputs(),
                                   cache=False)  # fmt: skip
    plan = composition.plan
    # Kept whole for XNNPACK, they went to XNNPACK and cut OpenVINO's partition in three.
    assert plan.ops_on("xnnpack") == {}
    assert plan.ops_on("portable") == {}
    assert "aten.max_pool2d_with_indices.default" in plan.ops_on("openvino")
    assert "aten.linear.default" not in plan.ops_on("openvino")
    assert [p.backend for p in plan.partitions] == ["openvino"]
    assert_runs_like_eager(composition)


def test_xnnpack_ahead_of_openvino_keeps_its_linear_whole():
    pytest.importorskip("openvino")
    plan = composer.plan(LinearAndPool().eval(), ["xnnpack", "openvino"], _inputs(), cache=False)
    assert plan.ops_on("xnnpack")["aten.linear.default"] == 1
    assert plan.ops_on("xnnpack")["aten.max_pool2d.default"] == 1


def test_an_op_pinned_off_the_backend_ahead_stays_whole_for_the_later_one():
    pytest.importorskip("openvino")
    stack = composer.Stack(["openvino", "xnnpack"], never={"openvino": ["aten.linear.default"]})
    plan = composer.plan(LinearAndPool().eval(), stack, _inputs(), cache=False)
    assert plan.ops_on("xnnpack") == {"aten.linear.default": 1}
    assert "aten.max_pool2d_with_indices.default" in plan.ops_on("openvino")


def test_pieces_pinned_off_the_backend_ahead_leave_the_op_whole_for_the_later_one():
    # What a repair does after OpenVINO's delegate misses eager: it pins the partition's nodes,
    # pieces among them, off OpenVINO. Decomposed for OpenVINO all the same, nobody took the
    # max_pool2d_with_indices: portable kernels, between two XNNPACK delegates (resnet18:
    # 4264 us against XNNPACK alone's 2186).
    pytest.importorskip("openvino")
    pieces = ["node:aten_max_pool2d_with_indices_default"]
    stack = composer.Stack(["openvino", "xnnpack"], never={"openvino": pieces})
    plan = composer.plan(LinearAndPool().eval(), stack, _inputs(), cache=False)
    assert plan.ops_on("portable") == {}
    assert plan.ops_on("xnnpack") == {"aten.max_pool2d.default": 1}
    # The linear's pieces are not pinned: OpenVINO still takes them.
    assert plan.ops_on("openvino")["aten.bmm.default"] == 1


def test_the_probe_names_no_op_pinned_off_the_backend():
    node, program = _linear_node()
    pieces = {"aten.permute_copy.default", "aten.view_copy.default", "aten.addmm.default"}
    probes = PieceProbes(_Asked(pieces))
    assert probes.prefers_pieces(node, program, pinned=lambda op: op == "aten.relu.default")
    assert not probes.prefers_pieces(node, program, pinned=lambda op: op == "aten.addmm.default")


def test_keep_whole_any_keeps_whole_what_any_backend_asks_to():
    # Every order decomposes the model alike: what measured placement's per-region pins need.
    pytest.importorskip("openvino")
    stack = composer.Stack(["openvino", "xnnpack"], keep_whole="any")
    plan = composer.plan(LinearAndPool().eval(), stack, _inputs(), cache=False)
    assert plan.ops_on("xnnpack") == {"aten.linear.default": 1, "aten.max_pool2d.default": 1}


def test_an_unknown_keep_whole_is_a_user_error(tmp_path):
    from composer.config import load_config

    with pytest.raises(composer.ComposerError, match="keep_whole must be one of priority, any"):
        composer.Stack(["xnnpack"], keep_whole="all")
    (tmp_path / "composer.toml").write_text('backends = ["xnnpack"]\nkeep_whole = "all"\n')
    with pytest.raises(composer.ComposerError, match="keep_whole must be one of priority, any"):
        load_config(tmp_path / "composer.toml")


# --- the probe itself ------------------------------------------------------------------


def _linear_node() -> tuple[torch.fx.Node, torch.export.ExportedProgram]:
    program = torch.export.export(torch.nn.Linear(8, 16).eval(), (torch.randn(1, 5, 8),))
    [node] = [n for n in program.graph.nodes if n.op == "call_function"]
    return node, program


class _Asked:
    """A backend's support taking the ops ``takes`` names, counting how often it is asked."""

    def __init__(self, takes: set[str]) -> None:
        self.takes = takes
        self.asked: list[set[str]] = []

    def __call__(self, program: torch.export.ExportedProgram) -> Support:
        self.asked.append({op_name(n) for n in program.graph.nodes if n.op == "call_function"})
        return Support(lambda n: op_name(n) in self.takes, lambda n: "no", [], set())


def test_the_probe_offers_the_op_whole_then_its_pieces_and_asks_once_per_signature():
    node, program = _linear_node()
    pieces = {"aten.permute_copy.default", "aten.view_copy.default", "aten.addmm.default"}
    asked = _Asked(pieces)
    probes = PieceProbes(asked)
    assert probes.prefers_pieces(node, program)
    assert probes.prefers_pieces(node, program)
    # What a 3-D linear is in the edge dialect: kept whole, then views around a 2-D addmm
    # with the weight permuted.
    assert asked.asked == [{"aten.linear.default"}, pieces]


def test_every_backend_asks_about_the_same_probe_programs_built_once(monkeypatch):
    # The probe's programs depend on the op, not on the backend: another backend, or the
    # next candidate measured placement composes, asks about copies of the ones built first.
    built = []
    edge_programs = pieces_module._Probe.edge_programs
    monkeypatch.setattr(pieces_module._Probe, "edge_programs",
                        lambda probe, keep: built.append(probe) or edge_programs(probe, keep))  # fmt: skip
    node, program = _linear_node()
    pieces = {"aten.permute_copy.default", "aten.view_copy.default", "aten.addmm.default"}
    first, second = _Asked(pieces), _Asked(pieces - {"aten.addmm.default"})
    assert PieceProbes(first).prefers_pieces(node, program)
    assert not PieceProbes(second).prefers_pieces(node, program)
    assert len(built) <= 1  # none where an earlier test probed a 3-D float linear
    assert first.asked == second.asked == [{"aten.linear.default"}, pieces]


def test_a_backend_taking_the_op_whole_keeps_it_whole():
    # Vulkan takes linear whole; decomposed for it, its own linear kernel would be lost.
    node, program = _linear_node()
    pieces = {"aten.permute_copy.default", "aten.view_copy.default", "aten.addmm.default"}
    assert not PieceProbes(_Asked(pieces | {"aten.linear.default"})).prefers_pieces(node, program)


def test_a_backend_missing_one_piece_does_not_take_the_op():
    node, program = _linear_node()
    assert not PieceProbes(_Asked({"aten.permute_copy.default", "aten.view_copy.default"})
                           ).prefers_pieces(node, program)  # fmt: skip


def test_a_node_with_a_symbolic_shape_is_not_probed():
    batch = torch.export.Dim("batch", min=2, max=8)
    program = torch.export.export(torch.nn.Linear(8, 16).eval(), (torch.randn(4, 8),),
                                  dynamic_shapes=({0: batch},))  # fmt: skip
    [node] = [n for n in program.graph.nodes if n.op == "call_function"]
    asked = _Asked({"aten.addmm.default", "aten.permute_copy.default"})
    assert not PieceProbes(asked).prefers_pieces(node, program)
    assert asked.asked == []
