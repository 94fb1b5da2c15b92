"""Every zoo model over several stacks: convex, equal to eager, and pinned by a golden plan.

Refresh the golden plans after an intended change with: pytest tests/test_zoo.py --composer-update-golden
"""

from __future__ import annotations

import pytest

from composer.models import zoo

STACKS = {
    "xnnpack": ["xnnpack"],
    "trt-xnnpack": ["tensorrt_stub", "xnnpack"],
    "xnnpack-trt": ["xnnpack", "tensorrt_stub"],
    "xnnpack-cuda": ["xnnpack", "cuda"],  # planned here, lowered only on a GPU machine
}


# CI time: the largest models' plans with the TensorRT stand-in on either side of XNNPACK
# (lowered, run and checked: 15-35 s each on 2 cores) run in the slow suite (-m slow); the
# default suite composes each of them with XNNPACK and plans it with xnnpack,cuda.
LARGEST = ("llama_block", "llama_decoder", "unet", "unet_bilinear")
SLOW = {(m, s) for m in LARGEST for s in ("trt-xnnpack", "xnnpack-trt")}


@pytest.mark.parametrize(
    ("name", "stack"),
    [
        pytest.param(name, stack, marks=pytest.mark.slow)
        if (name, stack) in SLOW
        else (name, stack)
        for name in sorted(zoo.ZOO)
        for stack in STACKS
    ],
)
def test_zoo_composition(composer_check, name, stack):
    model, inputs = zoo.load(name)
    result = composer_check(model, STACKS[stack], inputs, golden=f"{name}.{stack}")
    assert result.plan.partitions, "some backend takes part of every zoo model"
