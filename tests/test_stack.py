"""One Stack: built by the API, the config and the command line alike, checked once."""

from __future__ import annotations

import pytest

import composer
from composer.config import stack_from
from composer.contract.errors import BackendListError, ComposerError
from composer.models import zoo
from composer.registry.stack import Stack


def test_a_stack_plans_as_its_fields_given_as_keywords_do():
    model, inputs = zoo.load("cumsum_mlp")
    pins = {"tensorrt_stub": ["aten.relu.default"]}
    stack = Stack("tensorrt_stub,xnnpack", never=pins, placement="strict")
    by_stack = composer.plan(model, stack, inputs, cache=False)
    by_keywords = composer.plan(
        model, ["tensorrt_stub", "xnnpack"], inputs, never=pins, placement="strict", cache=False
    )
    assert by_stack.node_backends == by_keywords.node_backends
    relus = [n for n, op in by_stack.node_ops.items() if op == "aten.relu.default"]
    assert relus and all(by_stack.backend_of(n) != "tensorrt_stub" for n in relus)


def test_keywords_change_a_given_stack():
    stack = Stack(["xnnpack", "tensorrt_stub"], min_partition_size={"xnnpack": 2})
    changed = Stack.of(stack, placement="strict")
    assert changed.placement == "strict"
    assert changed.min_partition_size == {"xnnpack": 2}
    assert Stack.of(stack) is stack


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"options": {"cuda": {"x": "1"}}}, BackendListError, "options given for cuda"),
        ({"never": {"cuda": ["aten.relu.default"]}}, BackendListError, "never given for cuda"),
        ({"never": {"xnnpack": "aten.relu.default"}}, ComposerError, "list of op names"),
        ({"min_partition_size": {"xnnpack": 0}}, ComposerError, "whole number >= 1, not 0"),
        ({"min_partition_size": {"xnnpack": True}}, ComposerError, "whole number"),
        ({"placement": "fastest"}, ComposerError, "one of priority, strict, measured"),
        ({"tune_budget": -1}, ComposerError, "tune_budget must be"),
        ({"options": "xnnpack.fast=1"}, ComposerError, "options must map backend names"),
        ({"consolidate": False, "placement": "measured"}, ComposerError, "contradict"),
    ],
)
def test_a_bad_stack_is_refused_when_made(fields, error, message):
    with pytest.raises(error, match=message):
        Stack.of(["xnnpack"], **fields)


def test_consolidate_false_is_strict():
    assert Stack.of("xnnpack", consolidate=False).placement == "strict"
    assert not Stack.of("xnnpack", consolidate=False).consolidates


def test_only_keeps_the_named_backends_and_their_settings():
    stack = Stack(
        ["tensorrt_stub", "xnnpack"],
        options={"tensorrt_stub": {"precision": "fp16"}},
        never={"xnnpack": ["aten.relu.default"], "tensorrt_stub": ["aten.add.Tensor"]},
        placement="measured",
        tune_budget=3,
    )
    alone = stack.only(["xnnpack"])
    assert alone.backends == ("xnnpack",)
    assert alone.options == {} and alone.never == {"xnnpack": frozenset({"aten.relu.default"})}
    assert alone.placement == "priority" and alone.tune_budget is None


def test_the_config_and_the_command_line_build_one_stack(tmp_path):
    config = tmp_path / "composer.toml"
    config.write_text(
        'backends = ["tensorrt_stub", "xnnpack"]\nplacement = "measured"\ntune_budget = 30\n'
        '[options.tensorrt_stub]\nprecision = "fp16"\n'
    )
    stack = stack_from(config)
    assert stack.backends == ("tensorrt_stub", "xnnpack")
    assert (stack.placement, stack.tune_budget) == ("measured", 30.0)
    overridden = stack_from(
        config, options=["tensorrt_stub.precision=fp32"], placement="strict", tune_budget=5
    )
    assert overridden.options == {"tensorrt_stub": {"precision": "fp32"}}
    assert (overridden.placement, overridden.tune_budget) == ("strict", 5)
    # A command-line backend list without the backend the config sets options for
    with pytest.raises(BackendListError, match="options given for tensorrt_stub"):
        stack_from(config, backends="xnnpack")


def test_a_config_without_backends_needs_them_from_the_command_line(tmp_path):
    config = tmp_path / "composer.toml"
    config.write_text("[min_partition_size]\nxnnpack = 2\n")
    with pytest.raises(ComposerError, match="no backends given"):
        stack_from(config)
    assert stack_from(config, backends="xnnpack").min_partition_size == {"xnnpack": 2}


def test_a_bad_tune_budget_in_the_config_names_the_file(tmp_path):
    config = tmp_path / "composer.toml"
    config.write_text('backends = ["xnnpack"]\ntune_budget = "long"\n')
    with pytest.raises(ComposerError, match=r"composer\.toml: tune_budget must be"):
        stack_from(config)
