"""Bad files, flags and arguments: one clear line and exit 2, never a crash or a traceback."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from composer.cli import main
from composer.contract.errors import ComposerError
from composer.models import zoo


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def composer_command(cwd, *argv):
    return subprocess.run(
        [sys.executable, "-m", "composer.cli", *map(str, argv)],
        check=False, capture_output=True, text=True, cwd=cwd,
    )  # fmt: skip


def assert_one_line_error(code: int, err: str, *wanted: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith("composer: error: "), line
    for text in wanted:
        assert text in line, line


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """A small real program (zoo:mlp on XNNPACK) and its example inputs beside it."""
    folder = tmp_path_factory.mktemp("program")
    pte = folder / "mlp.pte"
    assert main(["lower", "zoo:mlp", "--backends", "xnnpack", "-o", str(pte), "--quiet"]) == 0
    torch.save(zoo.load("mlp")[1], folder / "inputs.pt")
    return pte


def damaged_programs(good: bytes, seed: int = 55) -> list[tuple[str, bytes]]:
    """Programs as disks, copies and downloads damage them: flipped bits anywhere or in the
    header, cut short, and files that never were programs."""
    rng = random.Random(seed)
    variants = []
    for _ in range(12):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        variants.append(("flipped bits", bytes(data)))
    for _ in range(6):
        data = bytearray(good)
        data[rng.randrange(64)] = rng.randrange(256)
        variants.append(("damaged header", bytes(data)))
    for _ in range(6):
        variants.append(("truncated", good[: rng.randrange(len(good))]))
    for size in (0, 7, 100, 10_000, 10_000, 10_000):
        variants.append(("random bytes", rng.randbytes(size)))
    # The runtime logs a backend id it does not know; one that is not UTF-8 aborted it.
    data = bytearray(good)
    data[data.find(b"XnnpackBackend") + 1] |= 0x80
    variants.append(("backend id not UTF-8", bytes(data)))
    return variants


# Each variant runs through composer.cli.main in one child process: a crash of the runtime
# (SIGABRT) ends the child, and the records it wrote say which variant did it.
FUZZ_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    from composer.cli import main

    inputs, paths = sys.argv[1], sys.argv[2:]
    for path in paths:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(["run", path, "--inputs", inputs])
        except BaseException:
            code, err = None, io.StringIO(traceback.format_exc())
        print(json.dumps({"path": path, "code": code, "err": err.getvalue()}), flush=True)
""")


def test_run_on_damaged_programs_never_dies_without_a_message(program, tmp_path):
    variants = damaged_programs(program.read_bytes())
    paths = []
    for index, (_kind, data) in enumerate(variants):
        paths.append(tmp_path / f"damaged{index}.pte")
        paths[-1].write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", FUZZ_DRIVER, str(program.parent / "inputs.pt"), *map(str, paths)],
        check=False, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    died_at = len(records)
    assert done.returncode == 0 and died_at == len(paths), (
        f"died (exit {done.returncode}) on variant {died_at} ({variants[died_at][0]}): "
        f"{done.stderr[-500:]}"
    )
    for record, (kind, _) in zip(records, variants):
        assert record["code"] in (0, 2), (kind, record)
        if record["code"] == 2:
            assert_one_line_error(record["code"], record["err"])
    assert "is damaged" in records[-1]["err"]


def test_random_bytes_are_refused_in_one_line_not_an_abort(tmp_path):
    (tmp_path / "noise.pte").write_bytes(random.Random(8).randbytes(10_000))
    done = composer_command(tmp_path, "run", "noise.pte", "--compare", "zoo:mlp")
    assert_one_line_error(done.returncode, done.stderr, "noise.pte is not an ExecuTorch program")


def test_a_truncated_program_says_how_much_is_missing(program, tmp_path, capsys):
    data = program.read_bytes()
    (tmp_path / "cut.pte").write_bytes(data[:-100])
    code, _, err = run(capsys, "run", tmp_path / "cut.pte", "--compare", "zoo:mlp")
    assert_one_line_error(code, err, "cut.pte is truncated", f"says {len(data):,} bytes")


def test_an_unknown_method_lists_the_program_s_methods(program, capsys):
    code, _, err = run(capsys, "run", program, "--method", "nosuch", "--compare", "zoo:mlp")
    assert_one_line_error(code, err, "has no method 'nosuch'; its methods: forward.")
    assert "Backend" not in err


