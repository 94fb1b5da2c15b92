"""The two ways to write a plugin: a ``composer.hookspecs.BackendPlugin`` subclass, and a module of
``@hookimpl`` functions (tests/sample_plugin). composer asks and checks both alike."""

from __future__ import annotations

import json
from pathlib import Path

import pluggy
import pytest
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer.contract import hookspecs
from composer.contract.errors import ComposerWarning, PluginError
from composer.contract.hookspecs import BackendPlugin
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
    pass


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


def test_a_backend_plugin_without_a_spec_is_skipped_saying_so():
    registry = Registry.from_entry_points()
    with pytest.warns(ComposerWarning, match="NoSpec sets no spec"):
        registry.add_plugin(NoSpec(), PluginInfo("nospec", "composer-nospec", "0"))
    assert [f.name for f in registry.failed if f.name == "nospec"] == ["nospec"]


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
                "plugin 'wrong_options' (composer-test-wrong_options) returned dict from "
                "composer_options for backend 'wrong_options'; it must return a list of "
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
                "plugin 'wrong_reason' returned int from composer_unavailable_reason; it must "
                "return a string or None."
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


def test_every_hook_is_declared_with_a_docstring_and_is_the_registry_s_spec():
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(BackendPlugin)
    declared = {name for name in dir(manager.hook) if name.startswith("composer_")}
    assert declared == hookspecs.HOOKS
    for name in hookspecs.HOOKS:
        assert len(getattr(BackendPlugin, name).__doc__.split()) > 20, name
