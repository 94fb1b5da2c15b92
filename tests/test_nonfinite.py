"""NaN and inf in the proof (composer.run.accuracy): compared as
``torch.testing.assert_close(equal_nan=True)`` compares them, counted in the verdict, never a
match where nothing was compared, and never a reason to move a delegate when the example input
holds them."""

from __future__ import annotations

import warnings

import pytest
import torch

import composer
from composer import ComposerWarning
from composer.models import zoo
from composer.run.accuracy import judge

NAN, INF = float("nan"), float("inf")


class Two(torch.nn.Module):
    """Two linears: a NaN anywhere in the first's weight reaches every output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def two(nan_weight: bool) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = Two().eval()
    if nan_weight:
        with torch.no_grad():
            model.a.weight[0, 0] = NAN
    return model, (torch.randn(2, 4),)


def composed(model, stack, inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ComposerWarning)
        composition = composer.compose(model, stack, inputs, cache=False)
    said = [str(w.message) for w in caught if issubclass(w.category, ComposerWarning)]
    return composition, said


def test_a_program_whose_every_output_is_nan_in_fp64_too_is_not_called_a_match():
    # Before: "ran and matched eager ...: rmse 0 against fp64, eager 0" with 16 of 16 NaN.
    model, inputs = two(nan_weight=True)
    assert bool(model(*inputs).isnan().all())
    composition, said = composed(model, ["xnnpack"], inputs)
    proof = composition.plan.proof
    assert "matched" not in proof, proof
    assert "nothing was compared: every output element is NaN in fp64 too" in proof, proof
    assert "a NaN weight" in proof, proof
    # the plan is not the only place it shows: a warning says the program is not proven
    assert any(line.startswith("the composed program is not proven:") for line in said), said
    # what runs where is what the finite model gets: the NaN moved nothing
    planned = composer.plan(*two(nan_weight=False)[:1], ["xnnpack"], inputs, cache=False)
    assert composition.plan.node_backends == planned.node_backends
    assert not composition.plan.repairs


def test_an_inf_in_the_example_input_moves_no_openvino_node():
    # Before: "max error nan ... allowed nan", and all 8 OpenVINO nodes moved to XNNPACK.
    # OpenVINO computes numbers for the row holding the inf, where eager computes NaN.
    model, (x,) = zoo.load("mlp")
    held = x.clone()
    held[0, 0] = INF
    composition, _ = composed(model, ["openvino", "xnnpack"], (held,))
    planned = composer.plan(model, ["openvino", "xnnpack"], (x,), cache=False)
    assert composition.plan.node_backends == planned.node_backends
    assert set(planned.node_backends.values()) == {"openvino"}
    assert not composition.plan.repairs, composition.plan.repairs
    proof = composition.plan.proof
    assert proof.startswith("ran and matched eager"), proof
    assert "nan" not in proof.replace("NaN", ""), proof  # no "rmse nan ... allowed nan"
    assert "8 of 32 output elements NaN in fp64 too, not compared" in proof, proof
    assert "the program's differ at 8 of them: the inputs hold NaN or inf" in proof, proof


def test_nan_and_inf_compare_as_assert_close_compares_them():
    eager = torch.tensor([1.0, NAN, INF, -INF, 2.0])
    same = judge(eager.clone(), eager, eager.double())
    assert same.ok
    assert same.describe() == (
        "rmse 0 against fp64, eager 0, allowed 1e-05; 3 of 5 output elements NaN or inf in "
        "fp64 too, not compared"
    )
    torch.testing.assert_close(eager.clone(), eager, equal_nan=True)  # the anchor agrees
    for position, value, said in [
        (1, 0.0, "of 5 output elements, 1 number(s) where eager's are NaN or inf"),
        (2, -INF, "of 5 output elements, 1 NaN or inf unlike eager's"),  # the sign of an inf
        (0, NAN, "of 5 output elements, 1 NaN or inf where eager computes a number"),
    ]:
        program = eager.clone()
        program[position] = value
        verdict = judge(program, eager, eager.double())
        assert not verdict.ok and verdict.describe() == said, (value, verdict.describe())
    # where the inputs held NaN or inf, what the program makes of them where the reference
    # is no number either is not judged; a NaN where the reference is a number still is
    program = eager.clone()
    program[1] = 0.0
    assert judge(program, eager, eager.double(), inputs_nonfinite=True).ok
    program[0] = NAN
    assert not judge(program, eager, eager.double(), inputs_nonfinite=True).ok


def test_errors_are_measured_over_the_finite_elements_only():
    torch.manual_seed(0)
    true = torch.randn(64, dtype=torch.float64)
    eager = true.float()
    program = eager * 1.01  # 1% off: a miss
    eager[:32], program[:32], true[:32] = NAN, NAN, NAN
    verdict = judge(program, eager, true)
    assert not verdict.ok
    output = verdict.outputs[0]
    assert (output.compared, output.not_compared) == (32, 32)
    # the RMSE of the 32 numbers, not diluted by 32 NaN counted as agreeing zeros
    finite = (program[32:].double() - true[32:]).square().mean().sqrt().item()
    assert output.program_error == pytest.approx(finite, rel=1e-9)
    assert verdict.describe().startswith(f"rmse {finite:.3g} against fp64"), verdict.describe()


def test_an_all_nan_program_against_a_finite_reference_is_a_mismatch():
    eager = torch.ones(8)
    verdict = judge(torch.full((8,), NAN), eager, eager.double())
    assert not verdict.ok and not verdict.nothing_compared
    assert verdict.describe() == "of 8 output elements, 8 NaN or inf where eager computes a number"
