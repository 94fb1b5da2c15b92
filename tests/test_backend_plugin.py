"""The two ways to write a plugin: a ``composer.hookspecs.BackendPlugin`` subclass, and a module of
``@hookimpl`` functions (tests/sample_plugin). composer asks and checks both alike."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pluggy
import pytest
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer.contract import hookspecs
from composer.contract.errors import ComposerWarning, PluginError
from composer.contract.hookspecs import BackendPlugin, hookimpl
from composer.models import zoo
from composer.registry.discovery import PluginInfo, Registry

HERE = Path(__file__).parent


class ClassPluginBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        ops = [str(n.target) for n in edge_program.graph.nodes if n.op == "call_function"]
        return PreprocessResult(processed_bytes=json.dumps(ops).encode())


class ReluAndCumsum(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        return any(name in str(node.target) for name in ("relu", "cumsum"))


class SampleAsClass(composer.BackendPlugin):
    """tests/sample_plugin's backend, written as a BackendPlugin: no @hookimpl on the override."""

    spec = composer.BackendSpec("sample", "ClassPluginBackend", description="relu and cumsum")

    def composer_operator_support(self, backend, program):
        return ReluAndCumsum()


class WithOptions(SampleAsClass):
    spec = composer.BackendSpec("with_options", "ClassPluginBackend")
    options = (composer.Option("precision", ("fp32", "fp16"), default="fp32"),)


class NoSpec(BackendPlugin):
    def composer_operator_support(self, backend, program):
        return ReluAndCumsum()


class NoSupport(BackendPlugin):
    spec = composer.BackendSpec("no_support", "ClassPluginBackend")


class TwoBackends(SampleAsClass):
    """A plugin of several backends declares them itself, and needs no ``spec``."""

    def composer_backends(self):
        return [composer.BackendSpec(name, "ClassPluginBackend") for name in ("one", "two")]


class MisspeltHookFunctions:
    """A module-style plugin (``@hookimpl`` functions) whose support hook is misspelt."""

    @hookimpl
    def composer_backends(self):
        return [composer.BackendSpec("misspelt", "ClassPluginBackend")]

    @hookimpl
    def composer_operator_suport(self, backend, program):
        return ReluAndCumsum()


@pytest.fixture
def sample_module(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE / "sample_plugin"))
    import composer_sample_backend

    return composer_sample_backend


def test_a_backend_plugin_subclass_plans_as_the_same_plugin_written_as_functions(sample_module):
    model, inputs = zoo.load("cumsum_mlp")
    plans = []
    for plugin in (sample_module, SampleAsClass()):
        registry = Registry.from_entry_points()
        registry.add_plugin(plugin, PluginInfo("sample", "composer-sample", "0"))
        plans.append(composer.plan(model, ["xnnpack", "sample"], inputs, registry=registry))
    by_module, by_class = plans
    assert by_class.ops_on("sample") == by_module.ops_on("sample")
    assert by_class.ops_on("sample")  # it took something: its override was called
    assert by_class.partitions == by_module.partitions


def test_hooks_a_backend_plugin_leaves_alone_give_their_defaults():
    registry = registry_with(WithOptions())
    (backend,) = registry.resolve(["with_options"])
    assert [option.name for option in registry.options(backend)] == ["precision"]
    assert registry.unavailable_reason(backend) is None
    assert registry.partitioner(backend, program=None) is None
    assert registry.compile_specs(backend, "forward", {}) is None
    assert registry.quantizer(backend, {}) is None


def test_a_backend_plugin_without_a_spec_cannot_be_instantiated():
    with pytest.raises(TypeError, match=r"NoSpec cannot be instantiated: it must give a spec"):
        NoSpec()


def test_a_backend_plugin_that_says_nothing_of_what_it_takes_cannot_be_instantiated():
    with pytest.raises(TypeError, match=r"override composer_operator_support or composer_part"):
        NoSupport()


def test_a_backend_plugin_declaring_its_backends_itself_needs_no_spec():
    registry = registry_with(TwoBackends())
    assert [backend.name for backend in registry.resolve(["one", "two"])] == ["one", "two"]


