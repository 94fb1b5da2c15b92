"""How composer names an op in plans, reports and blobs: ``aten.add.Tensor``."""

from __future__ import annotations

import operator

import torch
import torch.fx


def overload_of(target) -> torch._ops.OpOverload | None:
    """The ATen (or other namespace) overload behind an edge op or an OpOverload."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    wrapped = getattr(target, "_op", None)  # edge ops wrap the OpOverload
    return wrapped if isinstance(wrapped, torch._ops.OpOverload) else None


def op_name(node: torch.fx.Node) -> str:
    """``aten.add.Tensor`` for an ATen or edge op, ``higher_order.cond``, ``getitem``."""
    target = node.target
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    op = overload_of(target)
    if op is not None:
        return str(op)
    return getattr(target, "__name__", None) or str(target)
