"""Plugins that break the contract at lowering time get a one-line PluginError, exit 2.

Each plugin here lowers (or tries to) through a real ExecuTorch ``BackendDetails``; what the
plan can check it checks, so that a plan that succeeds means lowering gets as far as the
backend's own compiler.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir.backend.backend_details import BackendDetails
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec
from composer.cli import main
from composer.contract.errors import PluginError
from composer.contract.hookspecs import hookimpl
from composer.contract.op_names import op_name
from composer.models import zoo
from composer.registry import discovery as registry_module


class CrashingCompilerBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        raise RuntimeError("the compiler crashed")


class ChattyCompilerBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        print("Network summary for the chatty compiler")  # as Vela does
        raise RuntimeError("the compiler crashed")


class PlainBytesBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        return b"a blob, not a PreprocessResult"


class TakesRelu(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        return op_name(node) in ("aten.relu.default", "aten.linear.default")


class CannotDecide(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        raise ValueError("cannot decide")


class NumericReasons(TakesRelu):
    def reason_unsupported(self, node):
        return 42


class ContractPlugin:
    def __init__(self, name, backend_id, support=TakesRelu, keep_whole=None) -> None:
        self.spec = BackendSpec(name, backend_id)
        self.support = support
        self.keep_whole = keep_whole

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return self.support()

    @hookimpl
    def composer_ops_to_not_decompose(self, backend, program):
        return self.keep_whole


class NamedSpecs(ContractPlugin):
    @hookimpl
    def composer_compile_specs(self, backend, method_name):
        return ["fast"]


PLUGINS = [
    ContractPlugin("crashing", "CrashingCompilerBackend"),
    ContractPlugin("plain_bytes", "PlainBytesBackend"),
    ContractPlugin("chatty", "ChattyCompilerBackend"),
    ContractPlugin("no_class", "NoSuchBackend"),
    ContractPlugin("op_names", "CrashingCompilerBackend", keep_whole=["aten.linear.default"]),
    ContractPlugin("undecided", "CrashingCompilerBackend", support=CannotDecide),
    ContractPlugin("not_support", "CrashingCompilerBackend", support=lambda: {"aten.relu"}),
    ContractPlugin("numeric", "CrashingCompilerBackend", support=NumericReasons),
    NamedSpecs("named_specs", "CrashingCompilerBackend"),
]


@pytest.fixture
def broken_plugins(monkeypatch):
    monkeypatch.setattr(registry_module, "_default", registry_with(*PLUGINS))


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("composer: error: ")
    return line.removeprefix("composer: error: ")


@pytest.mark.parametrize(
    ("backend", "message", "plan_catches_it"),
    [
        (
            "crashing",
            (
                "plugin 'crashing' (composer-test-crashing): backend 'crashing' failed to lower: "
                "CrashingCompilerBackend.preprocess raised RuntimeError: the compiler crashed"
            ),
            False,
        ),
        (
            "plain_bytes",
            (
                "backend 'plain_bytes' failed to lower: PlainBytesBackend.preprocess must return "
                "executorch's PreprocessResult"
            ),
            False,
        ),
        ("no_class", "backend id 'NoSuchBackend', but no BackendDetails subclass", True),
        ("op_names", "returned 'aten.linear.default' from composer_ops_to_not_decompose", True),
        ("named_specs", "returned ['fast'] from composer_compile_specs; it must return", True),
        (
            "undecided",
            "CannotDecide.is_node_supported raised on node aten_permute_copy_default",
            True,
        ),
    ],
)
def test_a_plugin_failing_at_lowering_time_is_one_line_naming_it(
    capsys, tmp_path, monkeypatch, broken_plugins, backend, message, plan_catches_it
):
    monkeypatch.chdir(tmp_path)
    # strict: a partition whose backend fails to lower is otherwise moved (test_proof.py).
    argv = ["lower", "zoo:mlp", "--backends", backend, "-o", "m.pte", "--quiet",
            "--placement", "strict"]  # fmt: skip
    line = one_line_error(capsys, argv)
    assert line.startswith(f"plugin {backend!r}") and message in line
    assert list(tmp_path.iterdir()) == []
    if plan_catches_it:
        assert message in one_line_error(capsys, ["plan", "zoo:mlp", "--backends", backend])
    else:
        assert main(["plan", "zoo:mlp", "--backends", backend]) == 0


def test_by_default_a_crashing_compiler_s_partitions_move_and_the_program_is_written(
    capsys, tmp_path, monkeypatch, broken_plugins
):
    monkeypatch.chdir(tmp_path)
    assert main(["lower", "zoo:mlp", "--backends", "crashing,xnnpack", "-o", "m.pte"]) == 0
    out = capsys.readouterr().out
    assert "moved: crashing partition of " in out
    assert "failed to lower: RuntimeError: the compiler crashed" in out
    assert "proof: ran and matched eager" in out
    assert (tmp_path / "m.pte").stat().st_size > 0


def test_what_a_compiler_prints_goes_to_stderr_not_into_composer_s_output(
    capsys, tmp_path, monkeypatch, broken_plugins
):
    monkeypatch.chdir(tmp_path)
    argv = ["lower", "zoo:mlp", "--backends", "chatty,xnnpack", "-o", "m.pte", "--no-cache"]
    assert main([*argv, "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "proof: ran and matched eager" in out
    assert "Network summary" not in out
    assert "Network summary for the chatty compiler" in err


@pytest.mark.parametrize("broken", ["not_support", "undecided"])
def test_a_broken_plugin_gets_the_same_error_first_or_second(capsys, broken_plugins, broken):
    # Listed second, consolidation asks every backend what it supports before the broken
    # plugin's own partition() runs: that path must check the plugin the same way.
    first = one_line_error(capsys, ["plan", "zoo:mlp", "--backends", f"{broken},xnnpack"])
    second = one_line_error(capsys, ["plan", "zoo:mlp", "--backends", f"xnnpack,{broken}"])
    assert first.startswith(f"plugin {broken!r}")
    assert first == second


def test_a_reason_that_is_not_a_string_is_a_plugin_error(capsys, broken_plugins):
    line = one_line_error(capsys, ["plan", "zoo:cumsum_mlp", "--backends", "numeric"])
    assert line == (
        "plugin 'numeric' (composer-test-numeric): NumericReasons.reason_unsupported returned "
        "42 for node aten_permute_copy_default; it must return a string or None."
    )


def test_a_compiler_crashing_in_parallel_workers_is_named_as_when_serial(broken_plugins):
    model, inputs = zoo.load("mlp")
    split = {"cache": False}  # its two relus, apart
    assert len(composer.plan(model, ["crashing"], inputs, **split).partitions) == 2
    message = "CrashingCompilerBackend.preprocess raised RuntimeError: the compiler crashed"
    with pytest.raises(PluginError, match=message):
        composer.compose(model, ["crashing"], inputs, jobs=2, placement="strict", **split)


def test_a_compiler_error_from_a_pass_manager_says_what_the_pass_raised():
    # Arm's compiler (Ethos-U) runs its TOSA passes in torch.fx's PassManager, whose error
    # names the pass and every pass before it (a hundred of them, 9 KB in one repair's "why")
    # and wraps what went wrong.
    from torch.fx.passes.infra.pass_base import PassResult
    from torch.fx.passes.infra.pass_manager import PassManager

    from composer.lower.compiler_raised import said

    def fine(module):
        return PassResult(module, False)

    def broken(module):
        raise ValueError("int8-only NPU got a float input")

    model, _ = zoo.load("mlp")
    graph_module = torch.fx.symbolic_trace(model)
    with pytest.raises(Exception) as raised:
        PassManager([fine] * 200 + [broken])(graph_module)
    words = said(raised.value)
    assert words.endswith("(from ValueError: int8-only NPU got a float input)")
    assert "An error occurred when running the 'broken' pass" in words
    assert len(words) < 400


class ExplainsRelu(composer.ExplainedSupport):
    """composer's base: one answer, the rest declared with defaults."""

    def is_node_supported(self, submodules, node):
        return op_name(node) == "aten.relu.default"


