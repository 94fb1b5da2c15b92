"""Running CUDA delegates' compiled .so: the manifest format pinned on CPU, execution on a GPU.

The CPU tests drive ExecuTorch 1.5.1's own writer (backends/cuda/cuda_weight_collector.py)
and read what it writes, so a change in ExecuTorch's private manifest format fails here with
a message that says so. The GPU tests compose with the real CUDA backend and run the .so.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from pathlib import Path

import pytest
import torch
from executorch.backends.cuda import cuda_weight_collector as writer
from executorch.exir._serialize._cord import Cord
from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import PreprocessResult

import composer
from composer.contract.errors import ComposerError
from composer.measure import hosted_trace
from composer.models import zoo
from composer.plugins.cuda import manifest as cuda_manifest
from composer.plugins.cuda import runtime as cuda_runtime
from composer.plugins.cuda.manifest import ManifestFormatError, parse_manifest
from composer.run import named_data, piecewise, runtime, torch_free_runtime
from composer.run.compare import compare, flatten_tensors
from composer.run.runtime import LoadedProgram

FIXTURE = Path(__file__).parent / "data" / "aoti"
needs_gpu = pytest.mark.skipif(
    cuda_runtime.host_unavailable_reason() is not None,
    reason=f"needs a CUDA GPU: {cuda_runtime.host_unavailable_reason()}",
)


def _weights() -> dict[str, torch.Tensor]:
    base = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    return {
        "layer.weight": torch.randn(4, 3),
        "layer.bias": torch.randn(4).to(torch.bfloat16),
        "view.of_a_storage": base[1:, 2:].t(),  # offset and strides of a shared storage
        "steps": torch.tensor([1, 2, 3], dtype=torch.int64),
        "_tensor_constant0": torch.tensor([True, False]),  # AOTI-local: keyed by the .so
    }


def _written_by_executorch(tmp_path, weights, device_type=writer.AOTI_DEVICE_TYPE_CPU):
    """What CudaBackend.preprocess returns for a delegate with ``weights``, built by
    ExecuTorch's own collector exactly as AotiBackend.preprocess and CudaBackend drive it."""
    collector = writer.CudaWeightCollector()
    artifact = collector.materialize(
        {fqn: (tensor, None) for fqn, tensor in weights.items()},
        str(tmp_path),
        lambda tensor: device_type,
    )
    so_data = b"\x7fELF not really a shared object"
    so_key = hashlib.sha256(so_data).hexdigest() + "_so_blob"
    store = NamedDataStore()
    store.add_named_data(so_key, so_data, 1, None)
    weights_key = hashlib.sha256(b"").hexdigest() + "_weights_blob"
    store.add_named_data(weights_key, b"", 1, "aoti_cuda_blob")
    result = PreprocessResult(
        processed_bytes=f"{so_key}\n{weights_key}".encode(),
        debug_handle_map={},
        data_store_output=store.get_named_data_store_output(),
    )
    collector.add_preprocess_result(result, artifact, "cuda")
    collector.finish()
    output = result.data_store_output
    entries = dict(output.pte_data)
    for external in output.external_data.values():
        entries.update(external)
    data = {key: bytes(Cord(output.buffers[entry.buffer_index])) for key, entry in entries.items()}
    return result.processed_bytes, data, so_key


def test_executorch_still_writes_the_manifest_version_composer_reads():
    assert writer.CUDA_WEIGHT_CACHE_MAGIC == cuda_manifest.MANIFEST_MAGIC, (
        f"ExecuTorch's CUDA manifest is now {writer.CUDA_WEIGHT_CACHE_MAGIC!r}; composer reads "
        f"{cuda_manifest.MANIFEST_MAGIC!r}. Update composer/plugins/cuda/manifest.py:parse_manifest."
    )


def test_manifest_written_by_executorch_reads_back_every_field(tmp_path):
    weights = _weights()
    manifest_bytes, data, so_key = _written_by_executorch(tmp_path, weights)
    manifest = parse_manifest(manifest_bytes)
    assert manifest.so_blob_key == so_key
    assert [entry.fqn for entry in manifest.entries] == list(weights)
    for entry in manifest.entries:
        tensor = weights[entry.fqn]
        assert entry.dtype == tensor.dtype
        assert entry.device == "cpu"
        assert (entry.sizes, entry.strides) == (tuple(tensor.shape), tensor.stride())
        assert entry.storage_offset == tensor.storage_offset()
        assert entry.storage_nbytes == tensor.untyped_storage().nbytes()
        rebuilt = cuda_runtime.weight_tensor(entry, data[entry.storage_key])
        assert torch.equal(rebuilt, tensor), entry.fqn
    keys = {entry.fqn: entry.storage_key for entry in manifest.entries}
    assert keys["layer.weight"] == "cuda_fqn_weight:cpu:layer.weight"
    assert keys["_tensor_constant0"] == f"cuda_fqn_weight:cpu:{so_key}:_tensor_constant0"
    assert cuda_manifest.missing_weights(manifest, data) == []


