"""What a user sees of the installed backends: ``composer backends`` (a line a backend, fitted to
100 columns in a pipe; ``NAME`` for why not; ``--json``), ``composer.available_backends()``,
``composer.provable_backends()`` and ``composer.__version__``."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
import torch

import composer
from composer.cli import main
from composer.registry.discovery import Registry

IN_TREE = (
    "coreml", "cuda", "ethosu", "metal", "mlx", "mps", "openvino", "qnn", "tensorrt_stub", "vgf",
    "vulkan", "webgpu", "xnnpack",
)  # fmt: skip
VERSION = version("executorch-composer")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_is_the_installed_distributions():
    assert composer.__version__ == version("executorch-composer")
    from composer import __version__

    assert __version__ == composer.__version__


def test_version_of_a_source_tree_never_installed(monkeypatch):
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert composer._version() == "0+unknown"


@pytest.mark.parametrize("columns", [None, "100"])
def test_backends_is_a_line_a_backend_within_100_columns_in_a_pipe(capsys, monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: capsys's stdout is no terminal
    else:
        monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = run(capsys, "backends")
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, out
    assert lines[0].split() == ["backend", "lowers", "here", "proves", "here", "what", "it", "is"]
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.split()[0] in IN_TREE}
    assert list(rows) == list(IN_TREE), "each once, in the registry's order"
    assert rows["xnnpack"] == ["xnnpack", "yes", "yes", "XNNPACK:", "optimized", "CPU", "kernels",
                               "for", "Arm", "and", "x86"]  # fmt: skip
    # A stand-in lowers anywhere but runs nowhere: never proven here.
    assert rows["tensorrt_stub"][1:3] == ["yes", "no"]
    assert rows["mps"][1:3] == ["no", "no"]
    assert "composer backends NAME: why a backend does not lower or run here" in out


def test_backends_name_says_why_not_and_its_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run(capsys, "backends", "tensorrt_stub", "xnnpack")
    assert code == 0
    assert out.splitlines()[:4] == [
        "tensorrt_stub  a stand-in for TensorRT's ops, whose delegates run nowhere",
        f"  ExecuTorch backend TensorRTStubBackend on cuda, from executorch-composer {VERSION}",
        "  lowers here: yes",
        "  runs here: no, no runtime here has TensorRTStubBackend",
    ]
    assert "  runs here: yes, in the ExecuTorch runtime" in out.splitlines()
    assert "no options: tensorrt_stub, xnnpack" in out


def test_backends_json_is_a_list_of_objects(capsys):
    code, out, _ = run(capsys, "backends", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [each["name"] for each in listed if each["name"] in IN_TREE] == list(IN_TREE)
    by_name = {each["name"]: each for each in listed}
    assert by_name["xnnpack"] == {
        "name": "xnnpack",
        "description": "XNNPACK: optimized CPU kernels for Arm and x86",
        "backend_id": "XnnpackBackend",
        "device": "cpu",
        "distribution": "executorch-composer",
        "version": version("executorch-composer"),
        "lowers_here": True,
        "why_not_lower": None,
        "runs_here": True,
        "runs_in": "the ExecuTorch runtime",
        "why_not_run": None,
        "proves_here": True,
        "options": [],
        "options_error": None,
    }
    stub = by_name["tensorrt_stub"]
    assert (stub["lowers_here"], stub["runs_here"], stub["proves_here"]) == (True, False, False)
    assert stub["why_not_run"] == "no runtime here has TensorRTStubBackend"
    assert by_name["mps"]["lowers_here"] is False and by_name["mps"]["why_not_lower"]
    autotune = next(o for o in by_name["cuda"]["options"] if o["name"] == "max_autotune")
    assert autotune["choices"] == ["ON", "OFF"]
    # One backend, as a list still.
    code, out, _ = run(capsys, "backends", "--json", "openvino")
    assert [each["name"] for each in json.loads(out)] == ["openvino"]


def test_available_backends_are_those_that_lower_here_in_registry_order(capsys):
    available = composer.available_backends()
    assert {"xnnpack", "tensorrt_stub", "openvino"} <= set(available)
    assert "mps" not in available  # ExecuTorch's wheel has no MPS backend
    if not torch.cuda.is_available():
        assert "cuda" not in available
    assert available == [name for name in IN_TREE if name in available]
    provable = composer.provable_backends()
    assert "xnnpack" in provable and "tensorrt_stub" not in provable
    assert set(provable) <= set(available)
    # What `composer backends` says, the same.
    _, out, _ = run(capsys, "backends", "--json")
    listed = json.loads(out)
    assert available == [each["name"] for each in listed if each["lowers_here"]]
    assert provable == [each["name"] for each in listed if each["proves_here"]]


def test_registry_order_is_not_the_order_a_stack_loaded_plugins_in():
    registry = Registry.from_entry_points()
    registry.resolve("xnnpack")  # loads xnnpack's plugin alone, first
    names = [backend.name for backend in registry.in_order()]
    assert [name for name in names if name in IN_TREE] == list(IN_TREE)
    assert composer.available_backends(registry)[-1] == "xnnpack"
