"""The machine's errors are not the backend's (composer.contract.machine): an OS error while a
backend lowers or while the proof runs is retried once, or ends as one ComposerError; it never
moves a partition, so the program written does not depend on how busy the machine is."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from plugins_for_tests import Everything, registry_with

import composer
from composer import BackendSpec
from composer.cli import main
from composer.contract.hookspecs import hookimpl
from composer.contract.machine import MachineError
from composer.models import zoo
from composer.registry import discovery as registry_module


class ShortOfTheMachine(BackendDetails):
    """A real ExecuTorch backend whose compiler meets the machine's error ``raising`` the
    first ``times`` times it is called, then lowers as ComposerTestBackend does."""

    raising: OSError = BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    times = 0

    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        if ShortOfTheMachine.times > 0:
            ShortOfTheMachine.times -= 1
            raise ShortOfTheMachine.raising
        ops = [
            str(n.target) for n in edge_program.graph_module.graph.nodes if n.op == "call_function"
        ]
        return PreprocessResult(processed_bytes=json.dumps({"ops": ops}).encode())


class ShortPlugin:
    def __init__(self) -> None:
        self.spec = BackendSpec("short", "ShortOfTheMachine")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return Everything()


@pytest.fixture
def short(monkeypatch):
    monkeypatch.setattr(ShortOfTheMachine, "times", 0)
    return registry_with(ShortPlugin())


def compose(registry):
    model, inputs = zoo.load("mlp")
    return composer.compose(model, ["short", "xnnpack"], inputs, registry=registry, cache=False)


def test_a_compiler_out_of_processes_once_is_retried_and_writes_the_same_program(short):
    # Before: "failed to lower: BlockingIOError: [Errno 11]", and the nodes moved to XNNPACK.
    calm = compose(short)
    ShortOfTheMachine.times = 1
    busy = compose(short)
    assert ShortOfTheMachine.times == 0  # it did raise
    assert not busy.plan.repairs, busy.plan.repairs
    assert set(busy.plan.node_backends.values()) == {"short"}
    assert busy.plan.node_backends == calm.plan.node_backends
    assert busy.buffer == calm.buffer


def test_a_compiler_out_of_processes_twice_is_one_error_not_a_repair(short):
    ShortOfTheMachine.times = 2
    with pytest.raises(MachineError) as raised:
        compose(short)
    message = str(raised.value)
    assert message.startswith(
        "the machine ran short of processes or threads (the machine is busy) while lowering "
        "a partition with ShortOfTheMachine (BlockingIOError: [Errno 11] Resource temporarily "
        "unavailable), and again when retried."
    ), message
    assert "nothing was moved" in message and "after moving" not in message


@pytest.mark.parametrize(
    ("code", "text", "short_of"),
    [
        (errno.ENOSPC, "No space left", "disk space"),
        (errno.EFBIG, "File too large", "file size (a limit on the files it may write)"),
    ],
    ids=["ENOSPC", "EFBIG"],
)
def test_a_full_disk_while_lowering_ends_in_one_line_and_writes_nothing(
    short, capsys, tmp_path, monkeypatch, code, text, short_of
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ShortOfTheMachine, "raising", OSError(code, text))
    ShortOfTheMachine.times = 1000
    monkeypatch.setattr(registry_module, "_default", short)
    exit_code = main(["lower", "zoo:mlp", "--backends", "short,xnnpack", "-o", "m.pte",
                      "--quiet", "--no-cache"])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"composer: error: the machine ran short of {short_of} while lowering a partition with "
        f"ShortOfTheMachine (OSError: [Errno {code}] {text}), and again when retried."
    ), line
    assert list(tmp_path.iterdir()) == []


class OutOfMemoryOnce(torch.nn.Module):
    """The zoo's MLP, whose eager run (not its export) meets MemoryError ``times`` times: a
    machine out of memory while the proof runs eager."""

    times = 0

    def __init__(self) -> None:
        super().__init__()
        self.mlp, _ = zoo.load("mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if OutOfMemoryOnce.times > 0 and not torch.compiler.is_exporting():
            OutOfMemoryOnce.times -= 1
            raise MemoryError("out of memory")
        return self.mlp(x)


def test_the_proof_out_of_memory_once_is_retried_and_twice_is_one_error(monkeypatch):
    _, inputs = zoo.load("mlp")
    model = OutOfMemoryOnce().eval()
    monkeypatch.setattr(OutOfMemoryOnce, "times", 1)
    composition = composer.compose(model, ["xnnpack"], inputs, cache=False)
    assert OutOfMemoryOnce.times == 0  # it did raise
    assert composition.plan.proof.startswith("ran and matched eager"), composition.plan.proof
    OutOfMemoryOnce.times = 2
    with pytest.raises(MachineError, match=r"^the machine ran short of memory while running "
                       r"eager \(MemoryError: out of memory\), and again when retried"):  # fmt: skip
        composer.compose(model, ["xnnpack"], inputs, cache=False)
