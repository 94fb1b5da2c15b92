"""Where a model comes from on the command line: ``zoo:NAME``, ``corpus:NAME``, ``file.pt2``,
``pkg.mod:factory``."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from composer import corpus, zoo
from composer.contract.errors import ModelError


def load_model(source: str) -> tuple[Any, tuple | None]:
    """Return ``(model, example_inputs)``; for a ``.pt2`` the model is an ExportedProgram."""
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
                program = torch.export.load(path)
        except Exception as error:
            raise ModelError(
                f"{source} is not a readable torch.export archive ({type(error).__name__}: "
                f"{error}). Re-save it with torch.export.save."
            ) from error
        return program, None
    if ":" in source:
        return _from_factory(source)
    raise ModelError(
        f"cannot tell what model {source!r} is: use zoo:NAME ({', '.join(sorted(zoo.ZOO))}), "
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
