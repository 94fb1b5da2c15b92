"""Loading and running a .pte: errors that say what is wrong, in words."""

from __future__ import annotations

import pytest
import torch

import composer
from composer.contract.errors import ComposerError
from composer.models import zoo
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


class _MaxPool3d(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.adaptive_max_pool3d(x, (2, 2, 2))


def test_an_op_no_backend_took_and_the_runtime_lacks_is_named():
    """XNNPACK declines adaptive max pooling in 3d and the portable kernels have none: the
    refusal names the op and says what to do, not the backends this runtime registers."""
    with pytest.raises(ComposerError) as caught:
        composer.compose(_MaxPool3d(), ["xnnpack"], (torch.randn(1, 2, 4, 4, 4),), cache=False)
    message = str(caught.value)
    assert (
        "it has no kernel for aten::adaptive_max_pool3d.out, and no delegate of the program runs it"
        in message
    )
    assert "Add a backend that takes it" in message
    assert "XnnpackBackend" not in message and "one by one" not in message, message
    # The program that failed, as composed, to look into (ExecuTorch's suite judges it when it
    # delegates nothing, composer/conformance/flows.py): nothing delegated, its proof refused.
    unrepaired = caught.value.unrepaired
    assert not unrepaired.plan.partitions and unrepaired.plan.proof.startswith("refused: failed")


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


@pytest.mark.parametrize("stack", ["xnnpack", "openvino,xnnpack"])
def test_the_program_table_is_what_executorch_deserializes_without_the_segments(stack):
    from executorch.exir._serialize._program import deserialize_pte_binary

    from composer.run.program_table import program_table

    model, inputs = zoo.load("transformer_block")
    buffer = composer.compose(model, stack, inputs, cache=False).buffer
    table, whole = program_table(buffer), deserialize_pte_binary(buffer).program
    assert whole.segments == [] and table.segments  # the weights and blobs stayed behind
    for read, deserialized in zip(table.execution_plan, whole.execution_plan, strict=True):
        assert read.delegates and [(d.id, d.compile_specs) for d in read.delegates] == [
            (d.id, d.compile_specs) for d in deserialized.delegates
        ]
        assert (read.inputs, read.values, read.chains, read.operators) == (
            deserialized.inputs, deserialized.values, deserialized.chains, deserialized.operators
        )  # fmt: skip


def test_an_op_no_backend_took_whose_portable_kernel_refuses_its_inputs_is_named():
    """XNNPACK takes no 3-d convolution, and the portable kernel takes 1-d and 2-d only: the
    refusal quotes the kernel, names the op and says what to do."""
    with pytest.raises(ComposerError) as caught:
        composer.compose(torch.nn.Conv3d(3, 4, 3), ["xnnpack"], (torch.randn(1, 3, 6, 6, 6),),
                         cache=False)  # fmt: skip
    message = str(caught.value)
    assert "Expect input tensor to be 3-D or 4-D, but got, 5" in message, message
    assert (
        "; aten::convolution.out runs on ExecuTorch's portable kernels (no delegate of the "
        "program took it), which refuse these inputs: add a backend that takes it to the stack"
        in message
    ), message
