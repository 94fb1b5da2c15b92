"""Where a model comes from on the command line: ``zoo:NAME``, ``corpus:NAME``, ``file.pt2``,
``pkg.mod:factory``."""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from composer.contract.environment import shortened
from composer.contract.errors import ModelError
from composer.lower.export import load_program
from composer.models import corpus, zoo


def load_model(source: str, dynamic: Sequence[str] = ()) -> tuple[Any, tuple | None]:
    """Return ``(model, example_inputs)``; for a ``.pt2`` the model is an ExportedProgram.
    ``dynamic`` (``--dynamic``, see :func:`dynamic_shapes_from_text`) exports the module with
    those dims dynamic."""
    model, inputs = _load(source)
    if not dynamic:
        return model, inputs
    if not isinstance(model, torch.nn.Module):
        raise ModelError(
            f"--dynamic is for a module: {source} is already exported, with the dims it was "
            "exported with. Export it with dynamic_shapes= and save it again."
        )
    shapes = dynamic_shapes_from_text(dynamic, inputs or ())
    try:
        return torch.export.export(model.eval(), tuple(inputs), dynamic_shapes=shapes), inputs
    except Exception as error:
        raise ModelError(
            f"torch.export could not make {', '.join(dynamic)} dynamic: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error


# The largest size a dim may take: the runtime keeps sizes as int32 (SizesType); a larger bound
# failed only deep in lowering (XNNPACK's flatbuffer holds 32-bit dims: 2**32 sent every
# partition to repairs) or, beyond 64 bits, as a page of ExecuTorch's errors.
MAX_SIZE = 2**31 - 1
DYNAMIC_FORM = re.compile(r"^(?:(\d+):)?(\d+)=(\d+)\.\.(\d+)$")


def dynamic_shapes_from_text(specs: Sequence[str], inputs: Sequence[Any]) -> tuple:
    """torch.export's ``dynamic_shapes`` from ``INPUT:DIM=MIN..MAX`` strings (``INPUT``
    defaults to 0): ``1=2..128`` makes dim 1 of the first input a size from 2 to 128. Dims
    with the same range share one symbol, as a sequence length shared by inputs does."""
    shapes: list[dict[int, Any]] = [{} for _ in inputs]
    symbols: dict[tuple[int, int], Any] = {}
    for spec in specs:
        match = DYNAMIC_FORM.match(spec.replace(" ", ""))
        if match is None:
            raise ModelError(
                f"--dynamic {spec!r}: write INPUT:DIM=MIN..MAX, e.g. 0:1=2..128 (dim 1 of the "
                "first input from 2 to 128); INPUT defaults to 0."
            )
        index, dim, low, high = (int(g) if g else 0 for g in match.groups())
        if high > MAX_SIZE:
            raise ModelError(
                f"--dynamic {shortened(spec)!r}: MAX must be at most {MAX_SIZE:,} (ExecuTorch keeps "
                "a tensor's sizes as 32-bit integers); write a smaller MAX."
            )
        if index >= len(inputs) or not isinstance(inputs[index], torch.Tensor):
            raise ModelError(f"--dynamic {spec!r}: the model has no tensor input {index}.")
        if dim >= inputs[index].dim() or not low <= inputs[index].shape[dim] <= high:
            raise ModelError(
                f"--dynamic {spec!r}: input {index} has shape {list(inputs[index].shape)}; the "
                "dim must exist and its example size lie in the range."
            )
        if (low, high) not in symbols:
            symbols[(low, high)] = torch.export.Dim(f"d{len(symbols)}", min=low, max=high)
        shapes[index][dim] = symbols[(low, high)]
    return tuple(shape or None for shape in shapes)


def _load(source: str) -> tuple[Any, tuple | None]:
    if source.startswith("zoo:"):
        return zoo.load(source.removeprefix("zoo:"))
    if source.startswith("corpus:"):  # real architectures; needs the [corpus] extra
        return corpus.load(source.removeprefix("corpus:"))
    if source.endswith(".pt2"):
        path = Path(source)
        if not path.is_file():
            raise ModelError(f"no such file: {source}. Save one with torch.export.save(ep, path).")
        try:
            with _quiet_logger("torch.export"):  # it logs the whole traceback it then raises
                program = load_program(path)
        except Exception as error:
            raise ModelError(
                f"{source} is not a readable torch.export archive ({type(error).__name__}: "
                f"{error}). Re-save it with torch.export.save."
            ) from error
        return program, None
    if ":" in source:
        return _from_factory(source)
    near = f"did you mean zoo:{source}? Or " if source in zoo.ZOO else ""
    raise ModelError(
        f"cannot tell what model {source!r} is: {near}use zoo:NAME ({', '.join(sorted(zoo.ZOO))}), "
        "corpus:NAME (real architectures, e.g. corpus:resnet18), a .pt2 file from "
        "torch.export.save, or package.module:function returning (module, example_inputs)."
    )


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _importable_from_here() -> Iterator[None]:
    """Let ``models:build`` name a module in the current directory, as ``python -m`` would."""
    here = str(Path.cwd())
    if here in sys.path or "" in sys.path:
        yield
        return
    sys.path.insert(0, here)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(here)


def _from_factory(source: str) -> tuple[Any, tuple]:
    module_name, _, function_name = source.partition(":")
    try:
        with _importable_from_here():
            module = importlib.import_module(module_name)
    except Exception as error:
        raise ModelError(
            f"cannot import {module_name!r}: {type(error).__name__}: {error}"
        ) from error
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise ModelError(f"{module_name!r} has no function {function_name!r}.")
    try:
        result = factory()
    except Exception as error:
        raise ModelError(f"the factory {source} raised {type(error).__name__}: {error}") from error
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelError(
            f"the factory {source} must return (module, example_inputs), got "
            f"{type(result).__name__}."
        )
    model, inputs = result
    return model, tuple(inputs)
