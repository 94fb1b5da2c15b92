"""ExecuTorch's own C++ runtime as an executor (composer.run.cpp_runtime): its tensor file
format and how it is named. Running it needs the runner built on the GPU machine
(bench/et_runtime), where tests/test_gpu.py runs composer's CUDA programs in it."""

from __future__ import annotations

import os

import pytest
import torch

from composer import ComposerError
from composer.run import cpp_runtime


def test_tensors_round_trip_through_the_runners_file_format(tmp_path):
    tensors = [torch.randn(2, 3), torch.arange(5), torch.ones(0, 4), torch.tensor([True, False]),
               torch.randn(3).to(torch.bfloat16)]  # fmt: skip
    path = tmp_path / "t.bin"
    cpp_runtime.write_tensors(path, tensors)
    back = cpp_runtime.read_tensors(path)
    assert [t.dtype for t in back] == [t.dtype for t in tensors]
    for got, want in zip(back, tensors, strict=True):
        assert torch.equal(got, want)


def test_a_runner_variable_naming_no_program_is_an_error_that_says_what_to_do(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(cpp_runtime.RUNNER_VARIABLE, str(tmp_path / "missing"))
    with pytest.raises(ComposerError, match="no executable file: build the runner"):
        cpp_runtime.runner_path()


def test_without_the_variable_the_pip_runtime_runs_what_it_can():
    assert os.environ.get(cpp_runtime.RUNNER_VARIABLE) is None or pytest.skip("runner set here")
    assert cpp_runtime.runner_path() is None
