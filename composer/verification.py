"""Checking a composed program against eager: which executor runs it, and the tolerance.

Executors, best first: the ExecuTorch runtime, when it has every delegate's backend (XNNPACK,
OpenVINO and portable kernels in the pip wheel); on a CUDA GPU, each ``CudaBackend``
delegate's compiled AOTInductor ``.so`` hosted by libtorch with the rest as the Python
reference; otherwise the Python reference alone, where each delegate runs the subgraph it
was made from (that checks the wiring, not the backend's code).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from composer.backend_spec import Tolerance

if TYPE_CHECKING:
    from composer.composition import Composition

RUNTIME = "executorch runtime"
REFERENCE = "python reference"


@attrs.frozen
class Verification:
    """How the composed program compared with eager, and which executor ran it."""

    executor: str  # RUNTIME, REFERENCE or aoti_host.EXECUTOR
    max_abs_error: float
    ok: bool
    reason: str  # why this executor was chosen
    tolerance: Tolerance | None = None  # a backend's, when looser than the dtype's default

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "MISMATCH"
        within = ""
        if self.tolerance is not None:
            within = f", within atol {self.tolerance.atol:g} rtol {self.tolerance.rtol:g}"
            within += f" ({self.tolerance.reason})" if self.tolerance.reason else ""
        return (
            f"{verdict}: max |composed - eager| = {self.max_abs_error:.3g}{within} "
            f"({self.executor}; {self.reason})"
        )


def verify(composition: Composition, inputs: Sequence[Any] | None = None) -> Verification:
    """Run ``composition`` with the best executor here and compare it with eager."""
    inputs = tuple(composition.example_inputs if inputs is None else inputs)
    with torch.no_grad():
        # Copies, so that models updating buffers in place start from the same state as
        # the freshly loaded program, however often verify is called.
        expected = copy.deepcopy(composition.eager)(*inputs)
        executor, reason, run = _executor(composition)
        actual = run(inputs)
    tolerance = composition.plan.tolerance()
    ok, worst = compare(actual, expected, tolerance)
    return Verification(executor, worst, ok, reason, tolerance)


def _executor(composition: Composition):
    """(executor name, why it was chosen, a function running the program on inputs)."""
    from composer import aoti_host
    from composer.runtime import run_program, torch_mismatch

    can_run, reason = composition.runtime_can_run()
    if can_run:
        return RUNTIME, reason, lambda inputs: run_program(composition.buffer, inputs)
    has_cuda = aoti_host.CUDA_BACKEND_ID in composition.delegate_backend_ids()
    if has_cuda or torch_mismatch():
        unavailable = aoti_host.host_unavailable_reason() if has_cuda else None
        if unavailable is None:
            why = (f"{reason}: CudaBackend delegates ran as their compiled .so, those of "
                   "backends the runtime has as programs of their own there, any other as "
                   "its subgraph")  # fmt: skip
            # A fresh module per verify: it holds the loaded .so and its own buffer state.
            module = aoti_host.aoti_hosted(composition)
            elsewhere = sorted({name for _, name in module.meta["in_runtime"]} - {"executorch"})
            if elsewhere:
                why += f" (in {', '.join(elsewhere)})"
            in_python = module.meta["in_python"]
            if in_python:
                why += f" ({len(in_python)} ran as subgraphs: {in_python[0][1]})"
            return aoti_host.EXECUTOR, why, lambda inputs: module(*inputs)
        reason = f"{reason}, and the CUDA delegates' .so cannot run here: {unavailable}"
    return REFERENCE, reason, lambda inputs: copy.deepcopy(composition.reference)(*inputs)


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for comparing with eager: looser for the half types."""
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype.is_floating_point:
        return 1e-4, 1e-4
    return 0.0, 0.0


def flatten_tensors(value) -> list[torch.Tensor]:
    """The tensors of a (nested) output, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in flatten_tensors(item)]
    return []


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
