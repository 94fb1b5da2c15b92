"""What the compose-time proof costs next to composing (issue 23 item 4: under 5% on the zoo).

    .venv/bin/python bench/compose/proof_cost_bench.py [--models mlp,cnn] [--stacks xnnpack "openvino,xnnpack"]

For each zoo model and stack, composes twice without the cache, in turns: with the proof
(``check=True``, the default) and without (``check=False``). The proof's own seconds come from
the plan ("ran and matched eager in X s"); the share is those seconds over the whole checked
compose. The two composes' difference is printed beside it as a second view, noisier, since it
also holds the noise of a whole lowering.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import composer
from composer.models import zoo

PROOF_SECONDS = re.compile(r"in ([0-9.]+) s \(")


def measure(name: str, stack: str) -> dict:
    model, inputs = zoo.load(name)
    timed = {True: [], False: []}
    proof = ""
    for _ in range(2):
        for check in (True, False):
            started = time.perf_counter()
            composition = composer.compose(model, stack, inputs, cache=False, check=check)
            timed[check].append(time.perf_counter() - started)
            if check:
                proof = composition.plan.proof
    found = PROOF_SECONDS.search(proof)
    proof_s = float(found.group(1)) if found else None
    checked, unchecked = statistics.median(timed[True]), statistics.median(timed[False])
    return {
        "model": name,
        "stack": stack,
        "proof": proof,
        "compose_s": round(checked, 3),
        "compose_unchecked_s": round(unchecked, 3),
        "proof_s": proof_s,
        "proof_share": None if proof_s is None else round(proof_s / checked, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(sorted(zoo.ZOO)))
    parser.add_argument("--stacks", nargs="+", default=["xnnpack", "openvino,xnnpack"])
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        for stack in args.stacks:
            row = measure(name, stack)
            rows.append(row)
            print(json.dumps(row), flush=True)
    shares = [r["proof_share"] for r in rows if r["proof_share"] is not None]
    print("\n| model | stack | compose s (checked) | unchecked s | proof s | share |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        share = "-" if r["proof_share"] is None else f"{100 * r['proof_share']:.1f}%"
        print(f"| {r['model']} | {r['stack']} | {r['compose_s']:.2f} | "
              f"{r['compose_unchecked_s']:.2f} | {r['proof_s']} | {share} |")  # fmt: skip
    if shares:
        print(f"\nproof share of the compose time: median {100 * statistics.median(shares):.1f}%, "
              f"max {100 * max(shares):.1f}% over {len(shares)} programs that ran")  # fmt: skip


if __name__ == "__main__":
    main()
