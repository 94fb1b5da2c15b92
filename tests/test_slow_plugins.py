"""A plugin slow to answer is named at every call (composer.registry.asking), in ``plan`` and in
``lower``, and the time it took is counted in its backend's partitioning, where the wait is."""

from __future__ import annotations

import re
import time

import pytest
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec
from composer.cli import main
from composer.contract.hookspecs import hookimpl
from composer.models import zoo
from composer.registry import asking
from composer.registry import discovery as registry_module

SECONDS = 1.0
NOTICE = 0.3


class Linears(OperatorSupportBase):
    """Takes the linears; the first answer of ``plugin``'s support objects takes its ``first``
    seconds (a check that compiles once)."""

    def __init__(self, plugin: Slow) -> None:
        super().__init__()
        self.plugin = plugin

    def is_node_supported(self, submodules, node) -> bool:
        if self.plugin.first:
            time.sleep(self.plugin.first)
            self.plugin.first = 0.0
        return composer.op_name(node) in ("aten.linear.default", "aten.addmm.default")


class Slow:
    """A plugin whose support hook takes ``hook`` seconds at every call, and whose support
    object takes ``first`` seconds to answer its first question."""

    def __init__(self, hook: float = 0.0, first: float = 0.0) -> None:
        self.spec = BackendSpec("slow", "ComposerTestBackend")
        self.hook, self.first = hook, first
        self.calls = 0

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        self.calls += 1
        time.sleep(self.hook)
        return Linears(self)


@pytest.fixture(autouse=True)
def _notice_soon(monkeypatch):
    monkeypatch.setattr(asking, "SLOW_ANSWER_S", NOTICE)


def partitioning_seconds(lines: list[str]) -> float:
    (line,) = [line for line in lines if line.startswith("slow: ")]
    return float(re.match(r"slow: \d+ partition\(s\) in ([\d.]+) s", line)[1])


def test_every_call_of_a_slow_hook_is_named_while_lowering_and_all_its_time_counted():
    # Before: of its calls in a lowering only the one from inside the partitioning was named;
    # the keep-whole probe's call before it waited in silence and was counted nowhere.
    plugin = Slow(hook=SECONDS)
    said: list[str] = []
    model, inputs = zoo.load("mlp")
    composer.compose(model, ["slow", "xnnpack"], inputs, registry=registry_with(plugin),
                     cache=False, progress=said.append)  # fmt: skip
    assert plugin.calls >= 2, plugin.calls  # the probe's question, then the partitioning's
    # each call named while it was asked, then said answered
    asked = "plugin 'slow' (composer_operator_support)"
    calls = "".join(
        "S" if line.startswith("still asking") else "A"
        for line in said
        if line.startswith((f"still asking {asked}", "plugin 'slow' answered"))
    )
    assert re.fullmatch(r"(S+A)+", calls) and calls.count("A") == plugin.calls, said
    assert partitioning_seconds(said) >= plugin.calls * SECONDS, said


def test_a_slow_first_answer_of_the_keep_whole_probe_is_named_and_counted():
    plugin = Slow(first=SECONDS)
    said: list[str] = []
    model, inputs = zoo.load("mlp")
    composer.plan(model, ["slow", "xnnpack"], inputs, registry=registry_with(plugin),
                  cache=False, progress=said.append)  # fmt: skip
    still = [line for line in said if line.startswith("still asking plugin 'slow' (is_node_supported, node ")]  # fmt: skip
    assert still, said
    assert partitioning_seconds(said) >= SECONDS, said


def test_composer_plan_names_a_slow_plugin_on_stderr(capsys, monkeypatch):
    # Before: `composer plan` gave no progress, and the notices went to the log alone.
    monkeypatch.setattr(registry_module, "_default", registry_with(Slow(hook=SECONDS)))
    code = main(["plan", "zoo:mlp", "--backends", "slow,xnnpack", "--no-cache", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "still asking plugin 'slow' (composer_operator_support) after 0." in err, err
    assert "plugin 'slow' answered composer_operator_support after 1." in err, err
    assert out.lstrip().startswith("{") and "still asking" not in out  # the JSON alone
