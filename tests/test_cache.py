"""composer's cache of composed programs, plans and lowered partitions."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import attrs
import pytest
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from plugins_for_tests import registry_with
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec, Registry
from composer.cli import main
from composer.contract.errors import ComposerError, ComposerWarning
from composer.contract.hookspecs import hookimpl
from composer.lower.cache import Store, evict, info
from composer.models import zoo
from composer.registry import discovery as registry_module
from composer.run.runtime import LoadedProgram

fingerprint = importlib.import_module("composer.lower.fingerprint")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(folder))
    return folder


def _compose(model, inputs, backends=("xnnpack",), **kwargs):
    lines: list[str] = []
    composition = composer.compose(model, list(backends), inputs, progress=lines.append, **kwargs)
    return composition, lines


def _reused(lines: list[str]) -> bool:
    return any(line.startswith("reused the composed program from the cache") for line in lines)


def test_a_second_compose_is_answered_by_the_cache_with_the_same_bytes(cache):
    model, inputs = zoo.load("mlp")
    first, first_lines = _compose(model, inputs)
    second, second_lines = _compose(model, inputs)
    uncached, _ = _compose(model, inputs, cache=False)
    assert not first.from_cache and not _reused(first_lines)
    assert second.from_cache and _reused(second_lines)
    assert second.buffer == first.buffer == uncached.buffer
    assert second.plan == first.plan
    # The cached program runs and computes what eager does.
    got = LoadedProgram(second.buffer).run(inputs)[0]
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=1e-4)
    assert second.verify().ok
    # What only lowering makes is lowered again on demand, from cached partitions.
    assert second.delegate_backend_ids() == {"XnnpackBackend"}
    assert second.program.buffer == first.buffer
    assert {"program", "module", "partition"} <= {
        k for k, (n, _) in info(cache).entries.items() if n
    }


def test_cache_false_reads_and_writes_nothing(cache):
    model, inputs = zoo.load("mlp")
    composer.compose(model, ["xnnpack"], inputs, cache=False)
    composer.plan(model, ["xnnpack"], inputs, cache=False)
    assert not cache.exists()


def test_composer_no_cache_turns_it_off(cache, monkeypatch):
    monkeypatch.setenv("COMPOSER_NO_CACHE", "1")
    model, inputs = zoo.load("mlp")
    composer.compose(model, ["xnnpack"], inputs)
    composer.plan(model, ["xnnpack"], inputs)
    assert not cache.exists()


def test_a_plan_after_a_compose_is_read_from_the_composed_program(cache):
    model, inputs = zoo.load("transformer_block")
    composition = composer.compose(model, ["xnnpack"], inputs)
    lines: list[str] = []
    planned = composer.plan(model, ["xnnpack"], inputs, progress=lines.append)
    assert lines == [f"reused the plan from the cache ({cache})"]
    assert composition.plan.proof.startswith("ran and matched eager")
    assert planned.proof == ""  # a plan runs nothing, so it claims no proof
    assert planned == attrs.evolve(composition.plan, proof="")
    assert planned == composer.plan(model, ["xnnpack"], inputs, cache=False)


def test_plans_are_cached_too(cache):
    model, inputs = zoo.load("cnn")
    first = composer.plan(model, ["xnnpack"], inputs)
    lines: list[str] = []
    second = composer.plan(model, ["xnnpack"], inputs, progress=lines.append)
    assert second == first
    assert lines == [f"reused the plan from the cache ({cache})"]


def _changed_weights():
    model, inputs = zoo.load("mlp")
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    return model, inputs, {}


def _changed_shape():
    model, _ = zoo.load("mlp")
    return model, (torch.randn(3, 16),), {}


STALE = {
    "weights": _changed_weights,
    "input shape": _changed_shape,
    "backend list": lambda: (*zoo.load("mlp"), {"backends": ("xnnpack", "tensorrt_stub")}),
    "pin": lambda: (*zoo.load("mlp"), {"never": {"xnnpack": ["aten.relu.default"]}}),
    "min size": lambda: (*zoo.load("mlp"), {"min_partition_size": {"xnnpack": 3}}),
    "placement": lambda: (*zoo.load("mlp"), {"placement": "strict"}),
}


@pytest.mark.parametrize("component", sorted(STALE))
def test_changing_any_part_of_the_key_misses(cache, component):
    model, inputs = zoo.load("mlp")
    _compose(model, inputs)
    assert _reused(_compose(model, inputs)[1])
    changed, changed_inputs, kwargs = STALE[component]()
    composition, lines = _compose(changed, changed_inputs, **kwargs)
    assert not _reused(lines) and not composition.from_cache
    got = LoadedProgram(composition.buffer).run(changed_inputs)[0]
    torch.testing.assert_close(got, changed(*changed_inputs), atol=1e-4, rtol=1e-4)


def test_changing_an_option_misses(cache):
    # Plans are keyed as programs are; cuda plans on any machine, and has options.
    model, inputs = zoo.load("mlp")
    lines: list[str] = []
    for autotune in ("OFF", "OFF", "ON"):
        options = {"cuda": {"max_autotune": autotune}}
        composer.plan(model, ["cuda"], inputs, options=options, progress=lines.append)
    assert [line for line in lines if "cache" in line] == [
        f"reused the plan from the cache ({cache})"
    ]


def test_a_new_library_version_misses(cache, monkeypatch):
    model, inputs = zoo.load("mlp")
    _compose(model, inputs)
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda d: "99.0" if d == "executorch" else real(d)
    )
    fingerprint.versions.cache_clear()
    try:
        composition, lines = _compose(model, inputs)
    finally:
        fingerprint.versions.cache_clear()
    assert not _reused(lines) and not composition.from_cache


def test_the_key_covers_all_of_composers_source():
    # Editable installs: a change to the scheduler or a plugin changes what composer writes,
    # and its version number does not say so.
    package, sources = fingerprint.composer_sources()
    names = {str(path.relative_to(package)) for path in sources}
    assert {"__init__.py", "scheduler/partitioner.py", "plugins/xnnpack/__init__.py",
            "lower/fingerprint.py"} <= names  # fmt: skip


MODEL_SOURCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return {body}
"""


