"""``composer lower --beside-plain``: plain ExecuTorch's list of the same backends, run at the
sizes composer's program was proven at and judged by the same rule (the demo's first
screen shows what composer gives that the list does not)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import composer
from composer.models import zoo
from composer.pipeline.plain import beside_plain
from composer.registry.discovery import default_registry
from composer.registry.resolved import resolve_stack
from composer.registry.stack import Stack

DEMO = "composer.models.demo:speech_frontend"


def _openvino_here() -> bool:
    registry = default_registry()
    return registry.unavailable_reason(registry.backends["openvino"]) is None


@pytest.mark.skipif(not _openvino_here(), reason="OpenVINO does not lower here")
def test_the_demo_shows_plain_wrong_where_composer_is_proven(tmp_path):
    """OpenVINO's runtime binds a delegate's outputs at the largest length and never resizes
    them: plain's program answers 128 frames for 50, at every length but the largest, and
    composer plans the convolutions onto XNNPACK (before 3909ad4 it found them wrong and
    repaired). Run twice: the second is a cache hit, which imports no compiler of its own, and
    plain's import of OpenVINO's module (pytorch_tokenizers logs as it loads) stays quiet too."""
    command = [sys.executable, "-m", "composer.cli", "lower", DEMO, "--dynamic", "0:2=2..128",
               "--backends", "openvino,xnnpack", "-o", str(tmp_path / "demo.pte"),
               "--beside-plain", "--quiet"]  # fmt: skip
    environment = {**os.environ, "COMPOSER_CACHE_DIR": str(tmp_path / "cache")}
    for run in ("composed", "cache hit"):
        out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                             env=environment)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert "proof: ran and matched eager at 4 sizes" in out.stdout, run
        assert not any(line.startswith("moved:") for line in out.stdout.splitlines()), run
        plain = out.stdout.strip().splitlines()[-1]
        assert plain.startswith(
            "plain ExecuTorch, [OpenvinoPartitioner, XnnpackPartitioner]: WRONG at 3 of 4 sizes "
            "(at example: max |plain - eager| = inf; output shape [1, 8, 128] against eager's "
            "[1, 8, 50])"
        ), (run, plain)
        # Nothing upstream logs while composer reads the suite's partitioners.
        printed = out.stdout + out.stderr
        assert "Skipping" not in printed and "coremltools" not in printed, run
        assert "Registering override fallback regex" not in printed, run


def test_where_plain_is_right_it_says_so():
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, "xnnpack", inputs, cache=False)
    program = torch.export.export(model, inputs)
    outcome = beside_plain(
        composition, program, resolve_stack(Stack.of("xnnpack"), must_lower_here=False)
    )
    assert outcome.describe() == "plain ExecuTorch, [XnnpackPartitioner]: right at the example too"


@pytest.mark.skipif(not _openvino_here(), reason="OpenVINO does not lower here")
def test_where_plain_fails_it_says_how_and_keeps_upstream_prints_off_the_terminal(capsys):
    """A dynamic sequence length: OpenVINO's partitioner fails on the SymInt of a size
    (plain writes nothing), where composer's program is proven at every length."""
    model, inputs = zoo.load("transformer_block")
    seq = torch.export.Dim("seq", min=2, max=16)
    program = torch.export.export(model, inputs, dynamic_shapes=({1: seq},))
    composition = composer.compose(program, "openvino,xnnpack", cache=False)
    assert "at 4 sizes" in composition.plan.proof
    capsys.readouterr()
    stack = resolve_stack(Stack.of("openvino,xnnpack"), must_lower_here=False)
    outcome = beside_plain(composition, program, stack)
    assert outcome.describe() == (
        "plain ExecuTorch, [OpenvinoPartitioner, XnnpackPartitioner]: failed, nothing written: "
        "AttributeError: 'SymInt' object has no attribute 'type'"
    )
    assert "Op not supported" not in capsys.readouterr().out
