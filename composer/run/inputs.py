"""Inputs as a program takes them: nested structures flattened the way ``torch.export`` flattens
them (its ``in_spec``), and, for a program with dynamic dims, the sizes the proof runs it at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree


def flat_inputs(inputs: Sequence[Any]) -> list[Any]:
    """The leaves of ``inputs`` in the order an ExecuTorch method takes them: ``(x, (h, c))``
    becomes ``[x, h, c]``; ``None`` leaves are dropped, as torch.export drops them."""
    return [leaf for leaf in pytree.tree_leaves(tuple(inputs)) if leaf is not None]


def sizes_to_prove(
    example: Sequence[Any], dims: Sequence[Mapping[str, Any]]
) -> list[tuple[str, tuple]]:
    """(label, inputs) for each size the proof runs a dynamic program at: the example, then
    every symbol at its smallest, a middle and its largest value (the bounds torch.export
    gave). A lower bound of 0 is taken as 1: an empty sequence is nobody's call. Unbounded
    symbols are tried at twice the example's size instead of the bound."""
    example = tuple(example)
    if not dims:
        return [("example", example)]
    ranges: dict[str, list[int | None]] = {}
    for entry in dims:
        ranges.update(entry["ranges"])
    at_example = _example_values(example, dims)
    points: dict[str, dict[str, int]] = {}
    for name, pick in (("min", 0), ("mid", 1), ("max", 2)):
        values = {}
        for symbol, (low, high) in ranges.items():
            low = max(int(low), 1)
            high = high if high is not None else max(2 * at_example.get(symbol, low), low)
            values[symbol] = (low, (low + high) // 2, high)[pick]
        points[name] = values
    chosen = [("example", example)]
    seen = {_key(at_example)}
    for name, values in points.items():
        if _key(values) in seen:
            continue
        seen.add(_key(values))
        label = ", ".join(f"{s}={v}" for s, v in sorted(values.items()))
        chosen.append((f"{name} ({label})", _resized(example, dims, values)))
    return chosen


SAMPLE = "proof input"  # what the proof calls one of the user's own samples, with its number


def sample_label(index: int) -> str:
    """What the proof calls the user's ``index``-th sample (``proof_inputs``, from 0): "proof
    input 1" is the first."""
    return f"{SAMPLE} {index + 1}"


def points_to_prove(
    example: Sequence[Any], dims: Sequence[Mapping[str, Any]], samples: Sequence[Sequence[Any]] = ()
) -> list[tuple[str, tuple]]:
    """(label, inputs) for each point the proof runs a program at: :func:`sizes_to_prove`'s
    sizes, then each of the user's ``samples`` (``proof_inputs``), as given."""
    return [
        *sizes_to_prove(example, dims),
        *((sample_label(index), tuple(sample)) for index, sample in enumerate(samples)),
    ]


def _key(values: Mapping[str, int]) -> tuple:
    return tuple(sorted(values.items()))


def _example_values(example: tuple, dims) -> dict[str, int]:
    """The symbols' values at the example inputs, read off dims that are a plain symbol."""
    tensors = [leaf for leaf in flat_inputs(example) if isinstance(leaf, torch.Tensor)]
    values = {}
    for entry in dims:
        if entry["size"] in entry["ranges"] and entry["input"] < len(tensors):
            values[entry["size"]] = int(tensors[entry["input"]].shape[entry["dim"]])
    return values


def _resized(example: tuple, dims, values: Mapping[str, int]) -> tuple:
    """``example`` with each dynamic dim at its size for ``values``; new elements drawn like
    the example's: random normal for floats, the example's own values for integers (token
    ids stay within the vocabulary)."""
    leaves, spec = pytree.tree_flatten(example)
    shapes: dict[int, list[int]] = {}
    tensor_index = 0
    positions = {}
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            positions[tensor_index] = position
            shapes[tensor_index] = list(leaf.shape)
            tensor_index += 1
    symbols = {name: sympy.Symbol(name, integer=True) for name in values}
    for entry in dims:
        if entry["input"] not in shapes:
            continue
        expr = sympy.sympify(entry["size"], locals=symbols)
        size = expr.subs({symbols[s]: v for s, v in values.items() if s in symbols})
        shapes[entry["input"]][entry["dim"]] = int(sympy.ceiling(size))
    generator = torch.Generator().manual_seed(0)
    for index, shape in shapes.items():
        leaf = leaves[positions[index]]
        if list(leaf.shape) != shape:
            leaves[positions[index]] = _like(leaf, shape, generator)
    return tuple(pytree.tree_unflatten(leaves, spec))


def calibration_batches(inputs: Sequence[Any], batches: int, seed: int = 0) -> list[tuple]:
    """``batches`` random batches shaped like ``inputs``, to calibrate a quantizer with:
    floating tensors drawn anew, anything else (token ids) kept as it is."""
    generator = torch.Generator().manual_seed(seed)

    def like(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return torch.randn(value.shape, generator=generator, dtype=value.dtype)
        return value

    return [tuple(like(value) for value in inputs) for _ in range(batches)]


def _like(tensor: torch.Tensor, shape: list[int], generator: torch.Generator) -> torch.Tensor:
    if tensor.dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(tensor.dtype)
    pool = tensor.flatten()
    if pool.numel() == 0:
        return torch.zeros(shape, dtype=tensor.dtype)
    picks = torch.randint(0, pool.numel(), shape, generator=generator)
    return pool[picks]


def signature_inputs(buffer: bytes, method: str = "forward", seed: int = 0) -> tuple[list, str]:
    """Inputs for ``method`` of the program ``buffer`` made from its signature, as the program
    stores it (a dynamic input at its stored, largest, sizes), and the signature in words
    (``float32[1, 3, 224, 224], int64[1, 64] (largest sizes)``): random normal floats from
    ``seed``, zeros for integers and bools (an index of 0 is in range of any table). Raises
    a ComposerError for an input that is not a tensor."""
    from executorch.exir.schema import Tensor, TensorShapeDynamism
    from executorch.exir.tensor import get_scalar_type

    from composer.contract.errors import ComposerError
    from composer.run.program_table import execution_plan

    plan = execution_plan(buffer, method)
    if plan is None:
        raise ComposerError(f"the program has no method {method!r}.")
    generator = torch.Generator().manual_seed(seed)
    made, words, dynamic = [], [], False
    for index, value in enumerate(plan.inputs):
        tensor = plan.values[value].val
        if not isinstance(tensor, Tensor):
            raise ComposerError(
                f"input {index} of {method!r} is a {type(tensor).__name__}, not a tensor: "
                "pass --inputs FILE (a tuple of tensors saved with torch.save)."
            )
        dtype, shape = get_scalar_type(tensor.scalar_type), list(tensor.sizes)
        dynamic |= tensor.shape_dynamism != TensorShapeDynamism.STATIC
        if dtype.is_floating_point:
            made.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            made.append(torch.zeros(shape, dtype=dtype))
        words.append(f"{str(dtype).removeprefix('torch.')}{shape}")
    said = ", ".join(words) or "no inputs"
    return made, said + (" (largest sizes)" if dynamic else "")
