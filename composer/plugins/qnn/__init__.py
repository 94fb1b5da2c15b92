"""The ``qnn`` backend: ExecuTorch's Qualcomm AI Engine Direct (QNN) delegate, for Snapdragon.

QNN lowers only with Qualcomm's QNN SDK (its libraries compile each partition into a QNN
context binary), so without ``$QNN_SDK_ROOT`` it plans with a stand-in, and ``composer
backends`` says so. ExecuTorch's own check (``QnnOperatorSupport``) cannot run here either:
it builds every op with QNN's op builders, which need the node metadata QNN's own lowering
pipeline adds first, then asks a live QNN backend to validate it, and starting one without
``$QNN_SDK_ROOT`` makes ExecuTorch download the SDK. So support is the most faithful check that
runs offline: ExecuTorch's lists of ops QNN does not or not yet support, and the registry of
QNN op builders (one per edge op it can build), the same tables ``QnnOperatorSupport`` reads
before it builds anything. What the live validation would add (per-SoC dtype and shape limits)
is not checked, and QNN's own pipeline passes (int64 to int32 casts, scalar-op rewrites) do not
run in a composed stack.

Options from QNN's compile specs: ``soc_model`` (``SM8650``...), ``backend`` (HTP or GPU),
``htp_precision`` (FP16 for float models; QUANTIZED needs a model quantized with ExecuTorch's
QnnQuantizer first), ``online_prepare``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from composer.contract.backend_spec import BackendSpec, Tolerance
from composer.contract.hookspecs import BackendPlugin
from composer.contract.op_names import op_name
from composer.contract.options import Option, check_options
from composer.contract.support import any_chain, chain
from composer.plugins.aoti import is_core_alias
from composer.plugins.native import ON_OFF, NativeCheckSupport, import_problem, is_on, quiet

# QcomChipset's names in ExecuTorch 1.5.1 (backends/qualcomm/serialization/qc_schema.py).
SOC_MODELS = (
    "SM8850", "SM8845", "SM8750", "SM8650", "SM8550", "SM8475", "SM8450", "SM8350",
    "SA8797", "SA8295", "SA8255", "SC8380XP", "SSG2115P", "SSG2125P", "SXR1230P", "SXR2230P",
    "SXR2330P", "QCS9100", "SAR2230P", "SW6100", "QCM6490",
)  # fmt: skip
OPTIONS = (
    Option("soc_model", SOC_MODELS, default="SM8650",
           help="the Snapdragon SoC the program runs on (SM8650: 8 Gen 3)"),
    Option("backend", ("HTP", "GPU"), default="HTP", help="QNN's HTP (NPU) or GPU backend"),
    Option("htp_precision", ("FP16", "QUANTIZED"), default="FP16",
           help="FP16 for a float model; QUANTIZED for one quantized with QnnQuantizer"),
    Option("online_prepare", ON_OFF, default="OFF",
           help="compose the QNN graph on the device instead of ahead of time"),
)  # fmt: skip
SDK_LIBRARIES = "lib/x86_64-linux-clang"


def unavailable_reason() -> str | None:
    """Why QNN cannot lower here (one line, with what would let it), or ``None``."""
    problem = import_problem("executorch.backends.qualcomm.partition.qnn_partitioner")
    if problem is not None:
        return f"{problem}; it comes with executorch 1.5.1"
    root = os.environ.get("QNN_SDK_ROOT")
    if not root:
        return (
            "lowering needs Qualcomm's QNN SDK (AI Engine Direct): set QNN_SDK_ROOT to it and "
            f"put $QNN_SDK_ROOT/{SDK_LIBRARIES} on LD_LIBRARY_PATH"
        )
    if not (Path(root) / SDK_LIBRARIES).is_dir():
        return f"QNN_SDK_ROOT={root} has no {SDK_LIBRARIES}: point it at a QNN SDK for Linux"
    return None


def _names(node: torch.fx.Node) -> set[str]:
    """The names QNN's builder registry may list a node's op under."""
    names = {op_name(node)}
    target_name = getattr(node.target, "__name__", None)
    if target_name:
        names.add(target_name)
    return names


def qnn_support() -> NativeCheckSupport:
    """The tables ExecuTorch's ``QnnOperatorSupport`` reads before it builds a node (its
    unsupported and to-be-implemented lists, and QNN's op builder registry)."""
    with quiet():
        import executorch.backends.qualcomm.builders  # noqa: F401 - registers the builders
        from executorch.backends.qualcomm.builders.node_visitor_manager import (
            _node_visitor_dict,
        )
        from executorch.backends.qualcomm.partition.common_defs import (
            allow_list_operator,
            constant_operator,
            not_supported_operator,
            to_be_implemented_operator,
        )
    always = set(allow_list_operator) | set(constant_operator)

    def listed(ops, reason: str):
        names = {str(op) for op in ops}
        return lambda node: reason if op_name(node) in names else None

    def always_taken(node):
        return None if node.target in always else "not on QNN's allow or constant lists"

    def built(node):
        if not _names(node) & _node_visitor_dict.keys():
            return "no QNN op builder for it"
        if node.target in (torch.ops.aten.stack.default, torch.ops.aten.unbind.int):
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and value.dtype in (torch.int32, torch.int64):
                return "QNN takes no int32/int64 input or output for stack and unbind"
        return None

    return NativeCheckSupport(
        chain(
            listed(not_supported_operator, "ExecuTorch lists it as one QNN does not support"),
            listed(to_be_implemented_operator, "QNN's op builders do not implement it yet"),
            any_chain(always_taken, built),  # built's reason where neither takes it
        )
    )


