"""ExecuTorch's export recipes (``executorch.export``) both ways round.

- A recipe as a stack: ``composer.compose(model, recipe, inputs)`` takes an ``ExportRecipe``
  (one backend's, ``ExportRecipe.combine``'d, or a target's such as ``get_ios_recipe``). Its
  source transforms and quantizers run as ExecuTorch runs them (its own stages, up to
  ``torch.export``); its partitioners become the stack's backends, in their order, each found
  by the ExecuTorch backend it lowers to; composer then composes, guards and proves.
- composer as a recipe: ``composer.export_recipe("xnnpack,openvino")`` (recipe type
  ``ComposerRecipeType.STACK`` of the provider registered as ``"composer"``) for
  ``executorch.export.export(model, [inputs], recipe)``: ExecuTorch's pipeline lowers with
  composer's guarded, convex partitioners. The proof (running the program before it is
  written) needs composer's own pipeline: ``compose`` does it, ExecuTorch's stages cannot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from executorch.export import (
    BackendRecipeProvider,
    ExportRecipe,
    ExportSession,
    LoweringRecipe,
    RecipeType,
    StageType,
    recipe_registry,
)
from torch.export import ExportedProgram

from composer.contract.errors import ComposerError, ModelError
from composer.registry.discovery import Registry, default_registry
from composer.registry.stack import Stack
from composer.scheduler.drop_in import listed, partitioner

PROVIDER = "composer"
_BEFORE_LOWERING = (StageType.SOURCE_TRANSFORM, StageType.QUANTIZE, StageType.TORCH_EXPORT)


def recipe_backends(recipe: ExportRecipe, registry: Registry | None = None) -> list[str]:
    """The backends a recipe's partitioners lower to, in its order, as composer names them."""
    registry = registry or default_registry()
    lowering = recipe.lowering_recipe
    partitioners = lowering.partitioners if lowering is not None else None
    if isinstance(partitioners, dict):
        raise ComposerError(
            f"recipe {recipe.name!r} gives each method its own partitioners; composer takes one "
            "stack for every method: compose each method with its own recipe."
        )
    if not partitioners:
        raise ComposerError(
            f"recipe {recipe.name!r} has no partitioners, so it names no backend to compose."
        )
    if lowering.edge_transform_passes or lowering.edge_manager_transform_passes:
        raise ComposerError(
            f"recipe {recipe.name!r} declares edge transform passes, which composer's lowering "
            "does not run; apply them to the program yourself, or use a recipe without them."
        )
    by_id = {b.spec.backend_id: name for name, b in registry.backends.items()}
    names = []
    for each in partitioners:
        backend_id = getattr(getattr(each, "delegation_spec", None), "backend_id", None)
        name = by_id.get(backend_id)
        if name is None:
            raise ComposerError(
                f"recipe {recipe.name!r} lowers with {type(each).__name__} (ExecuTorch backend "
                f"{backend_id!r}), which no installed composer backend lowers to; "
                "`composer backends` lists them."
            )
        if name not in names:
            names.append(name)
    return names


def recipe_program(
    recipe: ExportRecipe,
    model: Any,
    example_inputs: Sequence[Any] | None,
    dynamic_shapes=None,
    calibration: Sequence[Sequence[Any]] = (),
) -> ExportedProgram:
    """``model`` through ``recipe``'s stages before lowering, run by ExecuTorch itself: source
    transforms, quantization (calibrated on ``example_inputs`` and ``calibration``'s input
    tuples), ``torch.export`` (with ``example_inputs``)."""
    if isinstance(model, ExportedProgram):
        if recipe.quantization_recipe is not None:
            raise ModelError(
                f"recipe {recipe.name!r} quantizes, which needs the module: pass the nn.Module "
                "and its example inputs, not an ExportedProgram."
            )
        return model
    if example_inputs is None:
        raise ModelError("a module needs its example inputs to export with a recipe.")
    session = ExportSession(
        model=model,
        example_inputs=[tuple(example_inputs), *(tuple(batch) for batch in calibration)],
        export_recipe=dataclasses.replace(recipe, pipeline_stages=list(_BEFORE_LOWERING)),
        dynamic_shapes=dynamic_shapes,
    )
    session.export()
    return session.get_exported_program()


class ComposerRecipeType(RecipeType):
    """composer's recipes for ``executorch.export``. ``STACK`` takes ``backends="a,b"``, the
    backends in priority order (with their default options)."""

    STACK = "composer_stack"

    @classmethod
    def get_backend_name(cls) -> str:
        return PROVIDER


class ComposerRecipeProvider(BackendRecipeProvider):
    """Recipes whose partitioners are composer's guarded, convex drop-ins, one per backend."""

    @property
    def backend_name(self) -> str:
        return PROVIDER

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return [ComposerRecipeType.STACK]

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        if recipe_type != ComposerRecipeType.STACK:
            return None
        backends = kwargs.pop("backends", None)
        if backends is None or kwargs:
            raise ComposerError(
                "composer's STACK recipe takes backends='a,b' and nothing else"
                + (f", not {sorted(kwargs)}" if kwargs else "")
                + "."
            )
        names = Stack.of(backends).backends
        return ExportRecipe(
            name=f"composer:{','.join(names)}",
            lowering_recipe=LoweringRecipe(
                partitioners=listed(*(partitioner(name) for name in names))
            ),
        )


def register() -> None:
    """Register composer's recipe provider with ExecuTorch's recipe registry (idempotent)."""
    if PROVIDER not in recipe_registry.list_backends():
        recipe_registry.register_backend_recipe_provider(ComposerRecipeProvider())


def export_recipe(backends: str | Sequence[str]) -> ExportRecipe:
    """An ``ExportRecipe`` for ``executorch.export.export`` lowering with composer's guarded
    partitioners for ``backends``, in priority order."""
    register()
    return ExportRecipe.get_recipe(ComposerRecipeType.STACK, backends=backends)


register()
