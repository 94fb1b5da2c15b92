"""Ops a backend asks to keep whole that then no backend takes: what becomes of them.

XNNPACK keeps ``aten.max_pool2d`` whole (under a filter), and ExecuTorch has no out variant
for it: left undelegated it fails ``to_executorch`` with "Missing out variants". composer
decomposes such a node (to ``max_pool2d_with_indices``, which portable kernels run) and
lowers again.
"""

from __future__ import annotations

import pytest
import torch
from eager_check import assert_runs_like_eager
from torch import nn

import composer


class ConvPoolLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8 * 3 * 3, 4)

    def forward(self, x):
        y = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(y.flatten(1))


class ScaledPool(nn.Module):
    """A non-persistent buffer, which OpenVINO's lowering deletes from the program it gets."""

    def __init__(self) -> None:
        super().__init__()
        scale = torch.linspace(0.5, 1.5, 8).view(1, 8, 1, 1)
        self.register_buffer("scale", scale, persistent=False)
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return nn.functional.max_pool2d(torch.relu(self.conv(x)) * self.scale, 2)


@pytest.mark.parametrize(
    "stack",
    [
        composer.Stack(["xnnpack"], never={"xnnpack": ["node:aten_max_pool2d_default"]}),
        composer.Stack(["xnnpack"], never={"xnnpack": ["aten.max_pool2d.default"]}),
        composer.Stack(["xnnpack"], min_partition_size={"xnnpack": 50}),
    ],
    ids=["node-pin", "op-pin", "min-size"],
)
def test_a_max_pool_xnnpack_leaves_is_decomposed_for_portable_kernels(stack):
    composition = composer.compose(ConvPoolLinear().eval(), stack,
                                   (torch.randn(1, 3, 8, 8),), cache=False)  # fmt: skip
    portable = composition.plan.ops_on("portable")
    assert portable["aten.max_pool2d_with_indices.default"] == 1
    assert "aten.max_pool2d.default" not in portable
    assert_runs_like_eager(composition)


def test_lowering_again_starts_from_a_program_no_backend_changed():
    """OpenVINO lowers first, then XNNPACK leaves a max_pool2d whole: the second attempt
    must not get the program OpenVINO's lowering took the buffer from (KeyError: 'scale')."""
    pytest.importorskip("openvino")
    pool = ["aten.max_pool2d.default", "aten.max_pool2d_with_indices.default"]
    stack = composer.Stack(
        ["openvino", "xnnpack"],
        never={"openvino": pool, "xnnpack": ["aten.max_pool2d.default"]},
    )
    said: list[str] = []
    composition = composer.compose(ScaledPool().eval(), stack, (torch.randn(1, 3, 8, 8),),
                                   cache=False, progress=said.append)  # fmt: skip
    assert any(line.startswith("decomposing aten_max_pool2d_default") for line in said)
    assert composition.plan.ops_on("openvino")["aten.mul.Tensor"] == 1
    assert dict(composition.plan.ops_on("portable")) == {"aten.max_pool2d_with_indices.default": 1}
    assert_runs_like_eager(composition)


def test_an_op_kept_whole_that_the_target_runtime_has_no_kernel_for_is_decomposed(monkeypatch):
    """XNNPACK keeps ``aten.linear`` whole; pinned off it, the linear has an out variant and
    the pip runtime a kernel for it, so it stays whole. A runtime without that kernel
    (bench/et_runtime's runner links the portable kernels alone: no ``aten::linear.out``;
    ``$COMPOSER_ET_RUNNER --list-kernels`` says so) would fail to load the program with error
    20, so for it the linear is decomposed into ops it has."""
    from executorch.extension.pybindings import portable_lib

    import composer.lower.priority

    stack = composer.Stack(["xnnpack"], never={"xnnpack": ["aten.linear.default"]})
    inputs = (torch.randn(1, 3, 8, 8),)
    kept = composer.compose(ConvPoolLinear().eval(), stack, inputs, cache=False)
    assert kept.plan.ops_on("portable")["aten.linear.default"] == 1

    without_linear = frozenset(portable_lib._get_operator_names()) - {"aten::linear.out"}
    monkeypatch.setattr(composer.lower.priority, "target_kernels", lambda: without_linear)
    said: list[str] = []
    composition = composer.compose(ConvPoolLinear().eval(), stack, inputs, cache=False,
                                   progress=said.append)  # fmt: skip
    portable = composition.plan.ops_on("portable")
    assert "aten.linear.default" not in portable
    assert portable.keys() & {"aten.addmm.default", "aten.mm.default"}
    assert any(line.startswith("decomposing aten_linear_default") for line in said)
    assert_runs_like_eager(composition)