def test_compare_with_a_pt2_uses_the_inputs_saved_in_it(program, tmp_path, capsys):
    model, inputs = zoo.load("mlp")
    torch.export.save(torch.export.export(model, inputs), tmp_path / "mlp.pt2")
    code, out, err = run(capsys, "run", program, "--compare", tmp_path / "mlp.pt2")
    assert code == 0, err
    assert f"compare with {tmp_path / 'mlp.pt2'}: OK" in out


@pytest.mark.parametrize("output_flag", ["-o", "--report"])
def test_lower_refuses_to_write_over_its_input_model(tmp_path, capsys, monkeypatch, output_flag):
    model, inputs = zoo.load("mlp")
    torch.export.save(torch.export.export(model, inputs), tmp_path / "mlp.pt2")
    before = (tmp_path / "mlp.pt2").read_bytes()
    (tmp_path / "link.json").symlink_to("mlp.pt2")
    monkeypatch.chdir(tmp_path)
    target = "mlp.pt2" if output_flag == "-o" else "link.json"
    argv = ["lower", "./mlp.pt2", "--backends", "xnnpack", "--quiet", "-o", "out.pte"]
    code, _, err = run(capsys, *argv, output_flag, target)
    assert_one_line_error(code, err, f"{target} is the input mlp.pt2", "Name another output")
    assert (tmp_path / "mlp.pt2").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "mlp.pt2"]


# A save that stalls once its temporary is whole, so that it can be killed there.
STALLED_SAVE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from composer.lower import atomic

    def stall(temporaries):
        print("written", flush=True)
        time.sleep(600)

    atomic._rename_all = stall
    atomic.write_all({Path(sys.argv[1]): b"x" * 20_000_000})
""")


def test_a_later_save_removes_what_a_killed_save_left(tmp_path, capsys):
    saving = subprocess.Popen(
        [sys.executable, "-c", STALLED_SAVE, str(tmp_path / "out.pte")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert saving.stdout.readline() == "written\n"
    saving.kill()
    saving.wait()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".out.pte.") and left.stat().st_size == 20_000_000
    # A save in progress here (this process's own temporary) is left alone.
    ours = tmp_path / f".other.pte.composer-{os.getpid()}.abcd1234.tmp"
    ours.write_bytes(b"")
    code, _, err = run(capsys, "lower", "zoo:mlp", "--backends", "xnnpack", "--quiet", "-o",
                       tmp_path / "out.pte")  # fmt: skip
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [ours.name, "out.pte"]


def test_a_cache_entry_under_another_key_is_not_served(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(cache))
    lower = ["lower", "--backends", "xnnpack", "--quiet", "-o", tmp_path / "out.pte"]
    assert run(capsys, *lower[:1], "zoo:mlp", *lower[1:])[0] == 0
    mlp_entries = set(cache.glob("*/*.entry"))
    assert run(capsys, *lower[:1], "zoo:cnn", *lower[1:])[0] == 0
    # Each of cnn's whole-program entries gets the bytes of mlp's entry of the same kind.
    for entry in set(cache.glob("*/*.entry")) - mlp_entries:
        if entry.parent.name in ("program", "module"):
            mlp_entry = next(e for e in mlp_entries if e.parent == entry.parent)
            entry.write_bytes(mlp_entry.read_bytes())
    code, out, err = run(capsys, *lower[:1], "zoo:cnn", *lower[1:])
    assert code == 0, err
    assert "aten.convolution" in out  # cnn's plan, lowered again
    assert "composer: warning: dropped a misplaced (another key's) program cache entry" in err


DATA_DEPENDENT = textwrap.dedent("""
    import torch

    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    def model():
        return Branchy(), (torch.randn(4),)
