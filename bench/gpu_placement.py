"""Measured placement with CUDA in the stack, on the GPU machine.

    source bench/gpu_setup.sh
    python3 bench/gpu_placement.py [--models mlp,cumsum_mlp] [--stack xnnpack,cuda] [--json out.json]

For each model, ``composer.compose(..., placement="measured")`` composes the candidates (the
declared order with priority and strict placement, the other order, each backend alone) and
times them together, interleaved: every candidate runs hosted (``composer.aoti_host``: CUDA
delegates as their compiled .so, XNNPACK delegates in an ExecuTorch runtime (the torch-free
executorch-numpy-runtime under the GPU machine's torch 2.11), the glue in Python).
Prints each candidate's median and the choice against the best single backend.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import composer
from composer import zoo


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cumsum_mlp,transformer_block")
    parser.add_argument("--stack", default="xnnpack,cuda")
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    # Not max_autotune=OFF: Inductor then calls mm/bmm as extern kernels that ExecuTorch's
    # CUDA shims lack, and lowering fails ("missing fallback kernels").
    stack = composer.Stack(args.stack, placement="measured")
    results = []
    for name in args.models.split(","):
        model, inputs = zoo.load(name)
        started = time.perf_counter()
        composition = composer.compose(model, stack, inputs, cache=False)
        seconds = time.perf_counter() - started
        placement = composition.plan.placement
        medians = {c["candidate"]: c["median_us"] for c in placement["candidates"]}
        singles = [v for k, v in medians.items() if k.endswith(" alone") and v is not None]
        chosen = medians.get(placement["chosen"])
        verified = composition.verify()
        print(f"## {name} ({seconds:.0f} s to measure); chose {placement['chosen']}; {verified}")
        for candidate in placement["candidates"]:
            print(f"  {candidate['candidate']:<32} {candidate['median_us']!s:>10} us  "
                  f"calls {candidate['delegate_calls']}  {candidate['note']}")  # fmt: skip
        if singles and chosen:
            print(f"  chosen vs best single backend: {min(singles) / chosen:.2f}x")
        results.append({"model": name, "seconds": seconds, "placement": placement,
                        "verify": str(verified)})  # fmt: skip
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
