"""The Arm backends: ``ethosu`` (Ethos-U NPUs of microcontrollers, compiled by Vela) and ``vgf``
(Vulkan ML extensions, a VGF file from Arm's model converter), both through TOSA.

Both need ``tosa_serializer`` (PyPI ``tosa-tools``), which every ExecuTorch Arm module imports,
so without it they neither plan nor lower. Every tosa-tools release pins ``numpy<2.2`` and
``flatbuffers==25.2.10``: install them (``pip install 'executorch-composer[ethosu]'`` or
``[vgf]``) in an environment whose numpy may be 2.1 (torch 2.13 and ExecuTorch 1.5.1 run on it).

Support is the TOSA partitioner's own operator check for the backend's TOSA profile (the
target's, for Ethos-U), asked node by node with the reason its reporter gives. A TOSA profile
without floats (every Ethos-U) takes int8 in and out: ``TOSAPartitioner`` then leaves out of a
partition its edge quantize and dequantize nodes and a first node reading floats; composer asks
node by node, so those rules are applied to a node's neighbours as the check sees them.
Ethos-U takes only a quantized model: quantize it with ExecuTorch's ``EthosUQuantizer`` (PT2E)
and hand composer the exported program.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from composer.contract.backend_spec import BackendSpec
from composer.contract.errors import ComposerError
from composer.contract.hookspecs import BackendPlugin
from composer.contract.options import Option
from composer.contract.support import chain
from composer.plugins.native import NativeCheckSupport, import_problem, quiet

NUMPY_NOTE = "tosa-tools pins numpy<2.2 and flatbuffers==25.2.10"

ETHOSU_TARGETS = (
    "ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256",
    "ethos-u65-256", "ethos-u65-512",
    "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048",
)  # fmt: skip
VGF_PROFILES = ("TOSA-1.0+FP", "TOSA-1.0+INT", "TOSA-1.0+FP+INT+int4+int16")

Q_DQ = (
    "quantized_decomposed.quantize_per_tensor",
    "quantized_decomposed.quantize_per_channel",
    "quantized_decomposed.dequantize_per_tensor",
    "quantized_decomposed.dequantize_per_channel",
)


class ArmPlugin(BackendPlugin):
    """A composer plugin for one of ExecuTorch's TOSA-based Arm backends."""

    spec: BackendSpec
    module: str  # the ExecuTorch module that holds the partitioner
    extra: str
    tools: tuple[tuple[str, str], ...] = ()  # (module to import, the package it comes from)

    def compile_spec(self, options: Mapping[str, str]):
        raise NotImplementedError

    def partitioner(self, compile_spec):
        raise NotImplementedError

    # --- shared -----------------------------------------------------------------------

    def _reason(self) -> str | None:
        # Not a cached_property: pluggy reads every attribute of a plugin as it registers it.
        return _import_reason(type(self))

    def _import_reason(self) -> str | None:
        install = f"pip install 'executorch-composer[{self.extra}]'"
        if import_problem("tosa_serializer") is not None:
            return (
                f"needs tosa_serializer from tosa-tools ({install}; {NUMPY_NOTE}, so use an "
                "environment where numpy may be 2.1)"
            )
        for module, package in self.tools:
            if import_problem(module) is not None:
                return f"needs {package} ({install})"
        problem = import_problem(self.module)
        return None if problem is None else f"{problem}; {install}"

    def unavailable_reason(self) -> str | None:
        return self._reason()

    def _require(self) -> None:
        # Unlike a backend that only lacks its compiler, these cannot even say what they
        # take: the TOSA check lives in modules that import tosa_serializer.
        reason = self.unavailable_reason()
        if reason is not None and import_problem(self.module) is not None:
            raise ComposerError(f"backend {self.spec.name!r} cannot plan or lower here: {reason}.")

    def support(self, program, options: Mapping[str, str]) -> NativeCheckSupport:
        from executorch.exir.backend.utils import WhyNoPartitionReporter

        with quiet():
            partitioner = self.partitioner(self.compile_spec(options))
        reporter = WhyNoPartitionReporter()
        check = partitioner._create_operator_support(program, reporter)
        tosa_spec = partitioner.tosa_spec
        int_only = tosa_spec.support_integer() and not tosa_spec.support_float()

        @functools.cache
        def takes(node: torch.fx.Node) -> bool:
            if node.op != "call_function":
                return False
            with quiet():
                return bool(check.is_node_supported({}, node))

        def tosa_check(node):
            if takes(node):
                return None
            reason = reporter._rejected_nodes.get(node)
            return reason or f"not in {tosa_spec}'s supported operators"

        def int8_in_and_out(node):
            name = str(getattr(node.target, "_op", node.target))
            if name.startswith(Q_DQ[:2]) and not takes(node.all_input_nodes[0]):
                return "an int8-only NPU takes int8 in: this quantize runs before it"
            if name.startswith(Q_DQ[2:]) and any(not takes(user) for user in node.users):
                return "an int8-only NPU gives int8 out: this dequantize runs after it"
            if not name.startswith(Q_DQ):
                for value in node.all_input_nodes:
                    tensor = value.meta.get("val")
                    if (
                        not takes(value)
                        and isinstance(tensor, torch.Tensor)
                        and tensor.dtype.is_floating_point
                    ):
                        return f"reads floats ({value.name}) into an int8-only NPU"
            return None

        return NativeCheckSupport(chain(tosa_check, int8_in_and_out) if int_only else tosa_check)

    def composer_unavailable_reason(self, backend):
        return self.unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        self._require()
        return self.support(program, self.checked_options(options))

    def composer_ops_to_not_decompose(self, backend, program, options):
        self._require()
        with quiet():
            partitioner = self.partitioner(self.compile_spec(self.checked_options(options)))
            ops, keep = partitioner.ops_to_not_decompose(program)
        # Only ops kept at every call (the filter looks at the Q/DQ around each).
        kept: dict[torch._ops.OpOverload, bool] = {}
        for node in program.graph.nodes:
            if node.op == "call_function" and node.target in ops:
                ok = keep is None or bool(keep(node))
                kept[node.target] = kept.get(node.target, True) and ok
        return [op for op, ok in kept.items() if ok]

    def composer_compile_specs(self, backend, method_name, options):
        self._require()
        with quiet():
            return self.compile_spec(self.checked_options(options))._to_list()


