"""The runtime half of the plugin contract: a backend's plugin supplies where its delegates run
(``composer_runtime``), and composer proves the backend's programs there, piece by piece where no
single runtime runs the whole program.

The backend is tests/runtime_plugin's ``tiny``: a third-party plugin written from the docs whose
runtime runs its delegates with NumPy. Nothing of it is mocked: its delegates are lowered by
ExecuTorch, its runtime computes them, XNNPACK's run in the pip runtime.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import attrs
import pytest
import torch

import composer
from composer.contract.errors import PluginError
from composer.pipeline import narrowing

sys.path.insert(0, str(Path(__file__).parent / "runtime_plugin"))
from composer_tiny_backend import TinyPlugin, TinyRuntime
from plugins_for_tests import registry_with

ROOT = Path(__file__).parent.parent


class GatedMlp(torch.nn.Module):
    """A linear (XNNPACK's) and elementwise ops with a weight of their own (tiny's)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.rand(8))

    def forward(self, x):
        return torch.relu(torch.tanh(self.fc(x)) * self.scale + x)


def _compose(plugin, **settings):
    torch.manual_seed(0)
    model, inputs = GatedMlp().eval(), (torch.randn(4, 8),)
    registry = registry_with(plugin)
    composition = composer.compose(model, "tiny,xnnpack", inputs, registry=registry, cache=False,
                                   **settings)  # fmt: skip
    return composition, model, inputs


def test_a_third_party_backend_with_a_runtime_is_proven_piece_by_piece():
    composition, _, _ = _compose(TinyPlugin())
    plan = composition.plan
    assert plan.ops_on("tiny") and plan.ops_on("xnnpack")
    assert plan.repairs == ()
    assert plan.proof.startswith("ran and matched eager"), plan.proof
    # The proof line says where each delegate ran: the plugin's runtime beside ExecuTorch's.
    assert (
        "piecewise: TinyBackend in tiny's NumPy runtime, XnnpackBackend in the ExecuTorch runtime"
        in plan.proof
    ), plan.proof
    result = composition.verify()  # again, on the runtimes the default registry knows
    assert result.ok, str(result)


class Counting(TinyRuntime):
    """tiny's runtime, counting the delegates it ran: what the proof ran was its code."""

    calls = 0

    def load(self, delegate):
        run = super().load(delegate)

        def counted(operands):
            Counting.calls += 1
            return run(operands)

        return counted


class CountingTiny(TinyPlugin):
    def composer_runtime(self, backend):
        return Counting()


def test_the_proof_ran_the_plugins_runtime_code():
    Counting.calls = 0
    composition, _, _ = _compose(CountingTiny())
    assert Counting.calls >= 1, composition.plan.proof


def test_a_runtime_that_computes_an_op_wrong_is_caught_and_only_that_op_moved(monkeypatch):
    monkeypatch.setenv("TINY_RUNTIME_BUG", "aten.tanh.default")
    composition, _, _ = _compose(TinyPlugin())
    plan = composition.plan
    (repair,) = plan.repairs
    assert repair.backend == "tiny" and "does not match its subgraph" in repair.why
    # Narrowed to the op its runtime computes wrong, named with the line that wrote it; the
    # rest of the partition stays on tiny.
    assert repair.nodes == ("aten_tanh_default",), repair
    assert "wrong there: aten.tanh.default at test_runtime_contract.py:" in repair.why
    assert "torch.tanh(self.fc(x))" in repair.why
    assert dict(plan.ops_on("tiny")) == {
        "aten.mul.Tensor": 1, "aten.add.Tensor": 1, "aten.relu.default": 1,
    }, plan.ops_on("tiny")  # fmt: skip
    assert plan.node_backends["aten_tanh_default"] == "xnnpack"
    assert plan.proof.startswith("ran and matched eager"), plan.proof
    assert "aten.tanh.default at test_runtime_contract.py:" in plan.proof
    assert "moved off tiny, its other ops kept" in plan.proof
    assert composition.verify().ok


