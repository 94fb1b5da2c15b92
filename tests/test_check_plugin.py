"""composer.testing.check_plugin: what a plugin author's CI runs to catch contract breaks."""

from __future__ import annotations

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
