"""ExecuTorch's XNNPACK partitioner, less the reshapes XNNPACK's own lowering refuses.

XNNPACK lowers ``unsqueeze_copy`` to its static reshape, whose new shape holds at most one
dynamic dim; ExecuTorch 1.5.1's partitioner tags such a node whatever its shape, and its
lowering then raises "XNNPACK reshape only supports 1 dynamic dimension". swin_v2_t exported at
``16 * Dim`` heights and widths has one in each shifted window's attention mask: plain
ExecuTorch fails it, and composer's repairs, which move the whole partition a compiler raised
on and lower the stack again, took a round of minutes for each. Declining those
nodes up front leaves them to portable kernels in one compose.
"""

from __future__ import annotations

import torch
from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
from executorch.backends.xnnpack.partition.config.generic_node_configs import (
    UnsqueezeCopyConfig,
)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as ExecutorchXnnpackPartitioner,
)
from torch.fx.experimental.symbolic_shapes import free_symbols

from composer.contract.op_names import op_name


def reshape_refused(node: torch.fx.Node) -> str | None:
    """Why XNNPACK's lowering refuses the static reshape ``node``: more than one dynamic dim
    in its output (its visitor, backends/xnnpack/operators/op_squeeze.py, counts them)."""
    shape = getattr(node.meta.get("val"), "shape", ())
    dynamic = sum(1 for size in shape if free_symbols(size))
    if dynamic <= 1:
        return None
    return f"XNNPACK's static reshape takes one dynamic dim; this output has {dynamic}"


class _CheckedUnsqueezeConfig(UnsqueezeCopyConfig):
    def check_constraints(self, node, ep) -> bool:
        return reshape_refused(node) is None and super().check_constraints(node, ep)


class XnnpackPartitioner(ExecutorchXnnpackPartitioner):
    """ExecuTorch's ``XnnpackPartitioner`` with its ``unsqueeze_copy`` check made XNNPACK's
    lowering's; composer asks it why it declined a node (``reason_unsupported``), as it asks
    an ``ExplainedSupport``."""

    def __init__(self, **kwargs) -> None:
        configs = [
            _CheckedUnsqueezeConfig if config is UnsqueezeCopyConfig else config
            for config in ALL_PARTITIONER_CONFIGS
        ]
        super().__init__(configs=configs, **kwargs)

    def reason_unsupported(self, node: torch.fx.Node) -> str | None:
        # the checked config declines exactly these, before ExecuTorch's own constraints
        if op_name(node) != "aten.unsqueeze_copy.default":
            return None
        return reshape_refused(node)
