"""Quantization scales in float64 where a quantize op is left to ExecuTorch's portable kernels.

The portable ``quantize_per_channel`` kernel, and the ``*.tensor`` per-tensor variants, take
only float64 scales: anything else fails an ``ET_CHECK`` that aborts the process (no error
returned, ``op_quantize.cpp``). Quantizers write float32 scales (NNCF's per-channel weight
scales for OpenVINO, left as a quantize op on the float weight), which is harmless while the
backend takes the op and aborts the proof, or the user's app, once a repair or a partitioner's
decline leaves it to portable kernels. Every portable q/dq kernel accepts float64, and float32
to float64 is exact, so a cast in front changes no value.
"""

from __future__ import annotations

import torch

QUANTIZED_NAMESPACE = "quantized_decomposed"
SCALE_ARGUMENTS = ("scale", "scales")


def doubled_scales(program) -> int:
    """Cast, in place, every float32 scale tensor an op of ``quantized_decomposed`` reads
    outside the delegates of ``program`` (an edge ``ExportedProgram``) to float64; how many
    tensors."""
    graph = program.graph_module.graph
    casts: dict = {}  # one cast a scale tensor, however many q/dq ops read it
    for node in list(graph.nodes):
        for scale in _float32_scales(node):
            if scale not in casts:
                casts[scale] = _cast_before(graph, node, scale)
            node.replace_input_with(scale, casts[scale])
    if casts:
        program.graph_module.recompile()
    return len(casts)


def _float32_scales(node) -> list:
    if node.op != "call_function" or getattr(node.target, "namespace", None) != QUANTIZED_NAMESPACE:
        return []
    schema = node.target._schema
    found = []
    for position, argument in enumerate(schema.arguments):
        if argument.name not in SCALE_ARGUMENTS:
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        fake = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if isinstance(fake, torch.Tensor) and fake.dtype == torch.float32:
            found.append(value)
    return found


def _cast_before(graph, node, scale):
    # Imported here: a cache hit imports no compiler.
    from executorch.exir.dialects._ops import ops as exir_ops

    fake = scale.meta["val"]
    with graph.inserting_before(node):
        cast = graph.call_function(
            exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
            (scale,),
            {"dtype": torch.float64, "dim_order": list(range(fake.dim()))},
        )
    cast.meta["val"] = fake.to(torch.float64)
    return cast
