"""The ``coreml`` backend: ExecuTorch's Core ML delegate (Apple's Neural Engine, GPU and CPU).

Support is ExecuTorch's own Core ML check (coremltools' PyTorch frontend registry, less the
ops ExecuTorch knows coremltools gets wrong), asked node by node with its reason kept.
``CoreMLBackend.preprocess`` converts each partition to an ML program with ``coremltools``
(``pip install 'executorch-composer[coreml]'``), which works on Linux for the default model
type, an ``.mlpackage`` that the device compiles when it loads it; ``model_type=COMPILED_MODEL``
(an ``.mlmodelc`` compiled ahead of time) needs macOS. The pip ExecuTorch runtime has no Core
ML backend, and coremltools cannot run a model off macOS, so a program with Core ML delegates
is verified through the Python reference here (composer says so).

A delegate's payload is ExecuTorch's flattened Core ML folder: ``metadata.json`` beside
``model.mlpackage``, whose ``model.mlmodel`` is an ML program (:func:`describe_payload`).

Core ML computes in float16 unless ``compute_precision=FLOAT32``: programs it takes part in
are compared with eager at a float16 tolerance.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from collections.abc import Mapping

import torch

from composer.contract.backend_spec import BackendSpec, Tolerance
from composer.contract.errors import ComposerError
from composer.contract.hookspecs import BackendPlugin
from composer.contract.op_names import op_name
from composer.contract.options import Option, check_options
from composer.plugins.aoti import is_core_alias
from composer.plugins.native import NativeCheckSupport, import_problem, quiet

INSTALL = "pip install 'executorch-composer[coreml]'"
COMPUTE_UNITS = ("ALL", "CPU_AND_NE", "CPU_AND_GPU", "CPU_ONLY")
PRECISIONS = ("FLOAT16", "FLOAT32")
MODEL_TYPES = ("MODEL", "COMPILED_MODEL")
# coremltools' ct.target names that an ML program can target (specification 6 and later).
DEPLOYMENT_TARGETS = (
    "iOS15", "iOS16", "iOS17", "iOS18", "iOS26",
    "macOS12", "macOS13", "macOS14", "macOS15", "macOS26",
    "tvOS15", "tvOS16", "tvOS17", "tvOS18", "tvOS26",
    "watchOS8", "watchOS9", "watchOS10", "watchOS11", "watchOS26",
)  # fmt: skip

OPTIONS = (
    Option("compute_units", COMPUTE_UNITS, default="ALL",
           help="where Core ML may run the model (ct.ComputeUnit)"),
    Option("minimum_deployment_target", DEPLOYMENT_TARGETS,
           help="the oldest OS the model must load on (default: coremltools' choice, iOS15)"),
    Option("compute_precision", PRECISIONS, default="FLOAT16",
           help="what the model computes in (ct.precision)"),
    Option("model_type", MODEL_TYPES, default="MODEL",
           help="MODEL: an .mlpackage; COMPILED_MODEL: an .mlmodelc, which needs macOS to lower"),
)  # fmt: skip


def _coremltools_version() -> str | None:
    try:
        return importlib.metadata.version("coremltools")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache  # reads the installed version: once is enough
def _spec() -> BackendSpec:
    version = _coremltools_version()
    return BackendSpec(
        name="coreml",
        backend_id="CoreMLBackend",
        device="npu",
        min_partition_size=1,
        description="Core ML: Apple's Neural Engine, GPU and CPU",
        # torch.testing's float16 tolerances are for one op; a model's error grows with depth.
        tolerance=Tolerance(atol=1e-2, rtol=1e-2,
                            reason="Core ML computes in float16 unless compute_precision=FLOAT32",
                            precision="float16"),
        library=f"coremltools {version}" if version else "",
    )  # fmt: skip


@functools.cache
def unavailable_reason() -> str | None:
    """Why Core ML cannot partition or lower here, or ``None``."""
    if _coremltools_version() is None:
        return f"the coremltools package is not installed ({INSTALL})"
    problem = import_problem("executorch.backends.apple.coreml.partition")
    if problem is not None:
        return f"{problem}; install a coremltools that imports with it: {INSTALL}"
    return None


def _require_coreml() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise ComposerError(f"backend 'coreml' cannot be used: {reason}.")


_MAX_POOLS = frozenset({
    "aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default",
    "aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
})  # fmt: skip


def _count(value) -> int | None:
    tensor = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return tensor.numel() if isinstance(tensor, torch.Tensor) else None


def conversion_hazard(node: torch.fx.Node) -> str | None:
    """Why coremltools 9.0 would fail to convert ``node`` although its check takes it, or
    ``None``: calls its converters reject, found lowering the zoo (a failed conversion fails
    the whole partition, so such a call is left to the next backend instead)."""
    name = op_name(node)
    if name in _MAX_POOLS:
        if len(node.args) < 3:
            return ("coremltools' max_pool converter needs the stride argument, which this "
                    "call leaves to its default (F.max_pool2d(x, k))")  # fmt: skip
        dilation = node.args[4] if len(node.args) > 4 else 1
        if any(d > 1 for d in (dilation if isinstance(dilation, list | tuple) else [dilation])):
            return "coremltools' max_pool converter takes no dilation above 1"
        if name.endswith("_with_indices.default") and any(
            user.args[1] == 1 for user in node.users if op_name(user) == "getitem"
        ):
            return "coremltools' max_pool converter gives no indices"
    if name == "aten.index_put.default":
        indices = node.args[1]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if any(index is None for index in indices) and (
            accumulate or any(_count(i) != 1 for i in indices if i is not None)
        ):
            return ("coremltools converts index_put with a whole slice (x[:, i] = v) only for "
                    "single-element indices and without accumulate")  # fmt: skip
    return None


def coreml_support(options: Mapping[str, str]) -> NativeCheckSupport:
    """ExecuTorch's Core ML check, with the reason for each decline."""
    with quiet():
        from executorch.backends.apple.coreml.partition.coreml_partitioner import (
            _OperatorsSupportedForCoreMLBackend,
        )
    check = _OperatorsSupportedForCoreMLBackend(log=False)

    def why_not(node):
        try:
            if check.is_node_supported({}, node):
                return conversion_hazard(node)
        except Exception as error:  # noqa: BLE001 - coremltools raises for some ops
            return f"coremltools' check raised {type(error).__name__}: {error}"
        if check.should_override_support(node):
            return "ExecuTorch lists it as one coremltools converts wrongly or not at all"
        return "coremltools has no converter for it"

    return NativeCheckSupport(why_not)


