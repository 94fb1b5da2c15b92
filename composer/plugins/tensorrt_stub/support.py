"""Which edge ops a TensorRT engine converts."""

from __future__ import annotations

import torch
import torch.fx

from composer.contract.op_names import overload_of
from composer.contract.support import ExplainedSupport

# Names of ATen overload packets (``aten.<name>``); every overload of each is taken.
CONVERTIBLE_OPS = frozenset(
    {
        # convolution and matrix products
        "convolution", "conv2d", "conv1d", "linear", "mm", "addmm", "bmm", "matmul",
        # pooling
        "max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d",
        "mean",
        # activations
        "relu", "gelu", "sigmoid", "tanh", "silu", "hardtanh", "leaky_relu",
        "_softmax", "softmax", "_log_softmax",
        # elementwise
        "add", "sub", "mul", "div", "rsqrt", "sqrt", "pow", "neg", "exp",
        # normalization
        "native_layer_norm", "layer_norm", "_native_batch_norm_legit_no_training",
        "batch_norm",
        # shape
        "view", "view_copy", "reshape", "permute", "permute_copy", "transpose",
        "t", "t_copy", "cat", "expand", "expand_copy", "squeeze", "squeeze_copy",
        "unsqueeze", "unsqueeze_copy", "clone", "_to_copy", "slice_copy", "flatten",
        "split", "split_with_sizes", "split_with_sizes_copy", "chunk",
        # comparisons and selection (attention masks)
        "eq", "ne", "lt", "gt", "logical_not", "any", "where", "full_like",
    }
)  # fmt: skip


# ExecuTorch's memory-format-aware clone is TensorRT's plain copy.
CONVERTIBLE_EXTRA_OPS = frozenset({"dim_order_ops._clone_dim_order"})

# TensorRT has no float64 or complex kernels.
UNSUPPORTED_DTYPES = frozenset({torch.float64, torch.complex64, torch.complex128})


def _packet_name(target) -> str | None:
    op = overload_of(target)
    if op is None:
        return None
    packet = op.overloadpacket.__name__
    return packet if op.namespace == "aten" else f"{op.namespace}.{packet}"


class TensorRTOperatorSupport(ExplainedSupport):
    """Tensors (not float64 or complex) through the ops in ``CONVERTIBLE_OPS``."""

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        name = _packet_name(node.target)
        if name not in CONVERTIBLE_OPS and name not in CONVERTIBLE_EXTRA_OPS:
            return False
        value = node.meta.get("val")
        values = value if isinstance(value, list | tuple) else [value]
        return all(
            isinstance(v, torch.Tensor) and v.dtype not in UNSUPPORTED_DTYPES for v in values
        )
