"""Peak memory of a proven compose beside plain ExecuTorch's lowering and one run (session 31).

    .venv/bin/python bench/compose/proof_memory_bench.py [--models vgg11,resnet50]
        [--stack openvino,xnnpack] [--static] [--hows plain,composer,plain]

Each row is one fresh process: a torchvision model exported at the sizes ExecuTorch's backend
test suite uses (``16 * Dim`` height and width, 16 to 256; ``--static``: 224 only), then either
plain ExecuTorch (``to_edge_transform_and_lower`` with the stack's partitioners as the suite's
testers build them, ``to_executorch``, one run in the pip runtime) or ``composer.compose(program,
stack)`` (its proof at every size the dims allow, and its repairs). The number is the process's
peak resident memory (``ru_maxrss``), imports and the model included, and its wall time. Plain
runs twice: its two peaks are the A/A control.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
started = time.perf_counter()
import torch
from torch.export import Dim
from composer.models.corpus import define_torchvision_ops
define_torchvision_ops()
import torchvision

name, how, stack, static = sys.argv[1:5]
torch.manual_seed(0)
model = getattr(torchvision.models, name)().eval()
inputs = (torch.randn(1, 3, 224, 224),)
dims = ({2: 16 * Dim("height", min=1, max=16), 3: 16 * Dim("width", min=1, max=16)},)
program = torch.export.export(model, inputs, dynamic_shapes=None if static == "1" else dims)
if how == "composer":
    import composer
    try:
        plan = composer.compose(program, stack, inputs, cache=False).plan
        said = "; ".join([plan.proof, *(f"{r.partition}: {r.why[:120]}" for r in plan.repairs)])
    except composer.ComposerError as refused:
        said = f"refused: {refused}"
else:
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime
    partitioners = []
    for backend in stack.split(","):
        if backend == "openvino":
            from executorch.backends.openvino.partitioner import OpenvinoPartitioner
            from executorch.exir.backend.backend_details import CompileSpec
            partitioners.append(OpenvinoPartitioner([CompileSpec("device", b"CPU")]))
        else:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
            partitioners.append(XnnpackPartitioner())
    try:
        lowered = to_edge_transform_and_lower(program, partitioner=partitioners)
        buffer = lowered.to_executorch().buffer
        Runtime.get().load_program(buffer).load_method("forward").execute(list(inputs))
        said = "lowered and ran once"
    except Exception as failed:  # plain's own failure is a row of the table, not the bench's
        said = f"failed: {type(failed).__name__}: {failed}"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
seconds = round(time.perf_counter() - started, 1)
print(json.dumps({"model": name, "how": how, "peak_gib": round(peak, 2), "seconds": seconds, "said": said[:600]}))
"""


def peak(name: str, how: str, stack: str, static: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, name, how, stack, str(int(static))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"model": name, "how": how, "error": done.stderr[-500:]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg11")
    parser.add_argument("--stack", default="xnnpack")
    parser.add_argument("--static", action="store_true", help="export at 224x224 only")
    parser.add_argument("--hows", default="plain,composer,plain")
    args = parser.parse_args()
    hows = args.hows.split(",")
    for name in args.models.split(","):
        rows = []
        for how in hows:
            rows.append(peak(name, how, args.stack, args.static))
            print(json.dumps(rows[-1]), flush=True)
        plains = [r["peak_gib"] for r in rows if r["how"] == "plain" and "peak_gib" in r]
        if hows == ["plain", "composer", "plain"] and len(plains) == 2 and "peak_gib" in rows[1]:
            print(f"{name}: composer {rows[1]['peak_gib']} GiB, plain {plains[0]} and "
                  f"{plains[1]} GiB (A/A {plains[1] / plains[0]:.2f}x); "
                  f"composer/plain {rows[1]['peak_gib'] / plains[0]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