def compile_specs(options: Mapping[str, str]) -> list:
    """ExecuTorch's Core ML compile specs for ``options``."""
    with quiet():
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend

    checked = check_options("coreml", OPTIONS, options)
    model_type = CoreMLBackend.MODEL_TYPE[checked["model_type"]]
    if model_type is CoreMLBackend.MODEL_TYPE.COMPILED_MODEL and sys.platform != "darwin":
        raise ComposerError(
            "coreml option model_type=COMPILED_MODEL compiles the model with Core ML, which "
            f"needs macOS (this is {sys.platform}); use MODEL, which the device compiles when "
            "it loads the program."
        )
    target = checked.get("minimum_deployment_target")
    return CoreMLBackend.generate_compile_specs(
        compute_unit=ct.ComputeUnit[checked["compute_units"]],
        minimum_deployment_target=ct.target[target] if target else None,
        compute_precision=ct.precision[checked["compute_precision"]],
        model_type=model_type,
    )


def describe_payload(data: bytes) -> str:
    """What a CoreMLBackend delegate's payload holds; ``ValueError`` if it is not a flattened
    Core ML folder holding an ML program."""
    import json
    import tempfile
    from pathlib import Path

    with quiet():
        import coremltools as ct
        from executorch.backends.apple.coreml import executorchcoreml

    with tempfile.TemporaryDirectory() as folder:
        if not executorchcoreml.unflatten_directory_contents(bytes(data), folder):
            raise ValueError("not a flattened Core ML folder (ExecuTorch cannot unflatten it)")
        root = Path(folder) / "lowered_module"
        if not (root / "metadata.json").is_file():
            raise ValueError(
                f"no lowered_module/metadata.json in {sorted(Path(folder).rglob('*'))}"
            )
        metadata = json.loads((root / "metadata.json").read_text())
        package = root / "model.mlpackage"
        if package.is_dir():
            with quiet():
                spec = ct.utils.load_spec(str(package))
            kind = spec.WhichOneof("Type")
            if kind != "mlProgram":
                raise ValueError(f"the Core ML model is a {kind}, not an ML program")
            what = f"Core ML model package (ML program, specification {spec.specificationVersion})"
        elif (root / "model.mlmodelc").is_dir():
            what = "compiled Core ML model (.mlmodelc)"
        else:
            raise ValueError(f"no model.mlpackage or model.mlmodelc in {sorted(root.iterdir())}")
    return (
        f"{what}, inputs {', '.join(metadata['inputNames'])}, "
        f"outputs {', '.join(metadata['outputNames'])}"
    )


# Kept whole, SDPA breaks the stack's next decomposition pass: with another backend after
# Core ML (coreml,xnnpack), ExecuTorch decomposes once per backend, and re-tracing a program
# that holds SDPA whole fails on the view after it ("Cannot view a tensor with shape [2, 8,
# 4, 8] and strides (256, 8, 64, 1)", zoo llama_block). Decomposed, Core ML takes its parts.
_DECOMPOSED_ANYWAY = frozenset({torch.ops.aten.scaled_dot_product_attention.default})


class CoreMLPlugin(BackendPlugin):
    options = OPTIONS

    @property
    def spec(self) -> BackendSpec:
        return _spec()

    def composer_unavailable_reason(self, backend):
        return unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        _require_coreml()
        return coreml_support(self.checked_options(options))

    def composer_ops_to_not_decompose(self, backend, program, options):
        _require_coreml()
        # As CoreMLPartitioner does (ops Core ML takes, less triu, tril, repeat_interleave
        # and view ops), but only ops it takes at every call: an op kept whole that it then
        # declines at one call stays whole outside it too.
        with quiet():
            from executorch.backends.apple.coreml.partition import CoreMLPartitioner

            wanted = set(CoreMLPartitioner().ops_to_not_decompose(program)[0])
        support = coreml_support(options)
        keep: dict[torch._ops.OpOverload, bool] = {}
        for node in program.graph.nodes:
            op = node.target
            if node.op != "call_function" or op not in wanted or torch.Tag.core in op.tags:
                continue  # a core op is never decomposed: asking to keep it draws a warning
            if op in _DECOMPOSED_ANYWAY:
                continue
            # conv2d whole is convolution to Core ML either way, but whole no backend before
            # it in a stack that takes only aten.convolution (XNNPACK) could take it.
            ok = support.reason_unsupported(node) is None and not is_core_alias(node)
            keep[op] = keep.get(op, True) and ok
        return [op for op, ok in keep.items() if ok]

    def composer_compile_specs(self, backend, method_name, options):
        return compile_specs(options)


plugin = CoreMLPlugin()
