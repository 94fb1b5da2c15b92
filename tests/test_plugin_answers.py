"""Every hook answering every wrong type: a PluginError naming the plugin, the hook and the
answer, never an answer taken for another (``"no"`` is truthy, so it read as "yes")."""

from __future__ import annotations

import re
import time
import warnings

import pytest
import torch
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec
from composer.cli import main
from composer.contract.errors import BackendListError, ComposerWarning, PluginError
from composer.contract.hookspecs import HOOKS, hookimpl
from composer.models import zoo
from composer.registry import asking
from composer.registry import discovery as registry_module
from composer.registry.answers import short_repr
from composer.registry.discovery import PluginInfo

NAME = "wrong"
LABEL = f"plugin {NAME!r} (composer-test-{NAME})"
SPEC = BackendSpec(NAME, "ComposerTestBackend")

WRONG = {
    "a string": "no",
    "an empty string": "",
    "an int": 1,
    "a bool": True,
    "an object": object(),
    "a dict": {},
    "a list of strings": ["no"],
    "a list holding None": [None],
    "None": None,
}
# The answers of WRONG that are right for a hook (None: "the default").
RIGHT = {
    "composer_backends": set(),
    "composer_options": {"None"},
    "composer_operator_support": {"None"},
    "composer_partitioner": {"None"},
    "composer_compile_specs": {"None"},
    "composer_ops_to_not_decompose": {"None"},
    "composer_quantizer": {"None"},
    "composer_rewrites": {"None"},
    "composer_unavailable_reason": {"None", "a string"},
    "composer_runtime": {"None"},
    # the support object's questions
    "is_node_supported": {"a bool"},
    "reason_unsupported": {"None", "a string", "an empty string"},
    "reason_unsupported_at_boundary": {"None", "a string", "an empty string"},
}
SUPPORT_QUESTIONS = ("is_node_supported", "reason_unsupported", "reason_unsupported_at_boundary")


class Answering(OperatorSupportBase):
    """A support object that answers ``question`` with ``answer`` and the rest rightly."""

    def __init__(self, question: str = "", answer=None) -> None:
        self.question, self.answer = question, answer

    def is_node_supported(self, submodules, node):
        return self.answer if self.question == "is_node_supported" else False

    def reason_unsupported(self, node):
        return self.answer if self.question == "reason_unsupported" else "no reason"

    def reason_unsupported_at_boundary(self, node, partition):
        return self.answer if self.question == "reason_unsupported_at_boundary" else None


class Plugin:
    """A bare object of hook functions, as a module of them would be (hashable, unlike a
    SimpleNamespace)."""


def plugin_answering(hook: str, answer) -> Plugin:
    """A plugin whose ``hook`` (or support question) answers ``answer``, the rest rightly."""
    question = hook if hook in SUPPORT_QUESTIONS else ""
    hooks = {
        "composer_backends": hookimpl(lambda: [SPEC]),
        "composer_operator_support": hookimpl(lambda backend: Answering(question, answer)),
    }
    if hook == "composer_backends":
        hooks[hook] = hookimpl(lambda: answer)
    elif hook.startswith("composer_"):
        hooks[hook] = hookimpl(lambda backend: answer)
    plugin = Plugin()
    plugin.spec = SPEC
    for name, function in hooks.items():
        setattr(plugin, name, function)
    return plugin


@pytest.fixture(scope="module")
def program() -> torch.export.ExportedProgram:
    return torch.export.export(torch.nn.ReLU(), (torch.randn(2),))


def ask(registry, hook: str, program):
    """Ask the backend ``hook`` (or the support object's question) as composer does."""
    backend = registry.resolve([NAME])[0]
    node = next(n for n in program.graph.nodes if n.op == "call_function")
    asks = {
        "composer_options": lambda: registry.options(backend),
        "composer_unavailable_reason": lambda: registry.unavailable_reason(backend),
        "composer_partitioner": lambda: registry.partitioner(backend, program),
        "composer_compile_specs": lambda: registry.compile_specs(backend, "forward", {}),
        "composer_ops_to_not_decompose": lambda: registry.ops_to_not_decompose(
            backend, program, {}
        ),
        "composer_quantizer": lambda: registry.quantizer(backend, {}),
        "composer_rewrites": lambda: registry.rewrites(backend, {}),
        "composer_runtime": lambda: registry.runtime(backend),
    }
    if hook in asks:
        return asks[hook]()
    support = registry.operator_support(backend, program, {})
    questions = {
        "composer_operator_support": lambda: support,
        "is_node_supported": lambda: support.takes(node),
        "reason_unsupported": lambda: support.why_not(node),
        "reason_unsupported_at_boundary": lambda: support.refuses_at_boundary(node, {node}),
    }
    return questions[hook]()


