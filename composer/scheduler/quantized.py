"""Quantized programs (PT2E's quantize/dequantize nodes): how close a backend's integer kernels
can be expected to come to the converted model, which simulates them in float.

An int8 kernel rounds once per op where the q/dq simulation rounds at the quantize nodes only;
XNNPACK's int8 ResNet-18 misses the converted module by about one step of its output's scale.
That is the backend computing what the quantized model means, not a wrong program, so the
proof allows a few steps of the scale the output is dequantized with.
"""

from __future__ import annotations

import torch.fx
from torch.export import ExportedProgram

from composer.contract.backend_spec import Tolerance
from composer.contract.op_names import op_name
from composer.scheduler.plans import QUANTIZED_OPS

# Steps of the output scale an integer backend may differ by: rounding differs per op and
# adds up along the network. Measured, XNNPACK's int8 ResNet-18 at 64 px against its q/dq
# reference: 2 steps (0.042 at scale 0.021) with fresh weights, 6 steps (0.046 at scale
# 0.0076) with batch-norm statistics calibrated (composer.corpus). Empirical, not a bound.
STEPS = 8
# Deep int8 networks whose activations quantize poorly add far more: XNNPACK's int8 MobileNetV2
# (composer.corpus, random weights) is 0.177 off its q/dq reference on outputs up to 0.42, the
# reference itself 0.235 off the float model, and plain ExecuTorch writes that program. A share
# of the largest output still tells a program that computes the model (zeros, a wrong layout,
# garbage miss by about all of it) from one that does not.
LARGEST = 0.5
# Steps of the largest output for activations quantized at run time (below): 1.5 measured.
DYNAMIC_STEPS = 4
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


# Activations quantized at run time (torchao's 8da4w, export_llama's -qmode 8da4w): their
# scales exist only while the program runs and follow the values, so the allowance is DYNAMIC_STEPS
# int8 steps of the largest output (XNNPACK's tiny Llama: 6e-3 on logits up to 0.51, about
# 1.5 such steps, at every token length).
DYNAMIC = Tolerance(
    0.0,
    0.0,
    f"activations quantized at run time (int8 per token): {DYNAMIC_STEPS} int8 steps of the "
    "largest output",
    of_largest=DYNAMIC_STEPS / 127,
    steps=STEPS,
)


# Outputs computed in float from quantized inputs (OpenVINO's quantizer leaves a network's last
# linear unquantized): no scale to count in, so STEPS int8 steps of the largest output
# (OpenVINO's int8 composer.zoo cnn: 0.34 off its q/dq reference, plain ExecuTorch's too).
FLOAT_OUTPUTS = Tolerance(
    0.0,
    0.0,
    f"outputs computed from int8 values: {STEPS} int8 steps of the largest output",
    of_largest=STEPS / 127,
    steps=STEPS,
)


def output_tolerance(program: ExportedProgram) -> Tolerance | None:
    """``STEPS`` of the largest scale the program's outputs are dequantized with (``None`` for
    a float program, or outputs that come from no dequantize node)."""
    output = program.graph.output_node()
    scales = [
        scale
        for value in torch.fx.node.map_aggregate(output.args[0], lambda a: a)
        if isinstance(value, torch.fx.Node)
        for scale in [_dequantized_scale(value, _PASS_THROUGH_DEPTH)]
        if scale is not None
    ]
    if not scales:
        ops = [op_name(n) for n in program.graph.nodes if n.op == "call_function"]
        if any("choose_qparams" in op for op in ops):
            return DYNAMIC
        if any(op.startswith(QUANTIZED_OPS) for op in ops):
            return FLOAT_OUTPUTS
        return None
    scale = max(scales)
    return Tolerance(
        STEPS * scale,
        0.0,
        f"{STEPS} steps of the output's scale {scale:.3g}, or {LARGEST:.0%} of the largest "
        "output where that is more: integer kernels against the q/dq simulation",
        of_largest=LARGEST,
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
