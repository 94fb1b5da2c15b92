"""The check a composed program has to pass: its compiled code, run, computes what eager does."""

from __future__ import annotations

import pytest
import torch

from composer.run.runtime import LoadedProgram, torch_mismatch

# OpenVINO computes in bf16 on CPUs that have it (composer's plan tolerance for it).
OPENVINO_ATOL, OPENVINO_RTOL = 1e-2, 1.6e-2


def assert_runs_like_eager(composition, atol=OPENVINO_ATOL, rtol=OPENVINO_RTOL) -> None:
    """Run ``composition``'s program in the ExecuTorch runtime on its example inputs and
    compare the first output with the eager model's. Skips where the pip runtime does not
    match this torch (the GPU machine's torch 2.11: "tensor does not have a device")."""
    mismatch = torch_mismatch()
    if mismatch is not None:
        pytest.skip(mismatch)
    actual = LoadedProgram(composition.buffer).run(composition.example_inputs)[0]
    with torch.no_grad():
        expected = composition.eager(*composition.example_inputs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
