"""Loading and running a .pte: errors that say what is wrong, in words."""

from __future__ import annotations

import pytest
import torch

import composer
from composer import zoo
from composer.contract.errors import ComposerError
from composer.run.runtime import LoadedProgram


@pytest.fixture(scope="module")
def stub_program() -> bytes:
    model, inputs = zoo.load("mlp")
    return composer.compose(model, ["tensorrt_stub"], inputs).buffer


def test_a_backend_the_runtime_lacks_is_named(stub_program):
    with pytest.raises(ComposerError) as caught:
        LoadedProgram(stub_program)
    message = str(caught.value)
    assert "cannot load method 'forward'" in message
    assert "It has no TensorRTStubBackend; it has: " in message
    assert "XnnpackBackend" in message


def test_inputs_are_checked_against_the_method():
    model, inputs = zoo.load("mlp")
    loaded = LoadedProgram(composer.compose(model, ["xnnpack"], inputs).buffer)
    [x] = inputs
    with pytest.raises(ComposerError, match=r"takes 1 input\(s\), got 2"):
        loaded.check_inputs((x, x))
    with pytest.raises(ComposerError, match="input 0 must be a tensor of shape"):
        loaded.check_inputs(([1, 2],))
    with pytest.raises(ComposerError, match="input 0 has shape .* int64; the program was exported"):
        loaded.check_inputs((x.long(),))
    loaded.check_inputs(inputs)
    torch.testing.assert_close(loaded.run(inputs)[0], model(*inputs), atol=1e-4, rtol=1e-4)