def test_where_what_narrowing_kept_fails_in_the_program_the_whole_partition_moves(monkeypatch):
    # Narrowing judges subsets of a partition as delegates of their own; the program composed
    # after it may cut the backend's partitions otherwise (tied_lm's Vulkan embedding and
    # linears crashed the runner together, where each trial passed). Here a narrowing that
    # keeps the wrong op stands for that: the next round fails, and the whole partition moves.
    monkeypatch.setenv("TINY_RUNTIME_BUG", "aten.tanh.default")

    def kept_the_wrong_op(self, culprit, plan, deadline):
        relu = tuple(n for n in culprit.nodes if plan.node_ops[n] == "aten.relu.default")
        return attrs.evolve(culprit, nodes=relu, whole=culprit.nodes,
                            narrowed="aten.relu.default", narrowed_how="a wrong guess")  # fmt: skip

    monkeypatch.setattr(narrowing.Narrowing, "narrowed", kept_the_wrong_op)
    composition, _, _ = _compose(TinyPlugin())
    plan = composition.plan
    assert not plan.ops_on("tiny"), plan.ops_on("tiny")
    assert plan.proof.startswith("ran and matched eager"), plan.proof
    assert "its other ops kept" not in plan.proof
    # one repair: the partition's nodes that failed again move with it, not said twice
    (repair,) = plan.repairs
    assert len(repair.nodes) == 4, repair
    assert "but what it kept failed in the program: the whole partition moved" in repair.why


def test_a_runtime_wrong_at_every_op_has_its_whole_partition_moved(monkeypatch):
    monkeypatch.setenv("TINY_RUNTIME_BUG", "*")
    composition, _, _ = _compose(TinyPlugin())
    plan = composition.plan
    (repair,) = plan.repairs
    assert repair.backend == "tiny" and len(repair.nodes) == 4, repair
    assert "wrong there" not in repair.why
    assert not plan.ops_on("tiny")
    assert plan.proof.startswith("ran and matched eager"), plan.proof


def test_strict_placement_refuses_what_the_runtime_computes_wrong(monkeypatch):
    monkeypatch.setenv("TINY_RUNTIME_BUG", "aten.tanh.default")
    with pytest.raises(composer.ComposerError, match=r"tiny:0 \(tiny\) does not match"):
        _compose(TinyPlugin(), placement="strict")


class NoRuntime(TinyPlugin):
    def composer_runtime(self, backend):
        return None


def test_without_a_runtime_the_program_is_not_proven_and_says_why():
    composition, _, _ = _compose(NoRuntime())
    assert composition.plan.proof.startswith("not run here"), composition.plan.proof
    assert "TinyBackend" in composition.plan.proof


class Unloadable(TinyRuntime):
    def load(self, delegate):
        raise ValueError("this driver has no kernel for aten.tanh.default")


class UnloadableTiny(TinyPlugin):
    def composer_runtime(self, backend):
        return Unloadable()


def test_a_delegate_its_runtime_cannot_load_is_named_and_moved():
    composition, _, _ = _compose(UnloadableTiny())
    (repair,) = composition.plan.repairs
    assert repair.backend == "tiny"
    assert "failed to load" in repair.why and "no kernel for aten.tanh.default" in repair.why


class WrongAnswer(TinyPlugin):
    def composer_runtime(self, backend):
        return "numpy"


def test_a_runtime_hook_answering_the_wrong_type_is_a_plugin_error():
    with pytest.raises(PluginError, match="composer_runtime.*a composer.DelegateRuntime or None"):
        _compose(WrongAnswer())


def _names_in_code(path: Path) -> list[tuple[int, str]]:
    """Every string constant (docstrings aside), name and attribute of ``path``'s code."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
    return found


def test_no_code_outside_the_plugins_names_a_backend_id():
    """Where a backend's programs run belongs to its plugin: core code that names a backend id
    ("CudaBackend") decides it for the plugin, and a third-party backend gets no such help."""
    ids = {backend.spec.backend_id for backend in composer.default_registry().backends.values()}
    assert {"CudaBackend", "XnnpackBackend", "VulkanBackend"} <= ids
    named = [
        f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
        for path in sorted((ROOT / "composer").rglob("*.py"))
        if "plugins" not in path.relative_to(ROOT / "composer").parts
        for line, text in _names_in_code(path)
        if any(backend_id in text for backend_id in ids)
    ]
    assert named == [], "\n".join(named)
