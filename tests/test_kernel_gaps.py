"""Ops the portable kernels refuse, rewritten before partitioning so the program runs."""

from __future__ import annotations

import pytest
import torch
from eager_check import assert_runs_like_eager
from executorch.exir import to_edge

import composer
from composer.contract.errors import ComposerError
from composer.run.runtime import run_program, torch_mismatch


class TimeShift(torch.nn.Module):
    """RWKV's token shift (``nn.ZeroPad2d((0, 0, 1, -1))``: one row in, the last out) and a
    crop of both sides of the last dimension (``F.pad`` with negative pads)."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        cropped = torch.nn.functional.pad(x, (-1, 2, 0, -1))  # 8 -> 9 wide, 5 -> 4 long
        return self.linear(self.shift(x)) - cropped[..., :8].sum(dim=1, keepdim=True)


INPUTS = (torch.randn(1, 5, 8),)


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
def test_a_negative_pad_composes_into_a_program_that_runs_and_matches(stack):
    if "openvino" in stack:
        pytest.importorskip("openvino")
    composition = composer.compose(TimeShift().eval(), stack, INPUTS, cache=False)
    assert composition.plan.proof.startswith("ran and matched eager")
    assert "aten.constant_pad_nd.default" not in [f.op for f in composition.plan.fallbacks]
    assert_runs_like_eager(composition)


def test_a_kernel_that_fails_is_named_with_its_reason_in_the_error():
    # Plain ExecuTorch keeps the negative pad: its portable kernel refuses it at run time.
    if torch_mismatch():
        pytest.skip(torch_mismatch())
    program = to_edge(torch.export.export(TimeShift().eval(), INPUTS)).to_executorch()
    with pytest.raises(ComposerError) as failed:
        run_program(program.buffer, INPUTS)
    message = str(failed.value)
    assert "in operator aten::constant_pad_nd.out: 0x12" in message
    assert "Padding values must be non-negative" in message
    assert "with type id" not in message
