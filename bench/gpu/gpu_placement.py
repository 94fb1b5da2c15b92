"""Measured placement with CUDA in the stack, on the GPU machine.

    source bench/gpu_setup.sh
    python3 bench/gpu/gpu_placement.py [--models mlp,cumsum_mlp] [--stack xnnpack,cuda] [--json out.json]

For each model, ``composer.compose(..., placement="measured")`` composes the candidates (the
declared order with priority and strict placement, the other order, each backend alone) and
times them together, interleaved: every candidate runs hosted (``composer.run.piecewise``: CUDA
delegates as their compiled .so, XNNPACK delegates in an ExecuTorch runtime (the torch-free
executorch-numpy-runtime under the GPU machine's torch 2.11), the glue in Python).
With two backends the per-region search runs too, hosted as well (each call timed,
``composer.measure.hosted_trace``). Prints each candidate's median, the choice against the best
single backend, and each region's time per option. ``--models`` takes zoo names and
``cell``/``rnn``/``segmenter``, bench/gpu/gpu_mix.py's models built to mix; ``--threads N`` gives
XNNPACK N threads (the runtime's default is one per core).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings

import composer
from composer.models import zoo


def load(name: str):
    """A zoo model, or one of bench/gpu/gpu_mix.py's models built to mix: ``cell`` (an unrolled GRU
    cell then a wide head, batch 1), ``rnn`` (a 32-step Elman RNN then a 4096-wide head, batch
    1; ``rnn64``: 64 steps) or ``segmenter`` (convolutions, then the logits upsampled to the input's size;
    256x256)."""
    steps = int(name[3:] or 32) if name.startswith("rnn") else 0  # rnn64: 64 steps
    if name not in ("cell", "segmenter") and not steps:
        return zoo.load(name)
    import torch
    from gpu_mix import CellThenWideHead, RNNThenWideHead, Segmenter  # beside this script

    torch.manual_seed(0)
    if name == "cell":
        return CellThenWideHead(32, 64, 16, 1024, 1000).eval(), (torch.randn(1, 16, 32),)
    if steps:
        return RNNThenWideHead(32, 64, steps, 4096, 1000).eval(), (torch.randn(1, steps, 32),)
    return Segmenter().eval(), (torch.randn(1, 3, 256, 256),)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cumsum_mlp,transformer_block")
    parser.add_argument("--stack", default="xnnpack,cuda")
    parser.add_argument("--json")
    parser.add_argument("--threads", type=int, help="XNNPACK's threads (default: one per core)")
    parser.add_argument("--tune-budget", type=float, help="seconds of composing candidates")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    # Not max_autotune=OFF: Inductor then calls mm/bmm as extern kernels that ExecuTorch's
    # CUDA shims lack, and lowering fails ("missing fallback kernels").
    stack = composer.Stack(
        args.stack, placement="measured", threads=args.threads, tune_budget=args.tune_budget
    )
    results = []
    for name in args.models.split(","):
        model, inputs = load(name)
        started = time.perf_counter()
        composition = composer.compose(model, stack, inputs, cache=False)
        seconds = time.perf_counter() - started
        placement = composition.plan.placement.to_dict()  # the plan's JSON form, as written
        medians = {c["candidate"]: c["median_us"] for c in placement["candidates"]}
        singles = [v for k, v in medians.items() if k.endswith(" alone") and v is not None]
        chosen = medians.get(placement["chosen"])
        verified = composition.verify()
        print(f"## {name} ({seconds:.0f} s to measure, XNNPACK on {placement['threads']} "
              f"thread(s)); chose {placement['chosen']}; {verified}")  # fmt: skip
        for candidate in placement["candidates"]:
            print(f"  {candidate['candidate']:<32} {candidate['median_us']!s:>10} us  "
                  f"calls {candidate['delegate_calls']}  {candidate['note']}")  # fmt: skip
        if singles and chosen:
            print(f"  chosen vs best single backend: {min(singles) / chosen:.2f}x")
        searched = placement.get("regions", {})
        for note in searched.get("notes", ()):
            print(f"  per region: {note}")
        if "chosen" in searched:
            print(f"  per region: {len(searched['chosen'])} regions, chose "
                  f"{dict(collections.Counter(searched['chosen']))}, estimated "
                  f"{searched['estimated_us']} us; a call's fixed cost {searched['call_us']}; "
                  f"switches {searched['switch_us']}")  # fmt: skip
            for index, times in enumerate(searched["region_us"]):
                nodes = searched["regions"][index]["nodes"]
                print(f"    region {index} ({len(nodes)} nodes, {nodes[0]}...): {times} -> "
                      f"{searched['chosen'][index]}")  # fmt: skip
        results.append({"model": name, "seconds": seconds, "placement": placement,
                        "verify": str(verified)})  # fmt: skip
        sys.stdout.flush()
        if args.json:  # after each model: a run cut short keeps what it measured
            with open(args.json, "w") as out:
                json.dump(results, out, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