def compile_specs(options: Mapping[str, str]) -> list:
    """ExecuTorch's QNN compile specs for ``options`` (no SDK needed to write them)."""
    with quiet():
        from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
        from executorch.backends.qualcomm.utils.utils import (
            generate_gpu_compiler_spec,
            generate_htp_compiler_spec,
            generate_qnn_executorch_compiler_spec,
        )

    checked = check_options("qnn", OPTIONS, options)
    if checked["backend"] == "GPU":
        backend_options = generate_gpu_compiler_spec()
    else:
        backend_options = generate_htp_compiler_spec(use_fp16=checked["htp_precision"] == "FP16")
    with quiet():
        return generate_qnn_executorch_compiler_spec(
            soc_model=QcomChipset[checked["soc_model"]],
            backend_options=backend_options,
            online_prepare=is_on(checked, "online_prepare"),
        )


class QnnPlugin(BackendPlugin):
    spec = BackendSpec(
        "qnn", "QnnBackend", device="npu",
        description="Qualcomm AI Engine Direct (QNN): Snapdragon NPU and GPU",
        tolerance=Tolerance(atol=1e-2, rtol=1e-2, precision="float16",
                            reason="QNN's HTP computes float models in float16"),
    )  # fmt: skip
    options = OPTIONS

    def composer_unavailable_reason(self, backend):
        return unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        self.checked_options(options)
        return qnn_support()

    def composer_ops_to_not_decompose(self, backend, program, options):
        with quiet():
            from executorch.backends.qualcomm.partition.utils import (
                filter_fn,
                get_skip_decomp_table,
            )

        wanted = set(get_skip_decomp_table())
        support = qnn_support()
        keep: dict[torch._ops.OpOverload, bool] = {}
        for node in program.graph.nodes:
            op = node.target
            if node.op != "call_function" or op not in wanted or torch.Tag.core in op.tags:
                continue
            # As QnnPartitioner keeps them (its table and filter), but only ops QNN then takes
            # at every call, and not conv2d-like aliases of one core op, which XNNPACK takes.
            ok = filter_fn(node) and support.reason_unsupported(node) is None
            keep[op] = keep.get(op, True) and ok and not is_core_alias(node)
        return [op for op, ok in keep.items() if ok]

    def composer_compile_specs(self, backend, method_name, options):
        return compile_specs(options)


plugin = QnnPlugin()
