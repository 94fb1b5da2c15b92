"""The ``xnnpack`` backend: ExecuTorch's real XNNPACK partitioner and backend (CPU).

The one backend whose delegates the pip ExecuTorch runtime executes, so compositions that
use only it (and portable kernels) verify end to end on any machine.
"""

from __future__ import annotations

from composer.contract.backend_spec import BackendSpec
from composer.contract.hookspecs import hookimpl

XNNPACK = BackendSpec(
    name="xnnpack",
    backend_id="XnnpackBackend",
    device="cpu",
    min_partition_size=1,
    description="ExecuTorch's XNNPACK delegate (CPU); runs in the pip runtime",
)


@hookimpl
def composer_backends():
    return [XNNPACK]


@hookimpl
def composer_partitioner(backend, program):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


@hookimpl
def composer_quantizer(backend):
    # Static int8 with per-channel weights: what ExecuTorch's XNNPACK examples and recipes use.
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
