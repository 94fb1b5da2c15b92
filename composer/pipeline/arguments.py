"""The keyword arguments of ``compose`` and ``plan`` checked before any work: a wrong type
is the caller's mistake, and said so, not a plugin's failure minutes later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram

from composer.contract.errors import ComposerError
from composer.registry.discovery import Registry
from composer.registry.names import is_count
from composer.run.inputs import flat_inputs, sample_label
from composer.scheduler.dynamic_dims import range_bounds


def check_arguments(
    example_inputs: Any = None,
    progress: Any = None,
    cache: Any = True,
    registry: Any = None,
    check: Any = True,
    jobs: Any = None,
    constant_methods: Any = None,
) -> None:
    """Raise a ComposerError naming the first argument of the wrong type."""
    if progress is not None and not callable(progress):
        _wrong("progress", progress, "a function taking one line of text, or None")
    for name, value in (("cache", cache), ("check", check)):
        if not isinstance(value, bool):
            _wrong(name, value, "True or False")
    if example_inputs is not None and (
        isinstance(example_inputs, torch.Tensor | str | bytes | Mapping)
        or not isinstance(example_inputs, Sequence)
    ):
        _wrong("example_inputs", example_inputs, "a tuple of the model's inputs, e.g. (x,)")
    if registry is not None and not isinstance(registry, Registry):
        _wrong("registry", registry, "a composer.Registry, or None for the installed plugins")
    if jobs is not None and not is_count(jobs):
        _wrong("jobs", jobs, "a whole number >= 1, or None")
    if constant_methods is not None and not isinstance(constant_methods, Mapping):
        _wrong("constant_methods", constant_methods, "a dict of name -> value, or None")


def proof_inputs_of(value: Any, *, several: bool = False, check: bool = True) -> tuple[tuple, ...]:
    """``proof_inputs`` as a tuple of samples, each a tuple of the model's inputs, or a
    ComposerError saying what they must be: a list of tuples like ``example_inputs``, for one
    method, with the proof on (``several``: ``model`` is a dict of methods; ``check``)."""
    if value is None:
        return ()
    if _not_a_sequence(value):
        _wrong("proof_inputs", value,
               "a list of input tuples like example_inputs, e.g. [(x1,), (x2,)]")  # fmt: skip
    samples = []
    for index, sample in enumerate(value):
        if _not_a_sequence(sample):
            _wrong(f"proof_inputs[{index}]", sample,
                   "a tuple of the model's inputs like example_inputs, e.g. (x1,)")  # fmt: skip
        samples.append(tuple(sample))
    if samples and several:
        raise ComposerError(
            "proof_inputs go with one method: with model a dict of methods, compose each "
            "method alone to prove it on your samples."
        )
    if samples and not check:
        raise ComposerError(
            "proof_inputs are what the proof runs the program at, and check=False (--no-check) "
            "turns the proof off: drop one of the two."
        )
    return tuple(samples)


def _not_a_sequence(value: Any) -> bool:
    return isinstance(value, torch.Tensor | str | bytes | Mapping) or not isinstance(
        value, Sequence
    )


def check_samples_fit(
    samples: Sequence[tuple], example: Sequence[Any], program: ExportedProgram | None
) -> None:
    """Raise a ComposerError naming the first of ``samples`` the program cannot take: another
    number of inputs than ``example``, another dtype or rank, a size other than the program's
    where it is static, or outside its range where it is dynamic (``program``'s placeholders,
    where it has one for each of the example's inputs; else the example's dtypes and ranks)."""
    expected = flat_inputs(example)
    shapes = _program_shapes(program, len(expected))
    dynamic = any(not isinstance(size, int) for shape in shapes or () for size in shape)
    remedy = " (a size outside a dynamic dim's range needs a wider one: --dynamic or "
    remedy = f"{remedy}dynamic_shapes)" if dynamic else ""
    for index, sample in enumerate(samples):
        name = f"{sample_label(index)} of {len(samples)}"
        given = flat_inputs(sample)
        if len(given) != len(expected):
            raise ComposerError(
                f"{name} has {len(given)} input(s), and the program takes {len(expected)}, as "
                f"example_inputs does ({_said(expected)}); nothing was lowered: give each "
                "sample as the model is called."
            )
        bound: dict[sympy.Symbol, int] = {}
        for position, (value, like) in enumerate(zip(given, expected, strict=True)):
            shape = shapes[position] if shapes else None
            why = _misfit(value, like, shape, program, bound)
            if why is not None:
                raise ComposerError(
                    f"{name} does not fit the program: its input {position} is "
                    f"{_said([value])}, where the program takes {why}; nothing was lowered: "
                    f"give samples the program takes{remedy}."
                )


def _program_shapes(program: ExportedProgram | None, count: int) -> list | None:
    """The shape of each user input of ``program`` (sizes: ints, SymInts for dynamic dims),
    where it has ``count`` tensor inputs; else None."""
    if program is None:
        return None
    names = set(program.graph_signature.user_inputs)
    values = [n.meta.get("val") for n in program.graph.nodes
              if n.op == "placeholder" and n.name in names]  # fmt: skip
    if len(values) != count or not all(isinstance(v, torch.Tensor) for v in values):
        return None
    return [list(v.shape) for v in values]


def _misfit(value: Any, like: Any, shape: list | None, program, bound: dict) -> str | None:
    """What the program takes at an input where ``value`` does not fit (``like``: the example's
    input there; ``shape``: the program's, with its dynamic dims), else None."""
    if not isinstance(like, torch.Tensor):
        return None if value == like else f"{like!r}, as in example_inputs"
    dtype = str(like.dtype).removeprefix("torch.")
    wanted = f"{dtype} of shape {_shape(shape or like.shape, program)}"
    if not isinstance(value, torch.Tensor) or value.dtype != like.dtype:
        return wanted
    if value.dim() != like.dim():
        return wanted
    if shape is None:
        return None
    for size, want in zip(value.shape, shape, strict=True):
        if isinstance(want, int):
            if size != want:
                return wanted
            continue
        expr = want.node.expr
        if isinstance(expr, sympy.Symbol):
            low, high = _range(program, expr)
            if size < low or (high is not None and size > high) or bound.get(expr, size) != size:
                return wanted
            bound[expr] = size
    return None


def _range(program: ExportedProgram, symbol: sympy.Symbol) -> tuple[int, int | None]:
    low, high = range_bounds(program.range_constraints.get(symbol))
    return int(low or 0), high


def _shape(shape: Sequence[Any], program: ExportedProgram | None) -> str:
    def size(want: Any) -> str:
        if isinstance(want, int) or program is None:
            return str(int(want))
        expr = want.node.expr
        if not isinstance(expr, sympy.Symbol):
            return str(expr)
        low, high = _range(program, expr)
        return f"{low}..{'' if high is None else high}"

    return f"({', '.join(size(s) for s in shape)})"


def _said(values: Sequence[Any]) -> str:
    return ", ".join(
        f"{str(v.dtype).removeprefix('torch.')} of shape {tuple(v.shape)}"
        if isinstance(v, torch.Tensor) else repr(v)[:40]
        for v in values
    )  # fmt: skip


def _wrong(name: str, value: Any, wanted: str) -> None:
    shown = type(value).__name__ if isinstance(value, torch.Tensor) else repr(value)
    raise ComposerError(f"{name} must be {wanted}, not {shown[:80]}.")
