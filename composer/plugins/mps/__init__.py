"""The ``mps`` backend: ExecuTorch's MPS delegate (Metal Performance Shaders graphs, macOS/iOS).

ExecuTorch 1.5.1's wheel does not ship it (``executorch.backends.apple.mps`` is absent): the
backend neither plans nor lowers from the wheel, and says so; on Apple GPUs use ``coreml`` or
``metal``, which the wheel has. An ExecuTorch built from source on macOS with the MPS backend
has the module; then support is ``MPSPartitioner``'s own, and it lowers on macOS.
"""

from __future__ import annotations

import sys

from composer.contract.backend_spec import BackendSpec
from composer.plugins.native import NativePartitionerPlugin


class MpsPlugin(NativePartitionerPlugin):
    spec = BackendSpec(
        name="mps",
        backend_id="MPSBackend",
        device="mps",
        min_partition_size=1,
        description="MPS: Apple GPUs, as Metal Performance Shaders graphs",
    )
    module = "executorch.backends.apple.mps.partition"
    missing = (
        "ExecuTorch 1.5.1's wheel has no MPS backend (executorch.backends.apple.mps); build "
        "ExecuTorch from source on macOS with it, or use coreml or metal for Apple GPUs"
    )

    def cannot_lower(self) -> str | None:
        if sys.platform != "darwin":
            return f"MPS lowering needs macOS (this is {sys.platform})"
        return None

    def partitioner(self):
        from executorch.backends.apple.mps.partition import MPSPartitioner

        return MPSPartitioner(compile_specs=[])


plugin = MpsPlugin()