def test_editing_the_model_code_misses(cache, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "edited_model.py"
    inputs = (torch.randn(2, 8),)

    def load(body):
        source.write_text(textwrap.dedent(MODEL_SOURCE.format(body=body)))
        sys.modules.pop("edited_model", None)
        torch.manual_seed(0)
        return importlib.import_module("edited_model").Model().eval()

    _compose(load("torch.relu(self.linear(x))"), inputs)
    assert _reused(_compose(load("torch.relu(self.linear(x))"), inputs)[1])
    model = load("torch.sigmoid(self.linear(x))")
    composition, lines = _compose(model, inputs)
    assert not _reused(lines)
    got = LoadedProgram(composition.buffer).run(inputs)[0]
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=1e-4)


def test_a_model_with_a_hook_is_still_cached_by_its_exported_program(cache):
    model, inputs = zoo.load("mlp")
    model.register_forward_hook(lambda module, args, output: output * 2)
    assert fingerprint.module_digest(model, inputs) is None
    _compose(model, inputs)
    composition, lines = _compose(model, inputs)
    assert _reused(lines)
    got = LoadedProgram(composition.buffer).run(inputs)[0]
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=1e-4)


def test_changing_one_layer_relowers_only_its_partitions(cache):
    model, inputs = zoo.load("llama_decoder")
    _compose(model, inputs)
    with torch.no_grad():
        model.layers[1].w2.weight.mul_(1.5)
    composition, lines = _compose(model, inputs)
    reused = [line for line in lines if "lowered partition(s) reused" in line]
    assert len(reused) == 1, lines
    count, total = (int(word) for word in reused[0].split(":")[1].split()[:3:2])
    # Layer 1's MLP (w1, w3, silu, w2 and the residual) is one partition; the rest is reused.
    assert 0 < count < total and total - count == 1, reused
    got = LoadedProgram(composition.buffer).run(inputs)[0]
    torch.testing.assert_close(got, model(*inputs), atol=1e-4, rtol=1e-4)