def test_a_misspelt_hook_method_is_refused_when_the_class_is_defined():
    with pytest.raises(PluginError) as raised:

        class Misspelt(SampleAsClass):
            def composer_operator_suport(self, backend, program):
                return ReluAndCumsum()

    assert "Misspelt.composer_operator_suport is named like a composer hook" in str(raised.value)
    assert "no hook composer_operator_suport: did you mean composer_operator_support?" in str(
        raised.value
    )


def test_a_misspelt_hook_function_skips_the_plugin_naming_it_and_the_hook():
    registry = Registry.from_entry_points()
    info = PluginInfo("misspelt", "composer-misspelt", "0")
    with pytest.warns(ComposerWarning) as warned:
        registry.add_plugin(MisspeltHookFunctions(), info)
    (message,) = [str(w.message) for w in warned if "misspelt" in str(w.message)]
    assert message.startswith("composer plugin 'misspelt' (from composer-misspelt) was skipped")
    assert (
        "its composer_operator_suport is named like a composer hook but there is no hook "
        "composer_operator_suport: did you mean composer_operator_support?"
    ) in message
    assert [f.name for f in registry.failed if f.name == "misspelt"] == ["misspelt"]
    with pytest.raises(composer.BackendListError, match="its plugin failed to load"):
        registry.resolve(["misspelt"])


class WrongOptions(SampleAsClass):
    spec = composer.BackendSpec("wrong_options", "ClassPluginBackend")

    def composer_options(self, backend):
        return {"precision": "fp32"}


class WrongSpecs(SampleAsClass):
    spec = composer.BackendSpec("wrong_specs", "ClassPluginBackend")

    def composer_compile_specs(self, backend, method_name):
        return ["fast"]


class WrongReason(SampleAsClass):
    spec = composer.BackendSpec("wrong_reason", "ClassPluginBackend")

    def composer_unavailable_reason(self, backend):
        return 42


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (
            WrongOptions(),
            (
                "plugin 'wrong_options' (composer-test-wrong_options) returned "
                "{'precision': 'fp32'} from composer_options; it must return a list of "
                "composer.Option (or None: no options)."
            ),
        ),
        (
            WrongSpecs(),
            (
                "plugin 'wrong_specs' (composer-test-wrong_specs) returned ['fast'] from "
                "composer_compile_specs; it must return a list of executorch's CompileSpec or None."
            ),
        ),
        (
            WrongReason(),
            (
                "plugin 'wrong_reason' (composer-test-wrong_reason) returned 42 from "
                "composer_unavailable_reason; it must return a reason (a non-empty string) or None."
            ),
        ),
    ],
)
def test_a_backend_plugin_answering_wrongly_gets_the_same_error_as_a_module(plugin, message):
    registry = registry_with(plugin)
    (backend,) = registry.resolve([plugin.spec.name])
    ask = {
        WrongOptions: lambda: registry.options(backend),
        WrongSpecs: lambda: registry.compile_specs(backend, "forward", {}),
        WrongReason: lambda: registry.unavailable_reason(backend),
    }[type(plugin)]
    with pytest.raises(PluginError) as raised:
        ask()
    assert str(raised.value) == message


def test_the_plugin_guide_s_class_example_plans_and_says_why_it_declines():
    # docs/plugins.md leads with it: its first python block, run as the plugin's module.
    guide = (HERE.parent / "docs" / "plugins.md").read_text()
    source = guide.split("```python\n", 1)[1].split("```", 1)[0]
    example = types.ModuleType("composer_mybackend_plugin")
    exec(compile(source, "docs/plugins.md", "exec"), example.__dict__)  # noqa: S102 - our docs
    registry = Registry.from_entry_points()
    registry.add_plugin(example.plugin, PluginInfo("mybackend", "composer-mybackend", "0"))
    model, inputs = zoo.load("mlp")
    plan = composer.plan(model, ["mybackend"], inputs, registry=registry)
    assert dict(plan.ops_on("mybackend")) == {"aten.relu.default": 2}
    assert "my accelerator runs relu only" in json.dumps(plan.to_dict())


def test_every_hook_is_declared_with_a_docstring_and_is_the_registry_s_spec():
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(BackendPlugin)
    declared = {name for name in dir(manager.hook) if name.startswith("composer_")}
    assert declared == hookspecs.HOOKS
    for name in hookspecs.HOOKS:
        assert len(getattr(BackendPlugin, name).__doc__.split()) > 20, name
