"""On the GPU: the dynamic bf16 programs plain ExecuTorch lowers (a derived dim) or
fails on (``xnnpack,cuda`` on an encoder; Inductor's NoValidChoicesError on a dilated or a
transposed convolution) are composed and proven at every size, in ExecuTorch's C++
runtime where $COMPOSER_ET_RUNNER names it (bench/et_runtime)."""

from __future__ import annotations

import os

import pytest
import torch
from test_widened import Decoder  # a transposed 1-D convolution, which cuda declines
from torch.export import Dim

import composer
from composer.run import cpp_runtime
from composer.run.inputs import sizes_to_prove

ET_RUNNER = os.environ.get("COMPOSER_ET_RUNNER")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.version.cuda is None or not torch.cuda.is_available(), reason="needs a CUDA GPU"
    ),
]


class Frames(torch.nn.Module):
    """Two strided convolutions over 4 * n frames, then a Linear per frame."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv1d(16, 32, 3, stride=2, padding=1)
        self.second = torch.nn.Conv1d(32, 32, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.second(torch.relu(self.first(x))))
        return self.head(hidden.transpose(1, 2))


class Tcn(torch.nn.Module):
    """Plain, dilated and depthwise 1-D convolutions: Inductor's Triton templates take no
    dilation, so those two leave cuda and the rest stays."""

    def __init__(self) -> None:
        super().__init__()
        conv = torch.nn.Conv1d
        self.convs = torch.nn.Sequential(
            conv(80, 64, 3, padding=1), torch.nn.GELU(),
            conv(64, 64, 3, dilation=2, padding=2), torch.nn.GELU(),
            conv(64, 64, 3, dilation=4, padding=4), torch.nn.GELU(),
            conv(64, 64, 5, groups=64, padding=2), torch.nn.GELU(), conv(64, 32, 1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


def _encoder():
    layer = torch.nn.TransformerEncoderLayer(256, 8, 512, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, 4)


CASES = {
    "derived_cuda": (Frames, (1, 16, 64), {2: 4 * Dim("n", min=2, max=64)}, "cuda"),
    "encoder_xnnpack_cuda": (_encoder, (1, 16, 256), {1: Dim("seq", min=2, max=256)},
                             "xnnpack,cuda"),
    "tcn_cuda": (Tcn, (1, 80, 64), {2: Dim("length", min=16, max=512)}, "cuda"),
    "decoder_cuda": (Decoder, (1, 64, 50), {2: Dim("length", min=8, max=400)}, "cuda"),
}  # fmt: skip
# What else each case's plan must say.
PROOF_ENDS = {"decoder_cuda": "repaired: the ops on portable kernels computed in float32"}
FALLBACK_SAYS = {"tcn_cuda": "AOTInductor's Triton convolution templates take no dilation"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dynamic_bf16_program_is_proven_at_every_size(case, monkeypatch):
    make, shape, dims, stack = CASES[case]
    if ET_RUNNER:
        monkeypatch.setenv(cpp_runtime.RUNNER_VARIABLE, ET_RUNNER)
    torch.manual_seed(0)
    model = make().eval().to(torch.bfloat16)
    inputs = (torch.randn(*shape, dtype=torch.bfloat16),)
    composition = composer.compose(model, stack, inputs, dynamic_shapes=(dims,), cache=False)
    assert composition.plan.proof.startswith("ran and matched eager at"), composition.plan.proof
    assert composition.plan.ops_on("cuda")
    assert composition.plan.proof.endswith(PROOF_ENDS.get(case, "")), composition.plan.proof
    if case in FALLBACK_SAYS:
        said = [why for f in composition.plan.fallbacks for _, why in f.reasons]
        assert FALLBACK_SAYS[case] in said, said
    for label, sized in sizes_to_prove(composition.example_inputs, composition.plan.dynamic_dims):
        result = composition.verify(sized)
        print(f"{case} {label}: {result}")
        assert result.ok, f"{label}: {result}"
        if ET_RUNNER:
            assert result.executor == cpp_runtime.EXECUTOR
