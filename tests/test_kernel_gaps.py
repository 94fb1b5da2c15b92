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


class PadToWindow(torch.nn.Module):
    """swin_v2_t's pad of its height up to a multiple of the window (7): an amount computed at
    run time, whatever the sign, is left to the kernel."""

    def forward(self, x):
        return torch.nn.functional.pad(torch.relu(x), (0, 0, 0, (7 - x.shape[2] % 7) % 7)) * 2


def test_a_pad_computed_at_run_time_composes_where_plain_runs():
    """The pass that crops negative pads compared the computed pad with 0 and failed
    ("'<' not supported between instances of 'Node' and 'int'"), blamed on ExecuTorch's
    lowering, where plain ExecuTorch's program ran (swin_v2_t in the suite's model tests)."""
    dims = ({2: torch.export.Dim("h", min=2, max=64)},)
    program = torch.export.export(PadToWindow(), (torch.randn(1, 4, 20, 8),), dynamic_shapes=dims)
    composition = composer.compose(program, "xnnpack", cache=False)
    assert composition.plan.proof.startswith("ran and matched eager at 4 sizes")
    x = torch.randn(1, 4, 30, 8)
    (out,) = run_program(composition.buffer, (x,))
    assert out.shape == (1, 4, 35, 8)
    torch.testing.assert_close(out, PadToWindow()(x))
