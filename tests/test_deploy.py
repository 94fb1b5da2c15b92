"""What people deploy, beside plain ExecuTorch: dynamic shapes, nested inputs, a backend whose
compiler refuses its partition. Each program composer writes must run in the pip runtime and
match eager where plain ExecuTorch's program of the same model runs."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import composer
from composer.contract.errors import ComposerError
from composer.report.plan_text import methods_summary_table, summary_table
from composer.run.runtime import LoadedProgram


class SignalNet(torch.nn.Module):
    """Conv1d over a signal of variable length, as speech front ends are."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv1d(16, 32, 3, padding=1)
        self.second = torch.nn.Conv1d(32, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def _signal_program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = SignalNet().eval()
    seq = Dim("seq", min=2, max=128)
    return torch.export.export(model, (torch.randn(1, 16, 50),), dynamic_shapes=({2: seq},))


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
def test_a_dynamic_program_is_proven_at_its_bounds_and_runs_at_any_length(stack):
    program = _signal_program()
    composition = composer.compose(program, stack, cache=False)

    plan = composition.plan
    assert [(d["input"], d["dim"]) for d in plan.dynamic_dims] == [(0, 2)]
    assert list(plan.dynamic_dims[0]["ranges"].values()) == [[2, 128]]
    assert "min (s" in plan.proof and "max (s" in plan.proof and "=128)" in plan.proof
    assert "dynamic: input 0 dim 2" in summary_table(plan)
    loaded = LoadedProgram(composition.buffer)
    eager = program.module()
    for length in (2, 17, 128):
        x = torch.randn(1, 16, length)
        loaded.check_inputs([x])
        (got,) = loaded.run([x])
        torch.testing.assert_close(got, eager(x), atol=1e-4, rtol=1e-4)


def test_the_runtime_refuses_a_length_past_the_bound_with_the_bound_in_words():
    composition = composer.compose(_signal_program(), "xnnpack", cache=False)
    with pytest.raises(ComposerError, match=r"exported for \[1, 16, 128\] float32 \(at most"):
        LoadedProgram(composition.buffer).check_inputs([torch.randn(1, 16, 129)])


class Recurrent(torch.nn.Module):
    """An LSTM called with its state, returning a dict: inputs and outputs are nested."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x, state):
        out, (h, c) = self.lstm(x, state)
        return {"logits": self.head(out), "state": (h, c)}


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
def test_nested_inputs_are_flattened_as_the_program_takes_them(stack):
    torch.manual_seed(0)
    model = Recurrent().eval()
    inputs = (torch.randn(1, 5, 8), (torch.randn(1, 1, 16), torch.randn(1, 1, 16)))
    composition = composer.compose(model, stack, inputs, cache=False)

    assert composition.plan.proof.startswith("ran and matched eager")
    assert composition.verify().ok
    other = (torch.randn(1, 5, 8), (torch.randn(1, 1, 16), torch.randn(1, 1, 16)))
    assert composition.verify(other).ok


def test_a_real_compiler_failure_moves_the_partition_it_was_handed():
    # ExecuTorch's own example: SDPA in bf16. OpenVINO's preprocess raises KeyError:
    # torch.bfloat16; plain ExecuTorch with XNNPACK alone runs it.
    from executorch.examples.models.toy_model.model import SdpaModule

    module = SdpaModule()
    model, inputs = module.get_eager_model(), module.get_example_inputs()
    composition = composer.compose(model, "openvino,xnnpack", inputs, cache=False)

    plan = composition.plan
    assert plan.proof.startswith("ran and matched eager")
    (repair,) = plan.repairs
    assert repair.backend == "openvino"
    assert repair.why == "failed to lower: KeyError: torch.bfloat16"
    assert not plan.nodes_on("openvino")


class FloatThenBfloat16(torch.nn.Module):
    """A float linear and relu, then attention in bf16: with tanh pinned off OpenVINO it gets
    two partitions, and its compiler fails only the bf16 one."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, k, v):
        q = torch.tanh(torch.relu(self.lin(x))).to(torch.bfloat16)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_only_the_partition_a_compiler_failed_on_moves():
    torch.manual_seed(0)
    x, k, v = torch.randn(1, 2, 8, 16), *torch.randn(2, 1, 2, 8, 16, dtype=torch.bfloat16)
    composition = composer.compose(
        FloatThenBfloat16().eval(), "openvino,xnnpack", (x, k, v), cache=False,
        never={"openvino": ["aten.tanh.default"]},
    )  # fmt: skip

    plan = composition.plan
    (repair,) = plan.repairs
    assert repair.why == "failed to lower: KeyError: torch.bfloat16"
    assert "aten__softmax_default" in repair.nodes
    # The float partition compiled: it stays on OpenVINO.
    assert "aten_relu_default" in plan.nodes_on("openvino")
    assert "aten_relu_default" not in repair.nodes
    assert plan.proof.startswith("ran and matched eager")


@pytest.mark.parametrize("stack", ["cuda", "xnnpack,cuda"])
def test_a_dynamic_transformer_plans_with_cuda_anywhere(stack):
    # The cuda plugin's op probes keyed a cache on shapes: a SymInt cannot be hashed.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2).eval()
    seq = Dim("seq", min=2, max=128)
    program = torch.export.export(model, (torch.randn(1, 10, 32),), dynamic_shapes=({1: seq},))
    plan = composer.plan(program, stack, cache=False)

    assert plan.nodes_on("cuda")
    assert plan.dynamic_dims[0]["ranges"] == {plan.dynamic_dims[0]["size"]: [2, 128]}


def test_compose_exports_a_module_with_dynamic_shapes():
    torch.manual_seed(0)
    seq = Dim("seq", min=4, max=64)
    composition = composer.compose(
        SignalNet().eval(), "xnnpack", (torch.randn(1, 16, 20),), cache=False,
        dynamic_shapes=({2: seq},),
    )  # fmt: skip
    assert list(composition.plan.dynamic_dims[0]["ranges"].values()) == [[4, 64]]
    assert "=64)" in composition.plan.proof


def test_the_command_line_makes_a_dim_dynamic(tmp_path, capsys):
    from composer.cli import main

    out = tmp_path / "block.pte"
    args = ["lower", "zoo:transformer_block", "--backends", "xnnpack", "--no-cache"]
    assert main([*args, "--dynamic", "0:1=2..64", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dynamic: input 0 dim 1" in printed and "in [2, 64])" in printed
    assert printed.count("proof: ran and matched eager at 4 sizes") == 1

    assert main([*args, "--dynamic", "1=2-64", "-o", str(out)]) == 2  # a usage error
    assert "write INPUT:DIM=MIN..MAX" in capsys.readouterr().err


class Decoder(torch.nn.Module):
    def __init__(self, shared: torch.nn.Linear) -> None:
        super().__init__()
        self.shared = shared
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.shared(x)))


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
def test_several_methods_make_one_program_sized_as_plain_executorch_s(stack):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    shared = torch.nn.Linear(64, 64)
    prefill = torch.export.export(Decoder(shared).eval(), (torch.randn(8, 64),))
    decode = torch.export.export(Decoder(shared).eval(), (torch.randn(1, 64),))
    metadata = {"get_max_seq_len": 8}
    said: list[str] = []
    composed = composer.compose(
        {"prefill": prefill, "decode": decode}, stack, cache=False, constant_methods=metadata,
        progress=said.append,
    )  # fmt: skip

    assert set(composed.plans) == {"prefill", "decode"}
    for name in ("prefill", "decode"):
        assert composed.plans[name].proof.startswith("ran and matched eager")
        assert composed.verify(name).ok
    program = Runtime.get().load_program(composed.buffer)
    assert program.method_names == {"prefill", "decode", "get_max_seq_len"}
    assert list(program.load_method("get_max_seq_len").execute([])) == [8]
    assert "method decode:" in methods_summary_table(composed.plans, composed.constant_methods)
    # Each method is lowered once (a repair aside): the program of both is written from them.
    lowerings = [line for line in said if line.startswith("lowered with")]
    assert len(lowerings) == 2 + sum(len(plan.repairs) for plan in composed.plans.values())
    if stack == "xnnpack":  # the shared weight is stored as plain ExecuTorch stores it
        plain = to_edge_transform_and_lower(
            {"prefill": prefill, "decode": decode},
            partitioner=[XnnpackPartitioner()],
            constant_methods=metadata,
        ).to_executorch()
        assert len(composed.buffer) == len(plain.buffer)


def test_constant_methods_need_several_methods():
    with pytest.raises(ComposerError, match="constant_methods go with several methods"):
        composer.compose(_signal_program(), "xnnpack", constant_methods={"n": 1})


def test_a_sequential_s_dynamic_input_is_proven_at_its_bounds():
    # nn.Sequential's forward takes `input`: a copy of its program renames that placeholder
    # `input_1` (not its spec), and the dynamic dims were looked up by name, so none were found.
    model = torch.nn.Sequential(torch.nn.Conv1d(16, 8, 3, padding=1), torch.nn.ReLU()).eval()
    composition = composer.compose(
        model, "xnnpack", (torch.randn(1, 16, 50),), cache=False,
        dynamic_shapes=({2: Dim("length", min=2, max=128)},),
    )  # fmt: skip
    assert composition.plan.proof.startswith("ran and matched eager at 4 sizes")
