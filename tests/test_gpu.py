"""Real CUDA lowering; runs only where a CUDA GPU and a CUDA build of torch are present."""

from __future__ import annotations

import pytest
import torch

import composer
from composer import zoo

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.version.cuda is None or not torch.cuda.is_available(), reason="needs a CUDA GPU"
    ),
]


@pytest.mark.parametrize("stack", [["cuda"], ["xnnpack", "cuda"]], ids=",".join)
def test_cuda_lowering_is_real_and_wired_right(stack):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    from gpu_check import copy_check, numerics, pte_check

    model, inputs = zoo.load("transformer_block")
    composition = composer.compose(model, stack, inputs)
    assert pte_check(composition)["ok"]
    assert copy_check(composition)["ok"]
    assert numerics(composition, model, inputs)["ok"]