""")


def test_an_untraceable_model_is_one_line_without_torch_s_graph_dump(tmp_path, capsys, monkeypatch):
    (tmp_path / "branchy.py").write_text(DATA_DEPENDENT)
    done = composer_command(tmp_path, "plan", "branchy:model", "--backends", "xnnpack")
    assert_one_line_error(done.returncode, done.stderr, "torch.export failed for Branchy")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ComposerError, match="torch.export failed"):  # --debug: as it is
        main(["--debug", "plan", "branchy:model", "--backends", "xnnpack"])
    assert "def forward(self, arg0_1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"progress": True}, "progress must be a function taking one line of text, or None"),
        ({"cache": "no"}, "cache must be True or False, not 'no'."),
        ({"check": None}, "check must be True or False, not None."),
        ({"example_inputs": torch.ones(4, 16)}, "example_inputs must be a tuple of the model's"),
        ({"registry": "xnnpack"}, "registry must be a composer.Registry"),
        ({"jobs": 0}, "jobs must be a whole number >= 1, or None, not 0."),
        ({"constant_methods": ["a"]}, "constant_methods must be a dict"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("entry", ["compose", "plan"])
def test_a_wrong_argument_type_is_named_before_any_work(entry, keywords, message):
    import composer

    if entry == "plan" and set(keywords) & {"check", "jobs", "constant_methods"}:
        pytest.skip("compose's own arguments")
    model, inputs = zoo.load("mlp")
    keywords = {"example_inputs": inputs, **keywords}
    with pytest.raises(ComposerError) as raised:
        getattr(composer, entry)(model, "xnnpack", **keywords)
    assert str(raised.value) == message or str(raised.value).startswith(message)
    assert "failed to lower" not in str(raised.value)


def test_version_names_composer_executorch_and_torch(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == (
        f"composer {version('executorch-composer')} (executorch {version('executorch')}, "
        f"torch {torch.__version__})\n"
    )


def test_backends_fits_the_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["backends"]) == 0
    assert main(["backends", "xnnpack", "cuda", "openvino"]) == 0
    lines = capsys.readouterr().out.splitlines()
    too_wide = [line for line in lines if len(line) > 80 and not line.startswith("failed")]
    assert not too_wide
    names = {line.split()[0] for line in lines if line and not line.startswith(" ")}
    assert {"xnnpack", "cuda", "openvino", "cuda.max_autotune"} <= names


LOWER = ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", "out.pte", "--quiet"]
PLAN = ["plan", "zoo:mlp", "--backends", "xnnpack"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*PLAN, "--threads", "0"], "--threads: must be a whole number >= 1, not '0'"),
        ([*PLAN, "--threads", "two"], "--threads: must be a whole number >= 1, not 'two'"),
        ([*PLAN, "--tune-budget", "nan"], "--tune-budget: must be a number >= 0, not 'nan'"),
        ([*PLAN, "--repair-time", "-1"], "--repair-time: must be a number >= 0, not '-1'"),
        ([*PLAN, "--placement", "fast"], "--placement: invalid choice: 'fast'"),
        ([*PLAN, "--dynamic", "0:9=1..4"], "the dim must exist"),
        ([*PLAN, "--option", "xnnpack.nope=1"], "unknown option 'nope' for backend 'xnnpack'"),
        ([*PLAN, "--config", "nope.toml"], "no such config file: nope.toml"),
        ([*LOWER, "--jobs", "0"], "--jobs: must be a whole number >= 1, not '0'"),
        ([*LOWER, "--bench", "-1"], "--bench: must be a whole number >= 1, not '-1'"),
        ([*LOWER, "--bench", "0"], "--bench: must be a whole number >= 1, not '0'"),
        ([*LOWER, "--quantize", "0"], "--quantize: must be a whole number >= 1, not '0'"),
        ([*LOWER, "--report", "r.txt"], "--report must end in .json or .html"),
        ([*LOWER, "--method", "=zoo:mlp"], "--method takes NAME=MODEL"),
        (["run", "{pte}", "--inputs", "inputs.pt", "--bench", "0"], "--bench: must be a whole"),
        (["run", "{pte}", "--inputs", "inputs.pt", "--threads", "-2"], "--threads: must be a"),
        (["run", "{pte}", "--inputs", "nope.pt"], "no such inputs file: nope.pt"),
        (["run", "{pte}", "--inputs", "junk.pt"], "cannot read inputs from junk.pt"),
        (["run", "{pte}", "--inputs", "text.pt"], "input 0 must be a tensor"),
        (["run", "{pte}", "--compare", "zoo:nope"], "no zoo model 'nope'"),
        (["run", "."], "no such file: ."),
        (["nope"], "argument command: invalid choice: 'nope'"),
    ],
)
def test_each_bad_flag_value_is_one_line_and_exit_2(
    program, tmp_path, capsys, monkeypatch, argv, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.pt").write_text("junk")
    torch.save(("text",), tmp_path / "text.pt")
    torch.save(zoo.load("mlp")[1], tmp_path / "inputs.pt")
    argv = [str(program) if a == "{pte}" else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exited:  # argparse's errors exit
        code = exited.code
    assert_one_line_error(code, capsys.readouterr().err, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs.pt", "junk.pt", "text.pt"]
