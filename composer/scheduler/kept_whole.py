"""Nodes kept undecomposed for a backend that no backend then took, found before ExecuTorch
refuses them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import torch
import torch.fx
from executorch.exir.operator.convert import to_out_variant
from executorch.exir.operator.util import _QUANT_PRIMITIVES
from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge
from torch.export import ExportedProgram

from composer.contract.errors import PartitionError
from composer.scheduler.origins import origin_name
from composer.scheduler.preserved import preserved


class KeptWholeButLeft(PartitionError):
    """Nodes kept undecomposed for a backend that then no backend took (a pin, a minimum
    partition size, consolidation): undelegated, ExecuTorch refuses them ("was not decomposed
    or delegated"), so they must be decomposed and the program lowered again."""

    def __init__(self, nodes: Mapping[str, tuple[str, Mapping[str, str]]]) -> None:
        # edge node name -> (its origin_name, {backend that kept it whole: why it left it})
        self.nodes = {name: (origin, dict(left)) for name, (origin, left) in nodes.items()}
        listed = ", ".join(
            f"{name} (kept whole for {', '.join(sorted(left))}: {'; '.join(left.values())})"
            for name, (_, left) in sorted(self.nodes.items())
        )
        super().__init__(
            f"no backend takes {listed}; lower again with them decomposed "
            "(SharedLowering.decomposed, as composer.compose does)."
        )


def _with_edge_forms(ops: Sequence[object]) -> set[object]:
    return {aten_to_edge(op) for op in ops} | set(ops)


# ExecuTorch's check passes over quantize/dequantize (a backend keeps them whole, Core ML
# does, and what it leaves runs on the quantized portable kernels composer loads).
_QUANTIZE_DEQUANTIZE = frozenset(_with_edge_forms(_QUANT_PRIMITIVES))


def aten_op(target: object) -> object:
    """The ATen op of an edge op (the form ``ops_to_not_decompose`` lists), else ``target``."""
    return getattr(target, "_op", target)


def kernel_name(target: object) -> str | None:
    """The name a runtime registers ``target``'s kernel under (``"aten::linear.out"``), else
    ``None``: no out variant, for which ``to_executorch`` fails with "Missing out variants"
    (aten.max_pool2d, which XNNPACK keeps whole, has none; its decomposition
    max_pool2d_with_indices has)."""
    try:
        out = (
            target.to_out_variant()
            if hasattr(target, "to_out_variant")
            else to_out_variant(target)[0]
        )
    except RuntimeError:
        return None
    return f"{out._schema.name}.{out._overloadname}"


def _runs(target: object, kernels: Collection[str] | None) -> bool:
    name = kernel_name(target)
    return name is not None and (kernels is None or name in kernels)


# One backend that asked to keep ops whole: its name, the ATen ops it asked for, and why its
# last partition() left each node it did not take.
Keeper = tuple[str, Collection[object], Mapping[str, str]]


def kept_whole_but_left(
    program: ExportedProgram,
    taken: Collection[torch.fx.Node],
    ops: Sequence[torch._ops.OpOverload],
    op_filter: Callable[[torch.fx.Node], bool] | None,
    keepers: Sequence[Keeper],
    kept: Sequence[torch._ops.OpOverload] = (),
    kernels: Collection[str] | None = None,
) -> dict[str, tuple[str, dict[str, str]]]:
    """The nodes of ``program`` (lowered by the whole stack; ``taken``: delegated) that
    ExecuTorch will refuse: kept whole as the stack asked (``ops``, under ``op_filter``) and
    taken by none, each with its origin name and the ``keepers`` that kept its op whole and why
    they left it. The same tests as ExecuTorch's own check after lowering
    (``_sanity_check_graph_for_non_decomp_ops``, which asks for ``ops`` and ``op_filter`` again
    of the lowered program) and as ``to_executorch``'s (a node of ``kept``, what the
    decomposition kept whole, with no out variant), made before it lowers. ``kernels``: the
    operators the target runtime has kernels for (``None``: any with an out variant); a node
    kept whole whose kernel it lacks is refused too, so it is decomposed and the program loads
    there (bench/et_runtime's runner has no ``aten::linear.out``, which CUDA keeps whole)."""
    refused = _with_edge_forms(preserved(ops))
    # ``kept``: what the decomposition kept whole (the stack's answer before lowering, which
    # ``ops``, asked of the lowered program, may no longer list: the AOTInductor plugins').
    kept_whole = _with_edge_forms(preserved(kept)) | refused
    left: dict[str, tuple[str, dict[str, str]]] = {}
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or node in taken or node.target not in kept_whole:
            continue
        if node.target in _QUANTIZE_DEQUANTIZE:
            continue
        # ExecuTorch's check refuses a node its filter keeps. The filter compares ATen ops, so
        # it passes every edge node, which then runs on its portable kernel if it has one
        # (upsample, stack); one without (max_pool2d, repeat_interleave) fails later in
        # to_executorch. A node made after the edge dialect (scalar_tensor, from a
        # decomposition while lowering) still has its ATen op, and the filter keeps it.
        checked = node.target in refused and (op_filter is None or op_filter(node))
        if not checked and _runs(node.target, kernels):
            continue
        why = {
            name: declined.get(node.name, "not taken")
            for name, kept_whole_ops, declined in keepers
            if aten_op(node.target) in kept_whole_ops
        }
        left[node.name] = (origin_name(node), why)
    return left
