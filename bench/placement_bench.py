"""Measured placement over the zoo: what it chose, against priority and each backend alone.

    .venv/bin/python bench/placement_bench.py [--models mlp,cnn] [--stacks "openvino,xnnpack;xnnpack,openvino"]

For every model and stack, ``composer.plan(..., placement="measured", cache=False)`` composes
each candidate (the declared order with priority and strict placement, the other orders, each
backend alone), runs it in the pip ExecuTorch runtime and times them together; this prints
the candidates' medians from that one run, the choice, and its speed-up over the declared
order and over the best single backend.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import composer
from composer import zoo

MODELS = ("mlp", "cnn", "mobilenet", "transformer_block", "llama_block", "gru", "cumsum_mlp")
STACKS = ("openvino,xnnpack", "xnnpack,openvino")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--stacks", default=";".join(STACKS))
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    print("| model | stack | declared (priority) us | best single us | measured chose "
          "| its us | vs declared | vs best single |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model, inputs = zoo.load(name)
        for stack in args.stacks.split(";"):
            plan = composer.plan(model, stack.split(","), inputs, placement="measured", cache=False)
            found = {c["candidate"]: c for c in plan.placement["candidates"]}
            declared = plan.placement["candidates"][0]["median_us"]
            singles = [c["median_us"] for c in found.values() if c["candidate"].endswith(" alone")]
            chosen = found[plan.placement["chosen"]]["median_us"]
            rows.append({"model": name, "stack": stack, **plan.placement})
            print(
                f"| {name} | {stack} | {declared:.1f} | {min(singles):.1f} "
                f"| {plan.placement['chosen']} | {chosen:.1f} | {declared / chosen:.2f}x "
                f"| {min(singles) / chosen:.2f}x |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
