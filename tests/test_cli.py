"""The composer command line, in process (main(argv)) and, for exit codes, as a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from composer.cli import main
from composer.models import zoo


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_backends_lists_every_backend_with_its_distribution(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # whole rows: a narrow terminal wraps them
    code, out, _ = run(capsys, "backends")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["backend", "lowers", "here"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert {"xnnpack", "tensorrt_stub", "cuda", "metal"} <= set(rows)
    assert rows["xnnpack"].split()[1:3] == ["yes", "yes"]
    code, out, _ = run(capsys, "backends", "xnnpack")
    assert "ExecuTorch backend XnnpackBackend on cpu, from executorch-composer" in out


def test_plan_prints_the_table_and_json(capsys):
    code, out, _ = run(capsys, "plan", "zoo:cumsum_mlp", "--backends", "tensorrt_stub,xnnpack")
    assert code == 0
    assert out.splitlines()[0].split() == ["backend", "nodes", "partitions", "ops"]
    assert "fallback aten_cumsum_default (aten.cumsum.default)" in out
    code, out, _ = run(capsys, "plan", "zoo:mlp", "--backends", "xnnpack", "--json")
    assert json.loads(out)["summary"]["xnnpack"]["partitions"] == 1


def test_lower_writes_pte_and_reports_then_run_compares(capsys, tmp_path):
    pte, report = tmp_path / "m.pte", tmp_path / "m.json"
    # --no-cache: the progress lines below are those of a lowering.
    code, out, err = run(capsys, "lower", "zoo:cumsum_mlp", "--backends", "xnnpack",
                         "-o", str(pte), "--report", str(report), "--verify",
                         "--no-cache")  # fmt: skip
    assert code == 0
    assert pte.read_bytes()[4:8] == b"ET12"
    assert json.loads(report.read_text())["delegate_calls"] == 2
    assert "verify: OK" in out and "executorch runtime" in out
    assert "xnnpack: 2 partition(s)" in err and "lowered with xnnpack" in err  # progress
    code, out, _ = run(capsys, "run", str(pte), "--compare", "zoo:cumsum_mlp")
    assert code == 0
    assert "output 0: shape [4, 16] float32" in out
    assert "compare with zoo:cumsum_mlp: OK" in out
    inputs = tmp_path / "inputs.pt"
    torch.save(zoo.load("cumsum_mlp")[1], inputs)
    code, out, _ = run(capsys, "run", str(pte), "--inputs", str(inputs))
    assert code == 0 and "output 0" in out


def test_lower_several_methods_into_one_program_and_run_each(capsys, tmp_path):
    pte, report = tmp_path / "m.pte", tmp_path / "m.json"
    code, out, _ = run(capsys, "lower", "zoo:mlp", "--method", "head=zoo:cumsum_mlp",
                       "--backends", "xnnpack", "-o", str(pte), "--report", str(report),
                       "--verify", "--quiet")  # fmt: skip
    assert code == 0
    assert "method forward:" in out and "method head:" in out
    assert "verify forward: OK" in out and "verify head: OK" in out
    assert set(json.loads(report.read_text())["methods"]) == {"forward", "head"}
    code, out, _ = run(capsys, "run", str(pte), "--method", "head", "--compare", "zoo:cumsum_mlp")
    assert code == 0 and "compare with zoo:cumsum_mlp: OK" in out
    # --bench times the method asked for, per delegate too (it timed forward's one delegate)
    code, out, _ = run(capsys, "run", str(pte), "--method", "head", "--compare", "zoo:cumsum_mlp",
                       "--bench", "5")  # fmt: skip
    assert code == 0 and re.search(r"^program\s+2\s", out, re.MULTILINE), out
    assert "delegate 1 (XnnpackBackend)" in out
    code, _, err = run(capsys, "lower", "zoo:mlp", "--method", "forward=zoo:cnn",
                       "--backends", "xnnpack", "-o", str(tmp_path / "n.pte"))  # fmt: skip
    assert code == 2 and "--method takes NAME=MODEL with a new name" in err


def test_lower_html_report(capsys, tmp_path):
    report = tmp_path / "plan.html"
    code, _, _ = run(capsys, "lower", "zoo:mlp", "--backends", "tensorrt_stub", "-o",
                     str(tmp_path / "m.pte"), "--report", str(report), "--quiet")  # fmt: skip
    assert code == 0
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
    assert "tensorrt_stub:0" in page


def test_explain_says_what_each_backend_answered(capsys):
    code, out, _ = run(capsys, "explain", "zoo:cumsum_mlp", "--backends", "tensorrt_stub,xnnpack",
                       "--op", "aten.cumsum.default")  # fmt: skip
    assert code == 0
    assert out.splitlines() == [
        "aten_cumsum_default (aten.cumsum.default) -> portable",
        "  tensorrt_stub: unsupported op",
        "  xnnpack: not tagged by XnnpackPartitioner",
    ]
    code, out, _ = run(capsys, "explain", "zoo:cumsum_mlp", "--backends", "tensorrt_stub,xnnpack",
                       "--node", "aten_relu_default")  # fmt: skip
    assert "tensorrt_stub: took it (partition tensorrt_stub:0)" in out
    assert "xnnpack: not offered: already lowered by tensorrt_stub" in out


def test_config_file_sets_the_stack_pins_and_sizes(capsys, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.composer]\nbackends = ["tensorrt_stub", "xnnpack"]\n'
        '[tool.composer.never]\ntensorrt_stub = ["aten.relu.default"]\n'
        "[tool.composer.min_partition_size]\nxnnpack = 1\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "explain", "zoo:cumsum_mlp", "--node", "aten_relu_default")
    assert code == 0
    assert "  tensorrt_stub: pinned off tensorrt_stub by the user" in out
    assert "  xnnpack: took it" in out
    # --backends on the command line wins over the file.
    code, out, _ = run(capsys, "plan", "zoo:cumsum_mlp", "--backends", "xnnpack")
    assert "tensorrt_stub" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "zoo:mlp", "--backends", "tensorrt"], "unknown backend 'tensorrt'"),
        (["plan", "zoo:mlp", "--backends", "xnnpack,xnnpack"], "appears twice"),
        (["plan", "zoo:mlp"], "no backends given"),
        (["plan", "zoo:nope", "--backends", "xnnpack"], "no zoo model 'nope'"),
        (["plan", "missing.pt2", "--backends", "xnnpack"], "no such file: missing.pt2"),
        (["plan", "composer_no_such_module:f", "--backends", "xnnpack"], "cannot import"),
        (["plan", "zoo:mlp", "--backends", "xnnpack", "--option", "cuda"], "BACKEND.NAME=VALUE"),
        (["plan", "zoo:mlp", "--backends", "cuda", "--option", "cuda.fast=ON"], "unknown option"),
        (["lower", "zoo:mlp", "--backends", "cuda", "-o", "x.pte"], "cannot lower on this machine"),
        (["run", "missing.pte"], "no such file: missing.pte"),
        (["explain", "zoo:mlp", "--backends", "xnnpack", "--op", "aten.nope"], "no op 'aten.nope'"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    if argv[0] == "lower" and torch.cuda.is_available():
        pytest.skip("cuda lowers here")
    code, _out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("composer: error: ") and message in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_corrupt_pt2_and_factory_that_raises(capsys, tmp_path, monkeypatch):
    (tmp_path / "bad.pt2").write_bytes(b"not a zip")
    (tmp_path / "factories.py").write_text(
        "def broken():\n    raise ValueError('no weights here')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run(capsys, "plan", "bad.pt2", "--backends", "xnnpack")
    assert code == 2 and "not a readable torch.export archive" in err
    code, _, err = run(capsys, "plan", "factories:broken", "--backends", "xnnpack")
    assert code == 2 and "the factory factories:broken raised ValueError: no weights here" in err


def test_pt2_file_from_torch_export_save(capsys, tmp_path):
    model, inputs = zoo.load("mlp")
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, inputs), path)
    code, out, _ = run(capsys, "plan", str(path), "--backends", "xnnpack")
    assert code == 0 and "xnnpack" in out


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "composer.cli", "plan", "zoo:mlp", "--backends", "nope"],
        check=False, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("composer: error: unknown backend")
    assert "Traceback" not in done.stderr


def test_no_consolidate_keeps_plain_priority_order(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "zoo:transformer_block", "--backends", "xnnpack,tensorrt_stub"]
    _, consolidated, _ = run(capsys, *argv)
    _, plain, _ = run(capsys, *argv, "--no-consolidate")
    assert "delegate calls: 3 " in consolidated
    assert "delegate calls: 7 " in plain
    (tmp_path / "composer.toml").write_text("consolidate = false\n")
    _, from_file, _ = run(capsys, *argv)
    assert "delegate calls: 7 " in from_file


def test_run_explains_a_program_whose_backend_this_runtime_lacks(capsys, tmp_path):
    pte = tmp_path / "stub.pte"
    run(capsys, "lower", "zoo:mlp", "--backends", "tensorrt_stub", "-o", str(pte), "--quiet")
    code, _, err = run(capsys, "run", str(pte), "--compare", "zoo:mlp")
    assert code == 2
    assert "cannot load method 'forward'" in err
    assert "XnnpackBackend" in err  # what this runtime does have


def composer_command(cwd, *argv):
    return subprocess.run(
        [sys.executable, "-m", "composer.cli", *argv],
        check=False, capture_output=True, text=True, cwd=cwd,
    )  # fmt: skip


# CI time (two processes that lower, about 2 minutes): the test below keeps stderr to
# composer's own lines in the default suite.
@pytest.mark.slow
def test_upstream_noise_stays_off_the_terminal_unless_debug(tmp_path):
    # A model updating a buffer in place (a KV cache, a running count): ExecuTorch warns
    # about buffer mutation; torch and torchao log at import. None of it is the user's
    # business. Lowered each time: a program from the cache makes no noise to hide.
    (tmp_path / "counting.py").write_text(
        "import torch\n\n"
        "class Counting(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.register_buffer('seen', torch.zeros(4))\n\n"
        "    def forward(self, x):\n"
        "        self.seen.add_(x)\n"
        "        return torch.relu(x) * 2\n\n"
        "def model():\n"
        "    return Counting(), (torch.randn(4),)\n"
    )
    argv = ["lower", "counting:model", "--backends", "xnnpack", "-o", "m.pte", "--quiet",
            "--no-cache"]  # fmt: skip
    done = composer_command(tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    debug = composer_command(tmp_path, "--debug", *argv)
    assert "Mutation on a buffer" in debug.stderr


def test_with_openvino_in_the_stack_stderr_holds_only_composer_s_lines(tmp_path):
    # ExecuTorch's OpenVINO module imports pytorch_tokenizers, whose C++ part printed
    # "I tokenizers:regex.cpp:40] Registering override fallback regex" before composer's lines.
    argv = ["lower", "zoo:mlp", "--backends", "openvino,xnnpack", "-o", "m.pte", "--no-cache"]
    done = composer_command(tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(re.match(r"\[ *\d+\.\d+s\] ", line) for line in lines), lines
    assert done.stdout.count("proof: ") == 1


def test_corrupt_pt2_is_one_line_in_a_terminal(tmp_path):
    (tmp_path / "bad.pt2").write_bytes(b"not a zip")
    done = composer_command(tmp_path, "plan", "bad.pt2", "--backends", "xnnpack")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("composer: error: bad.pt2 is not a readable torch.export archive")


def test_partition_ids_are_the_same_in_progress_lines_and_the_plan(capsys, tmp_path):
    report = tmp_path / "plan.json"
    code, _, err = run(capsys, "lower", "zoo:transformer_block", "--backends",
                       "xnnpack,tensorrt_stub", "-o", str(tmp_path / "m.pte"),
                       "--report", str(report), "--no-consolidate", "--no-cache")  # fmt: skip
    assert code == 0
    progress = dict(re.findall(r"^\[[ \d.]+s\]\s+(\S+:\d+)\s+(\d+) op\(s\)$", err, re.MULTILINE))
    planned = {p["id"]: str(len(p["nodes"])) for p in json.loads(report.read_text())["partitions"]}
    assert "tensorrt_stub:0" in progress
    assert progress == planned


def test_a_factory_in_the_current_directory_imports_without_pythonpath(tmp_path):
    (tmp_path / "my_models.py").write_text(
        "import torch\n\ndef small():\n    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "composer"), "plan", "my_models:small",
         "--backends", "xnnpack"],
        check=False, capture_output=True, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "aten.linear.default x1" in done.stdout


def test_a_plugins_own_error_for_a_bad_option_reaches_the_user_unchanged(capsys):
    code, _, err = run(capsys, "plan", "zoo:mlp", "--backends", "cuda", "--option",
                       "cuda.max_autotune=MAYBE")  # fmt: skip
    assert code == 2
    assert err == (
        "composer: error: option 'max_autotune' of backend 'cuda' must be one of ON, OFF, "
        "not 'MAYBE'.\n"
    )


def test_a_pin_naming_no_op_warns_with_the_closest_names(capsys, tmp_path, monkeypatch):
    (tmp_path / "composer.toml").write_text(
        'backends = ["tensorrt_stub"]\n[never]\ntensorrt_stub = ["aten.relu", "aten.cumsum.default"]\n'
    )
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "plan", "zoo:cumsum_mlp")
    assert code == 0
    assert err.splitlines() == [
        (
            "composer: warning: the pin never tensorrt_stub = 'aten.relu' names no op; did you "
            "mean aten.relu.default, aten.relu.out?"
        )
    ]


def test_plugin_warnings_print_as_one_composer_line(capsys, monkeypatch):
    from plugins_for_tests import CarelessPlugin, registry_with

    from composer.registry import discovery as registry_module

    monkeypatch.setattr(registry_module, "_default", registry_with(CarelessPlugin()))
    code, _, err = run(capsys, "plan", "zoo:mlp", "--backends", "xnnpack,careless")
    assert code == 0
    (line,) = err.splitlines()
    assert line.startswith(
        "composer: warning: composer removed tags that TagEverything of plugin 'careless' put on"
    )


def test_lower_quantize_writes_an_int8_program_that_ran(capsys, tmp_path):
    out_path = tmp_path / "m.pte"
    report = tmp_path / "plan.json"
    code, out, err = run(capsys, "lower", "zoo:mlp", "--backends", "xnnpack", "--quantize", "2",
                         "-o", str(out_path), "--report", str(report), "--no-cache")  # fmt: skip
    assert code == 0, err
    assert out_path.stat().st_size > 0
    plan = json.loads(report.read_text())
    assert plan["partitions"] and all(p["quantized"] for p in plan["partitions"])
    assert "quantized: outputs dequantized with scale" in out
    assert "proof: ran and matched eager" in out
