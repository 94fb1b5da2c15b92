"""Quantized programs (PT2E's quantize/dequantize nodes): what the proof allows integer kernels
beside the converted model, which simulates them in float.

The proof judges a quantized program as it judges a float one (composer.run.accuracy): against
the float computation the q/dq simulation approximates (the model without its activations'
quantize/dequantize pairs), beside the simulation's own error against it. An int8 kernel rounds
once per op where the simulation rounds at the quantize nodes only: both are about as far from
the float model, and a program that computes something else is not. The one allowance left is
for integer outputs, compared exactly otherwise: a delegate handing int8 values to the next.
"""

from __future__ import annotations

import torch.fx
from torch.export import ExportedProgram

from composer.contract.backend_spec import Tolerance
from composer.contract.op_names import op_name
from composer.scheduler.plans import QUANTIZED_OPS

# Steps an integer output of an int8 kernel may differ from the simulation's: rounding differs
# per op and adds up along the network. Measured, XNNPACK's int8 ResNet-18 at 64 px: 2 steps
# with fresh weights, 6 with batch-norm statistics calibrated (composer.models.corpus).
STEPS = 8
_DEQUANTIZE = (
    "quantized_decomposed.dequantize_per_tensor",
    "quantized_decomposed.dequantize_per_channel",
)
_PASS_THROUGH_DEPTH = 4  # view, reshape, flatten... between the dequantize and the output
# Ops that move values without computing new ones: an output behind them has the scale of the
# dequantize before them. Any other op computes in float from dequantized inputs.
PASS_THROUGH = frozenset({
    "view", "view_copy", "reshape", "_unsafe_view", "flatten", "permute", "permute_copy",
    "transpose", "t", "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy", "clone",
    "_clone_dim_order", "contiguous", "getitem", "expand", "expand_copy",
})  # fmt: skip


def output_tolerance(program: ExportedProgram) -> Tolerance | None:
    """What the plan says of a quantized program (``None`` for a float one): judged against
    the float model, integer outputs within ``STEPS``; the largest scale its outputs are
    dequantized with, where they are, for the reader."""
    output = program.graph.output_node()
    scales = [
        scale
        for value in torch.fx.node.map_aggregate(output.args[0], lambda a: a)
        if isinstance(value, torch.fx.Node)
        for scale in [_dequantized_scale(value, _PASS_THROUGH_DEPTH)]
        if scale is not None
    ]
    ops = [op_name(n) for n in program.graph.nodes if n.op == "call_function"]
    if not scales and not any(op.startswith(QUANTIZED_OPS) for op in ops):
        return None
    if any("choose_qparams" in op for op in ops):
        kind = "activations quantized at run time"
    elif scales:
        kind = f"outputs dequantized with scale {max(scales):.3g}"
    else:
        kind = "outputs computed in float from int8 values"
    return Tolerance(
        0.0,
        0.0,
        f"{kind}: integer kernels and the q/dq simulation judged against the float model "
        f"beside each other; integer outputs within {STEPS} steps",
        steps=STEPS,
    )


def _dequantized_scale(node: torch.fx.Node, depth: int) -> float | None:
    if depth < 0 or node.op != "call_function":
        return None
    if op_name(node).startswith(_DEQUANTIZE):
        scale = node.args[1] if len(node.args) > 1 else node.kwargs.get("scale")
        return float(scale) if isinstance(scale, int | float) else None
    if short_op_name(op_name(node)) not in PASS_THROUGH:
        return None
    found = [
        scale
        for arg in node.all_input_nodes
        for scale in [_dequantized_scale(arg, depth - 1)]
        if scale is not None
    ]
    return max(found) if found else None


def short_op_name(name: str) -> str:
    """``view_copy`` of ``aten.view_copy.default``; ``getitem`` as it is."""
    parts = name.split(".")
    return parts[1 if len(parts) > 2 else -1]