def test_cuda_placed_weights_are_marked_for_the_gpu(tmp_path):
    manifest_bytes, _data, _key = _written_by_executorch(
        tmp_path, {"w": torch.ones(2)}, writer.AOTI_DEVICE_TYPE_CUDA
    )
    (entry,) = parse_manifest(manifest_bytes).entries
    assert (entry.device, entry.storage_key) == ("cuda", "cuda_fqn_weight:cuda:w")


def test_missing_or_resized_weights_are_named(tmp_path):
    manifest_bytes, data, so_key = _written_by_executorch(tmp_path, _weights())
    manifest = parse_manifest(manifest_bytes)
    del data["cuda_fqn_weight:cpu:layer.bias"]
    data["cuda_fqn_weight:cpu:steps"] = data["cuda_fqn_weight:cpu:steps"][:-8]
    del data[so_key]
    assert cuda_manifest.missing_weights(manifest, data) == [
        f"{so_key}: no .so",
        "cuda_fqn_weight:cpu:layer.bias: not in the named data",
        "cuda_fqn_weight:cpu:steps: 16 bytes, manifest says 24",
    ]


@pytest.mark.parametrize(
    "change, expected, found",
    [
        (lambda b: b"ETCUDAFQN4" + b[10:], "the magic b'ETCUDAFQN3'", "b'ETCUDAFQN4"),
        (lambda b: b[:-4], "the strides of '_tensor_constant0' (8 bytes)", "only 4 bytes left"),
        (lambda b: b + b"\0", "the end of the manifest", "1 more bytes"),
        (lambda b: b"so_key\nweights_key", "the magic", "b'so_key"),  # the pre-FQN payload
    ],
    ids=["new-version", "truncated", "trailing-bytes", "old-key-list"],
)
def test_a_changed_manifest_fails_saying_the_format_changed(tmp_path, change, expected, found):
    manifest_bytes, _data, _key = _written_by_executorch(tmp_path, _weights())
    with pytest.raises(ManifestFormatError) as raised:
        parse_manifest(change(manifest_bytes))
    message = str(raised.value)
    assert "ExecuTorch's private CudaBackend manifest format changed" in message
    assert f"expected {expected}" in message and found in message
    assert isinstance(raised.value, ComposerError)


def test_unknown_dtype_code_is_a_format_change():
    entry = b"".join(
        [struct.pack("<I", 1), b"w", struct.pack("<I", 3), b"key"]
        + [struct.pack("<QiiqI", 4, 7, 1, 0, 1), struct.pack("<q", 1), struct.pack("<q", 1)]
    )
    manifest = cuda_manifest.MANIFEST_MAGIC + struct.pack("<I", 2) + b"so" + struct.pack("<I", 1)
    with pytest.raises(ManifestFormatError, match="dtype code"):
        parse_manifest(manifest + entry)  # 7 (double) is not in ExecuTorch 1.5.1's reader


def test_manifest_and_ptd_of_a_real_cuda_program():
    """What composer wrote for zoo:mlp with the real CUDA backend on a GPU (tests/data/aoti/
    README.md), read on any machine: the manifest names the weights the .ptd holds."""
    manifest = parse_manifest((FIXTURE / "mlp_cuda.manifest").read_bytes())
    data = named_data.ptd_named_data((FIXTURE / "mlp_cuda.ptd").read_bytes())
    shapes = {name: tuple(p.shape) for name, p in zoo.load("mlp")[0].named_parameters()}
    # AOTInductor kept fc3.bias (8 floats) inside the .so: not every parameter is in the .ptd.
    assert [entry.fqn for entry in manifest.entries] == [
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight"
    ]  # fmt: skip
    for entry in manifest.entries:
        assert entry.sizes == shapes[entry.fqn]
        assert (entry.device, entry.dtype) == ("cuda", torch.float32)
        assert entry.storage_key == f"cuda_fqn_weight:cuda:{entry.fqn}"
    assert set(data) == {entry.storage_key for entry in manifest.entries}
    data[manifest.so_blob_key] = b"the .so lives in the .pte"
    assert cuda_manifest.missing_weights(manifest, data) == []


def test_moving_the_reference_leaves_the_composition_alone():
    # LoweredBackendModule.__deepcopy__ shares its program's state_dict with the original.
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, ["xnnpack"], inputs)
    moved = piecewise.reference_on(composition, "meta")
    assert all(p.device.type == "meta" for p in _program_tensors(moved))
    assert all(p.device.type == "cpu" for p in _program_tensors(composition.reference))
    with torch.no_grad():
        ok, worst = compare(composition.reference(*inputs), model(*inputs))
    assert ok, worst