def test_a_damaged_entry_is_dropped_with_a_warning_and_lowered_again(cache):
    model, inputs = zoo.load("mlp")
    first, _ = _compose(model, inputs)
    for entry in cache.glob("*/*.entry"):
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF
        entry.write_bytes(bytes(data))
    with pytest.warns(ComposerWarning, match="dropped a damaged (module|program) cache entry"):
        second, lines = _compose(model, inputs)
    assert not _reused(lines)
    assert second.buffer == first.buffer
    with warnings.catch_warnings():
        warnings.simplefilter("error", ComposerWarning)
        assert _compose(model, inputs)[0].from_cache  # written again, whole


def test_least_recently_used_entries_go_first(tmp_path):
    store = Store(tmp_path, "program", max_bytes=10_000)
    for index in range(5):
        store.put(f"k{index}", bytes(3000))
    # A read counts as a use: k0 is now the most recent.
    assert store.get("k0") is not None
    import time

    for offset, key in enumerate(["k1", "k2", "k3", "k4", "k0"]):
        path = tmp_path / "program" / f"{key}.entry"
        os.utime(path, (time.time() - 100 + offset, time.time() - 100 + offset))
    assert store.evict() == 2
    assert [k for k in ("k0", "k1", "k2", "k3", "k4") if store.get(k) is not None] == [
        "k0",
        "k3",
        "k4",
    ]
    assert evict(tmp_path, 0) == 3


def test_the_size_bound_is_read_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPOSER_CACHE_SIZE", "1K")
    assert Store(tmp_path, "program").max_bytes == 1024
    monkeypatch.setenv("COMPOSER_CACHE_SIZE", "lots")
    with pytest.raises(ComposerError, match=r"COMPOSER_CACHE_SIZE='lots' is not a size.*2G"):
        Store(tmp_path, "program")


WRITER = """
import sys, composer
from composer.models import zoo
model, inputs = zoo.load("mlp")
composition = composer.compose(model, ["xnnpack"], inputs)
sys.stdout.write(composition.buffer.hex()[:64])
"""


