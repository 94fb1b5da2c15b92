"""Issues 56 and 59 on the GPU machine: the cases composer refused or failed on a GPU stack,
composed and proven (composer's proof; in ExecuTorch's C++ runtime where $COMPOSER_ET_RUNNER
names bench/et_runtime's runner), each beside plain ExecuTorch's ``CudaPartitioner`` list.

Cases (``--cases``, comma-separated):

- ``encoder_xnnpack_cuda``: a 4-layer bf16 transformer encoder (d 256, sequence 2..256
  dynamic) with ``xnnpack,cuda``: ExecuTorch's decomposition failed before partitioning
  ("Cannot view a tensor with shape [s, 1, 8, 32] ... as (s, 256)");
- ``conv1d_cuda``: a bf16 network of 1-D convolutions with a dynamic length, ``cuda``
  (Inductor's max-autotune: NoValidChoicesError);
- ``derived_cuda``: a bf16 model whose frame count is ``4 * Dim(...)``, ``cuda`` (issue 59);
- ``tcn_cuda``: bf16 dilated and depthwise 1-D convolutions, dynamic length, ``cuda``
  (Inductor's Triton convolution template takes neither dilation nor groups);
- ``depthwise_cuda``: a bf16 MobileNet-like block (a depthwise 3x3), dynamic batch, ``cuda``;
- ``deconv_cuda``: a bf16 decoder with a transposed 1-D convolution, dynamic length, ``cuda``
  (declined by the cuda plugin: bf16 on portable kernels).

One JSON object a line on stdout; stderr's line count says how quiet a compose was.

    python3 bench/gpu/gpu_repairs.py --cases encoder_xnnpack_cuda,conv1d_cuda,derived_cuda
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
import traceback

import torch
from torch import nn
from torch.export import Dim

import composer
from composer.run.inputs import sizes_to_prove


class Encoder(nn.Module):
    def __init__(self, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(dim, 8, 2 * dim, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv1d(80, 128, 3, padding=1), nn.GELU(),
            nn.Conv1d(128, 128, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv1d(128, 64, 3, padding=1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


class Frames(nn.Module):
    """A bf16 model over 4 * n frames: a strided convolution halves them twice."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv1d(16, 32, 3, stride=2, padding=1)
        self.second = nn.Conv1d(32, 32, 3, stride=2, padding=1)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.second(torch.relu(self.first(x)))).transpose(1, 2))


class Tcn(nn.Module):
    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv1d(80, channels, 3, padding=1), nn.GELU(),
            nn.Conv1d(channels, channels, 3, dilation=2, padding=2), nn.GELU(),
            nn.Conv1d(channels, channels, 3, dilation=4, padding=4), nn.GELU(),
            nn.Conv1d(channels, channels, 5, groups=channels, padding=2), nn.GELU(),
            nn.Conv1d(channels, 32, 1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


class Depthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU6(),
            nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU6(),
            nn.Conv2d(32, 64, 1), nn.ReLU6(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Deconv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Sequential(
            nn.Conv1d(64, 64, 3, padding=1), nn.GELU(),
            nn.ConvTranspose1d(64, 32, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv1d(32, 16, 3, padding=1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def _case(name: str):
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    if name == "encoder_xnnpack_cuda":
        x = torch.randn(1, 16, 256, dtype=bf16)
        return Encoder().eval().to(bf16), (x,), ({1: Dim("seq", min=2, max=256)},), "xnnpack,cuda"
    if name == "conv1d_cuda":
        x = torch.randn(1, 80, 64, dtype=bf16)
        return Conv1dNet().eval().to(bf16), (x,), ({2: Dim("length", min=8, max=512)},), "cuda"
    if name == "derived_cuda":
        x = torch.randn(1, 16, 64, dtype=bf16)
        frames = 4 * Dim("n", min=2, max=64)
        return Frames().eval().to(bf16), (x,), ({2: frames},), "cuda"
    if name == "tcn_cuda":
        x = torch.randn(1, 80, 64, dtype=bf16)
        return Tcn().eval().to(bf16), (x,), ({2: Dim("length", min=16, max=512)},), "cuda"
    if name == "depthwise_cuda":
        x = torch.randn(2, 3, 64, 64, dtype=bf16)
        return Depthwise().eval().to(bf16), (x,), ({0: Dim("batch", min=1, max=8)},), "cuda"
    if name == "deconv_cuda":
        x = torch.randn(1, 64, 50, dtype=bf16)
        return Deconv().eval().to(bf16), (x,), ({2: Dim("length", min=8, max=400)},), "cuda"
    raise SystemExit(f"unknown case {name}")


def _plain(program: torch.export.ExportedProgram, stack: str) -> dict:
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import to_edge_transform_and_lower

    partitioners = []
    for name in stack.split(","):
        if name == "cuda":
            specs = [CudaBackend.generate_method_name_compile_spec("forward")]
            partitioners.append(CudaPartitioner(specs))
        else:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
                XnnpackPartitioner,
            )

            partitioners.append(XnnpackPartitioner())
    started = time.perf_counter()
    try:
        to_edge_transform_and_lower(program, partitioner=partitioners).to_executorch()
    except Exception as error:  # noqa: BLE001 - plain's failure is the row's data
        return {"plain": f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    return {"plain": "lowered", "plain_s": round(time.perf_counter() - started, 1)}


def run(name: str, out: str) -> dict:
    model, inputs, shapes, stack = _case(name)
    program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    row: dict = {"case": name, "stack": stack}
    row.update(_plain(program, stack))
    err = io.StringIO()
    started = time.perf_counter()
    lines: list[str] = []
    try:
        with contextlib.redirect_stderr(err):
            composition = composer.compose(
                model, stack, inputs, dynamic_shapes=shapes, progress=lines.append
            )
        row["compose_s"] = round(time.perf_counter() - started, 1)
        row["proof"] = composition.plan.proof
        row["repairs"] = [str(r.why)[:300] for r in composition.plan.repairs]
        row["ops_on"] = {b: sum(composition.plan.ops_on(b).values()) for b in stack.split(",")}
        path = os.path.join(out, f"{name}.pte")
        composition.save(path)
        row["written"] = path
        if os.environ.get("COMPOSER_ET_RUNNER"):
            # Every size the proof runs at, again in ExecuTorch's C++ runtime.
            sizes = sizes_to_prove(composition.example_inputs, composition.plan.dynamic_dims)
            row["runner"] = {label: str(composition.verify(x))[:240] for label, x in sizes}
    except Exception as error:  # noqa: BLE001 - the refusal is the row's data
        row["compose_s"] = round(time.perf_counter() - started, 1)
        row["error"] = f"{type(error).__name__}: {error}"[:1500]
        row["traceback"] = traceback.format_exc()[-1500:]
    row["progress"] = [line for line in lines if "failed" in line or "repair" in line][:10]
    row["stderr_lines"] = len(err.getvalue().splitlines())
    row["stderr_head"] = err.getvalue().splitlines()[:5]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="encoder_xnnpack_cuda,conv1d_cuda,derived_cuda")
    parser.add_argument("--out", default="/tmp/programs")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.cases.split(","):
        print(json.dumps(run(name, args.out)), flush=True)


if __name__ == "__main__":
    main()
