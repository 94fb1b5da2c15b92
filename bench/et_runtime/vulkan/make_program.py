"""A small fp32 program lowered with plain ExecuTorch's VulkanPartitioner, for the Vulkan build of
composer_et_runner (bench/et_runtime/vulkan/README.md).

Here (ExecuTorch 1.5.1 in /work/main/.venv):
    .venv/bin/python bench/et_runtime/vulkan/make_program.py
writes, next to this file: program.pte (conv2d + relu + linear, every op in one VulkanBackend
delegate), inputs.bin and expected.bin (eager outputs), in the runner's tensor file format.

On the GPU machine, after the runner ran it (--outputs /tmp/vk_out.bin):
    python3 bench/et_runtime/vulkan/make_program.py --check /tmp/vk_out.bin
compares the outputs with expected.bin (needs numpy only, not ExecuTorch or composer) and prints
one JSON line; exit status 0 when they match within --atol/--rtol.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC = b"ETRUNIO1"


def read_tensors(path: str) -> list:
    """The runner's tensor file as numpy arrays (None for a non-tensor value). A numpy-only
    twin of composer.run.cpp_runtime.read_tensors: the device call that builds the Vulkan
    runner checks it without torch, ExecuTorch's wheel or composer installed."""
    import numpy as np

    dtypes = {
        6: np.float32,
        7: np.float64,
        5: np.float16,
        3: np.int32,
        4: np.int64,
        1: np.int8,
        0: np.uint8,
        2: np.int16,
        11: np.bool_,
    }
    with open(path, "rb") as file:
        data = file.read()
    if data[:8] != MAGIC:
        raise SystemExit(f"{path} is not a tensor file of the runner")
    (count,), at = struct.unpack_from("<I", data, 8), 12
    out = []
    for _ in range(count):
        code, ndim = struct.unpack_from("<iI", data, at)
        at += 8
        sizes = struct.unpack_from(f"<{ndim}q", data, at)
        at += 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", data, at)
        at += 8
        raw = data[at : at + nbytes]
        at += nbytes
        out.append(None if code < 0 else np.frombuffer(raw, dtype=dtypes[code]).reshape(sizes))
    return out


def check(path: str, atol: float, rtol: float) -> int:
    import numpy as np

    got, want = read_tensors(path), read_tensors(os.path.join(HERE, "expected.bin"))
    report = {
        "outputs": len(got),
        "expected": len(want),
        "max_abs_err": [],
        "ok": len(got) == len(want),
    }
    for g, w in zip(got, want):
        if g is None or w is None or g.shape != w.shape:
            report["ok"] = False
            report["max_abs_err"].append(None)
            continue
        err = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if w.size else 0.0
        report["max_abs_err"].append(err)
        report["ok"] = report["ok"] and bool(np.allclose(g, w, atol=atol, rtol=rtol))
    print(json.dumps(report))
    return 0 if report["ok"] else 1


class ConvReluLinear:
    """Built lazily so that --check needs no torch."""

    @staticmethod
    def make():
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
                self.linear = torch.nn.Linear(8 * 16 * 16, 10)

            def forward(self, x):
                y = torch.relu(self.conv(x))
                return self.linear(y.reshape(1, -1))

        return Net()


def make(out_dir: str) -> None:
    import torch
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))
    from composer.run.cpp_runtime import write_tensors

    torch.manual_seed(0)
    model = ConvReluLinear.make().eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
    ep = torch.export.export(model, (x,))
    edge = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])
    graph = edge.exported_program().graph_module
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    delegated = [n for n in calls if "executorch_call_delegate" in str(n.target)]
    leftover = [
        str(n.target) for n in calls if n not in delegated and "getitem" not in str(n.target)
    ]
    program = edge.to_executorch()
    plan = program.executorch_program.execution_plan[0]
    backends = sorted({d.id for d in plan.delegates})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "program.pte"), "wb") as file:
        file.write(program.buffer)
    write_tensors(os.path.join(out_dir, "inputs.bin"), [x])
    write_tensors(os.path.join(out_dir, "expected.bin"), [expected])
    print(
        json.dumps(
            {
                "pte": os.path.join(out_dir, "program.pte"),
                "bytes": len(program.buffer),
                "delegates": len(delegated),
                "backends": backends,
                "ops_outside_delegates": leftover,
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", default=HERE)
    parser.add_argument(
        "--check", metavar="OUTPUTS_BIN", help="compare a runner output file with expected.bin"
    )
    # Vulkan's shaders may run in reduced precision on some devices; fp32 buffers by default.
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--rtol", type=float, default=1e-3)
    args = parser.parse_args()
    if args.check:
        return check(args.check, args.atol, args.rtol)
    make(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
