"""composer.testing.check_plugin: what a plugin author's CI runs to catch contract breaks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_plugin_contract import ContractPlugin
from test_plugins import OneSpecNotAList

import composer
from composer.testing import check_plugin

HERE = Path(__file__).parent


def test_op_name_is_the_name_plans_use_not_str_of_the_target():
    program = torch.export.export(torch.nn.ReLU(), (torch.randn(2),))
    from executorch.exir import to_edge

    (node,) = [
        n for n in to_edge(program).exported_program().graph.nodes if n.op == "call_function"
    ]
    assert composer.op_name(node) == "aten.relu.default"
    assert str(node.target) != "aten.relu.default"  # the trap docs/plugins.md warns about


def test_the_sample_plugin_passes_before_and_after_xnnpack(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE / "sample_plugin"))
    import composer_sample_backend

    checked = check_plugin(composer_sample_backend, name="sample", models=["transformer_block"])
    assert checked == [
        "zoo:transformer_block with sample",
        "zoo:transformer_block with sample,xnnpack",
        "zoo:transformer_block with xnnpack,sample",
    ]


def test_a_preprocess_returning_bytes_is_caught():
    plugin = ContractPlugin("plain_bytes", "PlainBytesBackend")
    with pytest.raises(AssertionError) as caught:
        check_plugin(plugin, name="plain_bytes", models=["mlp"], partners=[])
    assert str(caught.value) == (
        "plugin 'plain_bytes' breaks composer's contract:\n  zoo:mlp with plain_bytes: "
        "PluginError: plugin 'plain_bytes' (the plugin under test): backend 'plain_bytes' failed "
        "to lower: PlainBytesBackend.preprocess must return executorch's "
        "PreprocessResult(processed_bytes=...) (AttributeError: 'bytes' object has no attribute "
        "'processed_bytes')"
    )


def test_a_plugin_composer_would_skip_is_caught():
    with pytest.raises(AssertionError, match=r"composer skips plugin 'lonely': its composer_"):
        check_plugin(OneSpecNotAList(), name="lonely")


# What docs/plugins.md has a plugin author put in their CI, for the sample plugin.
AUTHOR_TEST = """
from composer.testing import check_plugin
import composer_sample_backend


def test_sample_keeps_composer_s_contract():
    # One small model, the backend alone: the check's before-and-after-xnnpack stacks are
    # tested in process above, and each costs a lowering.
    checked = check_plugin(composer_sample_backend, models=["cumsum_mlp"], partners=[])
    assert checked == ["zoo:cumsum_mlp with sample"], checked
"""


@pytest.fixture(scope="module")
def sample_installed(tmp_path_factory) -> Path:
    """The sample plugin pip-installed, as an author's CI installs theirs: a folder for
    PYTHONPATH, where importlib.metadata finds its entry point."""
    target = tmp_path_factory.mktemp("site")
    # Built from a copy: setuptools writes build/ and an .egg-info into the folder it builds,
    # and an .egg-info in tests/ is an installed plugin to every other test.
    source = shutil.copytree(HERE / "sample_plugin", tmp_path_factory.mktemp("src") / "sample")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return target


def test_check_plugin_passes_for_the_sample_plugin_installed_with_pip(sample_installed, tmp_path):
    # The plugin under test is also what its entry point loads: registered twice, pluggy
    # refuses it, and the author's CI fails on a plugin that keeps the contract.
    (tmp_path / "test_contract.py").write_text(AUTHOR_TEST)
    env = {**os.environ, "PYTHONPATH": str(sample_installed), "COLUMNS": "200"}
    author_ci = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_contract.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert author_ci.returncode == 0, author_ci.stdout[-4000:] + author_ci.stderr[-2000:]
    assert "1 passed" in author_ci.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "composer.cli", "backends"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    sample = next(line for line in listed.stdout.splitlines() if line.startswith("sample "))
    assert sample.endswith("(composer-sample-backend 0.3.0)"), sample  # its distribution
