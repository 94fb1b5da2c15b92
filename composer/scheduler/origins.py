"""Which node of the exported program a node of a later program descends from: names change
as programs are decomposed and lowered, origins do not. A module of its own because the proof
of a program read from the cache needs it, and none of ExecuTorch's compiler."""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx

from composer.contract.op_names import op_name
from composer.scheduler.plans import QUANTIZED_OPS


def origin_name(node: torch.fx.Node) -> str:
    """The name of the node of the first exported program that ``node`` descends from.

    The same in the program ``ops_to_not_decompose``'s filter sees and in the edge program a
    partitioner sees, where the node's own name differs (upsample_nearest2d, then
    aten_upsample_nearest2d_vec). A node kept whole is its origin's only descendant of its op.
    """
    sources = node.meta.get("from_node")
    if not sources:
        return node.name
    source = sources[-1]
    while source.from_node:
        source = source.from_node[-1]
    return source.name


def origin_backends(
    graph_module: torch.fx.GraphModule, node_backends: Mapping[str, str]
) -> dict[str, str]:
    """Which backend took each node of the exported program, by origin name, read from the
    lowered ``graph_module`` (the graphs inside its delegates too) and its plan's
    ``node_backends``: the names a quantizer or a repair knows are the exported program's."""
    graphs = [graph_module.graph]
    for node in graph_module.graph.nodes:
        lowered = getattr(graph_module, node.target, None) if node.op == "get_attr" else None
        if hasattr(lowered, "original_module"):
            graphs.append(lowered.original_module.graph)
    computed: dict[str, str] = {}
    requantized: dict[str, str] = {}
    for graph in graphs:
        for node in graph.nodes:
            if node.op == "call_function" and node.name in node_backends:
                # The quantize/dequantize PT2E put after an op descends from it too; where
                # they went says nothing of where the op went (a lone dequantize delegated
                # to XNNPACK gave it the 3-d convolution left to portable kernels).
                kind = requantized if op_name(node).startswith(QUANTIZED_OPS) else computed
                kind[origin_name(node)] = node_backends[node.name]
    return {**requantized, **computed}
