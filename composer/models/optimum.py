"""A ``composer`` recipe for Hugging Face's optimum-executorch: ``main_export(...,
recipe="composer", recipe_kwargs={"backends": "xnnpack,openvino"})`` exports a transformers
model with optimum's own task code (its static KV cache, its custom SDPA where asked) and
composes every program it exports with the stack, proven, instead of a single partitioner.

    import composer.models.optimum  # registers the recipe with optimum-executorch
    from optimum.exporters.executorch import main_export

    main_export("path/to/model", task="text-generation", recipe="composer",
                output_dir="out", recipe_kwargs={"backends": "xnnpack"})

optimum-executorch 1.1.0 pins ``transformers==5.0.0rc1``; it installs beside torch 2.13 and
ExecuTorch 1.5.1, but not beside composer's ``corpus`` extra (``transformers==5.23.0``), so it
has an environment of its own (``scripts/optimum-env``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from optimum.exporters.executorch.recipe_registry import register_recipe

from composer.lower.atomic import ptd_name
from composer.pipeline.compose import compose
from composer.pipeline.methods import MethodsComposition

RECIPE = "composer"


class WrittenProgram:
    """What optimum's ``export_to_executorch`` saves: a composed program, as ExecuTorch's
    ``ExecutorchProgramManager`` offers its bytes and its .ptd data."""

    def __init__(self, composition: MethodsComposition) -> None:
        self.composition = composition

    def write_to_file(self, file: BinaryIO) -> None:
        file.write(self.composition.buffer)

    def write_tensor_data_to_file(self, folder: str | Path) -> None:
        for name, data in self.composition.data_files.items():
            (Path(folder) / ptd_name(name)).write_bytes(data)


@register_recipe(RECIPE)
def export_with_composer(model: Any, backends: str = "xnnpack", **settings: Any):
    """optimum's recipe signature: ``model`` is one of its exportable modules (its ``export()``
    gives the programs, its ``metadata`` the constant methods runners read). ``backends`` and
    ``settings`` are ``compose``'s stack and keywords, given as ``recipe_kwargs``."""
    programs = model.export()
    if len(programs) == 1:  # one program is the method "forward", as optimum's recipes write it
        programs = {"forward": next(iter(programs.values()))}
    composition = compose(
        programs, backends, constant_methods=getattr(model, "metadata", None), **settings
    )
    return {"model": WrittenProgram(composition)}
