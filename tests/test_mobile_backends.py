"""The vendor backends of ExecuTorch's wheel as composer plugins.

Each plugin registers through the ``composer`` entry points like a third-party one. Where a
backend lowers on this machine (Vulkan: its serialization is Python; Core ML: coremltools
converts on Linux) the program is composed for real, each delegate's payload is checked to be
in the backend's own format, and the program is verified against eager; the pip ExecuTorch
runtime has neither backend, so verification runs the Python reference and says so. Backends
that need a vendor SDK (QNN) plan with a stand-in. The stacks users ship are pinned by golden
plans (``pytest tests/test_mobile_backends.py --composer-update-golden`` rewrites them).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary

import composer
from composer.measure.etdump import delegate_backend_ids
from composer.models import zoo
from composer.registry.discovery import default_registry
from composer.report.plan_text import summary_table
from composer.run.verification import REFERENCE

HAS_COREMLTOOLS = importlib.util.find_spec("coremltools") is not None
needs_coremltools = pytest.mark.skipif(
    not HAS_COREMLTOOLS, reason="coremltools is not installed (pip install '.[coreml]')"
)
HAS_TOSA = importlib.util.find_spec("tosa_serializer") is not None
needs_tosa = pytest.mark.skipif(
    not HAS_TOSA, reason="tosa-tools is not installed (pip install '.[ethosu]', numpy<2.2)"
)

_composed: dict[tuple, composer.Composition] = {}


def composed(model_name: str, stack: tuple[str, ...], **settings) -> composer.Composition:
    """One composition per model, stack and settings for the whole module."""
    key = (model_name, stack, tuple(sorted((k, repr(v)) for k, v in settings.items())))
    if key not in _composed:
        model, inputs = zoo.load(model_name)
        _composed[key] = composer.compose(model, list(stack), inputs, **settings)
    return _composed[key]


def delegates(buffer: bytes, backend_id: str):
    """(compile specs as a dict, payload bytes) of each ``backend_id`` delegate of forward."""
    program = deserialize_pte_binary(buffer).program
    plan = program.execution_plan[0]
    return [
        (
            {spec.key: bytes(spec.value) for spec in delegate.compile_specs},
            bytes(program.backend_delegate_data[delegate.processed.index].data),
        )
        for delegate in plan.delegates
        if delegate.id == backend_id
    ]


def assert_verified_by_reference(composition: composer.Composition, backend_id: str) -> None:
    verification = composition.verify()
    assert verification.ok, str(verification)
    # The pip runtime has no such backend: the Python reference ran, and says why.
    assert verification.executor == REFERENCE
    assert f"no {backend_id}" in verification.reason
    assert f"no {backend_id}" in composition.plan.proof


def test_every_backend_of_the_wheel_registers_through_an_entry_point():
    backends = default_registry().backends
    for name in ("vulkan", "coreml", "qnn", "webgpu", "ethosu", "vgf", "mps", "mlx"):
        assert backends[name].origin.distribution == "executorch-composer"
        assert backends[name].origin.name == name
        assert backends[name].spec.name == name


# --- Vulkan ---------------------------------------------------------------------------


def test_vulkan_lowers_here():
    assert default_registry().unavailable_reason(default_registry().backends["vulkan"]) is None


# CI time: the default suite lowers mlp; the slow suite adds the convolutional ones.
@pytest.mark.parametrize(
    "model_name", ["mlp", *(pytest.param(m, marks=pytest.mark.slow) for m in ("cnn", "mobilenet"))]
)
def test_vulkan_then_xnnpack_writes_vulkan_flatbuffers_and_matches_eager(model_name):
    from composer.plugins.vulkan import describe_payload

    composition = composed(model_name, ("vulkan", "xnnpack"))
    ids = delegate_backend_ids(composition.buffer)
    assert "VulkanBackend" in ids
    assert set(ids) <= {"VulkanBackend", "XnnpackBackend"}
    assert len(ids) == composition.plan.delegate_calls
    for _specs, payload in delegates(composition.buffer, "VulkanBackend"):
        assert payload[4:8] == b"VH00"
        description = describe_payload(payload)  # raises unless VK00 of Vulkan's schema
        assert not description.startswith("Vulkan graph: 0 op(s)")
    assert_verified_by_reference(composition, "VulkanBackend")


def test_vulkan_declines_with_its_own_reason_and_xnnpack_takes_the_rest():
    # The small CNN's convolutions are ones Vulkan's checker rejects ("op args not supported"):
    # XNNPACK, next in the stack, takes them.
    composition = composed("cnn", ("vulkan", "xnnpack"))
    plan = composition.plan
    assert plan.ops_on("xnnpack")["aten.convolution.default"] == 2
    assert plan.ops_on("vulkan")["aten.relu.default"] == 2
    assert plan.ops_on("portable") == {}


def test_a_payload_of_another_format_is_not_taken_for_vulkans():
    from composer.plugins.vulkan import describe_payload

    (_specs, payload), *_ = delegates(
        composed("mlp", ("vulkan", "xnnpack")).buffer, "VulkanBackend"
    )
    with pytest.raises(ValueError):
        describe_payload(payload[:4] + b"XXXX" + payload[8:])
    with pytest.raises(ValueError):
        describe_payload(payload[:64])


def test_vulkan_options_reach_its_compile_specs():
    composition = composed(
        "mlp",
        ("vulkan",),
        options={"vulkan": {"force_fp16": "on", "storage_type_override": "buffer"}},
    )
    (specs, _payload), *_ = delegates(composition.buffer, "VulkanBackend")
    assert specs["force_fp16"] == b"\x01"
    assert specs["storage_type_override"] == (0).to_bytes(4, "little")  # VkStorageType.BUFFER


def test_vulkan_leaves_bool_ops_to_others_as_its_runtime_lacks_them():
    # ExecuTorch's Vulkan runtime has no logical_not kernel: a program whose Vulkan delegate
    # holds one dies at load ("Missing operator: aten.logical_not.default", H200).
    # composer builds the partitioner as ExecuTorch's Vulkan tester does, skip_bool_tensors ON.
    model, inputs = zoo.load("llama_block")
    plan = composer.plan(model, ["vulkan", "xnnpack"], inputs)
    assert "aten.logical_not.default" not in plan.ops_on("vulkan")
    assert "contains bool tensor" in dict(plan.explain("aten_logical_not_default"))["vulkan"]
    offered = composer.plan(
        model, ["vulkan", "xnnpack"], inputs, options={"vulkan": {"skip_bool_tensors": "OFF"}}
    )
    assert offered.ops_on("vulkan")["aten.logical_not.default"] == 2


def test_an_unknown_vulkan_option_is_refused_before_any_work():
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match="unknown option 'fp16' for backend 'vulkan'"):
        composer.plan(model, ["vulkan"], inputs, options={"vulkan": {"fp16": "ON"}})


def test_importing_vulkans_partitioner_leaves_the_root_logger_alone():
    # ExecuTorch's Vulkan partitioner sets the root logger to INFO when imported; after that
    # every library's INFO lines would print. A fresh process, as the import happens once.
    code = (
        "import logging; from composer.models import zoo; import composer\n"
        "model, inputs = zoo.load('mlp')\n"
        "composer.plan(model, ['vulkan'], inputs, cache=False)\n"
        "print(logging.getLogger().level)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split()[-1] == str(logging.WARNING)


@pytest.mark.slow  # CI time (about a minute): the default suite lowers mlp and cnn with Vulkan
def test_vulkan_lowers_the_transformer_block():
    composition = composed("transformer_block", ("vulkan", "xnnpack"), placement="strict")
    assert "VulkanBackend" in delegate_backend_ids(composition.buffer)


# --- Core ML ----------------------------------------------------------------------------


@needs_coremltools
@pytest.mark.parametrize("model_name", ["mlp", "cnn", "mobilenet"])
def test_coreml_then_xnnpack_writes_ml_program_packages_and_matches_eager(model_name):
    from composer.plugins.coreml import describe_payload

    composition = composed(model_name, ("coreml", "xnnpack"))
    ids = delegate_backend_ids(composition.buffer)
    assert "CoreMLBackend" in ids
    assert set(ids) <= {"CoreMLBackend", "XnnpackBackend"}
    for _specs, payload in delegates(composition.buffer, "CoreMLBackend"):
        # ExecuTorch's flattened folder: metadata.json beside model.mlpackage, an ML program.
        assert describe_payload(payload).startswith("Core ML model package (ML program")
    assert_verified_by_reference(composition, "CoreMLBackend")


@needs_coremltools
def test_composer_lower_with_coreml_draws_no_conversion_progress_bars(tmp_path):
    # coremltools draws a tqdm bar per conversion pass: 8 lines of a 5-op MLP on stderr.
    out = tmp_path / "mlp.pte"
    run = subprocess.run(
        [sys.executable, "-m", "composer.cli", "lower", "zoo:mlp", "--backends", "coreml,xnnpack",
         "-o", str(out)],
        check=False, capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "COMPOSER_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert out.exists()
    assert "coreml:0  5 op(s)" in run.stderr
    assert "Running MIL" not in run.stderr
    assert "Converting PyTorch Frontend" not in run.stderr


@needs_coremltools
def test_coreml_states_its_float16_tolerance_and_coremltools_version():
    from importlib.metadata import version

    plan = composed("mlp", ("coreml", "xnnpack")).plan
    assert plan.tolerances["coreml"].atol == pytest.approx(1e-2)
    assert "float16" in plan.tolerances["coreml"].reason
    assert plan.libraries == {"coreml": f"coremltools {version('coremltools')}"}


@needs_coremltools
def test_a_payload_of_another_format_is_not_taken_for_a_core_ml_package():
    from composer.plugins.coreml import describe_payload

    with pytest.raises((ValueError, RuntimeError)):
        describe_payload(b"not a flattened Core ML folder" * 8)


@needs_coremltools
@pytest.mark.parametrize(
    ("model_name", "op", "why"),
    [
        # F.max_pool2d(x, 2) leaves the stride to its default; coremltools' converter needs it.
        ("unet", "aten.max_pool2d", "needs the stride argument"),
        # A KV cache written at input_pos (k_cache[:, :, input_pos] = k): four positions.
        ("llama_decoder", "aten.index_put", "single-element indices"),
    ],
)
def test_coreml_leaves_calls_coremltools_fails_to_convert_to_the_next_backend(model_name, op, why):
    composition = composed(model_name, ("coreml", "xnnpack"))
    plan = composition.plan
    # op: the name's start (max_pool2d stays whole when XNNPACK, next, asks for it)
    assert not [name for name in plan.ops_on("coreml") if name.startswith(op)]
    assert plan.ops_on("coreml"), "Core ML still takes the rest"
    # Predicted, not found by a failed lowering: nothing had to move.
    assert plan.repairs == ()
    nodes = [node for node, node_op in plan.node_ops.items() if node_op.startswith(op)]
    assert nodes
    for node in nodes:
        assert why in dict(plan.explain(node))["coreml"]
    assert_verified_by_reference(composition, "CoreMLBackend")


@needs_coremltools
def test_coreml_options_reach_its_compile_specs_and_the_model():
    from composer.plugins.coreml import describe_payload

    options = {
        "compute_units": "cpu_only",
        "minimum_deployment_target": "iOS17",
        "compute_precision": "FLOAT32",
    }
    composition = composed("mlp", ("coreml",), options={"coreml": options})
    (specs, payload), *_ = delegates(composition.buffer, "CoreMLBackend")
    assert specs["compute_units"] == b"cpu_only"
    assert specs["min_deployment_target"] == b"8"  # ct.target.iOS17
    assert specs["model_compute_precision"] == b"float32"
    assert "specification 8" in describe_payload(payload)


@needs_coremltools
@pytest.mark.skipif(sys.platform == "darwin", reason="macOS compiles Core ML models")
def test_a_compiled_core_ml_model_is_refused_off_macos_with_what_to_use():
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match="COMPILED_MODEL .* needs macOS.*use MODEL"):
        composer.compose(
            model, ["coreml"], inputs, options={"coreml": {"model_type": "compiled_model"}}
        )


# --- WebGPU (Vulkan's serialization, the ops WebGPU's runtime implements) ---------------


@pytest.mark.slow  # CI time (80 s); the test below plans WebGPU in the default suite
def test_webgpu_then_xnnpack_writes_vulkan_flatbuffers_of_webgpu_ops_only():
    from executorch.backends.webgpu.test.tester import WEBGPU_SUPPORTED_OPS

    from composer.plugins.webgpu import describe_payload

    composition = composed("mobilenet", ("webgpu", "xnnpack"))
    plan = composition.plan
    implemented = {str(op._op) for op in WEBGPU_SUPPORTED_OPS}
    assert plan.ops_on("webgpu")["aten.convolution.default"] == 5
    assert set(plan.ops_on("webgpu")) <= implemented
    # Batch norm is not among them (it is on Vulkan's list): XNNPACK takes it.
    assert plan.ops_on("xnnpack")["aten._native_batch_norm_legit_no_training.default"] == 5
    ids = delegate_backend_ids(composition.buffer)
    assert set(ids) == {"VulkanBackend", "XnnpackBackend"}
    for specs, payload in delegates(composition.buffer, "VulkanBackend"):
        assert specs["skip_bool_tensors"] == b"\x01"
        describe_payload(payload)
    assert_verified_by_reference(composition, "VulkanBackend")


def test_webgpu_leaves_what_its_runtime_lacks_with_the_reason():
    model, inputs = zoo.load("mlp")
    plan = composer.plan(model, ["webgpu", "xnnpack"], inputs)
    assert plan.ops_on("webgpu") == {}  # no linear or relu kernel in WebGPU's runtime
    assert dict(plan.explain("aten_relu_default"))["webgpu"] == "op is not in allowlist"


# --- QNN (plan only: lowering needs Qualcomm's SDK) -------------------------------------


@pytest.fixture
def without_qnn_sdk(monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)


def test_qnn_says_what_would_let_it_lower(without_qnn_sdk, tmp_path, monkeypatch):
    registry = default_registry()
    reason = registry.unavailable_reason(registry.backends["qnn"])
    assert "QNN SDK" in reason and "QNN_SDK_ROOT" in reason
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    assert "has no lib/x86_64-linux-clang" in registry.unavailable_reason(registry.backends["qnn"])


def test_qnn_then_xnnpack_plans_with_a_stand_in(without_qnn_sdk):
    model, inputs = zoo.load("mobilenet")
    plan = composer.plan(model, ["qnn", "xnnpack"], inputs)
    assert plan.stand_ins == ("qnn",)
    assert "qnn (stand-in)" in summary_table(plan)
    # QNN's op builders cover the whole small MobileNet: one partition, nothing left over.
    assert plan.ops_on("qnn")["aten.convolution.default"] == 5
    assert [p.backend for p in plan.partitions] == ["qnn"]
    assert plan.tolerances["qnn"].atol == pytest.approx(1e-2)


def test_qnn_says_why_it_leaves_an_op(without_qnn_sdk):
    model, inputs = zoo.load("cumsum_mlp")
    plan = composer.plan(model, ["qnn", "xnnpack"], inputs)
    assert plan.ops_on("qnn")["aten.cumsum.default"] == 1  # QNN has a cumsum builder
    model, inputs = zoo.load("transformer_block")
    plan = composer.plan(model, ["qnn", "xnnpack"], inputs)
    nodes = [n for n, op in plan.node_ops.items() if op == "aten.any.dim"]
    assert nodes and dict(plan.explain(nodes[0]))["qnn"] == "no QNN op builder for it"


def test_compose_refuses_qnn_with_the_reason(without_qnn_sdk):
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.BackendListError, match="cannot lower on this machine: .*QNN SDK"):
        composer.compose(model, ["qnn", "xnnpack"], inputs)


def test_qnn_options_make_its_compile_specs_without_the_sdk():
    from executorch.backends.qualcomm.serialization.qc_schema import (
        QcomChipset,
        QnnExecuTorchBackendType,
        QnnExecuTorchHtpPrecision,
    )
    from executorch.backends.qualcomm.serialization.qc_schema_serialize import (
        flatbuffer_to_option,
    )

    from composer.plugins.qnn import compile_specs

    (spec,) = compile_specs({"soc_model": "SM8750"})
    option = flatbuffer_to_option(spec.value)
    assert option.soc_info.soc_model == QcomChipset.SM8750
    assert option.backend_options.backend_type == QnnExecuTorchBackendType.kHtpBackend
    assert option.backend_options.htp_options.precision == QnnExecuTorchHtpPrecision.kHtpFp16
    (spec,) = compile_specs({"backend": "gpu"})
    gpu = flatbuffer_to_option(spec.value).backend_options.backend_type
    assert gpu == QnnExecuTorchBackendType.kGpuBackend


# --- Arm: Ethos-U and VGF (tosa-tools pins numpy<2.2: they run where it installs) -------


@pytest.mark.skipif(HAS_TOSA, reason="tosa-tools is installed here")
@pytest.mark.parametrize("name", ["ethosu", "vgf"])
def test_arm_backends_say_what_they_need_to_plan(name):
    registry = default_registry()
    reason = registry.unavailable_reason(registry.backends[name])
    assert "tosa-tools" in reason and f"executorch-composer[{name}]" in reason
    assert "numpy<2.2" in reason
    model, inputs = zoo.load("mlp")
    with pytest.raises(composer.ComposerError, match=f"'{name}' cannot plan or lower here"):
        composer.plan(model, [name, "xnnpack"], inputs)


def quantized_for_ethos_u(model_name: str, target: str):
    """A zoo model quantized (int8) with ExecuTorch's Ethos-U quantizer, exported."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.quantizer import (
        EthosUQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model, inputs = zoo.load(model_name)
    quantizer = EthosUQuantizer(EthosUCompileSpec(target))
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    prepared(*inputs)
    return torch.export.export(convert_pt2e(prepared), inputs), inputs


