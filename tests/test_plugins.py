"""Plugin discovery, third-party plugins installed with pip, and the priority list."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from plugins_for_tests import GreedyPlugin, registry_with

import composer
from composer import BackendListError, BackendSpec, PluginError
from composer.contract.errors import ComposerWarning
from composer.contract.hookspecs import hookimpl
from composer.models import zoo
from composer.registry.discovery import PluginInfo, Registry, default_registry

HERE = Path(__file__).parent


def test_in_tree_plugins_register_through_entry_points():
    backends = default_registry().backends
    assert {"xnnpack", "tensorrt_stub"} <= set(backends)
    assert backends["xnnpack"].origin.distribution == "executorch-composer"
    assert backends["xnnpack"].spec == BackendSpec(
        "xnnpack",
        "XnnpackBackend",
        device="cpu",
        min_partition_size=1,
        description=backends["xnnpack"].spec.description,
    )
    assert backends["tensorrt_stub"].spec.min_partition_size == 2


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(
        BackendListError, match=r"unknown backend 'tensorrt'.*tensorrt_stub, .*xnnpack"
    ):
        default_registry().resolve("tensorrt,xnnpack")


def test_duplicate_backend_is_an_error():
    with pytest.raises(BackendListError, match="'xnnpack' appears twice"):
        default_registry().resolve(["xnnpack", "tensorrt_stub", "xnnpack"])


@pytest.mark.parametrize("names", ["", [], " , "])
def test_empty_backend_list_is_an_error(names):
    with pytest.raises(BackendListError, match="empty"):
        default_registry().resolve(names)


def test_compose_refuses_unknown_backend_before_exporting():
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match="unknown backend 'cuda_typo'"):
        composer.compose(model, ["cuda_typo"], inputs)


def test_second_declaration_of_a_backend_name_is_ignored_with_a_warning():
    registry = registry_with(GreedyPlugin("greedy"))
    with pytest.warns(
        UserWarning, match=r"'greedy' is declared by plugin 'greedy'.*keeping the first"
    ):
        registry.add_plugin(GreedyPlugin("greedy"), PluginInfo("other", "composer-other", "1"))
    assert registry.backends["greedy"].origin.name == "greedy"


def test_a_plugin_added_again_through_its_entry_point_is_kept_once_without_a_warning():
    # check_plugin adds the plugin under test, and its entry point loads the same object later.
    plugin = GreedyPlugin("greedy")
    registry = registry_with(plugin)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ComposerWarning)
        registry.add_plugin(plugin, PluginInfo("mine", "composer-mine", "1"))
    assert registry.backends["greedy"].plugin is plugin
    assert registry.backends["greedy"].origin.distribution == "composer-test-greedy"
    assert registry.failed == []


def test_two_plugins_whose_entry_points_share_a_name_both_load():
    registry = registry_with(GreedyPlugin("greedy"))
    registry.add_plugin(GreedyPlugin("greedy_fork"), PluginInfo("greedy", "composer-fork", "1"))
    assert registry.backends["greedy_fork"].origin.distribution == "composer-fork"
    assert registry.backends["greedy"].origin.distribution == "composer-test-greedy"


class OneSpecNotAList:
    @hookimpl
    def composer_backends(self):
        return BackendSpec("lonely", "ComposerTestBackend")


class RaisingBackends:
    @hookimpl
    def composer_backends(self):
        raise RuntimeError("no licence server")


class WrongReturn:
    @hookimpl
    def composer_backends(self):
        return ["not a spec"]


BROKEN_CONTRACT = [
    (OneSpecNotAList(), "lonely", "returned BackendSpec(name='lonely'"),
    (RaisingBackends(), "raising", "raised RuntimeError: no licence server"),
    (WrongReturn(), "wrong", "returned ['not a spec']"),
]


@pytest.mark.parametrize(("plugin", "name", "what"), BROKEN_CONTRACT)
def test_plugin_breaking_composer_backends_is_skipped_with_a_warning(plugin, name, what):
    registry = registry_with(GreedyPlugin())
    with pytest.warns(ComposerWarning) as caught:
        registry.add_plugin(plugin, PluginInfo(name, f"composer-{name}", "0"))
    (message,) = [str(w.message) for w in caught if name in str(w.message)]
    assert message.startswith(f"composer plugin {name!r} (from composer-{name}) was skipped: ")
    assert what in message
    assert [f.name for f in registry.failed] == [name]
    assert name not in registry.backends
    assert {"greedy", "xnnpack"} <= set(registry.backends)
    with pytest.raises(BackendListError, match=rf"unknown backend {name!r} \(its plugin failed"):
        registry.resolve([name])


def test_every_command_works_beside_a_plugin_that_breaks_composer_backends(capsys, monkeypatch):
    from composer.cli import main
    from composer.registry import discovery as registry_module

    broken = Registry.from_entry_points()
    with pytest.warns(ComposerWarning):
        broken.add_plugin(OneSpecNotAList(), PluginInfo("lonely", "composer-lonely", "0"))
    monkeypatch.setattr(registry_module, "_default", broken)
    assert main(["plan", "zoo:mlp", "--backends", "xnnpack"]) == 0
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "failed to load plugin lonely (composer-lonely): its composer_backends returned" in out


class RaisingSupport:
    spec = BackendSpec("raiser", "ComposerTestBackend")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        raise RuntimeError("boom")


def test_plugin_hook_that_raises_is_named():
    registry = registry_with(RaisingSupport())
    model, inputs = zoo.load("mlp")
    with pytest.raises(PluginError, match=r"plugin 'raiser'.*composer_operator_support.*boom"):
        composer.plan(model, ["raiser"], inputs, registry=registry)


def test_nn_module_without_example_inputs_is_a_model_error():
    with pytest.raises(composer.ModelError, match="pass example_inputs"):
        composer.plan(zoo.load("mlp")[0], ["xnnpack"])


def test_model_that_fails_to_export_is_a_model_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
                return x
            return -x

    with pytest.raises(composer.ModelError, match="torch.export failed for DataDependent"):
        composer.plan(DataDependent(), ["xnnpack"], (torch.randn(3),))


class RescalesOnFirstCall(torch.nn.Module):
    """As transformers' RWKV: in eval mode, its first call divides its weights in place."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.rescaled = False

    def forward(self, x):
        if not self.rescaled:
            with torch.no_grad():
                self.linear.weight.div_(2)
            self.rescaled = True
        return torch.relu(self.linear(x))


