"""Which input dims of an exported program are symbolic, and the ranges torch.export gave them.

The plan carries them so that the report can say what a program accepts and the proof can run
it at the bounds, from a program read back from the cache as from one just lowered.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind


def dynamic_dims(program: ExportedProgram) -> tuple[dict[str, Any], ...]:
    """One entry per symbolic dim of a user input: ``input`` (its index among the program's
    tensor inputs, flattened), ``dim``, ``size`` (the expression, ``"s27"`` or ``"2*s27"``) and
    ``ranges``: symbol -> ``[min, max]`` (``max`` is ``None`` where unbounded)."""
    # Placeholders and input specs in the same order; by position, not name: a deepcopy of
    # the program renames a placeholder called ``input`` to ``input_1``, not its spec.
    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"]
    ranges = {str(symbol): r for symbol, r in program.range_constraints.items()}
    found = []
    index = 0
    for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=False):
        if spec.kind != InputKind.USER_INPUT:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and not isinstance(_expr(size), int):
                expr = _expr(size)
                found.append(
                    {
                        "input": index,
                        "dim": dim,
                        "size": str(expr),
                        "ranges": {
                            str(s): _bounds(ranges.get(str(s)))
                            for s in sorted(expr.free_symbols, key=str)
                        },
                    }
                )
        index += 1
    return tuple(found)


def _expr(size: torch.SymInt):
    expr = size.node.expr
    return int(expr) if expr.is_number else expr


def _bounds(value_range) -> list[int | None]:
    if value_range is None:
        return [0, None]
    low, high = value_range.lower, value_range.upper
    unbounded = str(high) in ("oo", "int_oo") or not getattr(high, "is_finite", True)
    return [int(low), None if unbounded else int(high)]
