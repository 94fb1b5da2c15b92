"""ExecuTorch's export recipes both ways round: a recipe as composer's stack (its quantizer run
by ExecuTorch's own stage, its partitioners as the backends), and composer as a recipe for
``executorch.export.export``."""

from __future__ import annotations

import pytest
from executorch.backends.xnnpack.recipes.xnnpack_recipe_types import XNNPackRecipeType
from executorch.export import ExportRecipe, LoweringRecipe, export
from executorch.export.target_recipes import get_ios_recipe
from executorch.runtime import Runtime

import composer
from composer.models import zoo


def test_an_int8_xnnpack_recipe_quantizes_and_composes_on_xnnpack():
    model, inputs = zoo.load("cnn")
    recipe = ExportRecipe.get_recipe(XNNPackRecipeType.PT2E_INT8_STATIC_PER_CHANNEL)

    composition = composer.compose(model, recipe, inputs, cache=False)

    plan = composition.plan
    assert plan.backends == ("xnnpack",)
    assert plan.proof.startswith("ran and matched eager"), plan.proof
    (partition,) = plan.partitions
    assert partition.quantized
    assert plan.quantization is not None  # proven against the quantized model, and says so


def test_a_target_recipe_plans_as_its_partitioners_stack():
    model, inputs = zoo.load("cnn")
    recipe = get_ios_recipe()  # Core ML, then XNNPACK

    plan = composer.plan(model, recipe, inputs, cache=False)

    assert plan.backends == ("coreml", "xnnpack")


def test_a_recipe_whose_backend_composer_has_no_plugin_for_is_refused_by_name():
    class Elsewhere:
        class delegation_spec:  # the attribute ExecuTorch's partitioners carry
            backend_id = "SomeoneElsesBackend"

    recipe = ExportRecipe(name="theirs", lowering_recipe=LoweringRecipe(partitioners=[Elsewhere()]))
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match="'SomeoneElsesBackend'.*composer backends"):
        composer.plan(model, recipe, inputs, cache=False)


def test_executorch_export_with_composer_s_recipe_writes_a_program_that_runs():
    pytest.importorskip("openvino")
    model, inputs = zoo.load("cnn")

    recipe = composer.export_recipe("xnnpack,openvino")
    session = export(model, [inputs], recipe)

    method = Runtime.get().load_program(session.get_pte_buffer()).load_method("forward")
    (output,) = method.execute(list(inputs))
    assert (output - model(*inputs)).abs().max().item() < 1e-4
    assert recipe.name == "composer:xnnpack,openvino"
    lowered = session.get_edge_program_manager().exported_program().graph_module
    backend_ids = {
        getattr(lowered, node.target).backend_id
        for node in lowered.graph.nodes
        if node.op == "get_attr" and node.target.startswith("lowered_module")
    }
    assert backend_ids == {"XnnpackBackend"}  # XNNPACK first took every node it can
