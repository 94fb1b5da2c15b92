"""ExecuTorch's own LLM flow as a model source: export_llama's decoder, as ``export_llama``
exports it (KV cache, custom SDPA, a dynamic token dimension), ready for ``composer.compose``.

``export_llama`` lowers with the backends its flags name (``-X``, ``--vulkan``...) in one fixed
order; here the flags build and export the model only, and composer lowers it with a stack::

    program, metadata = llama.exported({"dim": 64, "n_layers": 2, ...}, "-kv", "-d", "fp32")
    composed = composer.compose({"forward": program}, "xnnpack", constant_methods=metadata)

The weights are random (seeded, N(0, 0.02) as the Llama recipe initializes them) unless the
flags name a checkpoint; they reach export_llama as a checkpoint of their own: its default
initialization leaves weights and buffers (RoPE tables, masks, caches) as uninitialized memory,
whose NaN logits match anything.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from composer.contract.errors import ModelError

# A Llama 3 of a few hundred thousand weights: exports in seconds, lowers in under a minute.
TINY = {
    "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512,
    "multiple_of": 32, "norm_eps": 1e-5, "rope_theta": 500000.0, "use_scaled_rope": False,
}  # fmt: skip
# What a KV-cache decoder with a dynamic token dimension takes: export_llama's usual flags,
# less the backend ones (composer's stack lowers it).
DECODER_FLAGS = (
    "--model", "llama3", "-kv", "--use_sdpa_with_kv_cache", "-d", "fp32",
    "--max_seq_length", "64", "--max_context_length", "64",
)  # fmt: skip
_BACKEND_FLAGS = {"-X", "--xnnpack", "--vulkan", "--coreml", "--qnn", "--mps", "--openvino"}


def exported(
    params: Mapping[str, Any] | str | Path = TINY, *flags: str, seed: int = 0
) -> tuple[torch.export.ExportedProgram, dict[str, Any]]:
    """export_llama's decoder for ``params`` (a params dict or JSON file) and ``flags``
    (export_llama's command line, :data:`DECODER_FLAGS` by default), as an ExportedProgram
    with example inputs, and its metadata (the constant methods LLM runners read)."""
    try:
        from executorch.examples.models.llama import export_llama_lib as lib
        from executorch.extension.llm.export.config.llm_config import LlmConfig
    except ImportError as error:
        raise ModelError(f"export_llama is not importable here: {error}") from error
    backends = _BACKEND_FLAGS.intersection(flags)
    if backends:
        raise ModelError(
            f"leave {', '.join(sorted(backends))} out of the flags: composer's stack lowers the "
            "model (--backends on the command line, the stack in composer.compose)."
        )
    with tempfile.TemporaryDirectory(prefix="composer_llama_") as folder:
        if isinstance(params, Mapping):
            path = Path(folder) / "params.json"
            path.write_text(json.dumps(dict(params)))
        else:
            path = Path(params)
            if not path.is_file():
                raise ModelError(f"no such params file: {path}")
        arguments = ["--params", str(path), *(flags or DECODER_FLAGS)]
        config = _config(lib, LlmConfig, arguments)
        if not config.base.checkpoint:
            # Seeded weights go in as a checkpoint, so that a quantizing flag (-qmode 8da4w)
            # quantizes them (the model export_llama prepares is already quantized), and so
            # that its buffers are made as with a real checkpoint: without one, export_llama
            # calls to_empty() on the whole model, and the RoPE tables, causal masks and KV
            # caches hold whatever memory held (NaN logits; RoPE entries of 2.75e38 seen).
            # Parameters only: the prepared model's buffers are that memory.
            plain = _config(
                lib, LlmConfig, ["--params", str(path), "--model", config.base.model_class]
            )
            model = lib._prepare_for_llama_export(plain).model
            _initialize(model, seed)
            checkpoint = Path(folder) / "seeded.pth"
            torch.save({k: v.detach() for k, v in model.named_parameters()}, checkpoint)
            config = _config(lib, LlmConfig, [*arguments, "--checkpoint", str(checkpoint)])
        manager = lib._prepare_for_llama_export(config).export()
        program = manager._export(manager.pre_autograd_graph_module)
    return program, dict(manager.metadata)


def _config(lib, config_class, arguments: list[str]):
    try:
        return config_class.from_args(lib.build_args_parser().parse_args(arguments))
    except SystemExit as error:
        raise ModelError(f"export_llama refused the flags {' '.join(arguments)}") from error


def _initialize(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm scales start at one
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
