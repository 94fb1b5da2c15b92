"""The ``xnnpack`` backend: ExecuTorch's real XNNPACK partitioner and backend (CPU).

The one backend whose delegates the pip ExecuTorch runtime executes, so compositions that
use only it (and portable kernels) verify end to end on any machine.
"""

from __future__ import annotations

from composer.contract.backend_spec import BackendSpec
from composer.contract.hookspecs import BackendPlugin


class XnnpackPlugin(BackendPlugin):
    spec = BackendSpec(
        "xnnpack", "XnnpackBackend",
        description="XNNPACK: optimized CPU kernels for Arm and x86",
    )  # fmt: skip

    def composer_partitioner(self, backend, program):
        from composer.plugins.xnnpack.partitioner import XnnpackPartitioner

        return XnnpackPartitioner()

    def composer_quantizer(self, backend):
        # Static int8, per-channel weights: what ExecuTorch's XNNPACK examples and recipes use.
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        quantizer = XNNPACKQuantizer()
        return quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))


plugin = XnnpackPlugin()
