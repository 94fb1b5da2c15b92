"""A dilated convolution, which CUDA's Triton templates refuse, written as undilated ones they
take (``composer_rewrites``), so a TCN stays on the GPU instead of going to portable kernels."""

from __future__ import annotations

import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

import composer
from composer.plugins.cuda.undilated import UndilatedConvolutions


class Dilated(torch.nn.Module):
    """1-D and 2-D convolutions, dilated, padded and strided, at a dynamic length."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv1d(4, 8, 3, dilation=2, padding=2)
        self.second = torch.nn.Conv1d(8, 8, 3, dilation=4, padding=4, stride=2)
        self.third = torch.nn.Conv2d(8, 6, (3, 2), dilation=(2, 3), padding=(1, 2), groups=2)

    def forward(self, x):
        y = self.second(torch.relu(self.first(x)))
        return self.third(y.unsqueeze(2).expand(-1, -1, 7, -1))


class Tcn(torch.nn.Module):
    """A TCN as bench/gpu's: residual dilated Conv1d blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Conv1d(16, 16, 3, dilation=d, padding=d) for d in (1, 2, 4, 8)
        )

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x)) + x
        return x


def test_the_rewritten_convolutions_compute_what_the_dilated_ones_do_at_every_length():
    torch.manual_seed(0)
    model = Dilated().eval()
    length = torch.export.Dim("length", min=20, max=200)
    program = torch.export.export(model, (torch.randn(2, 4, 50),),
                                  dynamic_shapes=({2: length},))  # fmt: skip
    edge = to_edge_transform_and_lower(
        program, transform_passes=[UndilatedConvolutions()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )  # fmt: skip
    graph = edge.exported_program().graph_module.graph
    convolutions = [n for n in graph.nodes if "convolution" in str(n.target)]
    assert len(convolutions) == 3 + 3 + 6  # a convolution a tap
    assert all(list(n.args[5]) == [1] * len(n.args[5]) for n in convolutions)  # none dilated
    rewritten = edge.exported_program().module()
    for size in (20, 51, 200):
        x = torch.randn(2, 4, size)
        torch.testing.assert_close(rewritten(x), model(x), rtol=1e-5, atol=1e-5)


def _plan(**options):
    torch.manual_seed(0)
    model = Tcn().eval().to(torch.bfloat16)
    inputs = (torch.randn(1, 16, 64, dtype=torch.bfloat16),)
    length = torch.export.Dim("length", min=16, max=512)
    stack = composer.Stack(["cuda"], options={"cuda": options} if options else {})
    return composer.plan(model, stack, inputs, dynamic_shapes=({2: length},))


def test_a_tcn_plans_whole_on_cuda_with_its_dilated_convolutions_rewritten():
    plan = _plan()
    on_cuda = plan.ops_on("cuda")
    assert not plan.ops_on("portable"), plan.ops_on("portable")
    assert on_cuda["aten.conv1d.default"] == 1 + 3 * 3  # the undilated block, 3 taps each
    assert on_cuda["aten.slice_copy.Tensor"] > 0
    assert not any("dilation" in why for f in plan.fallbacks for _, why in f.reasons)


def test_without_triton_templates_nothing_is_rewritten():
    # With max_autotune OFF no convolution compiles for CudaBackend (an ATen fallback it has no
    # shim for), dilated or not: rewriting would only make more of them.
    plan = _plan(max_autotune="OFF")
    ops = {
        op: n for backend in plan.backends + ("portable",) for op, n in plan.ops_on(backend).items()
    }
    assert ops["aten.convolution.default"] == 4
    assert "aten.slice_copy.Tensor" not in ops