def test_a_model_that_writes_its_parameters_is_refused_before_any_backend_lowers():
    model, inputs = RescalesOnFirstCall().eval(), (torch.randn(2, 8),)
    with pytest.raises(
        composer.ModelError,
        match=r"the model writes to 1 parameter\(s\) in forward \(linear.weight\); "
        r"an ExecuTorch program cannot update parameters.*one call on the example inputs",
    ):
        composer.compose(model, ["xnnpack"], inputs, cache=False)
    exported = torch.export.export(RescalesOnFirstCall().eval(), inputs, strict=False)
    with pytest.raises(composer.ModelError, match=r"writes to 1 parameter.*register_buffer"):
        composer.plan(exported, ["xnnpack"])


def test_a_model_that_rescales_once_composes_after_one_call_as_the_error_says():
    model, inputs = RescalesOnFirstCall().eval(), (torch.randn(2, 8),)
    model(*inputs)
    composition = composer.compose(model, ["xnnpack"], inputs, cache=False)
    assert composition.plan.proof.startswith("ran and matched eager")
    assert composition.plan.delegate_calls == 1


@pytest.fixture(scope="module")
def installed_plugins(tmp_path_factory) -> Path:
    """The sample and broken plugin packages, pip-installed into a directory of their own."""
    target = tmp_path_factory.mktemp("site")
    sources = tmp_path_factory.mktemp("sources")
    for package in ("sample_plugin", "broken_plugin"):
        # Built from a copy: setuptools writes build/ and an .egg-info into the folder it
        # builds, and an .egg-info in tests/ is an installed plugin to every other test.
        source = shutil.copytree(HERE / package, sources / package)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--no-index", "--target", str(target), str(source)],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return target


