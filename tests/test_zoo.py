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


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_composition(composer_check, name, stack):
    model, inputs = zoo.load(name)
    result = composer_check(model, STACKS[stack], inputs, golden=f"{name}.{stack}")
    assert result.plan.partitions, "some backend takes part of every zoo model"
