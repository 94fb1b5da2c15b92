"""A size read from a graph input, given to each of its readers: before partitioning, for
backends whose delegates take tensors only.

Export reads a dynamic input's size once (``sym_size.int`` of the placeholder) and every view,
``arange`` and mask sized by it reads that one node. Partitioned, the node lands in one
delegate or on the host and the size crosses into every other delegate that reads it, as an
int. AOTInductor compiles a delegate's inputs and outputs as tensors: an int input arrives as
``None`` (export_llama's dynamic decoder with ``cuda``: "aten::arange() ... 'end' ...
'NoneType'", "aten::view_copy() ... immutable_list"). With a copy of its own, each reader goes
to its partition with it, and the delegate computes the size from the input's shape. Sizes
are free to compute, so copies cost nothing at run time.
"""

from __future__ import annotations

import torch
import torch.fx
from executorch.exir.pass_base import PassResult


def sizes_per_reader(graph_module: torch.fx.GraphModule) -> PassResult:
    """Every ``sym_size.int`` of a placeholder read by several nodes becomes one per reader."""
    graph = graph_module.graph
    modified = False
    for node in list(graph.nodes):
        if not _is_input_size(node) or len(node.users) < 2:
            continue
        for user in list(node.users)[1:]:
            with graph.inserting_after(node):
                copy = graph.call_function(node.target, node.args, dict(node.kwargs))
            copy.meta = dict(node.meta)
            user.replace_input_with(node, copy)
        modified = True
    if modified:
        graph_module.recompile()
    return PassResult(graph_module, modified)


def _is_input_size(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target is torch.ops.aten.sym_size.int
        and node.args[0].op == "placeholder"
    )
