"""Backend options are checked by composer, for every backend, from what each plugin declares."""

from __future__ import annotations

import pytest
import torch
from plugins_for_tests import Everything, registry_with

import composer
from composer import ComposerError, Option, PluginError
from composer.cli import main
from composer.contract.hookspecs import hookimpl
from composer.models import zoo

KNOWN = {
    "tensorrt_stub": "none",
    "xnnpack": "none",
    "openvino": "device",
    "cuda": "triton_kernel_mode, max_autotune, low_memory_mode, target_device",
}


class NotExportable(torch.nn.Module):
    """Export fails on it: an option error seen instead proves options are checked first."""

    def forward(self, x):
        raise RuntimeError("export must not have started")


@pytest.mark.parametrize("backend", sorted(KNOWN))
def test_unknown_option_is_an_error_before_any_work_listing_the_known_ones(backend):
    message = f"unknown option 'bogus' for backend '{backend}'; known: {KNOWN[backend]}."
    with pytest.raises(ComposerError) as raised:
        composer.plan(NotExportable(), [backend], (torch.randn(2),),
                      options={backend: {"bogus": "1"}})  # fmt: skip
    assert str(raised.value) == message


@pytest.mark.parametrize("backend", sorted(KNOWN))
def test_unknown_option_on_the_command_line_is_one_line_and_exit_2(capsys, backend):
    code = main(["plan", "zoo:mlp", "--backends", backend, "--option", f"{backend}.bogus=1"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"composer: error: unknown option 'bogus' for backend '{backend}'; "
        f"known: {KNOWN[backend]}.\n"
    )


@pytest.mark.parametrize(
    ("backend", "given", "message"),
    [
        ("cuda", {"max_autotune": "maybe"},
         "option 'max_autotune' of backend 'cuda' must be one of ON, OFF, not 'maybe'."),
        ("openvino", {"device": ["CPU"]},
         "option 'device' of backend 'openvino' must be a string, not list ['CPU']."),
        ("xnnpack", "fast",
         "options for backend 'xnnpack' must map option names to values, not str 'fast'."),
        ("tensorrt_stub", ["bogus"],
         "options for backend 'tensorrt_stub' must map option names to values, not list ['bogus']."),
    ],
)  # fmt: skip
def test_an_ill_typed_option_is_an_error_before_any_work(backend, given, message):
    with pytest.raises(ComposerError) as raised:
        composer.plan(NotExportable(), [backend], (torch.randn(2),), options={backend: given})
    assert str(raised.value) == message


def test_a_value_outside_the_choices_on_the_command_line_is_one_line_and_exit_2(capsys):
    code = main(["plan", "zoo:mlp", "--backends", "xnnpack,cuda", "--option",
                 "cuda.triton_kernel_mode=maybe"])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err == (
        "composer: error: option 'triton_kernel_mode' of backend 'cuda' must be one of ON, OFF, "
        "not 'maybe'.\n"
    )


def test_good_options_plan_for_every_backend_in_the_box():
    # cuda plans anywhere with a stand-in, so its options are checked on any machine too.
    model, inputs = zoo.load("mlp")
    plan = composer.plan(
        model, ["tensorrt_stub", "cuda", "openvino", "xnnpack"], inputs,
        options={"cuda": {"max_autotune": "off", "target_device": "cuda:1"},
                 "openvino": {"device": "cpu"}, "xnnpack": {}},
    )  # fmt: skip
    assert plan.partitions


class Recording:
    """A third-party backend declaring options, recording what its hooks receive."""

    def __init__(self, name: str = "recording", declares: object = ()) -> None:
        self.spec = composer.BackendSpec(name, "ComposerTestBackend")
        self.declares = declares
        self.received: list[dict[str, str]] = []

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program, options):
        self.received.append(dict(options))
        return Everything()


class WithOptions(Recording):
    @hookimpl
    def composer_options(self, backend):
        return self.declares


PRECISION = Option(
    "precision", choices=("fp32", "fp16"), default="fp32", help="what it computes in"
)
DEVICE_ID = Option("device_id", help="which device")


def test_hooks_receive_the_checked_options_with_defaults_filled_in():
    plugin = WithOptions(declares=[PRECISION, DEVICE_ID])
    registry = registry_with(plugin)
    model, inputs = zoo.load("mlp")

    def received(options):
        plugin.received.clear()
        composer.plan(model, ["recording"], inputs, registry=registry, options=options)
        return plugin.received

    assert set(map(str, received(None))) == {"{'precision': 'fp32'}"}
    given = {"recording": {"precision": "FP16", "device_id": 1}}
    assert set(map(str, received(given))) == {"{'precision': 'fp16', 'device_id': '1'}"}
    with pytest.raises(ComposerError, match=r"must be one of fp32, fp16, not 'bf16'"):
        received({"recording": {"precision": "bf16"}})


def test_a_third_party_plugin_without_the_hook_works_and_takes_no_options():
    plugin = Recording("plain")
    registry = registry_with(plugin)
    model, inputs = zoo.load("mlp")
    plan = composer.plan(model, ["plain", "xnnpack"], inputs, registry=registry)
    assert plan.ops_on("plain")
    assert plugin.received and not any(plugin.received)
    with pytest.raises(
        ComposerError, match=r"^unknown option 'x' for backend 'plain'; known: none\.$"
    ):
        composer.plan(model, ["plain"], inputs, registry=registry, options={"plain": {"x": "1"}})


@pytest.mark.parametrize(
    ("declares", "message"),
    [
        ({"precision": "fp32"}, r"returned \{'precision': 'fp32'\} from composer_options; it must"),
        ([PRECISION, PRECISION], "declares option 'precision' twice"),
    ],
)  # fmt: skip
def test_a_plugin_declaring_options_wrongly_is_named(declares, message):
    registry = registry_with(WithOptions("bad", declares))
    model, inputs = zoo.load("mlp")
    with pytest.raises(PluginError, match=rf"plugin 'bad' \(composer-test-bad\) .*{message}"):
        composer.plan(model, ["bad"], inputs, registry=registry)


def test_option_rejects_a_default_outside_its_choices_and_a_string_of_choices():
    with pytest.raises(ValueError, match="default 'ON' is not one of its choices"):
        Option("mode", choices=("on", "off"), default="ON")
    with pytest.raises(TypeError, match="not the string 'ON'"):
        Option("mode", choices="ON")


def test_backends_lists_each_backends_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # whole rows: a narrow terminal wraps them
    assert main(["backends", "cuda", "openvino", "tensorrt_stub", "xnnpack", "metal"]) == 0
    words = {
        line.split()[0]: " ".join(line.split()[1:]) for line in capsys.readouterr().out.splitlines()
    }
    assert words["cuda.max_autotune"] == "ON|OFF Inductor max-autotune"
    assert words["cuda.target_device"] == (
        "any, default cuda:0 the CUDA device the delegate runs on"
    )
    assert words["openvino.device"].startswith("any, default CPU ")
    assert {"tensorrt_stub", "xnnpack", "metal"} <= set(
        words["no"].removeprefix("options: ").split(", ")
    )


def test_drop_in_partitioner_checks_options_too():
    with pytest.raises(composer.ComposerError, match="unknown option 'bogus' for backend"):
        composer.partitioner("tensorrt_stub", bogus="1")


def test_measured_placement_checks_options_before_any_work():
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match="unknown option 'bogus' for backend"):
        composer.compose(model, ["xnnpack", "openvino"], inputs, placement="measured",
                         options={"xnnpack": {"bogus": "1"}})  # fmt: skip
