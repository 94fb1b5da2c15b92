"""Peak memory of a proven compose beside plain ExecuTorch's lowering and one run (session 31).

    .venv/bin/python bench/compose/proof_memory_bench.py [--models vgg11,resnet50]

Each row is one fresh process: a torchvision model exported at the sizes ExecuTorch's backend
test suite uses (``16 * Dim`` height and width, 16 to 256), then either plain ExecuTorch
(``to_edge_transform_and_lower`` with XNNPACK's partitioner, ``to_executorch``, one run in
the pip runtime) or ``composer.compose(program, "xnnpack")`` (its proof at every size the dims allow). The number is
the process's peak resident memory (``ru_maxrss``), imports and the model included. Plain runs
twice: its two peaks are the A/A control.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys
import torch
from torch.export import Dim
from composer.models.corpus import define_torchvision_ops
define_torchvision_ops()
import torchvision

name, how = sys.argv[1:3]
torch.manual_seed(0)
model = getattr(torchvision.models, name)().eval()
inputs = (torch.randn(1, 3, 224, 224),)
dims = ({2: 16 * Dim("height", min=1, max=16), 3: 16 * Dim("width", min=1, max=16)},)
program = torch.export.export(model, inputs, dynamic_shapes=dims)
if how == "composer":
    import composer
    said = composer.compose(program, "xnnpack", inputs, cache=False).plan.proof
else:
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    buffer = lowered.to_executorch().buffer
    Runtime.get().load_program(buffer).load_method("forward").execute(list(inputs))
    said = "lowered and ran once"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"model": name, "how": how, "peak_gib": round(peak, 2), "said": said[:90]}))
"""


def peak(name: str, how: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, name, how], capture_output=True, text=True, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"model": name, "how": how, "error": done.stderr[-500:]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg11")
    args = parser.parse_args()
    for name in args.models.split(","):
        rows = [peak(name, how) for how in ("plain", "composer", "plain")]
        for row in rows:
            print(json.dumps(row))
        plains = [r["peak_gib"] for r in rows if r["how"] == "plain" and "peak_gib" in r]
        if len(plains) == 2 and "peak_gib" in rows[1]:
            print(f"{name}: composer {rows[1]['peak_gib']} GiB, plain {plains[0]} and "
                  f"{plains[1]} GiB (A/A {plains[1] / plains[0]:.2f}x); "
                  f"composer/plain {rows[1]['peak_gib'] / plains[0]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