CASES = [
    pytest.param(hook, answer, id=f"{hook}-{label}")
    for hook, right in RIGHT.items()
    if hook != "composer_backends"
    for label, answer in WRONG.items()
    if label not in right
]


def test_every_hook_is_in_the_table():
    assert set(HOOKS) | set(SUPPORT_QUESTIONS) == set(RIGHT)


@pytest.mark.parametrize(("hook", "answer"), CASES)
def test_a_wrong_answer_is_a_plugin_error_naming_plugin_hook_and_answer(program, hook, answer):
    registry = registry_with(plugin_answering(hook, answer))
    with pytest.raises(PluginError) as raised:
        ask(registry, hook, program)
    message = str(raised.value)
    assert message.startswith(LABEL), message
    assert hook in message and "must return" in message
    # A list hook names the first wrong item of a list ('aten.linear.default' among ops).
    listed = hook == "composer_ops_to_not_decompose" and isinstance(answer, list)
    wrong = answer[0] if listed else answer
    assert f"returned {short_repr(wrong)} " in message, message


@pytest.mark.parametrize(
    "label", [label for label in WRONG if label not in RIGHT["composer_backends"]]
)
def test_a_wrong_list_of_backends_skips_the_plugin_with_a_warning_naming_it(label):
    registry = registry_with()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plugin = plugin_answering("composer_backends", WRONG[label])
        registry.add_plugin(plugin, PluginInfo(NAME, f"composer-test-{NAME}", "0"))
    said = [str(w.message) for w in caught if issubclass(w.category, ComposerWarning)]
    assert any(f"plugin {NAME!r}" in line and "composer_backends" in line for line in said), said
    with pytest.raises(BackendListError, match="its plugin failed to load"):
        registry.resolve([NAME])


def test_lower_with_a_support_answering_no_stops_naming_the_plugin(capsys, tmp_path, monkeypatch):
    # Before: "no" was taken as yes, every node went to the backend, and lower wrote a
    # program it could not prove, exit 0.
    monkeypatch.chdir(tmp_path)
    says_no = plugin_answering("is_node_supported", "no")
    monkeypatch.setattr(registry_module, "_default", registry_with(says_no))
    code = main(["lower", "zoo:mlp", "--backends", f"{NAME},xnnpack", "-o", "m.pte", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"composer: error: {LABEL}: Answering.is_node_supported returned 'no'")
    assert line.endswith("it must return True or False.")
    assert list(tmp_path.iterdir()) == []


class SlowToAnswer:
    """A plugin whose support hook takes ``seconds`` to answer (a slow or hung compiler)."""

    def __init__(self, seconds: float) -> None:
        self.spec = BackendSpec("slow", "ComposerTestBackend")
        self.seconds = seconds

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        time.sleep(self.seconds)
        return Answering()  # takes nothing


def test_a_slow_plugin_is_named_while_it_is_asked_and_its_time_counted(monkeypatch):
    # Before: silence while the hook slept, then "slow: 0 partition(s) in 0.01 s".
    monkeypatch.setattr(asking, "SLOW_ANSWER_S", 0.4)
    registry = registry_with(SlowToAnswer(seconds=1.5))
    said: list[str] = []
    model, inputs = zoo.load("mlp")
    composer.plan(model, ["slow"], inputs, registry=registry, cache=False, progress=said.append)
    asked = "plugin 'slow' (composer_operator_support)"
    still = [
        i
        for i, line in enumerate(said)
        if re.fullmatch(rf"still asking {re.escape(asked)} after 0\.\d s", line)
    ]
    done = "plugin 'slow' answered composer_operator_support after 1."
    answered = [i for i, line in enumerate(said) if line.startswith(done)]
    assert still and answered and still[0] < answered[0], said  # said while it was asked
    (partition_line,) = [line for line in said if line.startswith("slow: ")]
    seconds = float(re.fullmatch(r"slow: 0 partition\(s\) in ([\d.]+) s", partition_line)[1])
    assert seconds >= 1.5, partition_line


def test_a_quick_plugin_is_not_mentioned(monkeypatch):
    monkeypatch.setattr(asking, "SLOW_ANSWER_S", 0.4)
    lines: list[str] = []
    model, inputs = zoo.load("mlp")
    composer.plan(model, ["xnnpack"], inputs, cache=False, progress=lines.append)
    assert not [line for line in lines if "asking" in line or "answered" in line], lines
