"""Ops left to ExecuTorch's portable kernels computed in float32 where the model is bf16 or fp16.

Portable kernels compute a reduced-precision op in its own dtype, accumulations included, where
eager on a GPU or XNNPACK accumulates in float32: a bf16 network whose convolutions or matmuls
no backend of the stack takes misses the proof's bound there (a bf16 MLP left wholly to portable
kernels erred 8x eager; a transposed convolution a CUDA stack declines, 6x). Widening those
ops, with a cast where the program's values enter and leave them, computes what eager
computes. The program's inputs, outputs and delegates keep their dtypes.
"""

from __future__ import annotations

import contextlib

import torch
from torch.export import ExportedProgram

REDUCED = (torch.bfloat16, torch.float16)
WIDE = torch.float32


def widen_portable_ops(program: ExportedProgram) -> int:
    """Compute in float32 each op of ``program`` (an edge program, delegates lowered) that runs
    on portable kernels in bf16 or fp16; return how many. ``program`` is changed in place."""
    graph = program.graph_module.graph
    widened = [node for node in graph.nodes if _widens(node)]
    chosen = set(widened)
    up: dict[torch.fx.Node, torch.fx.Node] = {}  # a reduced value -> its float32 copy
    for node in widened:
        for arg in node.all_input_nodes:
            if arg in chosen or _dtype(arg) not in REDUCED:
                continue
            if arg not in up:
                with graph.inserting_after(arg):
                    up[arg] = _cast(graph, arg, WIDE)
            node.replace_input_with(arg, up[arg])
    for node in widened:
        reduced = _dtype(node)
        node.meta["val"] = _as(node.meta["val"], WIDE)
        outside = [user for user in node.users if user not in chosen]
        if outside and reduced is not None:
            with graph.inserting_after(node):
                down = _cast(graph, node, reduced)
            for user in outside:
                user.replace_input_with(node, down)
    graph.lint()
    program.graph_module.recompile()
    return len(widened)


def computes_reduced(program: ExportedProgram) -> bool:
    """Whether an op outside the delegates of ``program`` (an edge program, or the one
    ``to_executorch`` left with out variants) computes in bf16 or fp16."""
    return any(
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and _dtype(node) in REDUCED
        for node in program.graph.nodes
    )


def _widens(node: torch.fx.Node) -> bool:
    """An edge op whose float tensors, in and out, are all bf16 (or all fp16), and whose output
    dtype follows its inputs' (no ``dtype`` argument): a delegate call, a cast, a factory are
    left as they are."""
    # Imported here: the proof asks on every compose, and a cache hit imports no compiler.
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    if node.op != "call_function" or not isinstance(node.target, EdgeOpOverload):
        return False
    if any(arg.name == "dtype" for arg in node.target._schema.arguments):
        return False
    dtypes = {_dtype(arg) for arg in node.all_input_nodes} | {_dtype(node)}
    floats = {d for d in dtypes if d is not None and d.is_floating_point}
    return len(floats) == 1 and floats <= set(REDUCED) and _dtype(node) in REDUCED


def _dtype(node: torch.fx.Node) -> torch.dtype | None:
    value = node.meta.get("val")
    return value.dtype if isinstance(value, torch.Tensor) else None


def _as(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with getattr(value, "fake_mode", None) or contextlib.nullcontext():
        return value.to(dtype)


def _cast(graph: torch.fx.Graph, node: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    from executorch.exir.dialects._ops import ops as exir_ops

    value = node.meta["val"]
    cast = graph.call_function(
        exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
        (node,),
        {"dtype": dtype, "dim_order": list(range(value.dim()))},
    )
    cast.meta.update({k: v for k, v in node.meta.items() if k in _KEPT_META})
    cast.meta["val"] = _as(value, dtype)
    return cast


# What a cast inherits from the value it casts: where it came from, for the plan's report.
_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "debug_handle")
