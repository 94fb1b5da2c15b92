"""PT2E-quantized programs compose where plain ExecuTorch lowers them, and the proof holds
integer kernels to the quantized model's own precision, said in the plan."""

from __future__ import annotations

import pytest
import torch

import composer
from composer import corpus


@pytest.fixture(scope="module")
def quantized_resnet18() -> torch.export.ExportedProgram:
    return corpus.quantized("resnet18")


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
def test_quantized_resnet18_composes_whole_on_xnnpack_and_runs(quantized_resnet18, stack):
    composition = composer.compose(quantized_resnet18, stack, cache=False)

    plan = composition.plan
    assert plan.proof.startswith("ran and matched eager")
    assert plan.nodes_on("portable") == []
    assert plan.ops_on("xnnpack")["quantized_decomposed.dequantize_per_tensor.default"] > 0
    # The tolerance says where it comes from: the output's quantization scale.
    assert plan.quantization is not None
    assert "steps of the output's scale" in plan.quantization.reason
    assert "tolerance quantized" in plan.summary_table()
    verification = composition.verify()
    assert verification.ok and verification.max_abs_error <= plan.quantization.atol
    if stack.startswith("openvino"):
        (repair,) = plan.repairs
        assert repair["why"].startswith("failed to lower: OpConversionFailure")
        assert "compiled with: openvino" not in plan.summary_table()