SCRIPT = """
import json, sys, warnings
import composer
from composer.models import zoo
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    registry = composer.default_registry()
    model, inputs = zoo.load("cumsum_mlp")
    composition = composer.compose(model, ["xnnpack", "sample"], inputs)
    at_compose = {
        "warnings": [str(w.message) for w in caught if "composer plugin" in str(w.message)],
        "imported": sorted(m for m in sys.modules if m.startswith("composer_")),
    }
    registry.backends  # listing every backend imports every plugin
print(json.dumps({
    "at_compose": at_compose,
    "backends": {n: b.origin.distribution + " " + b.origin.version
                 for n, b in registry.backends.items()},
    "failed": [f.name for f in registry.failed],
    "warnings": [str(w.message) for w in caught if "composer plugin" in str(w.message)],
    "sample_ops": dict(composition.plan.ops_on("sample")),
    "ok": composition.verify().ok,
}))
"""


def test_third_party_plugin_installed_with_pip_stacks_with_the_others(installed_plugins):
    env = {**os.environ, "PYTHONPATH": str(installed_plugins)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # A compose imports the plugins its stack names, not the broken one beside them.
    assert result["at_compose"] == {"warnings": [], "imported": ["composer_sample_backend"]}
    assert result["backends"]["sample"] == "composer-sample-backend 0.3.0"
    assert result["backends"]["xnnpack"].startswith("executorch-composer ")
    assert result["failed"] == ["broken"]
    assert (
        "composer plugin 'broken' (from composer-broken-backend) failed to import"
        in (result["warnings"][0])
    )
    assert "composer_dependency_that_is_not_installed" in result["warnings"][0]
    assert result["sample_ops"] == {"aten.cumsum.default": 1}
    assert result["ok"]


def test_cli_lists_third_party_and_broken_plugins(installed_plugins):
    # Wide enough that the table keeps whole names (it fits the terminal's width).
    env = {**os.environ, "PYTHONPATH": str(installed_plugins), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "composer.cli", "backends"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["backend", "lowers", "here", "proves", "here", "what", "it", "is"]
    sample = next(line for line in lines if line.startswith("sample "))
    # Its own description, and the distribution it came from.
    assert sample.split() == [
        "sample", "yes", "no", "relu", "and", "cumsum", "(composer-sample-backend", "0.3.0)",
    ]  # fmt: skip
    assert any(line.startswith("failed to load plugin broken") for line in lines)


@pytest.fixture
def sample_plugin(monkeypatch) -> Registry:
    """A third-party plugin as the plugin guide makes one (tests/sample_plugin), in process."""
    registry = Registry.from_entry_points()
    monkeypatch.syspath_prepend(str(HERE / "sample_plugin"))
    import composer_sample_backend

    registry.add_plugin(composer_sample_backend, PluginInfo("sample", "composer-sample", "0"))
    return registry


@pytest.mark.parametrize("model_name", ["transformer_block", "llama_block"])
def test_a_backend_listed_before_xnnpack_keeps_its_linears_whole(sample_plugin, model_name):
    # The first backend's decomposition used to turn linear into permute + addmm, and
    # XNNPACK's preprocess then failed on 3-D inputs; the plan said nothing of it.
    model, inputs = zoo.load(model_name)
    planned = composer.plan(model, ["sample", "xnnpack"], inputs, registry=sample_plugin)
    composition = composer.compose(model, ["sample", "xnnpack"], inputs, registry=sample_plugin)
    assert composition.plan.partitions == planned.partitions
    assert composition.plan.ops_on("xnnpack").get("aten.linear.default", 0) > 0
    assert composition.verify().ok