def _program_tensors(module):
    for child in module.modules():
        program = getattr(child, "original_module", None)
        if program is not None:
            yield from program.state_dict.values()


@pytest.mark.skipif(cuda_runtime.host_unavailable_reason() is None, reason="a GPU is here")
def test_without_a_gpu_hosting_says_why():
    reason = cuda_runtime.host_unavailable_reason()
    assert "CUDA" in reason
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, ["xnnpack"], inputs)
    with pytest.raises(ComposerError, match="cannot host the program on the GPU here"):
        piecewise.piecewise_module(composition, host="cuda")


@pytest.mark.parametrize("model_name", ["cumsum_mlp", "transformer_block"])
def test_delegates_of_backends_the_runtime_has_run_there(model_name):
    """The executor behind a CUDA program's verify and timing, on a CPU: every XNNPACK and
    OpenVINO delegate runs as a program of its own in the ExecuTorch runtime."""
    model, inputs = zoo.load(model_name)
    composition = composer.compose(model, ["xnnpack", "openvino"], inputs)
    hosted = piecewise.piecewise_module(composition)
    in_runtime = [m for m in hosted.modules() if isinstance(m, piecewise.RuntimeDelegate)]
    assert len(in_runtime) == composition.plan.delegate_calls > 1
    assert not [n for n in hosted.graph.nodes if piecewise._is_delegate_call(n)]
    with torch.no_grad():
        ok, worst = compare(flatten_tensors(hosted(*inputs)), model(*inputs))
    assert ok, f"max |hosted - eager| = {worst}"


def test_under_another_torch_a_delegate_without_a_runtime_says_why(monkeypatch):
    """Under a torch the pip runtime is not built for, and without the torch-free runtime
    (it needs Python 3.12), a delegate runs as its subgraph, and the plan says why."""
    if torch_free_runtime.backends():
        pytest.skip("the torch-free runtime is installed here")
    monkeypatch.setattr(runtime, "BUILT_FOR_TORCH", "0.0.")
    model, inputs = zoo.load("mlp")
    composition = composer.compose(model, ["xnnpack"], inputs)
    hosted = piecewise.piecewise_module(composition)
    assert hosted.meta["in_runtime"] == []
    [(_, why)] = hosted.meta["in_python"]
    assert why == (
        f"the pip runtime is built for torch 0.0.x, not {torch.__version__}, and "
        "executorch-numpy-runtime, which links no torch, is not installed (pip install it; it "
        "needs Python 3.12)"
    )
    with pytest.raises(ComposerError, match="1 delegate.s. would run as Python subgraphs"):
        piecewise.program_runner(composition, hosted=True)


def test_a_hosted_program_offers_what_a_loaded_one_does():
    """How measured placement times every candidate of a stack with CUDA in it."""
    model, inputs = zoo.load("cumsum_mlp")
    composition = composer.compose(model, ["xnnpack"], inputs)
    hosted = piecewise.program_runner(composition, hosted=True)
    loaded = piecewise.program_runner(composition, hosted=False)
    assert isinstance(hosted, piecewise.HostedProgram)
    assert isinstance(loaded, LoadedProgram)
    ok, worst = compare(hosted.run(inputs), loaded.run(inputs))
    assert ok, worst
    timed = hosted.timed_call(inputs)
    ok, worst = compare(flatten_tensors(timed()), model(*inputs))
    assert ok, worst


def test_a_hosted_trace_times_each_call_and_names_its_partition():
    """What measured placement reads for a stack with CUDA in it, where ETDump sees nothing."""
    model, inputs = zoo.load("cumsum_mlp")
    composition = composer.compose(model, ["xnnpack"], inputs)
    program = piecewise.program_runner(composition, hosted=True)
    traced = hosted_trace.trace_together({"xnnpack": program}, inputs, runs=7)["xnnpack"]
    partitions = [p.id for p in composition.plan.partitions]
    assert [(unit, where) for unit, where, _latency in traced.steps] == [
        (partitions[0], "xnnpack"), ("aten_cumsum_default", "portable"),
        (partitions[1], "xnnpack"),
    ]  # fmt: skip
    for _unit, _where, latency in traced.steps:
        assert latency.runs == 7 and latency.median_us > 0
    assert traced.execute.runs == 7
    assert traced.between_steps_us >= 0


# ---- on a GPU ------------------------------------------------------------------------------

_compositions: dict[tuple, composer.Composition] = {}