@needs_tosa
def test_ethos_u_lowers_a_quantized_model_to_a_vela_command_stream():
    from composer.plugins.arm import describe_ethosu_payload

    registry = default_registry()
    if registry.unavailable_reason(registry.backends["ethosu"]) is not None:
        pytest.skip(registry.unavailable_reason(registry.backends["ethosu"]))
    program, inputs = quantized_for_ethos_u("mlp", "ethos-u55-128")
    composition = composer.compose(program, ["ethosu", "xnnpack"], inputs)
    plan = composition.plan
    assert plan.ops_on("ethosu")["aten.linear.default"] == 3
    # int8 in and out: the quantize before the NPU and the dequantize after it stay outside.
    assert plan.ops_on("xnnpack")["quantized_decomposed.quantize_per_tensor.default"] == 1
    ids = delegate_backend_ids(composition.buffer)
    assert "EthosUBackend" in ids
    (specs, payload), *_ = delegates(composition.buffer, "EthosUBackend")
    assert specs["target"] == b"ethos-u55-128"
    assert describe_ethosu_payload(payload).startswith("Vela command stream")
    with pytest.raises(ValueError):
        describe_ethosu_payload(payload[16:])
    assert_verified_by_reference(composition, "EthosUBackend")


@needs_tosa
def test_quantize_for_ethos_u_and_xnnpack_gives_each_its_own_int8_region():
    # The float plan gives an int8-only NPU nothing; composer.quantize asks what Ethos-U takes
    # once its quantizer quantized the whole model, then quantizes each region with the
    # quantizer of the backend that takes it: Arm's for the convolutions, XNNPACK's for the
    # linear Ethos-U leaves.
    registry = default_registry()
    if registry.unavailable_reason(registry.backends["ethosu"]) is not None:
        pytest.skip(registry.unavailable_reason(registry.backends["ethosu"]))
    model, inputs = zoo.load("mobilenet")
    program = composer.quantize(model, "ethosu,xnnpack", inputs)
    composition = composer.compose(program, "ethosu,xnnpack", inputs, cache=False)
    plan = composition.plan
    assert plan.ops_on("ethosu")["aten.convolution.default"] == 5
    assert plan.ops_on("xnnpack")["aten.linear.default"] == 1
    assert plan.ops_on("portable") == {}
    assert all(partition.quantized for partition in plan.partitions)
    assert "EthosUBackend" in delegate_backend_ids(composition.buffer)
    assert_verified_by_reference(composition, "EthosUBackend")


