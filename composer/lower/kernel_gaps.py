"""Rewrites, before partitioning, of ops ExecuTorch's portable kernels refuse into the same
computation in ops they take.

Portable kernels are where every node no backend takes ends up, so an op they refuse makes a
program that fails when it runs, whatever the stack: composer's proof would find it, with
nowhere left to move it. Each rewrite here is exact (the same values, bit for bit), so a
backend that took the op before takes its replacement as well or better.
"""

from __future__ import annotations

import torch.fx
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

_PAD = exir_ops.edge.aten.constant_pad_nd.default
_SLICE = exir_ops.edge.aten.slice_copy.Tensor


class NegativePadAsSlice(ExportPass):
    """``constant_pad_nd`` with a negative pad, which crops (transformers' RWKV shifts time by
    one token with ``nn.ZeroPad2d((0, 0, 1, -1))``), as a slice then a pad of what is left:
    the portable kernel checks ``pad[i] >= 0`` and fails with error 0x12 at run time, and
    XNNPACK declines the op."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        # ExportPass retraces the whole graph (new node names, seconds on a large model):
        # only where there is something to rewrite.
        if not any(_crops(node) for node in graph_module.graph.nodes):
            return PassResult(graph_module, False)
        return super().call(graph_module)

    def call_operator(self, op, args, kwargs, meta):
        if op is not _PAD or not any(map(_negative, args[1])):
            return super().call_operator(op, args, kwargs, meta)
        x, pad = args[0], list(args[1])
        value = args[2] if len(args) > 2 else kwargs.get("value", 0.0)
        shape = x.to_tensor().shape
        # pad pairs (before, after) run from the last dimension backwards.
        for pair in range(len(pad) // 2):
            dim = len(shape) - 1 - pair
            before, after = pad[2 * pair], pad[2 * pair + 1]
            if _negative(before) or _negative(after):
                start = -before if _negative(before) else 0
                # A symbolic size cannot be an argument: a negative end counts from the end.
                size = shape[dim] if isinstance(shape[dim], int) else None
                end = (after if size is None else size + after) if _negative(after) else size
                x = super().call_operator(_SLICE, (x, dim, start, end, 1), {}, meta)
        kept = [0 if _negative(p) else p for p in pad]
        if all(isinstance(p, int) and p == 0 for p in kept):
            return x
        return super().call_operator(_PAD, (x, kept, value), {}, meta)


def _crops(node: torch.fx.Node) -> bool:
    return node.target is _PAD and any(map(_negative, node.args[1]))


def _negative(pad: object) -> bool:
    """A pad known to crop: one computed at run time (swin_v2_t pads to a multiple of its
    window) is left to the kernel, as plain ExecuTorch leaves it."""
    return isinstance(pad, int) and pad < 0


# Applied in this order to every edge program composer lowers (plan's stand-ins included).
PASSES = (NegativePadAsSlice(),)
