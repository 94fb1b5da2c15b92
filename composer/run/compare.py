"""Comparing a program's outputs with eager's: the tolerance per dtype, or a looser backend's."""

from __future__ import annotations

import math

import torch
import torch.utils._pytree as pytree

from composer.contract.backend_spec import Tolerance


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for comparing with eager: looser for the half types."""
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype.is_floating_point:
        return 1e-4, 1e-4
    return 0.0, 0.0


def flatten_tensors(value) -> list[torch.Tensor]:
    """The tensors of a (nested) output, in order, as torch.export flattens them: eager's
    tuples, lists, dicts and model-output classes against the runtime's flat list."""
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def compare(actual, expected, tolerance: Tolerance | None = None) -> tuple[bool, float]:
    """(all close within the dtype's tolerance or a looser backend's, largest difference)."""
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
        if tolerance is not None and want.dtype.is_floating_point:
            atol, rtol = max(atol, tolerance.atol), max(rtol, tolerance.rtol)
            if tolerance.of_largest and want.numel():
                largest = want.detach().abs().nan_to_num(0.0).max().item()
                atol = max(atol, tolerance.of_largest * largest)
        # NaN where eager has NaN is what eager computes (a model with uninitialized weights:
        # export_llama without a checkpoint); NaN elsewhere, or none where eager has one, is not.
        both_nan = got.isnan() & want.isnan() if want.is_floating_point() else None
        if want.numel():
            difference = (got.double() - want.double()).abs()
            if both_nan is not None:
                difference = difference.masked_fill(both_nan, 0.0)
            largest = difference.max().item()
            worst = float("nan") if math.isnan(largest) else max(worst, largest)
        ok = ok and torch.allclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    return ok, worst
