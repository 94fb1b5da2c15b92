"""From a model to an ``ExportedProgram``: an ``nn.Module`` is exported with its example inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from composer.contract.errors import ModelError

Model = ExportedProgram | torch.nn.Module


def export_model(model: Model, example_inputs: Sequence[Any] | None) -> ExportedProgram:
    """An ``ExportedProgram`` as is; a module exported with its example inputs."""
    if isinstance(model, ExportedProgram):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ModelError(
            f"expected a torch.nn.Module or torch.export.ExportedProgram, got "
            f"{type(model).__name__}."
        )
    if example_inputs is None:
        raise ModelError(
            f"{type(model).__name__} is an nn.Module: pass example_inputs (a tuple of tensors) "
            "so it can be exported, or pass an ExportedProgram."
        )
    try:
        return torch.export.export(model.eval(), tuple(example_inputs), strict=False)
    except Exception as error:
        raise ModelError(
            f"torch.export failed for {type(model).__name__}: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}. Make the model exportable "
            "(see torch.export's docs) or export it yourself and pass the ExportedProgram."
        ) from error


def example_inputs_of(model: Model, given: Sequence[Any] | None) -> tuple:
    if given is not None:
        return tuple(given)
    stored = getattr(model, "example_inputs", None)
    if stored:
        args, _kwargs = stored
        return tuple(args)
    return ()
