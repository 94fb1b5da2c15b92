"""ExecuTorch's decomposition of a stack fails before any backend partitions; composer lowers
again with the op kept whole for a later backend decomposed.

XNNPACK's pass before CUDA's, with scaled_dot_product_attention kept whole for CUDA, left a
``view`` of a permuted SDPA output that ExecuTorch's retrace refuses ("Cannot view a tensor
with shape [s, 1, 8, 32] ... as (s, 256)"); plain ExecuTorch's list fails on this model too.
Plan mode runs the same decompositions on any machine (cuda plans with its stand-in).
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import composer
from composer.contract.errors import ComposerError
from composer.lower import priority as lower_in_order_module


def _bf16_encoder() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, 1).eval().to(torch.bfloat16)
    x = torch.randn(1, 16, 64, dtype=torch.bfloat16)
    return torch.export.export(model, (x,), dynamic_shapes=({1: Dim("seq", min=2, max=256)},))


def test_sdpa_kept_for_cuda_after_xnnpack_is_decomposed_when_executorch_cannot_trace_it():
    lines: list[str] = []
    plan = composer.plan(_bf16_encoder(), "xnnpack,cuda", cache=False, progress=lines.append)
    said = [line for line in lines if line.startswith("ExecuTorch's decomposition failed")]
    assert len(said) == 1, lines
    assert "aten.scaled_dot_product_attention.default kept whole" in said[0]
    assert "Cannot view a tensor" in said[0]
    # SDPA's pieces still go to the GPU: nothing is left to portable kernels but sizes.
    on_cuda = plan.ops_on("cuda")
    assert any("bmm" in str(op) or "softmax" in str(op) for op in on_cuda), on_cuda
    assert plan.dynamic_dims[0]["size"] == "seq"


def test_a_decomposition_failure_no_decomposition_fixes_names_what_was_tried(monkeypatch):
    # With no tries allowed, the first failure is the refusal: ExecuTorch named, the dims said.
    monkeypatch.setattr(lower_in_order_module, "MAX_DECOMPOSITION_TRIES", 0)
    with pytest.raises(ComposerError) as raised:
        composer.plan(_bf16_encoder(), "xnnpack,cuda", cache=False)
    message = str(raised.value)
    assert message.startswith("ExecuTorch's to_edge_transform_and_lower failed before any")
    assert "the program's dynamic dims: input 0 dim 1 = seq (seq in [2, 256])" in message