class EthosUPlugin(ArmPlugin):
    spec = BackendSpec(
        name="ethosu",
        backend_id="EthosUBackend",
        device="npu",
        min_partition_size=1,
        description="Arm Ethos-U NPUs of microcontrollers: int8, TOSA, Vela",
    )
    options = (
        Option("target", ETHOSU_TARGETS, default="ethos-u55-128",
               help="the Ethos-U configuration (its MACs per cycle): decides the TOSA profile"),
    )  # fmt: skip
    module = "executorch.backends.arm.ethosu"
    extra = "ethosu"
    tools = (("ethosu.vela", "ethos-u-vela"),)

    def compile_spec(self, options):
        from executorch.backends.arm.ethosu import EthosUCompileSpec

        return EthosUCompileSpec(self.checked_options(options)["target"])

    def partitioner(self, compile_spec):
        from executorch.backends.arm.ethosu import EthosUPartitioner

        return EthosUPartitioner(compile_spec)

    def composer_quantizer(self, backend, options):
        # Symmetric int8, per-channel weights: Arm's examples' (aot_arm_compiler) for Ethos-U.
        self._require()
        from executorch.backends.arm.quantizer import (
            EthosUQuantizer,
            get_symmetric_quantization_config,
        )

        with quiet():
            quantizer = EthosUQuantizer(self.compile_spec(options))
        return quantizer.set_global(get_symmetric_quantization_config())


class VgfPlugin(ArmPlugin):
    spec = BackendSpec(
        name="vgf",
        backend_id="VgfBackend",
        device="gpu",
        min_partition_size=1,
        description="Arm VGF: Vulkan ML extensions, through TOSA",
    )
    options = (
        Option("tosa_spec", VGF_PROFILES, default="TOSA-1.0+FP",
               help="the TOSA profile: FP for float models, INT for quantized ones"),
    )  # fmt: skip
    module = "executorch.backends.arm.vgf"
    extra = "vgf"

    def unavailable_reason(self) -> str | None:
        reason = self._reason()
        if reason is not None:
            return reason
        return _model_converter_problem()

    def compile_spec(self, options):
        from executorch.backends.arm.vgf import VgfCompileSpec

        return VgfCompileSpec(self.checked_options(options)["tosa_spec"])

    def partitioner(self, compile_spec):
        from executorch.backends.arm.vgf import VgfPartitioner

        return VgfPartitioner(compile_spec)


@functools.cache
def _model_converter_problem() -> str | None:
    """Why Arm's model-converter (VgfBackend's compiler) cannot run here, or ``None``."""
    import subprocess

    from executorch.backends.arm.vgf import model_converter

    binary = model_converter.find_model_converter_binary()
    if binary is None:
        return (
            "needs Arm's model-converter on PATH "
            "(pip install 'executorch-composer[vgf]': ai_ml_sdk_model_converter)"
        )
    try:
        run = subprocess.run(
            [binary, "--version"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
            env=model_converter.model_converter_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Arm's model-converter does not run here ({error})"
    if run.returncode != 0:
        line = next((x for x in run.stderr.splitlines() if x.strip()), f"exit {run.returncode}")
        if "not found (required by" in line:  # the wheel's binary is built against glibc 2.38
            line = line.split(": ", 1)[-1].split(" (required by")[0]
            return (
                f"Arm's model-converter does not run on this system ({line}): it needs "
                "glibc 2.38 or newer (Ubuntu 24.04)"
            )
        return f"Arm's model-converter does not run here: {line}"
    return None


@functools.cache
def _import_reason(plugin_class: type[ArmPlugin]) -> str | None:
    return plugin_class._import_reason(plugin_class)


ethosu = EthosUPlugin()
vgf = VgfPlugin()


def describe_ethosu_payload(data: bytes) -> str:
    """What an EthosUBackend payload holds; ``ValueError`` unless it is Vela's command stream:
    blocks of a 16-byte name, a 16-byte header (int32 length first) and data padded to 16
    bytes, from ``vela_bin_stream`` to ``vela_end_stream``."""
    blocks: list[tuple[str, int]] = []
    offset = 0
    while offset + 32 <= len(data):
        name = bytes(data[offset : offset + 16]).rstrip(b"\0").decode("ascii", "replace")
        length = int.from_bytes(data[offset + 16 : offset + 20], "little", signed=True)
        if length < 0:
            break
        blocks.append((name, length))
        offset += 32 + (length + 15) // 16 * 16
        if name == "vela_end_stream":
            break
    names = [name for name, _ in blocks]
    if len(names) < 2 or names[0] != "vela_bin_stream" or names[-1] != "vela_end_stream":
        raise ValueError(f"not a Vela command stream (blocks {names[:4]})")
    sizes = dict(blocks)
    if not sizes.get("cmd_data"):
        raise ValueError("a Vela command stream without commands")
    return (
        f"Vela command stream: {sizes['cmd_data']} command byte(s), "
        f"{sizes.get('weight_data', 0)} weight byte(s), blocks {', '.join(names[1:-1])}"
    )
