"""A program's outputs beside eager's alone, without a truth: the figure benchmarks print and
the check a backend's standalone run gets (the proof judges by composer.run.accuracy)."""

from __future__ import annotations

import math

import torch

from composer.contract.backend_spec import Tolerance
from composer.run.accuracy import default_tolerance, flatten_tensors

__all__ = ["compare", "default_tolerance", "flatten_tensors"]


def compare(actual, expected, tolerance: Tolerance | None = None) -> tuple[bool, float]:
    """(all close within the dtype's default tolerance, largest difference); integer outputs
    within ``tolerance.steps``."""
    actual, expected = flatten_tensors(actual), flatten_tensors(expected)
    if len(actual) != len(expected):
        return False, float("inf")
    worst, ok = 0.0, True
    for got, want in zip(actual, expected):
        if got.shape != want.shape:
            return False, float("inf")
        got = got.to(want.dtype)
        atol, rtol = default_tolerance(want.dtype)
        if tolerance is not None and not want.dtype.is_floating_point:
            atol = max(atol, tolerance.steps)
        if want.numel():
            difference = (got.double() - want.double()).abs()
            if want.is_floating_point():
                # The same NaN or inf as eager's is what eager computes (assert_close's
                # equal_nan); elsewhere it is an error
                same = ~want.isfinite() & ((got == want) | (got.isnan() & want.isnan()))
                difference = difference.masked_fill(same, 0.0)
            largest = difference.max().item()
            worst = largest if math.isnan(largest) else max(worst, largest)
        ok = ok and torch.allclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    return ok, worst