class ExplainsReluWithReasons(ExplainsRelu):
    def reason_unsupported(self, node):
        return f"only relu, not {op_name(node)}"


@pytest.mark.parametrize(
    ("support", "reason"),
    [
        (TakesRelu, "unsupported op"),  # a bare OperatorSupportBase
        (ExplainsRelu, "unsupported op"),  # the base's default
        (ExplainsReluWithReasons, "only relu, not aten.addmm.default"),
    ],
)
def test_a_support_object_explains_what_it_declines_where_it_says(support, reason):
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend  # noqa: F401

    plugin = ContractPlugin("explaining", "XnnpackBackend", support=support)
    model, inputs = zoo.load("mlp")
    plan = composer.plan(model, ["explaining"], inputs, registry=registry_with(plugin))
    assert plan.nodes_on("explaining")
    addmm = next(f for f in plan.fallbacks if f.op == "aten.addmm.default")
    assert dict(addmm.reasons)["explaining"] == reason


def test_the_base_asks_nothing_at_a_delegates_edge_unless_a_plugin_answers():
    from composer.contract.support import asks_at_boundary
    from composer.plugins.openvino.support import OpenvinoSupport

    assert not asks_at_boundary(ExplainsRelu())
    assert not asks_at_boundary(TakesRelu())
    assert asks_at_boundary(OpenvinoSupport.__new__(OpenvinoSupport))
