"""`composer run`: inputs made from the program's signature, `--save-outputs`, and `--compare`
judged against fp64 by the proof's rule, each as the user sees it."""

from __future__ import annotations

import re

import pytest
import torch

import composer
from composer.cli import main
from composer.models.model_source import load_model

SIGNATURE_LINE = (
    "no --inputs: made inputs from the program's signature: float32[8, 16] (largest sizes); "
    "random normal (seed 0)"
)


def run(capsys, *argv):
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """zoo:mlp with its batch dim dynamic (1..8), XNNPACK: the .pte stores [8, 16] for it."""
    model, inputs = load_model("zoo:mlp", ["0=1..8"])
    composition = composer.compose(model, ["xnnpack"], inputs, cache=False)
    path = tmp_path_factory.mktemp("run") / "mlp.pte"
    path.write_bytes(composition.buffer)
    return path


def _saved(path):
    value = torch.load(path, weights_only=True)
    assert isinstance(value, list) and all(isinstance(t, torch.Tensor) for t in value), value
    return value


def test_run_without_inputs_makes_them_from_the_signature_and_says_so(capsys, program, tmp_path):
    code, out, err = run(capsys, "run", program, "--save-outputs", tmp_path / "a.pt")
    assert code == 0, err
    assert SIGNATURE_LINE in err.splitlines(), err
    assert "output 0: shape [8, 8] float32" in out  # at the stored (largest) size
    # the same outputs as a run given those inputs: random normal from seed 0, as stored
    inputs = tmp_path / "inputs.pt"
    torch.save((torch.randn(8, 16, generator=torch.Generator().manual_seed(0)),), inputs)
    code, _, err = run(capsys, "run", program, "--inputs", inputs, "--save-outputs",
                       tmp_path / "b.pt")  # fmt: skip
    assert code == 0 and "no --inputs" not in err
    made, given = _saved(tmp_path / "a.pt"), _saved(tmp_path / "b.pt")
    assert len(made) == 1 and torch.equal(made[0], given[0])


def test_save_outputs_replaces_its_own_file_and_refuses_a_users(capsys, program, tmp_path):
    inputs, saved = tmp_path / "inputs.pt", tmp_path / "outputs.pt"
    torch.save((torch.ones(3, 16),), inputs)
    code, out, _ = run(capsys, "run", program, "--inputs", inputs, "--save-outputs", saved)
    assert code == 0 and f"outputs saved to {saved}" in out
    first = _saved(saved)
    assert [list(t.shape) for t in first] == [[3, 8]]
    # composer's own outputs are replaced by the next run's
    torch.save((torch.zeros(2, 16),), inputs)
    code, _, err = run(capsys, "run", program, "--inputs", inputs, "--save-outputs", saved)
    assert code == 0, err
    assert [list(t.shape) for t in _saved(saved)] == [[2, 8]]
    # a file the user saved is not, and the refusal comes before the run
    mine = tmp_path / "mine.pt"
    torch.save([torch.arange(4)], mine)
    before = mine.read_bytes()
    code, out, err = run(capsys, "run", program, "--inputs", inputs, "--save-outputs", mine)
    assert code == 2 and "output 0" not in out
    assert f"{mine} exists and is not a program's outputs composer wrote" in err
    assert "--force" in err and mine.read_bytes() == before
    # nor the inputs the run reads, --force or not
    code, _, err = run(capsys, "run", program, "--inputs", inputs, "--save-outputs", inputs,
                       "--force")  # fmt: skip
    assert code == 2 and "is the input" in err
    # --force replaces the user's file
    code, _, err = run(capsys, "run", program, "--inputs", inputs, "--save-outputs", mine,
                       "--force")  # fmt: skip
    assert code == 0, err
    assert [list(t.shape) for t in _saved(mine)] == [[2, 8]]


def test_compare_is_judged_against_fp64_and_says_the_allowed_error(capsys, program, tmp_path):
    code, out, _ = run(capsys, "run", program, "--compare", "zoo:mlp")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("compare with"))
    assert re.fullmatch(
        r"compare with zoo:mlp: OK, matches eager: rmse \S+ against fp64, eager \S+, allowed \S+",
        line,
    ), line
    # another model of the same signature: the program is not it, and says by how much
    other = torch.nn.Linear(16, 8).eval()
    example = (torch.randn(4, 16),)
    pt2 = tmp_path / "other.pt2"
    torch.export.save(torch.export.export(other, example), pt2)
    code, out, _ = run(capsys, "run", program, "--compare", pt2)
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith("compare with"))
    assert re.fullmatch(
        rf"compare with {re.escape(str(pt2))}: MISMATCH, does NOT match eager: rmse \S+ "
        r"against fp64, eager \S+, allowed \S+",
        line,
    ), line
    assert "max |pte - eager|" not in out
