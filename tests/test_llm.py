"""ExecuTorch's own LLM flow: export_llama's KV-cache decoder (dynamic token dimension, custom
SDPA and cache-update ops), composed with a stack and its metadata, run as a runner runs it:
a prefill, then one token at a time, the cache kept in the loaded method."""

from __future__ import annotations

import pytest
import torch

import composer
from composer.contract.errors import ModelError
from composer.models import llama
from composer.run.runtime import LoadedProgram


@pytest.fixture(scope="module")
def decoder():
    return llama.exported()


def test_the_decoder_s_buffers_are_made_as_with_a_checkpoint(decoder):
    # Without a checkpoint export_llama leaves its RoPE tables, masks and KV caches as
    # uninitialized memory (NaN logits, which match anything).
    program, _ = decoder
    for name, buffer in program.module().named_buffers():
        assert torch.isfinite(buffer.float()).all() and buffer.float().abs().max() < 1e4, name


def test_planning_twice_leaves_the_program_as_it_was(decoder):
    program, _ = decoder
    first = composer.plan(program, "xnnpack", cache=False)
    assert composer.plan(program, "xnnpack", cache=False).node_ops == first.node_ops


@pytest.mark.slow
def test_export_llama_s_8da4w_decoder_composes_within_its_dynamic_quantization():
    flags = (*llama.DECODER_FLAGS, "-qmode", "8da4w", "-G", "32")
    program, metadata = llama.exported(llama.TINY, *flags)
    composed = composer.compose(
        {"forward": program}, "xnnpack", cache=False, constant_methods=metadata
    )
    plan = composed.plans["forward"]
    assert plan.proof.startswith("ran and matched eager at 4 sizes")
    assert "activations quantized at run time" in plan.quantization.reason
    assert plan.ops_on("xnnpack")["torchao.choose_qparams_affine.default"] > 0


@pytest.mark.parametrize(
    "stack", ["xnnpack", pytest.param("openvino,xnnpack", marks=pytest.mark.slow)]
)
def test_export_llama_s_decoder_prefills_and_decodes_like_eager(decoder, stack):
    program, metadata = decoder
    composed = composer.compose({"forward": program}, stack, cache=False, constant_methods=metadata)

    plan = composed.plans["forward"]
    assert plan.proof.startswith("ran and matched eager at 4 sizes")
    assert plan.nodes_on("xnnpack")
    loaded = LoadedProgram(composed.buffer)
    eager = program.module()  # holds its own KV cache, as the loaded method does
    steps = [(torch.tensor([[1, 7, 42, 9, 100]]), 0)]
    steps += [(torch.tensor([[token]]), 5 + i) for i, token in enumerate((3, 77, 500))]
    for tokens, position in steps:
        position = torch.tensor([position])
        (logits,) = loaded.run([tokens, position])
        expected = eager(tokens, {"input_pos": position})
        assert expected.abs().max() > 0.05  # real logits, not NaN or zeros
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    # LLM runners read the metadata as methods of the program.
    assert loaded.program.load_method("get_max_seq_len").execute([]) == [64]


def test_backend_flags_are_composer_s_to_choose():
    with pytest.raises(ModelError, match="leave -X out of the flags"):
        llama.exported(llama.TINY, *llama.DECODER_FLAGS, "-X")
