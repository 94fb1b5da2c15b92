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
