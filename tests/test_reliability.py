"""Reliability: files are written whole or not at all, output is reproducible, fuzzing finds
no invalid partition, no mismatch and no crash other than a ComposerError."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from plugins_for_tests import GreedyPlugin, registry_with

import composer
from composer import atomic, zoo
from composer.cli import main
from composer.strategies import models, stacks
from composer.testing import check_convex


def test_interrupt_while_saving_leaves_no_file(tmp_path, monkeypatch):
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, ["xnnpack"], inputs)
    real = atomic._write_temporary
    calls = []

    def interrupted(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(atomic, "_write_temporary", interrupted)
    with pytest.raises(KeyboardInterrupt):
        composition.save(tmp_path / "m.pte", extra={tmp_path / "m.json": b"{}"})
    assert list(tmp_path.iterdir()) == []


def test_output_in_a_file_instead_of_a_directory_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "afile").write_text("x")
    code = main(
        ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", str(tmp_path / "afile" / "m.pte")]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_is_a_clear_error(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code = main(["lower", "zoo:mlp", "--backends", "xnnpack", "-o", str(locked / "m.pte")])
    finally:
        locked.chmod(0o755)
    assert code == 2
    assert "cannot write" in capsys.readouterr().err
    assert list(locked.iterdir()) == []


REPRODUCE = """
import hashlib, warnings
warnings.filterwarnings("ignore")
import composer
from composer import zoo
model, inputs = zoo.load("llama_block")
composition = composer.compose(model, ["tensorrt_stub", "xnnpack"], inputs)
print(hashlib.sha256(composition.buffer).hexdigest())
print(hashlib.sha256(composition.plan.to_json().encode()).hexdigest())
"""


def test_same_model_and_stack_give_identical_bytes_across_processes():
    digests = [
        subprocess.run(
            [sys.executable, "-c", REPRODUCE], capture_output=True, text=True, check=True
        ).stdout.split()[-2:]
        for _ in range(2)
    ]
    assert digests[0] == digests[1]
    model, inputs = zoo.load("llama_block")
    here = composer.compose(model, ["tensorrt_stub", "xnnpack"], inputs)
    assert hashlib.sha256(here.buffer).hexdigest() == digests[0][0]


FUZZ_BACKENDS = ["tensorrt_stub", "xnnpack", "greedy"]
FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
LONG_FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))


def fuzz_one(model, stack):
    registry = registry_with(GreedyPlugin())
    try:
        composition = composer.compose(model, stack, model.example_inputs, registry=registry)
    except composer.ComposerError:
        return  # a clear error is an allowed outcome; anything else fails the test
    check_convex(composition.plan)
    result = composition.verify()
    assert result.ok, (model, stack, result)


@FUZZ
@given(model=models(max_steps=10), stack=stacks(FUZZ_BACKENDS))
def test_fuzz_random_graphs_and_stacks_with_a_third_party_plugin(model, stack):
    fuzz_one(model, stack)


@pytest.mark.slow
@LONG_FUZZ
@given(model=models(max_steps=25), stack=stacks(FUZZ_BACKENDS))
def test_fuzz_long(model, stack):
    fuzz_one(model, stack)
