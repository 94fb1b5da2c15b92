"""Repairs of a refused compile, on the CPU: a stand-in backend whose compiler refuses a partition
as AOTInductor's max-autotune does ("NoValidChoicesError": its Triton convolution templates
take no dilation, and CudaBackend allows no ATen choice). Only the refused partition leaves
the backend, and the repair says Inductor's words. (On the GPU, the cuda plugin declines a
dilated convolution up front: tests/test_aoti_plugins.py, bench/gpu/gpu_repairs.py.)"""

from __future__ import annotations

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from plugins_for_tests import registry_with
from torch import nn
from torch._inductor.select_algorithm import NoValidChoicesError
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer import BackendSpec
from composer.contract.hookspecs import hookimpl

INDUCTOR_SAID = (
    "No choices to select. Provided reason: No choices exist for backend. please consider "
    "adding ATEN into max_autotune_conv_backends config (defined in torch/_inductor/config.py) "
    "to allow at least one choice."
)  # what the H100 said of a bf16 TCN's dilated convolution


class TritonConvOnlyBackend(BackendDetails):
    """Compiles a partition unless it holds a dilated convolution, which it refuses as Inductor
    does with Triton templates only."""

    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        for node in edge_program.graph_module.graph.nodes:
            if "convolution" in str(node.target) and any(d != 1 for d in node.args[5]):
                raise NoValidChoicesError(INDUCTOR_SAID)
        return PreprocessResult(processed_bytes=b"compiled")


class ConvsAndRelus(OperatorSupportBase):
    def is_node_supported(self, submodules, node) -> bool:
        return composer.op_name(node) in ("aten.convolution.default", "aten.relu.default")


class TritonConvOnlyPlugin:
    def __init__(self) -> None:
        self.spec = BackendSpec("tritonconv", "TritonConvOnlyBackend")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return ConvsAndRelus()


class Tcn(nn.Module):
    """A plain convolution, then (past a cumsum no convolution backend takes) a dilated one."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Conv1d(8, 16, 3, padding=1)
        self.dilated = nn.Conv1d(16, 16, 3, dilation=2, padding=2)

    def forward(self, x):
        y = torch.relu(self.plain(x)).cumsum(-1)
        return torch.relu(self.dilated(y))


def test_only_the_partition_inductor_refused_leaves_its_backend():
    registry = registry_with(TritonConvOnlyPlugin())
    said: list[str] = []
    composition = composer.compose(
        Tcn().eval(), ["tritonconv", "xnnpack"], (torch.randn(1, 8, 20),),
        registry=registry, cache=False, progress=said.append,
    )  # fmt: skip
    plan = composition.plan
    (repair,) = plan.repairs
    assert repair.backend == "tritonconv"
    assert repair.why == f"failed to lower: NoValidChoicesError: {INDUCTOR_SAID}"
    assert repair.moved_to == {"xnnpack": 2}  # the dilated convolution and its relu
    # The plain convolution's partition compiled and stays.
    assert plan.ops_on("tritonconv") == {"aten.convolution.default": 1, "aten.relu.default": 1}
    # A stand-in's delegate has no runtime here: the proof says so rather than pass.
    assert plan.proof == "not run here: the runtime has no TritonConvOnlyBackend"
    assert any("NoValidChoicesError" in line and "leave tritonconv" in line for line in said)
