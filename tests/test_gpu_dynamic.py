"""On the GPU: the dynamic bf16 programs plain ExecuTorch lowers (a derived dim, issue 59) or
fails on (``xnnpack,cuda`` on an encoder, issue 56) are composed and proven at every size, in
ExecuTorch's C++ runtime where $COMPOSER_ET_RUNNER names it (bench/et_runtime)."""

from __future__ import annotations

import os

import pytest
import torch
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


def _encoder():
    layer = torch.nn.TransformerEncoderLayer(256, 8, 512, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, 4)


CASES = {
    "derived_cuda": (Frames, (1, 16, 64), {2: 4 * Dim("n", min=2, max=64)}, "cuda"),
    "encoder_xnnpack_cuda": (_encoder, (1, 16, 256), {1: Dim("seq", min=2, max=256)},
                             "xnnpack,cuda"),
}  # fmt: skip


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
    for label, sized in sizes_to_prove(composition.example_inputs, composition.plan.dynamic_dims):
        result = composition.verify(sized)
        print(f"{case} {label}: {result}")
        assert result.ok, f"{label}: {result}"
        if ET_RUNNER:
            assert result.executor == cpp_runtime.EXECUTOR
