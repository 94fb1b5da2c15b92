"""The proof on the user's own inputs: ``proof_inputs=`` and ``--proof-inputs FILE`` (a list of
input tuples saved with torch.save). The program is run at each sample beside the sizes it is
proven at, the proof line names them, a sample that shows the program wrong is repaired like a
size, and a sample or file the program cannot take is one line before anything is lowered."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import composer
from composer.cli import main
from composer.run import proof as proof_module
from tests.test_bad_input import assert_one_line_error

sys.path.insert(0, str(Path(__file__).parent / "runtime_plugin"))
from composer_tiny_backend import TinyPlugin
from plugins_for_tests import registry_with


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _ran_at(monkeypatch) -> list[tuple]:
    """The inputs the proof runs the program at, as it runs it."""
    seen: list[tuple] = []
    verify = proof_module.verify

    def recorded(composition, inputs, expected):
        seen.append(tuple(inputs))
        return verify(composition, inputs, expected)

    monkeypatch.setattr(proof_module, "verify", recorded)
    return seen


def test_the_proof_runs_at_each_sample_and_its_line_names_them(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model, inputs = Small().eval(), (torch.randn(2, 8),)
    samples = [(torch.randn(2, 8) * 3,), (torch.rand(2, 8),)]
    # Cached whole without samples first: the compose with samples must prove its own.
    composer.compose(model, "xnnpack", inputs)
    said: list[str] = []
    ran = _ran_at(monkeypatch)
    composition = composer.compose(model, "xnnpack", inputs, proof_inputs=samples,
                                   progress=said.append)  # fmt: skip
    proof = composition.plan.proof
    assert proof.startswith("ran and matched eager at the example and proof inputs 1, 2 in"), proof
    assert not any("reused the composed program" in line for line in said), said
    for (sample,) in samples:
        assert any(torch.equal(sample, x) for (x,) in ran), "the proof never ran this sample"
    # One sample, and a dynamic program: the sizes, then the sample.
    dim = torch.export.Dim("batch", min=1, max=8)
    composition = composer.compose(model, "xnnpack", inputs, cache=False, proof_inputs=samples[:1],
                                   dynamic_shapes=({0: dim},))  # fmt: skip
    proof = composition.plan.proof
    assert " sizes: example; " in proof and ", and at proof input 1 in " in proof, proof


class ReluFirst(torch.nn.Module):
    """relu, mul and add (tiny's), then a linear (XNNPACK's). tiny's relu, made wrong, is wrong
    only where its input is positive: an all-negative example cannot show it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.relu(x) * self.scale + x)


def test_a_sample_that_shows_the_program_wrong_is_caught_and_repaired(monkeypatch):
    monkeypatch.setenv("TINY_RUNTIME_BUG", "aten.relu.default")
    torch.manual_seed(0)
    model = ReluFirst().eval()
    negative, positive = (-torch.rand(4, 8) - 0.1,), (torch.rand(4, 8) + 0.1,)
    registry = registry_with(TinyPlugin())

    def compose(**given):
        return composer.compose(model, "tiny,xnnpack", negative, registry=registry, cache=False,
                                **given)  # fmt: skip

    # On the example alone the wrong relu shows nothing: no repair, and tiny keeps it.
    unrepaired = compose().plan
    assert unrepaired.repairs == () and unrepaired.ops_on("tiny")["aten.relu.default"] == 1
    plan = compose(proof_inputs=[positive]).plan
    (repair,) = plan.repairs
    assert repair.backend == "tiny" and repair.nodes == ("aten_relu_default",), repair
    assert plan.node_backends["aten_relu_default"] == "xnnpack"
    assert plan.proof.startswith("ran and matched eager at the example and proof input 1"), plan
    # Under strict placement the failure is the error, and names the sample.
    with pytest.raises(composer.ComposerError, match="does not match eager at proof input 1"):
        compose(proof_inputs=[positive], placement="strict")


LOWER = ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", "out.pte", "--quiet", "--no-cache"]


def _saved(path: Path, value) -> str:
    torch.save(value, path)
    return str(path)


def test_bad_files_and_samples_are_one_line_before_lowering(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a tensor file\n")
    right = torch.randn(4, 16)
    rows = [
        ([], "missing.pt", ["--proof-inputs: no such file: missing.pt"]),
        ([], "notes.txt", ["notes.txt is not a file torch.save wrote", "torch.save([(x1,)"]),
        ([], _saved(tmp_path / "t.pt", right), ["t.pt holds Tensor", "list of input tuples"]),
        ([], _saved(tmp_path / "e.pt", []), ["e.pt holds an empty list"]),
        ([], _saved(tmp_path / "l.pt", [right]), ["proof input 1 is a Tensor, not a tuple"]),
        ([], _saved(tmp_path / "i.pt", [(right,), (3,)]), ["proof input 2 holds int"]),
        ([], _saved(tmp_path / "d.pt", [(right.double(),)]),
         ["proof input 1 of 1 does not fit", "is float64 of shape (4, 16)",
          "takes float32 of shape (4, 16)", "nothing was lowered"]),
        ([], _saved(tmp_path / "n.pt", [(right,), (right, right)]),
         ["proof input 2 of 2 has 2 input(s), and the program takes 1"]),
        ([], _saved(tmp_path / "s.pt", [(torch.randn(4, 8),)]),
         ["proof input 1 of 1 does not fit", "takes float32 of shape (4, 16)"]),
        (["--dynamic", "0:0=2..8"], _saved(tmp_path / "r.pt", [(right,), (torch.randn(9, 16),)]),
         ["proof input 2 of 2 does not fit", "shape (9, 16)", "takes float32 of shape (2..8, 16)",
          "--dynamic"]),
        (["--no-check"], _saved(tmp_path / "c.pt", [(right,)]), ["--no-check", "proof_inputs"]),
        (["--method", "decode=zoo:mlp"], _saved(tmp_path / "m.pt", [(right,)]),
         ["--proof-inputs goes with one method"]),
    ]  # fmt: skip
    for flags, file, wanted in rows:
        code = main([*LOWER, *flags, "--proof-inputs", file])
        assert_one_line_error(code, capsys.readouterr().err, *wanted)
        assert not (tmp_path / "out.pte").exists(), file
    # A sample that fits the program and that the model itself refuses (a token id past its
    # vocabulary) is the user's to see: one line, not a repair.
    table = torch.nn.Embedding(10, 4).eval()
    with pytest.raises(composer.ComposerError, match=r"eager\) fails on proof input 1 of"):
        composer.compose(table, "xnnpack", (torch.tensor([1, 2]),), cache=False,
                         proof_inputs=[(torch.tensor([3, 50]),)])  # fmt: skip
    # The samples file is read, never written over.
    code = main([*LOWER[:4], "-o", "c.pt", "--force", "--proof-inputs", "c.pt"])
    assert_one_line_error(code, capsys.readouterr().err, "c.pt is the input c.pt")