@needs_tosa
def test_vgf_takes_a_float_model_in_tosas_fp_profile():
    model, inputs = zoo.load("mobilenet")
    plan = composer.plan(model, ["vgf", "xnnpack"], inputs)
    assert plan.ops_on("vgf")["aten.convolution.default"] == 5
    assert plan.ops_on("portable") == {}


# --- MPS and MLX: not usable from ExecuTorch 1.5.1's wheel ------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("mps", "wheel has no MPS backend"),
        ("mlx", "wheel lacks MLX's generated serialization code"),
    ],
)
def test_apple_backends_the_wheel_lacks_say_why_and_what_would_let_them(name, why):
    registry = default_registry()
    if registry.backends[name].plugin._import_problem() is None:
        pytest.skip(f"{name} imports here (an ExecuTorch from source)")
    reason = registry.unavailable_reason(registry.backends[name])
    assert why in reason and "from source" in reason
    model, inputs = zoo.load("mlp")
    with pytest.raises(
        composer.ComposerError, match=f"'{name}' cannot plan or lower here: .*{why}"
    ):
        composer.plan(model, [name, "xnnpack"], inputs)


# --- golden plans of the stacks users ship ---------------------------------------------

GOLDEN_MODELS = ["mlp", "cnn", "mobilenet", "resnet", "llama_block", "tied_lm", "unet"]
# CI time: the default suite pins mlp's plan (the others take 20-50 s each to lower with Vulkan;
# cnn's composition with Vulkan is checked by test_vulkan_declines_with_its_own_reason...); the
# slow suite (-m slow) the rest.
GOLDEN_SLOW = ("cnn", "mobilenet", "resnet", "llama_block", "tied_lm", "unet")
LOWERING_STACKS = {
    "vulkan-xnnpack": ["vulkan", "xnnpack"],
    "coreml-xnnpack": pytest.param(["coreml", "xnnpack"], marks=needs_coremltools),
}


