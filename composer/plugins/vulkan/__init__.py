"""The ``vulkan`` backend: ExecuTorch's Vulkan delegate, for GPUs of Android phones and more.

Support is the Vulkan partitioner's own check (``VulkanSupportedOperators`` over the op
registry: dtypes, texture and buffer limits, argument rules), asked node by node with its
reason kept. ``VulkanBackend.preprocess`` is Python (graph passes, then a flatbuffer), so it
lowers on any machine; the pip ExecuTorch runtime has no Vulkan backend, so a program with
Vulkan delegates is verified through the Python reference there (composer says so), and runs
on a device through ExecuTorch's Vulkan runtime.

A delegate's payload is ExecuTorch's Vulkan format: a ``VH00`` header, then a flatbuffer with
file identifier ``VK00`` (the graph), then the constant bytes (:func:`describe_payload`).
"""

from __future__ import annotations

from collections.abc import Mapping

from composer.contract.backend_spec import BackendSpec
from composer.contract.hookspecs import BackendPlugin
from composer.contract.options import Option, check_options
from composer.plugins.native import ON_OFF, NativeCheckSupport, import_problem, is_on, quiet

STORAGE_TYPES = ("TEXTURE_3D", "TEXTURE_2D", "BUFFER")
MEMORY_LAYOUTS = ("TENSOR_WIDTH_PACKED", "TENSOR_HEIGHT_PACKED", "TENSOR_CHANNELS_PACKED")

# The keys of ExecuTorch's own compile options (``VulkanPartitioner(compile_options=...)``).
OPTIONS = (
    Option("storage_type_override", STORAGE_TYPES,
           help="how tensors are stored on the GPU (default TEXTURE_3D)"),
    Option("memory_layout_override", MEMORY_LAYOUTS,
           help="how tensors are packed (default TENSOR_WIDTH_PACKED)"),
    Option("small_texture_limits", ON_OFF, default="OFF",
           help="2048-texel textures, which desktop GPUs take (default: mobile 16384)"),
    Option("force_fp16", ON_OFF, default="OFF",
           help="compute in fp16 on the GPU (results then differ from fp32 eager)"),
    Option("downcast_64_bit", ON_OFF, default="ON",
           help="store int64/float64 as 32-bit, as Vulkan shaders have no 64-bit types"),
    Option("require_dynamic_shapes", ON_OFF, default="OFF",
           help="take only ops whose Vulkan kernels can resize"),
    # ON, as ExecuTorch's Vulkan tester builds it: its runtime has no logical_not kernel
    # ("Missing operator: aten.logical_not.default"), so with OFF a program dies at load
    # where the partitioner took one (vit_b_16: 24 partitions for the proof to move).
    Option("skip_bool_tensors", ON_OFF, default="ON",
           help="leave ops on bool tensors to others (the runtime lacks bool kernels such "
           "as logical_not; OFF offers them to Vulkan)"),
)  # fmt: skip
# Partitioner-only options: they decide what Vulkan takes, not how it compiles.
SUPPORT_ONLY = ("require_dynamic_shapes", "skip_bool_tensors")

HEADER_MAGIC = b"VH00"
FLATBUFFER_IDENTIFIER = b"VK00"


def unavailable_reason() -> str | None:
    """Why Vulkan cannot lower here, or ``None``: its serialization is Python, so only an
    ExecuTorch without the Vulkan package stops it."""
    problem = import_problem("executorch.backends.vulkan.partitioner.vulkan_partitioner")
    return None if problem is None else f"{problem}; it comes with executorch 1.5.1"


def compile_options(options: Mapping[str, str]) -> dict[str, object]:
    """``options`` as ExecuTorch's Vulkan compile options (enums and booleans)."""
    from executorch.backends.vulkan.serialization.vulkan_graph_schema import (
        VkMemoryLayout,
        VkStorageType,
    )

    checked = check_options("vulkan", OPTIONS, options)
    result: dict[str, object] = {}
    if "storage_type_override" in checked:
        result["storage_type_override"] = VkStorageType[checked["storage_type_override"]]
    if "memory_layout_override" in checked:
        result["memory_layout_override"] = VkMemoryLayout[checked["memory_layout_override"]]
    for option in OPTIONS:
        if option.choices == ON_OFF and option.name in checked:
            result[option.name] = is_on(checked, option.name)
    return result


