"""Property tests: random models over random stacks compose, stay convex and match eager."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

import composer
from composer.models.strategies import models, stacks
from composer.testing import check_convex

SHIPPED = ["tensorrt_stub", "xnnpack"]
FAST = settings(max_examples=12, deadline=None)
LONG = settings(max_examples=300, deadline=None)


def compose_and_check(model, stack):
    composition = composer.compose(model, stack, model.example_inputs)
    check_convex(composition.plan, composition.edge)
    result = composition.verify()
    assert result.ok, (model, stack, result)


@FAST
@given(model=models(), stack=stacks(SHIPPED))
def test_random_models_match_eager_and_stay_convex(model, stack):
    compose_and_check(model, stack)


@pytest.mark.slow
@LONG
@given(model=models(max_steps=30), stack=stacks(SHIPPED))
def test_random_models_long_run(model, stack):
    compose_and_check(model, stack)
