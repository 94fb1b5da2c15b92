"""How composer names an op in plans, reports and blobs: ``aten.add.Tensor``."""

from __future__ import annotations

import operator

import torch
import torch.fx


def op_name(node: torch.fx.Node) -> str:
    """``aten.add.Tensor`` for an ATen or edge op, ``higher_order.cond``, ``getitem``."""
    target = node.target
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    op = getattr(target, "_op", target)  # edge ops wrap the ATen overload
    if isinstance(op, torch._ops.OpOverload):
        return str(op)
    return getattr(target, "__name__", None) or str(target)
