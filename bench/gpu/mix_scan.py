"""Issue 42 item 2, on any machine: where a mix of backends could win, read from plans. Each
corpus model is planned (composer.plan: no compile, stand-ins for backends absent here) with
each stack; one JSON line a model and stack pair: nodes per backend, delegate calls, the ops
left to portable kernels. A CUDA delegate call costs about 130 us in the C++ runtime on the H100
(bench/RESULTS.md), so a mix pays for itself only where what it moves off portable kernels costs
more than the calls it adds.

    .venv/bin/python bench/gpu/mix_scan.py --models resnet18,bert --stacks "xnnpack;xnnpack,cuda" \\
        --out bench/results/corpus_xnnpack_cuda_plans_2026-11-27.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import composer
from composer.models import corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.names()))
    parser.add_argument("--stacks", default="xnnpack;xnnpack,cuda")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    stacks = args.stacks.split(";")
    with open(args.out, "a") as out:
        for name in args.models.split(","):
            model, inputs = corpus.load(name)
            row: dict = {"model": name}
            for stack in stacks:
                started = time.perf_counter()
                try:
                    plan = composer.plan(model, stack, inputs, cache=False)
                except composer.ComposerError as error:
                    row[stack] = {"error": str(error)[:300]}
                    continue
                backends = [*stack.split(","), "portable"]
                row[stack] = {
                    "nodes": {b: len(plan.nodes_on(b)) for b in backends},
                    "calls": plan.delegate_calls,
                    "portable_ops": plan.ops_on("portable"),
                    "s": round(time.perf_counter() - started, 1),
                }
            print(json.dumps(row)[:400], flush=True)
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
