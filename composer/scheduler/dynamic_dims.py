"""Which input dims of an exported program are symbolic, and the ranges torch.export gave them.

The plan carries them so that the report can say what a program accepts and the proof can run
it at the bounds, from a program read back from the cache as from one just lowered.
"""

from __future__ import annotations

import re
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind


def dynamic_dims(program: ExportedProgram) -> tuple[dict[str, Any], ...]:
    """One entry per symbolic dim of a user input: ``input`` (its index among the program's
    tensor inputs, flattened), ``dim``, ``size`` (the expression, ``"s27"`` or ``"2*s27"``) and
    ``ranges``: symbol -> ``[min, max]`` (``max`` is ``None`` where unbounded). Symbols are
    named as the user named their ``Dim`` (``"2*half"``) where torch.export kept the name."""
    # Placeholders and input specs in the same order; by position, not name: a deepcopy of
    # the program renames a placeholder called ``input`` to ``input_1``, not its spec.
    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"]
    ranges = {str(symbol): r for symbol, r in program.range_constraints.items()}
    written = _written_names(placeholders)
    symbolic = []  # (input index, dim, expression, how the user wrote it)
    index = 0
    for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=False):
        if spec.kind != InputKind.USER_INPUT:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and not isinstance(_expr(size), int):
                source = f"L['{spec.arg.name}'].size()[{dim}]"
                symbolic.append((index, dim, _expr(size), written.get(source)))
        index += 1
    names = _user_names(symbolic)
    return tuple(
        {
            "input": index,
            "dim": dim,
            "size": str(expr.subs(names)),
            "ranges": {
                str(names.get(s, s)): range_bounds(ranges.get(str(s)))
                for s in sorted(expr.free_symbols, key=str)
            },
        }
        for index, dim, expr, _ in symbolic
    )


def _written_names(placeholders: list) -> dict[str, str]:
    """How the user wrote each input dim (``"L['x'].size()[2]" -> "2*half"``), as
    torch.export's ShapeEnv kept it; empty for a program loaded from a file, which loses it."""
    for node in placeholders:
        env = getattr(getattr(node.meta.get("val"), "fake_mode", None), "shape_env", None)
        if env is not None:
            return dict(getattr(env, "source_name_to_debug_name", {}))
    return {}


def _user_names(symbolic: list) -> dict[sympy.Symbol, sympy.Symbol]:
    """The program's symbols renamed as the user wrote them (``s44 -> half``), where each
    written form has the one symbol of its expression and says the same; none where two
    disagree or a name is taken, so the sizes stay the program's own."""
    names: dict[sympy.Symbol, sympy.Symbol] = {}
    for _, _, expr, text in symbolic:
        if text is None or len(expr.free_symbols) != 1:
            continue
        try:
            written = sympy.sympify(text, locals=_symbols_in(text))
        except (sympy.SympifyError, SyntaxError, TypeError):
            continue
        if len(getattr(written, "free_symbols", ())) != 1:
            continue
        (symbol,), (name,) = expr.free_symbols, written.free_symbols
        if sympy.expand(expr.subs(symbol, name) - written) != 0:
            continue
        if names.setdefault(symbol, name) != name:
            return {}
    taken = {s for _, _, expr, _ in symbolic for s in expr.free_symbols} - names.keys()
    chosen = {name.name for name in names.values()}
    if len(chosen) != len(names) or chosen & {s.name for s in taken}:
        return {}
    return names


def _symbols_in(text: str) -> dict[str, sympy.Symbol]:
    # Every identifier a symbol: a Dim named E or N is the user's, not sympy's constant.
    return {word: sympy.Symbol(word, integer=True) for word in re.findall(r"[A-Za-z_]\w*", text)}


def _expr(size: torch.SymInt):
    expr = size.node.expr
    return int(expr) if expr.is_number else expr


def range_bounds(value_range) -> list[int | None]:
    """[low, high] of a range torch.export gave a symbol (``range_constraints``); high is
    None where it is unbounded."""
    if value_range is None:
        return [0, None]
    low, high = value_range.lower, value_range.upper
    unbounded = str(high) in ("oo", "int_oo") or not getattr(high, "is_finite", True)
    return [int(low), None if unbounded else int(high)]
