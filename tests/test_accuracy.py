"""What "right" means (composer.run.accuracy): a program's outputs judged against a higher-precision
truth beside eager's, as torch._dynamo judges compiled models; and the proof holding every
program composer writes to it, in fp32, bf16 and int8, with nothing written that misses."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch._dynamo.utils import same

import composer
from composer import BackendSpec, ComposerError, Tolerance
from composer.contract.hookspecs import hookimpl
from composer.pipeline import proven
from composer.registry.stack import Stack
from composer.report.plan_text import summary_table
from composer.run import piecewise, verification
from composer.run.accuracy import eager_in_precision, judge, truth, unquantized
from composer.run.runtime import program_backend_ids, run_program


class Wide(torch.nn.Module):
    """Outputs of 2048 elements: RMSE over them is a steady figure (dynamo's own multipliers
    grow for small tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def wide(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Wide().eval().to(dtype), (torch.randn(16, 64).to(dtype),)


def int8_wide() -> tuple[torch.export.ExportedProgram, torch.nn.Module, tuple[torch.Tensor]]:
    """Wide quantized as ExecuTorch's XNNPACK guide does, and the float model it came from."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model, inputs = wide()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    for seed in range(3):
        prepared(torch.randn(16, 64, generator=torch.Generator().manual_seed(seed)))
    return torch.export.export(convert_pt2e(prepared), inputs), model, inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_one_percent_off_fail_and_outputs_as_close_as_eager_pass(dtype):
    model, inputs = wide(dtype)
    with torch.no_grad():
        eager = model(*inputs)
    true, name = truth(model, inputs)
    assert name == "fp64" and true.dtype == torch.float64
    assert judge(eager, eager, true).ok
    # closer to the truth than eager: the truth rounded to the model's dtype
    assert judge(true.to(dtype), eager, true).ok
    off = judge(eager * 1.01, eager, true)
    assert not off.ok
    assert "against fp64, eager" in off.describe()


def test_the_rule_is_dynamos():
    # Anchored to torch._dynamo.utils.same with fp64_ref, tol 1e-4 and its larger multipliers
    # for small tensors: the same verdict on outputs a little and a lot off, in both dtypes.
    for dtype in (torch.float32, torch.bfloat16):
        model, inputs = wide(dtype)
        with torch.no_grad():
            eager = model(*inputs)
        true, _ = truth(model, inputs)
        for factor in (1.0, 1.0005, 1.003, 1.01, 1.1):
            program = (eager.double() * factor).to(dtype)
            expected = same(
                eager, program, fp64_ref=true, tol=1e-4, log_error=lambda *a: None,
                use_larger_multiplier_for_smaller_tensor=True,
            )  # fmt: skip
            assert judge(program, eager, true).ok == expected, (dtype, factor)


def test_a_few_wrong_elements_fail_where_the_rmse_alone_would_pass():
    # dynamo's RMSE dilutes them: one element of 2048 off by 30x eager's worst error passes
    # same(); composer's bound on the worst element (10x eager's) does not. In bf16: in fp32
    # such an element is within same()'s 1e-4 of eager, where both rules pass it.
    model, inputs = wide(torch.bfloat16)
    with torch.no_grad():
        eager = model(*inputs)
    true, _ = truth(model, inputs)
    eager_worst = (eager.double() - true).abs().max().item()
    program = eager.clone()
    program[3, 7] += 30 * eager_worst
    dynamo = same(eager, program, fp64_ref=true, tol=1e-4, log_error=lambda *a: None,
                  use_larger_multiplier_for_smaller_tensor=True)  # fmt: skip
    assert dynamo
    verdict = judge(program, eager, true)
    assert not verdict.ok
    assert re.search(
        r"worst element \S+ off fp64, eager's \S+, allowed \S+ \(rmse", verdict.describe()
    )
    program[3, 7] = eager[3, 7] + 5 * eager_worst  # within the bound: as wrong as rounding is
    assert judge(program, eager, true).ok


def test_openvinos_int8_average_pooling_wrong_at_its_last_window_is_repaired():
    # ExecuTorch's backend suite (avgpool1d_combinations, openvino_int8): OpenVINO's int8
    # average pooling with ceil_mode computes its last, partial window 17 quantization steps off
    # (a proof by RMSE alone passed it; the suite's atol did not).
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, inputs = torch.nn.AvgPool1d(3, 2, 1, ceil_mode=True).eval(), (torch.randn(1, 8, 100),)
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), OpenVINOQuantizer())
    prepared(*inputs)
    program = torch.export.export(convert_pt2e(prepared), inputs)
    composition = composer.compose(program, "openvino", cache=False)
    (repair,) = composition.plan.repairs
    assert repair.backend == "openvino" and "worst element" in repair.why
    # narrowed to the pooling: its views and q/dq stay on OpenVINO
    assert repair.moved_to == {"portable": 1}, repair
    assert "wrong there: aten.avg_pool" in repair.why, repair.why
    (ran,) = run_program(composition.buffer, list(inputs))
    with torch.no_grad():
        eager = program.module()(*inputs)
    assert (ran - eager).abs().max().item() < 0.05


def test_int8_is_judged_against_the_float_model_beside_its_q_dq_simulation():
    program, float_model, inputs = int8_wide()
    simulation = program.module()
    true, name = truth(simulation, inputs)
    assert name == "the float model"
    with torch.no_grad():
        eager, float_out = simulation(*inputs), float_model(*inputs)
    # Without its activations' q/dq the module computes the float model (weights quantized).
    assert (true - float_out).abs().max() < (eager - float_out).abs().max() / 3
    composition = composer.compose(program, "xnnpack", cache=False)
    assert "against the float model" in composition.plan.proof
    outputs = verification.verify(composition).verdict
    assert outputs.ok
    # int8's own error is about 2% of these outputs (rmse 0.0044 on values of rms 0.2): a
    # program 1% off is as close as quantization itself allows; 5% off is not.
    from composer.run.runtime import run_program

    ran = run_program(composition.buffer, list(inputs))[0]
    assert not judge(ran * 1.05, eager, true, steps=8).ok


def test_activation_pairs_are_taken_out_and_weights_stay_quantized():
    program, _, _ = int8_wide()
    simulation = program.module()
    stripped = unquantized(simulation)
    ops = [str(n.target) for n in stripped.graph.nodes if n.op == "call_function"]
    assert not any("quantize_per_tensor" in op and "dequantize" not in op for op in ops)
    assert any("dequantize_per_channel" in op for op in ops)  # the weights' own
    assert unquantized(wide()[0]) is None  # a float model has nothing to take out


@pytest.fixture
def xnnpack_one_percent_high(monkeypatch):
    """XNNPACK's delegates answer 1% high, in the program and alone: a backend whose compiled
    code is slightly wrong (a fault put into composer's calls of the runtime, not into
    ExecuTorch)."""
    whole = verification.run_program

    def run_program(program, inputs, method="forward"):
        outputs = whole(program, inputs, method)
        if "XnnpackBackend" in program_backend_ids(program):
            outputs = [o * 1.01 if o.is_floating_point() else o for o in outputs]
        return outputs

    alone = piecewise.RuntimeDelegate.forward

    def forward(self, *inputs):
        outputs = alone(self, *inputs)
        scale = lambda o: o * 1.01 if o.is_floating_point() else o
        return scale(outputs) if self.single_output else tuple(scale(o) for o in outputs)

    monkeypatch.setattr(verification, "run_program", run_program)
    monkeypatch.setattr(piecewise.RuntimeDelegate, "forward", forward)


def test_a_delegate_one_percent_off_is_caught_named_and_moved(xnnpack_one_percent_high):
    model, inputs = wide()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", composer.ComposerWarning)
        composition = composer.compose(model, "xnnpack", inputs, cache=False)
    plan = composition.plan
    assert [r.backend for r in plan.repairs] == ["xnnpack"]
    why = plan.repairs[0].why
    assert why.startswith("does not match its subgraph") and "against fp64" in why
    assert plan.nodes_on("xnnpack") == []
    assert plan.proof.startswith("ran and matched eager")


def test_repairs_stop_before_a_round_that_would_end_past_their_time(
    xnnpack_one_percent_high, tmp_path, monkeypatch
):
    # repair_time=0.5: half the first compose and proof again. The round that would move
    # XNNPACK's partition takes about as long as the first, so it is not begun (before, the
    # time was checked only after a round, and this one ran, 2x the first in all). The first
    # compose counts as it took: this model's second would be within the shortest counted.
    monkeypatch.setattr(proven, "SHORTEST_COMPOSE", 0.0)
    model, inputs = wide()
    out = tmp_path / "wide.pte"
    stack = composer.Stack(["xnnpack"], repair_time=0.5)
    with pytest.raises(ComposerError) as raised:
        composer.compose(model, stack, inputs, cache=False).save(out)
    assert re.search(
        r"repairs stopped after \d+ s: another round \(the last took \d+ s\) would end past "
        r"repair_time=0\.5 times the first compose and proof \(\d+ s\)\. Tried: nothing yet\.",
        str(raised.value),
    ), str(raised.value)
    assert "does not match its subgraph" in str(raised.value)
    assert not out.exists()


def test_a_small_models_repairs_are_not_decided_by_the_machines_load():
    # Seen in CI: a 1 s first compose, its repair round 1.5 s on a busy machine, and the
    # next round was refused (2.4 + 1.4 > 4 x 0.6) with the program unrepaired. The first
    # compose counts as SHORTEST_COMPOSE seconds at least.
    assert proven.round_fits(spent=2.4, last_round=1.4, first_compose=0.6, repair_time=3)
    assert proven.round_fits(spent=4.6, last_round=4.6, first_compose=4.6, repair_time=1)
    # a large model's budget is its own compose's: convnext_small's 1116 s of 747 allowed
    assert not proven.round_fits(spent=700, last_round=100, first_compose=187, repair_time=3)
    assert not proven.round_fits(spent=30, last_round=15, first_compose=12, repair_time=1)


class HalvedCumsum(torch.nn.Module):
    """A partition reading a size derived from the input's, ``(h + 1)//2``: the slice and the
    cumsum stay off XNNPACK, the linear after them is its delegate."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cumsum(x[:, ::2], dim=1))


def test_a_delegate_reading_a_derived_size_is_judged_not_refused(xnnpack_one_percent_high):
    # torch's input check of the delegate's subgraph cannot invert (h + 1)//2 and refused
    # every size: the culprit search blamed the delegate for "cannot run at this size"
    # (convnext_small in ExecuTorch's model tests, wrongly, at every round of repairs).
    h = torch.export.Dim("h", min=4, max=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", composer.ComposerWarning)
        composition = composer.compose(
            HalvedCumsum(), "xnnpack", (torch.randn(1, 20, 16),),
            dynamic_shapes={"x": {1: h}}, cache=False,
        )  # fmt: skip
    (repair,) = composition.plan.repairs
    assert repair.why.startswith("does not match its subgraph"), repair.why
    assert "against fp64" in repair.why
    assert composition.plan.proof.startswith("ran and matched eager at 4 sizes")


def test_strict_placement_writes_nothing_that_misses(xnnpack_one_percent_high, tmp_path):
    model, inputs = wide()
    out = tmp_path / "wide.pte"
    with pytest.raises(ComposerError, match="does not match eager: .*against fp64, eager"):
        composition = composer.compose(
            model, composer.Stack(["xnnpack"], placement="strict"), inputs, cache=False
        )
        composition.save(out)
    assert not out.exists()


class HalfPack:
    """XNNPACK declared as computing in bf16: how OpenVINO is declared on CPUs with bf16 units,
    so the bf16 path of the proof runs on every CPU."""

    spec = BackendSpec(
        "halfpack",
        "XnnpackBackend",
        tolerance=Tolerance(
            0, 0, reason="a test backend said to compute in bf16", precision="bfloat16"
        ),
    )

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_partitioner(self, backend, program):
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()


def test_a_backend_computing_in_bf16_is_held_to_eager_in_bf16_and_the_plan_says_so():
    from plugins_for_tests import registry_with

    model, inputs = wide()
    composition = composer.compose(model, "halfpack", inputs, registry=registry_with(HalfPack()),
                                   cache=False)  # fmt: skip
    plan = composition.plan
    assert plan.computes_in() == "bfloat16"
    assert "eager bfloat16" in plan.proof
    assert "precision halfpack: judged against eager in bfloat16" in summary_table(plan)
    assert plan.to_dict()["tolerances"]["halfpack"]["precision"] == "bfloat16"


class CarefulPack(HalfPack):
    """XNNPACK declaring a safer option, as the cuda plugin declares triton_kernel_mode=OFF."""

    spec = BackendSpec("carefulpack", "XnnpackBackend", safer_options={"kernels": "plain"})

    @hookimpl
    def composer_options(self, backend):
        from composer.contract.options import Option

        return [Option("kernels", choices=("fast", "plain"), default="fast", help="kernels")]


def _careful_wide(plugin: CarefulPack) -> tuple[composer.Plan, list[str]]:
    """``wide()`` composed with ``plugin`` alone: its plan, and the progress said."""
    from plugins_for_tests import registry_with

    model, inputs = wide()  # no attention
    progress: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", composer.ComposerWarning)
        composition = composer.compose(model, "carefulpack", inputs, cache=False,
                                       registry=registry_with(plugin),
                                       progress=progress.append)  # fmt: skip
    return composition.plan, progress


def test_a_backends_safer_options_are_tried_before_its_nodes_move(xnnpack_one_percent_high):
    plan, progress = _careful_wide(CarefulPack())
    repairs = plan.repairs
    # the option changes nothing here (the fault is in every XNNPACK delegate), so the nodes
    # move after it was tried
    assert [r.options for r in repairs] == [{"kernels": "plain"}, None]
    assert any("trying carefulpack with kernels=plain" in line for line in progress)
    assert "tried kernels=plain" in summary_table(plan)
    assert plan.nodes_on("carefulpack") == []


class CarefulAboutAttention(CarefulPack):
    """CarefulPack, its safer option changing attention alone (the cuda plugin's Triton)."""

    spec = BackendSpec(
        "carefulpack", "XnnpackBackend", safer_options={"kernels": "plain"},
        safer_for=("aten.scaled_dot_product_attention.default",),
    )  # fmt: skip


def test_a_wrong_delegate_the_safer_options_cannot_change_moves_at_once(xnnpack_one_percent_high):
    plan, progress = _careful_wide(CarefulAboutAttention())  # the option changes no delegate
    assert [r.options for r in plan.repairs] == [None]
    assert not any("trying carefulpack" in line for line in progress)
    assert plan.nodes_on("carefulpack") == []


class WritesItsDtype(torch.nn.Module):
    """``.to(torch.float32)`` and an ``arange`` in float32: the exported graph names the dtype
    (``_to_copy``, ``_assert_tensor_metadata``), as export_llama's decoder does."""

    def forward(self, x):
        steps = torch.arange(x.shape[-1], dtype=torch.float32)
        return x.to(torch.float32) / 3 + steps / 7


def test_the_truth_of_an_exported_graph_that_names_its_dtype_is_still_float64():
    x = torch.randn(2, 5)
    graph = torch.export.export(WritesItsDtype(), (x,)).module()
    true, name = truth(graph, (x,))
    assert name == "fp64" and true.dtype == torch.float64
    expected = x.double() / 3 + torch.arange(5, dtype=torch.float64) / 7
    assert torch.equal(true, expected)


class TakesKeywords(torch.nn.Module):
    def forward(self, *, x):
        return WritesItsDtype()(x)


def test_a_program_exported_with_keyword_inputs_is_judged_against_float64():
    # optimum exports its decoders with keyword inputs (input_ids=, cache_position=): their
    # graph sits in a wrapper taking the leaves, and its written dtypes were left as float32,
    # so the fp64 copy failed ("Tensor dtype mismatch") and the proof held them to eager.
    program = torch.export.export(TakesKeywords(), (), {"x": torch.randn(2, 5)})
    composition = composer.compose(program, "xnnpack", cache=False)
    assert "against fp64" in composition.plan.proof, composition.plan.proof


class Bf16Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def test_a_bf16_program_whose_error_builds_up_on_portable_kernels_computes_them_in_float32():
    # XNNPACK (1.5.1) takes no bf16 linear: plain ExecuTorch's program runs on portable
    # kernels, which accumulate in bf16, at about 6x eager's error against fp64 (composer
    # refused it, "the error is in the 12 ops left to ExecuTorch's portable kernels"). No
    # delegate is to blame; the repair computes those ops in float32 (a bf16
    # transposed convolution CUDA declines lands there too; tests/test_widened.py).
    torch.manual_seed(0)
    model = Bf16Mlp().eval().to(torch.bfloat16)
    inputs = (torch.randn(8, 256).to(torch.bfloat16),)
    said: list[str] = []
    composition = composer.compose(model, "xnnpack", inputs, cache=False, progress=said.append)
    proof = composition.plan.proof
    assert proof.endswith("repaired: the ops on portable kernels computed in float32"), proof
    assert any("computing them in float32, composing again" in line for line in said), said
    rmse, eager = (
        float(x) for x in re.findall(r"rmse ([0-9.e-]+) against fp64, eager ([0-9.e-]+)", proof)[0]
    )
    assert rmse <= eager * 1.01, proof  # each op in float32, rounded as eager rounds it
    (out,) = run_program(composition.buffer, list(inputs))
    assert out.dtype == torch.bfloat16  # the program's outputs keep the model's dtype
    assert Stack.of("xnnpack", widen_portable=True).settings()["widen_portable"] is True
    assert "widen_portable" not in Stack.of("xnnpack").settings()  # other cache keys stay


class MaxWithIndices(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool1d(x, 2, return_indices=True)


def test_a_bf16_backend_is_held_to_eager_integers_not_to_bf16_ties():
    """ExecuTorch's suite through composer: eager in bf16 rounds 1.0 and 1.001 to
    one value and picks the first index, where float32 (and OpenVINO) pick the second; the proof
    then moved a right max-pool off OpenVINO ("integer outputs differ by 63")."""
    module, x = MaxWithIndices(), torch.tensor([[[1.0, 1.001, 3.0, 2.0]]])
    eager = module(x)
    held_to, precision = eager_in_precision(module, (x,), eager, "bfloat16")
    assert precision == "bfloat16"
    assert torch.equal(held_to[1], eager[1]) and held_to[1].tolist() == [[[1, 2]]]
    assert held_to[0].tolist() != eager[0].tolist()  # the values are bf16 eager's
