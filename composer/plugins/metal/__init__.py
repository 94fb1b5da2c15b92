"""The ``metal`` backend: ExecuTorch's Metal backend (AOTInductor on MPS), macOS only."""

from __future__ import annotations

import sys

import torch

from composer.contract.backend_spec import BackendSpec
from composer.plugins.aoti import AotiPlugin


class MetalPlugin(AotiPlugin):
    spec = BackendSpec(
        name="metal",
        backend_id="MetalBackend",
        device="mps",
        min_partition_size=1,
        description="Metal: Apple GPUs, compiled by AOTInductor",
        # AotiPartitioner tags mutated buffers into its delegate (tag_mutated_buffer): an
        # LLM's KV caches stay on the device, not copied in and out every token.
        keeps_state=True,
        # AOTInductor compiles delegate inputs as tensors: a size handed in arrives as None.
        sizes_from_shapes=True,
        # Inductor compiles a graph of constants alone for the CPU (BackendSpec's doc).
        needs_a_runtime_input=True,
    )
    inductor_device = "mps"

    def backend_class(self) -> type:
        from executorch.backends.apple.metal.metal_backend import MetalBackend

        return MetalBackend

    def unavailable_reason(self) -> str | None:
        if sys.platform != "darwin":
            return f"Metal lowering needs macOS with MPS (this is {sys.platform})"
        if not torch.backends.mps.is_available():
            return "MPS is not available"
        return None


plugin = MetalPlugin()
