"""bf16 ops left to ExecuTorch's portable kernels, computed in float32 (composer.lower.widened):
the proof's repair where the error builds up outside every delegate."""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim

import composer
from composer.run.inputs import sizes_to_prove


class Decoder(nn.Module):
    """A transposed 1-D convolution between two others: the cuda plugin declines the transposed
    one (Inductor has no Triton template for it), so on the GPU it runs on portable kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Sequential(
            nn.Conv1d(64, 64, 3, padding=1), nn.GELU(),
            nn.ConvTranspose1d(64, 32, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv1d(32, 16, 3, padding=1),
        )  # fmt: skip

    def forward(self, x):
        return self.up(x)


def test_a_dynamic_bf16_decoder_on_portable_kernels_is_proven_at_every_length():
    """XNNPACK takes no bf16 convolution, so all of it is left to portable kernels: 6x eager's
    error at the example (the H100's `cuda` stack refused it the same way). Computed in float32
    and rounded as eager rounds, it matches eager, and at the largest length too: the retrace
    had narrowed the length's range to 8..320, and the program refused 400."""
    torch.manual_seed(0)
    model = Decoder().eval().to(torch.bfloat16)
    inputs = (torch.randn(1, 64, 50, dtype=torch.bfloat16),)
    shapes = ({2: Dim("length", min=8, max=400)},)
    said: list[str] = []
    composition = composer.compose(
        model, "xnnpack", inputs, dynamic_shapes=shapes, cache=False, progress=said.append
    )
    proof = composition.plan.proof
    assert "at 4 sizes" in proof and "max (length=400)" in proof, proof
    assert proof.endswith("repaired: the ops on portable kernels computed in float32"), proof
    assert any("op(s) on portable kernels computed in float32" in line for line in said), said
    for label, sized in sizes_to_prove(composition.example_inputs, composition.plan.dynamic_dims):
        result = composition.verify(sized)
        # At most a step of bf16 at the outputs' size (below 1): a float32 sum rounded to bf16
        # lands a step off eager's where another CPU's kernels sum in another order (0.00195,
        # 2**-9, at length 204 on 2026-11-28's AVX2 machine; under 1e-3 on an AVX-512 one).
        assert result.ok and result.max_abs_error <= 2**-8, (label, str(result))


def test_a_float32_program_is_not_widened():
    torch.manual_seed(0)
    model, inputs = Decoder().eval(), (torch.randn(1, 64, 20),)
    composition = composer.compose(
        model, composer.Stack.of("xnnpack", widen_portable=True), inputs, cache=False
    )
    assert "float32" not in composition.plan.proof
    assert "dim_order_ops._to_dim_order_copy.default" not in composition.plan.ops_on("portable")
