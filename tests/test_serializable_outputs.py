"""A model that returns torch's structs (``torch.topk``, ``x.max(dim)``, in a dict too) composes.

``to_executorch`` writes the output's pytree spec, and torch has no serialized name for
``torch.return_types``: plain ExecuTorch fails to write such a program. composer writes the
struct as the tuple it is; the runtime returns the fields in order, as it returns any outputs.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

import composer


class TopK(torch.nn.Module):
    def forward(self, x):
        return torch.topk(torch.relu(x) * 2, 3)


class MaxAndMin(torch.nn.Module):
    def forward(self, x):
        return x.max(dim=1), {"low": torch.min(x, dim=0)}


@pytest.mark.parametrize("model", [TopK(), MaxAndMin()], ids=lambda m: type(m).__name__)
def test_a_struct_output_composes_where_plain_cannot_write_it(model):
    inputs = (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)
    program = torch.export.export(model, inputs)
    with pytest.raises(NotImplementedError, match="No registered serialization name"):
        to_edge_transform_and_lower(program).to_executorch()
    composition = composer.compose(model, ["xnnpack"], inputs, cache=False)
    assert "ran and matched eager" in composition.plan.proof, composition.plan.proof
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(composition.buffer).load_method("forward")
    got = method.execute(list(inputs))
    want = torch.utils._pytree.tree_leaves(model(*inputs))
    assert len(got) == len(want)
    for out, expected in zip(got, want, strict=True):
        torch.testing.assert_close(out, expected)