@pytest.mark.parametrize(
    ("stack", "backends"),
    [
        pytest.param(name, *getattr(v, "values", (v,)), marks=getattr(v, "marks", ()), id=name)
        for name, v in LOWERING_STACKS.items()
    ],
)
@pytest.mark.parametrize(
    "model_name",
    [pytest.param(m, marks=pytest.mark.slow) if m in GOLDEN_SLOW else m for m in GOLDEN_MODELS],
)
def test_stack_users_ship(composer_check, model_name, stack, backends):
    model, inputs = zoo.load(model_name)
    result = composer_check(model, backends, inputs, golden=f"{model_name}.{stack}")
    assert result.plan.partitions
    assert result.plan.repairs == (), "every partition lowered as planned"


PLANNED_STACKS = {"qnn-xnnpack": ["qnn", "xnnpack"]}


@pytest.mark.parametrize("stack", list(PLANNED_STACKS))
@pytest.mark.parametrize("model_name", [*GOLDEN_MODELS, "transformer_block", "llama_decoder"])
def test_stack_users_ship_planned_here(composer_check, without_qnn_sdk, model_name, stack):
    model, inputs = zoo.load(model_name)
    result = composer_check(model, PLANNED_STACKS[stack], inputs, golden=f"{model_name}.{stack}")
    assert not result.verified and result.plan.stand_ins == (PLANNED_STACKS[stack][0],)
