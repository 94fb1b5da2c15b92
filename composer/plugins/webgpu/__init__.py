"""The ``webgpu`` backend: ExecuTorch's WebGPU delegate (browsers and native Dawn on Metal/Vulkan).

ExecuTorch 1.5.1's WebGPU backend has no ahead-of-time layer of its own: ``WebGPUPartitioner``
is the Vulkan partitioner, and its runtime reads the Vulkan serialization (a ``VH00`` header
and a ``VK00`` flatbuffer) from ``VulkanBackend`` delegates. So it lowers here like ``vulkan``,
and its delegates carry the backend id ``VulkanBackend``. Its runtime implements fewer ops than
Vulkan's: support is Vulkan's own check restricted to the edge ops ExecuTorch lists as
implemented by the WebGPU runtime (``WEBGPU_SUPPORTED_OPS`` of its test harness, which lowers
with exactly that allowlist), with bool tensors left out, as that harness does.

Do not stack ``webgpu`` with ``vulkan``: both write ``VulkanBackend`` delegates, which the
program cannot tell apart.
"""

from __future__ import annotations

from composer.contract.backend_spec import BackendSpec
from composer.contract.hookspecs import BackendPlugin
from composer.contract.options import Option
from composer.plugins.native import ON_OFF, import_problem, quiet
from composer.plugins.vulkan import describe_payload, vulkan_support

__all__ = ["describe_payload"]

# As ExecuTorch's WebGPU test harness partitions: bool tensors are left out.
VULKAN_OPTIONS = {"skip_bool_tensors": "ON"}
ALLOWLIST_MODULE = "executorch.backends.webgpu.test.tester"


def unavailable_reason() -> str | None:
    """Why WebGPU cannot lower here, or ``None``."""
    for module in ("executorch.backends.webgpu.partitioner", ALLOWLIST_MODULE):
        problem = import_problem(module)
        if problem is not None:
            return f"{problem}; it comes with executorch 1.5.1"
    return None


def webgpu_ops() -> set:
    """The edge ops ExecuTorch lists as implemented by the WebGPU runtime."""
    with quiet():
        from executorch.backends.webgpu.test.tester import WEBGPU_SUPPORTED_OPS
    return set(WEBGPU_SUPPORTED_OPS)


class WebGpuPlugin(BackendPlugin):
    spec = BackendSpec(
        "webgpu", "VulkanBackend", device="gpu",
        description="WebGPU: browsers, and native Dawn on Metal or Vulkan",
    )  # fmt: skip
    options = (
        Option("require_dynamic_shapes", ON_OFF, default="OFF",
               help="take only ops whose kernels can resize"),
    )  # fmt: skip

    def composer_unavailable_reason(self, backend):
        return unavailable_reason()

    def composer_operator_support(self, backend, program, options):
        vulkan_options = {**VULKAN_OPTIONS, **self.checked_options(options)}
        return vulkan_support(program, vulkan_options, operator_allowlist=webgpu_ops())

    def composer_ops_to_not_decompose(self, backend, program, options):
        with quiet():
            from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
                ops_not_to_decompose,
            )
            from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge

        implemented = webgpu_ops()
        return [op for op in ops_not_to_decompose if aten_to_edge(op) in implemented]

    def composer_compile_specs(self, backend, method_name, options):
        with quiet():
            from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
                parse_compile_options,
            )
        # The compile options ExecuTorch's WebGPU harness lowers with; the partitioner-only
        # ones decide support, and VulkanBackend's preprocess ignores them.
        return parse_compile_options({"skip_bool_tensors": True})


plugin = WebGpuPlugin()