def test_concurrent_writers_leave_whole_entries(cache):
    env = {**os.environ, "COMPOSER_CACHE_DIR": str(cache)}
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER], env=env, stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    outputs = [writer.communicate(timeout=600)[0] for writer in writers]
    assert all(writer.returncode == 0 for writer in writers)
    assert len(set(outputs)) == 1
    entries = list(cache.glob("*/*.entry"))
    assert entries and not list(cache.glob("*/.tmp-*"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ComposerWarning)
        for entry in entries:
            assert Store(cache, entry.parent.name).get(entry.stem) is not None


def test_cli_no_cache_and_cache_info(cache, tmp_path, capsys):
    target = tmp_path / "mlp.pte"
    args = ["lower", "zoo:mlp", "--backends", "xnnpack", "-o", str(target)]
    assert main([*args, "--no-cache"]) == 0
    assert not cache.exists()
    assert main(args) == 0
    first = target.read_bytes()
    capsys.readouterr()
    assert main(args) == 0
    assert "reused the composed program from the cache" in capsys.readouterr().err
    assert target.read_bytes() == first
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "program: 1 entry" in out and "module: 1 entry" in out and "partition: 1 entry" in out
    assert main(["cache", "clear"]) == 0
    assert main(["cache", "info"]) == 0
    assert "program: 0 entries" in capsys.readouterr().out


def test_partitions_lowered_in_parallel_are_the_same_bytes(cache):
    model, inputs = zoo.load("transformer_block")
    serial, _ = _compose(model, inputs, cache=False, jobs=1)
    parallel, _ = _compose(model, inputs, cache=False, jobs=2)
    assert len(serial.plan.partitions) > 1
    assert parallel.buffer == serial.buffer
    with pytest.raises(ComposerError, match="jobs must be a whole number >= 1, or None, not 0"):
        composer.compose(model, ["xnnpack"], inputs, jobs=0)


class UnrepeatableBackend(BackendDetails):
    """Lowers to different bytes every time, as AOTInductor's autotuning can."""

    @staticmethod
    def preprocess(edge_program, compile_specs):
        return PreprocessResult(processed_bytes=os.urandom(16))


class TakesRelu(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        return node.op == "call_function" and "relu" in str(node.target)


class UnrepeatablePlugin:
    spec = BackendSpec("unrepeatable", "UnrepeatableBackend")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return TakesRelu()


def test_a_cached_program_whose_partitions_left_the_cache_is_not_silently_swapped(
    cache, monkeypatch
):
    monkeypatch.setattr(registry_module, "_default", registry_with(UnrepeatablePlugin()))
    model, inputs = zoo.load("mlp")
    first, _ = _compose(model, inputs, backends=["unrepeatable"])
    second, _ = _compose(model, inputs, backends=["unrepeatable"])
    assert second.from_cache and second.buffer == first.buffer
    assert second.edge is not None  # its partitions are cached: lowered again, same bytes
    shutil.rmtree(cache / "partition")
    third, _ = _compose(model, inputs, backends=["unrepeatable"])
    assert third.from_cache
    with pytest.raises(ComposerError, match="lowering it again for its edge program made "
                       "different bytes.*cache=False"):  # fmt: skip
        third.edge  # noqa: B018


def test_a_program_whose_partitions_could_not_be_stored_is_not_stored(cache, monkeypatch):
    class Unpicklable:  # a local class: pickle cannot name it
        pass

    def preprocess(edge_program, compile_specs):
        return PreprocessResult(os.urandom(16), _delegate_info_meta=Unpicklable())

    monkeypatch.setattr(UnrepeatableBackend, "preprocess", staticmethod(preprocess))
    monkeypatch.setattr(registry_module, "_default", registry_with(UnrepeatablePlugin()))
    model, inputs = zoo.load("mlp")
    _compose(model, inputs, backends=["unrepeatable"])
    assert not list(cache.glob("partition/*.entry"))
    assert not _compose(model, inputs, backends=["unrepeatable"])[0].from_cache


def test_another_compiler_library_version_lowers_the_partitions_again(cache, monkeypatch):
    registry = Registry.from_entry_points()
    model, inputs = zoo.load("mlp")
    _compose(model, inputs, registry=registry)
    reused = "xnnpack: 1 of 1 lowered partition(s) reused from the cache"
    assert reused in _compose(model, inputs, registry=registry)[1]
    backend = registry.backends["xnnpack"]
    upgraded = attrs.evolve(backend, spec=attrs.evolve(backend.spec, library="xnnpack 99"))
    monkeypatch.setitem(registry._backends, "xnnpack", upgraded)
    assert reused not in _compose(model, inputs, registry=registry)[1]


def test_a_result_from_the_cache_repeats_composers_warnings(cache):
    model, inputs = zoo.load("mlp")
    pin = {"never": {"xnnpack": ["aten.relu"]}}
    for _ in range(2):
        with pytest.warns(ComposerWarning, match="names no op; did you mean aten.relu.default"):
            composition, _ = _compose(model, inputs, **pin)
        with pytest.warns(ComposerWarning, match="names no op; did you mean aten.relu.default"):
            composer.plan(model, ["xnnpack"], inputs, **pin)
    assert composition.from_cache


def test_a_cached_program_lowers_again_the_same_under_no_grad(cache):
    # verify runs under no_grad, and torch.export's graph of a model with a KV cache
    # differs there: the lowering behind a cached program must be made as the first was.
    model, inputs = zoo.load("llama_decoder")
    _compose(model, inputs)
    composition, _ = _compose(model, inputs)
    assert composition.from_cache
    with torch.no_grad():
        assert composition.edge is not None
    assert composition.verify().ok


class _TakesAnActivation(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, hidden):
        return torch.relu(self.linear(hidden))


def test_a_program_exported_with_an_activation_as_its_example_comes_from_the_cache(cache):
    # optimum exports Whisper's decoder with the encoder's output, computed with grad, as its
    # example input; a second compose from the cache deep-copied the program and escaped with
    # torch's "Only Tensors created explicitly by the user (graph leaves) support the deepcopy
    # protocol".
    hidden = torch.nn.Linear(8, 8)(torch.randn(2, 8))  # not a leaf: it has a grad_fn
    program = torch.export.export(_TakesAnActivation().eval(), (hidden,))
    first, _ = _compose(program, None)
    again, lines = _compose(program, None)
    assert _reused(lines) and again.buffer == first.buffer
    assert again.verify().ok