def vulkan_support(
    program, options: Mapping[str, str], operator_allowlist: set | None = None
) -> NativeCheckSupport:
    """The Vulkan partitioner's own check for ``program``, with the reason for each decline.

    ``operator_allowlist``: only these edge ops, as ``VulkanPartitioner`` takes it (WebGPU's
    runtime implements fewer ops than Vulkan's, from the same serialization).
    """
    with quiet():  # importing it sets the root logger to INFO; quiet() puts it back
        import executorch.backends.vulkan.patterns as vk_patterns
        import executorch.backends.vulkan.utils as vk_utils
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
            VulkanSupportedOperators,
        )

    compiled = compile_options(options)
    reasons: dict[object, str] = {}

    class Recording(VulkanSupportedOperators):
        def log_skip(self, node, reason: str) -> None:  # the partitioner logs why, at INFO
            reasons[node] = reason

    limits = (
        vk_utils.SMALL_TEXTURE_LIMITS
        if compiled.get("small_texture_limits")
        else vk_utils.DEFAULT_TEXTURE_LIMITS
    )
    check = Recording(
        limits,
        vk_utils.DEFAULT_BUFFER_LIMIT,
        require_dynamic_shape=bool(compiled.get("require_dynamic_shapes")),
        skip_bool_tensors=bool(compiled.get("skip_bool_tensors")),
        operator_allowlist=operator_allowlist,
        fusable_subgraphs=vk_patterns.get_all_fusable_subgraphs(program.graph_module),
    )

    def why_not(node):
        if check.is_node_supported({}, node):
            return None
        return reasons.get(node) or "unsupported op"

    return NativeCheckSupport(why_not)


def describe_payload(data: bytes) -> str:
    """What a VulkanBackend delegate's payload holds; ``ValueError`` if it is not Vulkan's
    format (a ``VH00`` header, then a flatbuffer of ``schema.fbs`` with identifier ``VK00``)."""
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        VulkanDelegateHeader,
    )

    header = VulkanDelegateHeader.from_bytes(data[: VulkanDelegateHeader.EXPECTED_LENGTH])
    flatbuffer_end = header.flatbuffer_offset + header.flatbuffer_size
    if flatbuffer_end > len(data) or header.bytes_offset + header.bytes_size > len(data):
        raise ValueError(f"the header points past the payload's {len(data)} bytes")
    flatbuffer = data[header.flatbuffer_offset : flatbuffer_end]
    if flatbuffer[4:8] != FLATBUFFER_IDENTIFIER:
        raise ValueError(f"the flatbuffer's identifier is {flatbuffer[4:8]!r}, not VK00")
    graph = _decompiled(flatbuffer)
    constants = graph.get("constants", [])
    named = sum(1 for constant in constants if constant.get("named_key"))
    return (
        f"Vulkan graph: {len(graph.get('chain', []))} op(s), {len(graph.get('values', []))} "
        f"value(s), {len(constants)} constant(s) ({named} in named data), "
        f"{header.bytes_size} constant byte(s) inline"
    )


def _decompiled(flatbuffer: bytes) -> dict:
    """The flatbuffer as JSON, read by ExecuTorch's flatc against Vulkan's own schema (flatc
    fails on data that does not follow it)."""
    import importlib.resources
    import json
    import re
    import tempfile
    from pathlib import Path

    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    schema = importlib.resources.files("executorch.backends.vulkan.serialization")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "schema.fbs").write_bytes((schema / "schema.fbs").read_bytes())
        (Path(folder) / "schema.bin").write_bytes(flatbuffer)
        _flatc_decompile(folder, str(Path(folder) / "schema.fbs"),
                         str(Path(folder) / "schema.bin"), ["--raw-binary"])  # fmt: skip
        text = (Path(folder) / "schema.json").read_text()
    # flatc writes non-finite floats (a -inf attention mask) as bare nan / inf, which is not
    # JSON; ExecuTorch's own reader (flatbuffer_to_vk_graph) fails on them.
    text = re.sub(r"(?<=[:\[,\s])(-?)inf\b", lambda m: f"{m.group(1)}Infinity", text)
    text = re.sub(r"(?<=[:\[,\s])-?nan\b", "NaN", text)
    return json.loads(text)


class VulkanPlugin(BackendPlugin):
    spec = BackendSpec(
        "vulkan", "VulkanBackend", device="gpu",
        description="Vulkan: the GPUs of Android phones and others",
    )  # fmt: skip
    options = OPTIONS

    def composer_unavailable_reason(self, backend):
        return unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        return vulkan_support(program, options)

    def composer_ops_to_not_decompose(self, backend, program, options):
        with quiet():
            from executorch.backends.vulkan.op_registry import vulkan_supported_ops
            from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
                ops_not_to_decompose,
            )
            from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge

        # Keep whole only what Vulkan's registry has (all three in 1.5.1: hardswish,
        # upsample_nearest2d.vec, pixel_shuffle), so an op it has no kernel for decomposes.
        return [op for op in ops_not_to_decompose if aten_to_edge(op) in vulkan_supported_ops]

    def composer_compile_specs(self, backend, method_name, options):
        with quiet():
            from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
                parse_compile_options,
            )

        compiled = compile_options(options)
        for name in SUPPORT_ONLY:
            compiled.pop(name, None)
        return parse_compile_options(compiled)


plugin = VulkanPlugin()
