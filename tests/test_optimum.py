"""optimum-executorch's ``main_export(..., recipe="composer")`` (composer/models/optimum.py): a
transformers causal LM from a small config, exported by optimum's own task code, composed with a
stack; its program prefills and decodes like the one optimum's own XNNPACK recipe writes.

optimum-executorch pins transformers==5.0.0rc1, which composer's corpus extra excludes: this
runs in the environment ``scripts/optimum-env`` makes, and skips elsewhere."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("optimum.exporters.executorch")

from executorch.runtime import Runtime
from optimum.exporters.executorch import main_export
from transformers import LlamaConfig, LlamaForCausalLM

import composer.models.optimum  # noqa: F401 - registers the recipe


def _logits(program_path, steps):
    method = Runtime.get().load_program(program_path.read_bytes()).load_method("forward")
    return [method.execute([tokens, positions])[0] for tokens, positions in steps]


@pytest.mark.parametrize("backends", ["xnnpack", "openvino,xnnpack"])
def test_main_export_with_the_composer_recipe_decodes_like_optimum_s_xnnpack(tmp_path, backends):
    if "openvino" in backends:
        pytest.importorskip("openvino")
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    for recipe, kwargs in (("xnnpack", {}), ("composer", {"backends": backends})):
        main_export(
            str(tmp_path / "model"), task="text-generation", recipe=recipe,
            output_dir=str(tmp_path / recipe), recipe_kwargs=kwargs, max_seq_len=64,
        )  # fmt: skip
    prompt = torch.tensor([[1, 17, 230, 5, 99]])
    steps = [(prompt, torch.arange(5))]  # a 5-token prefill, then one token at a time
    steps += [(torch.tensor([[40 + i]]), torch.tensor([5 + i])) for i in range(3)]

    ours = _logits(tmp_path / "composer" / "model.pte", steps)
    theirs = _logits(tmp_path / "xnnpack" / "model.pte", steps)

    for step, (got, want) in enumerate(zip(ours, theirs, strict=True)):
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 1e-3, f"step {step}"
