"""Comparing a program's outputs with eager's: the tolerance per dtype, or a looser backend's."""

from __future__ import annotations

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
        if tolerance is not None and want.dtype.is_floating_point:
            atol, rtol = max(atol, tolerance.atol), max(rtol, tolerance.rtol)
        if want.numel():
            worst = max(worst, (got.double() - want.double()).abs().max().item())
        ok = ok and torch.allclose(got, want, atol=atol, rtol=rtol)
    return ok, worst
