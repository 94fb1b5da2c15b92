"""composer writes only where it may: a new path, or a file it recognizes as its own output of
the same kind. Every output flag, tried against a model's source, a config, a manifest, a notes
file and another output of the same command, is refused in one line, before any work, with the
file's bytes unchanged; composer's own earlier outputs are replaced, and ``--force`` replaces
the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bad_input import assert_one_line_error, run

import composer
import composer.fleet
from composer.contract.errors import ComposerError
from composer.fleet.jobs import run_job
from composer.lower.atomic import check_ours
from composer.models import zoo

SOURCE = "import torch\n\n\ndef factory():\n    return torch.nn.Linear(2, 2), (torch.ones(1, 2),)\n"
USERS_FILES = {
    "mymod.py": SOURCE,  # the model's source: mymod:factory
    "pyproject.toml": '[project]\nname = "mine"\n\n[tool.composer]\nbackends = ["xnnpack"]\n',
    "composer.toml": 'backends = ["xnnpack"]\n',
    "models.txt": "zoo:mlp\n",  # a sweep's manifest
    "notes.txt": "what I tried today\n",
    "package.json": '{"name": "mine", "version": "1.0.0"}\n',
    "index.html": "<!DOCTYPE html>\n<html><body>my page</body></html>\n",
}
OWN = "composer replaces only its own outputs: name a new file, or pass --force"


@pytest.fixture
def users_folder(tmp_path, monkeypatch):
    """The working folder holds the user's files; nothing that loads a model or runs a job may
    be reached (a refusal comes before any work)."""
    for name, text in USERS_FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the outputs were checked")

    monkeypatch.setattr("composer.models.model_source.load_model", no_work)
    monkeypatch.setattr(composer.fleet, "_run", no_work)
    monkeypatch.setattr("composer.conformance.command._pytest", no_work)
    return tmp_path


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# (the command's arguments, the file it must not write over, what its one line says)
LOWER = ["lower", "zoo:mlp", "--backends", "xnnpack", "--quiet"]
SWEEP = ["sweep", "zoo:mlp", "--stacks", "xnnpack"]
REFUSED = [
    # -o, the program
    (["lower", "mymod:factory", "--quiet", "-o", "mymod.py"], "mymod.py is the input mymod.py"),
    ([*LOWER, "-o", "pyproject.toml"], "pyproject.toml exists and is not an ExecuTorch program"),
    ([*LOWER, "-o", "composer.toml"], "composer.toml is the input composer.toml"),
    ([*LOWER, "-o", "models.txt"], "models.txt exists and is not an ExecuTorch program"),
    ([*LOWER, "-o", "notes.txt"], "notes.txt exists and is not an ExecuTorch program"),
    ([*LOWER, "-o", "out.json", "--report", "out.json"], "out.json is named twice"),
    # --report, the plan's page or JSON
    ([*LOWER, "-o", "out.pte", "--report", "package.json"], "package.json exists and is not a plan report"),
    ([*LOWER, "-o", "out.pte", "--report", "index.html"], "index.html exists and is not a plan report"),
    (["lower", "mymod:factory", "-o", "out.pte", "--report", "mymod.py"], "--report must end in .json or .html"),
    # --results, the sweep's records
    (["sweep", "mymod:factory", "--stacks", "xnnpack", "--results", "mymod.py"], "mymod.py is the input mymod.py"),
    ([*SWEEP, "--results", "pyproject.toml"], "pyproject.toml exists and is not a sweep's results"),
    ([*SWEEP, "--results", "composer.toml"], "composer.toml exists and is not a sweep's results"),
    (["sweep", "models.txt", "--stacks", "xnnpack", "--results", "models.txt"], "models.txt is the input models.txt"),
    ([*SWEEP, "--results", "notes.txt"], "notes.txt exists and is not a sweep's results"),
    ([*SWEEP, "--results", "r.html", "--html", "r.html"], "r.html is named twice"),
    # --html, the sweep's page
    ([*SWEEP, "--results", "r.jsonl", "--html", "index.html"], "index.html exists and is not a sweep's page"),
    ([*SWEEP, "--results", "r.jsonl", "--html", "notes.txt"], "notes.txt exists and is not a sweep's page"),
    (["sweep", "models.txt", "--stacks", "xnnpack", "--html", "models.txt"], "models.txt is the input models.txt"),
    ([*SWEEP, "--results", "r.jsonl", "--html", "pyproject.toml"], "pyproject.toml exists and is not a sweep's page"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[" ".join(a[3:]) for a, _ in REFUSED])
def test_an_output_over_a_file_composer_does_not_own_is_refused_before_any_work(
    users_folder, capsys, argv, message
):
    before = folder_bytes(users_folder)
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, err, message)
    assert out == ""
    assert folder_bytes(users_folder) == before  # nothing changed, nothing new


@pytest.mark.parametrize("flag", ["--results", "--html"])
def test_force_does_not_let_a_sweep_write_over_what_it_reads(users_folder, capsys, flag):
    argv = ["sweep", "models.txt", "--stacks", "xnnpack", "--force", flag, "models.txt"]
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, "models.txt is the input models.txt", "Name another output")
    assert (users_folder / "models.txt").read_text() == USERS_FILES["models.txt"]


def test_a_refused_output_says_how_to_go_on(users_folder, capsys):
    code, _, err = run(capsys, *SWEEP, "--results", "notes.txt")
    assert_one_line_error(
        code, err, f"notes.txt exists and is not a sweep's results composer wrote; {OWN}"
    )


def test_a_golden_file_that_is_not_a_golden_plan_is_refused_before_any_job(users_folder, capsys):
    golden = users_folder / "golden"
    golden.mkdir()
    (golden / "zoo_mlp.xnnpack.json").write_text('{"backends": ["xnnpack"], "ops": ')  # cut short
    before = folder_bytes(golden)
    code, _, err = run(capsys, *SWEEP, "--results", "r.jsonl", "--golden", "golden")
    assert_one_line_error(code, err, "golden/zoo_mlp.xnnpack.json exists and is not a golden plan",
                          "pass --update-golden")  # fmt: skip
    code, _, err = run(
        capsys, *SWEEP, "--results", "r.jsonl", "--golden", "golden", "--update-golden"
    )
    assert_one_line_error(code, err, "zoo_mlp.xnnpack.json exists and is not a golden plan",
                          "--force")  # fmt: skip
    assert folder_bytes(golden) == before and not (users_folder / "r.jsonl").exists()


@pytest.mark.parametrize(
    ("name", "text"),
    [("report.json", '{"mine": true}\n'), ("report.csv", "a,b\n1,2\n"), ("pytest.ini", "[pytest]\naddopts = -x\n")],
)  # fmt: skip
def test_conformance_refuses_a_report_dir_whose_files_are_not_the_suites(
    users_folder, capsys, name, text
):
    (users_folder / "mine").mkdir()
    (users_folder / "mine" / name).write_text(text)
    code, out, err = run(capsys, "conformance", "--report-dir", "mine", "--stack", "xnnpack")
    assert_one_line_error(code, err, f"mine/{name} exists and is not", "pass another --report-dir")
    assert out == "" and (users_folder / "mine" / name).read_text() == text
    assert [p.name for p in (users_folder / "mine").iterdir()] == [name]


def test_conformance_refuses_a_report_dir_that_is_a_file(users_folder, capsys):
    code, _, err = run(capsys, "conformance", "--report-dir", "notes.txt", "--stack", "xnnpack")
    assert_one_line_error(code, err, "--report-dir notes.txt is a file, not a folder")
    assert (users_folder / "notes.txt").read_text() == USERS_FILES["notes.txt"]


def test_the_api_refuses_as_the_command_line_does(users_folder):
    with pytest.raises(ComposerError, match="notes.txt exists and is not a sweep's results"):
        composer.sweep(["zoo:mlp"], ["xnnpack"], results="notes.txt")
    with pytest.raises(ComposerError, match="r.jsonl is named twice"):
        composer.sweep(["zoo:mlp"], ["xnnpack"], results="r.jsonl", html="./r.jsonl")
    assert folder_bytes(users_folder) == {n: t.encode() for n, t in sorted(USERS_FILES.items())}


# --- composer's own outputs are replaced; --force replaces the rest -----------------------


@pytest.fixture(scope="module")
def mlp():
    """zoo:mlp composed once with XNNPACK (composer's cache makes later composes cheap)."""
    model, inputs = zoo.load("mlp")
    return composer.compose(model, "xnnpack", inputs)


def test_save_replaces_a_program_it_wrote_and_refuses_notes_unless_forced(tmp_path, mlp):
    program, notes = tmp_path / "out.pte", tmp_path / "notes.txt"
    program.write_bytes(b"an old program")  # not one: refused
    notes.write_text("mine\n")
    for path in (program, notes):
        with pytest.raises(
            ComposerError, match=f"{path.name} exists and is not an ExecuTorch program.*force=True"
        ):
            mlp.save(path)  # fmt: skip
    assert notes.read_text() == "mine\n"
    mlp.save(program, force=True)
    mlp.save(program)  # its own program now: replaced without being told
    with pytest.raises(ComposerError, match="is not a plan report"):
        mlp.save(tmp_path / "new.pte", extra={notes: b"{}"})
    assert program.read_bytes() == mlp.buffer and not (tmp_path / "new.pte").exists()


def test_lower_writes_over_its_own_program_and_reports_and_over_notes_with_force(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for report in ("out.html", "out.json", "out.html", "out.json"):
        code, _, err = run(capsys, *LOWER, "-o", "out.pte", "--report", report)
        assert code == 0, err
    assert '<meta name="generator" content="composer report">' in Path("out.html").read_text()
    Path("notes.txt").write_text("mine\n")
    assert run(capsys, *LOWER, "-o", "notes.txt")[0] == 2
    code, out, err = run(capsys, *LOWER, "-o", "notes.txt", "--force")
    assert code == 0 and "wrote notes.txt" in out, err
    assert Path("notes.txt").read_bytes() == Path("out.pte").read_bytes()


def in_process(todo, ray, workers, bench, done, device_resource, placement):
    """The sweep's jobs composed in this process: what is written, not how jobs run, is tested."""
    for job in todo:
        done(run_job({"model": job.model, "stack": job.stack}))


def test_sweep_writes_over_its_own_results_page_and_goldens_and_over_notes_with_force(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(composer.fleet, "_run", in_process)
    argv = [*SWEEP, "--results", "r.jsonl", "--html", "r.html", "--golden", "golden"]
    for extra in ([], ["--update-golden"], []):
        code, out, err = run(capsys, *argv, *extra)
        assert code == 0, err + out
    assert "matches its golden plan" in out
    assert [r["model"] for r in map(json.loads, Path("r.jsonl").read_text().splitlines())] == [
        "zoo:mlp"
    ]
    assert '<meta name="generator" content="composer sweep page">' in Path("r.html").read_text()
    check_ours(Path("golden/zoo_mlp.xnnpack.json"), "golden")
    Path("notes.txt").write_text("mine\n")
    Path("page.txt").write_text("mine\n")
    assert run(capsys, *SWEEP, "--results", "notes.txt")[0] == 2
    code, out, err = run(capsys, *SWEEP, "--results", "notes.txt", "--html", "page.txt", "--force")
    assert code == 0, err
    assert json.loads(Path("notes.txt").read_text())["model"] == "zoo:mlp"
    assert "composer sweep" in Path("page.txt").read_text()
