"""A dilated convolution as a sum of undilated ones, which AOTInductor's Triton templates take.

CudaBackend compiles convolutions with Triton templates only, and Inductor offers them only for
a dilation of 1: a dilated convolution fails to compile ("NoValidChoicesError"), so cuda
declines it, and a TCN's dilated ``Conv1d`` went to the CPU's portable kernels with copies each
way, 39x to 707x slower than eager on the GPU. The same convolution, with kernel size ``k`` and
dilation ``d``, is the sum over its ``k`` taps ``j`` of a kernel-size-1 convolution of the input
shifted by ``j * d`` (a slice with the convolution's stride) with the weight's tap ``j``: the
same products, added in another order. This pass writes it so, before partitioning; the proof
then holds the rewritten program to eager like any other.
"""

from __future__ import annotations

import itertools
import sys

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult

from composer.plugins.cuda.dilation import is_dilated

_EDGE = exir_ops.edge.aten
_CONV1D, _CONV2D, _CONVOLUTION = (
    _EDGE.conv1d.default, _EDGE.conv2d.default, _EDGE.convolution.default,
)  # fmt: skip
_SLICE, _PAD, _ADD = _EDGE.slice_copy.Tensor, _EDGE.constant_pad_nd.default, _EDGE.add.Tensor
# The taps one convolution may become: a 7x7 dilated kernel is 49 convolutions already.
MOST_TAPS = 64


def _as_list(value, spatial: int) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return values * spatial if len(values) == 1 else values


def _parts(op, args, kwargs):
    """(input, weight, bias, stride, padding, dilation, groups) of a convolution this pass
    rewrites, or None: a transposed one, a padding given as a string, or one undilated."""
    if op in (_CONV1D, _CONV2D):
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        defaults = (None, None, None, 1, 0, 1, 1)
    elif op is _CONVOLUTION:
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                 "output_padding", "groups")  # fmt: skip
        defaults = (None, None, None, 1, 0, 1, False, 0, 1)
    else:
        return None
    given = dict(zip(names, defaults, strict=True))
    given.update(zip(names, args, strict=False))
    given.update(kwargs)
    if given.get("transposed") or isinstance(given["padding"], str):
        return None
    spatial = given["weight"].to_tensor().dim() - 2
    dilation = _as_list(given["dilation"], spatial)
    if all(d == 1 for d in dilation):
        return None
    kernel = list(given["weight"].to_tensor().shape[2:])
    if _count(kernel) > MOST_TAPS:
        return None
    return (given["input"], given["weight"], given["bias"], _as_list(given["stride"], spatial),
            _as_list(given["padding"], spatial), dilation, kernel, given["groups"])  # fmt: skip


def _count(kernel: list[int]) -> int:
    count = 1
    for size in kernel:
        count *= size
    return count


class UndilatedConvolutions(ExportPass):
    """Each dilated, untransposed convolution (``aten.conv1d``, ``conv2d``, ``convolution``) as
    a sum of kernel-size-1 convolutions of the same op over shifted, strided slices of its
    padded input: no dilation is left for the backend to decline."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        # ExportPass retraces the whole graph: only where there is something to rewrite.
        if not any(_dilated(node) for node in graph_module.graph.nodes):
            return PassResult(graph_module, False)
        return super().call(graph_module)

    def call_operator(self, op, args, kwargs, meta):
        parts = _parts(op, args, kwargs)
        if parts is None:
            return super().call_operator(op, args, kwargs, meta)
        x, weight, bias, stride, padding, dilation, kernel, groups = parts
        spatial = len(kernel)
        if any(padding):
            # pad pairs run from the last dimension backwards
            pads = [p for p in reversed(padding) for p in (p, p)]
            x = super().call_operator(_PAD, (x, pads, 0.0), {}, meta)
        total = None
        for tap in itertools.product(*(range(k) for k in kernel)):
            shifted, tap_weight = x, weight
            for axis, j in enumerate(tap):
                dim = 2 + axis
                tail = (kernel[axis] - 1 - j) * dilation[axis]
                # a symbolic length cannot be an argument: a negative end counts from the end
                end = -tail if tail else sys.maxsize
                shifted = super().call_operator(
                    _SLICE, (shifted, dim, j * dilation[axis], end, stride[axis]), {}, meta
                )
                tap_weight = super().call_operator(_SLICE, (tap_weight, dim, j, j + 1, 1), {}, meta)
            conv_args = (shifted, tap_weight, bias if total is None else None,
                         [1] * spatial, [0] * spatial, [1] * spatial)  # fmt: skip
            if op is _CONVOLUTION:
                conv_args = (*conv_args, False, [0] * spatial, groups)
            else:
                conv_args = (*conv_args, groups)
            term = super().call_operator(op, conv_args, {}, meta)
            total = term if total is None else super().call_operator(_ADD, (total, term), {}, meta)
        return total


def _dilated(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in (_CONV1D, _CONV2D, _CONVOLUTION):
        return False
    transposed = node.target is _CONVOLUTION and len(node.args) > 6 and node.args[6]
    return not transposed and is_dilated(node)
