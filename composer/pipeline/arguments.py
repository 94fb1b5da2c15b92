"""The keyword arguments of ``compose`` and ``plan`` checked before any work: a wrong type
is the caller's mistake, and said so, not a plugin's failure minutes later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from composer.contract.errors import ComposerError
from composer.registry.discovery import Registry
from composer.registry.names import is_count


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


def _wrong(name: str, value: Any, wanted: str) -> None:
    shown = type(value).__name__ if isinstance(value, torch.Tensor) else repr(value)
    raise ComposerError(f"{name} must be {wanted}, not {shown[:80]}.")