def _composed(model_name: str, stack: tuple[str, ...]):
    if (model_name, stack) not in _compositions:
        model, inputs = zoo.load(model_name)
        _compositions[model_name, stack] = composer.compose(model, list(stack), inputs)
    return _compositions[model_name, stack]


@pytest.mark.parametrize("host", ["cpu", "cuda"])
@pytest.mark.parametrize(
    "model_name, stack",
    [
        ("mlp", ("cuda",)),
        ("transformer_block", ("cuda",)),
        ("transformer_block", ("xnnpack", "cuda")),
        ("llama_block", ("xnnpack", "cuda")),
        ("cnn", ("cuda",)),  # convolutions: Triton templates only
        ("unet", ("cuda", "xnnpack")),  # transposed convolutions go to XNNPACK
    ],
    ids=lambda value: ",".join(value) if isinstance(value, tuple) else value,
)
@pytest.mark.gpu
@needs_gpu
def test_compiled_delegates_match_eager(model_name, stack, host):
    composition = _composed(model_name, stack)
    hosted = piecewise.piecewise_module(composition, host=host)
    compiled = [m for m in hosted.modules() if isinstance(m, piecewise.PluginDelegate)]
    assert len(compiled) == len(composition.plan.partitions_of("cuda")) > 0
    in_runtime = [m for m in hosted.modules() if isinstance(m, piecewise.RuntimeDelegate)]
    in_python = hosted.meta["in_python"]
    assert len(in_runtime) + len(in_python) == len(composition.plan.partitions_of("xnnpack"))
    assert all(why for _delegate, why in in_python)  # each says why
    assert not [n for n in hosted.graph.nodes if piecewise._is_delegate_call(n)]
    inputs = composition.example_inputs
    with torch.no_grad():
        expected = composition.eager(*inputs)
        actual = hosted(*[t.to(host) for t in inputs])
    assert all(t.device.type == host for t in flatten_tensors(actual))
    ok, worst = compare([t.cpu() for t in flatten_tensors(actual)], expected)
    assert ok, f"max |.so - eager| = {worst}"
    data = named_data.named_data(composition.buffer, composition.data_files)
    assert cuda_manifest.weights_check(composition.buffer, data) == [[] for _ in compiled]


@pytest.mark.gpu
@needs_gpu
def test_xnnpack_delegates_run_in_a_runtime_on_the_gpu_machine():
    """The GPU machine's torch is not the pip runtime's: there the delegates run in the
    torch-free runtime, their compiled code still, not as Python subgraphs."""
    composition = _composed("transformer_block", ("xnnpack", "cuda"))
    hosted = piecewise.piecewise_module(composition)
    assert hosted.meta["in_python"] == []
    # in_runtime lists every delegate with the runtime that ran it: the cuda plugin's too
    in_runtime = [
        (d, r) for d, r in hosted.meta["in_runtime"] if r != cuda_runtime.CudaRuntime.name
    ]
    runtimes = {name for _, name in in_runtime}
    assert len(in_runtime) == len(composition.plan.partitions_of("xnnpack")) > 0
    if runtime.torch_mismatch():
        assert runtimes == {"executorch-numpy-runtime (ExecuTorch 1.3.1)"}
    inputs = composition.example_inputs
    with torch.no_grad():
        ok, worst = compare(flatten_tensors(hosted(*inputs)), composition.eager(*inputs))
    assert ok, worst


@pytest.mark.gpu
@needs_gpu
def test_weights_come_from_the_ptd():
    """Zero every weight the manifest binds from the .ptd: the .so then computes what eager
    computes with those parameters zeroed, not what the trained model computes."""
    composition = _composed("mlp", ("cuda",))
    (manifest,) = cuda_manifest.cuda_manifests(composition.buffer)
    data = named_data.named_data(composition.buffer, composition.data_files)
    zeroed = {
        key: bytes(len(value)) if key.startswith("cuda_fqn_weight:") else value
        for key, value in data.items()
    }
    compiled = cuda_runtime.CompiledCudaDelegate(manifest, zeroed)

    def module(*inputs):
        (output,) = compiled(inputs)
        return output.cpu()

    inputs = composition.example_inputs
    eager = copy.deepcopy(composition.eager)
    with torch.no_grad():
        for name, parameter in eager.named_parameters():
            if name in {entry.fqn for entry in manifest.entries}:
                parameter.zero_()
        ok, worst = compare(module(*inputs), eager(*inputs))
        assert ok, f"max |.so with zeroed .ptd - eager with zeroed weights| = {worst}"
        assert not compare(module(*inputs), composition.eager(*inputs))[0]
    with pytest.raises(ComposerError, match="data is incomplete"):
        cuda_runtime.CompiledCudaDelegate(manifest, {})
