"""Measured placement over the zoo, side by side with eager, each backend alone and priority.

    .venv/bin/python bench/placement/placement_bench.py [--models mlp,unet] [--stacks "openvino,xnnpack;xnnpack,openvino"] [--runs 100] [--json out.json]

For every model: each backend alone, each stack with priority placement, and each stack with
``placement="measured"`` (which composes its candidates, times them in the pip ExecuTorch
runtime and keeps the fastest) are composed, and the per-region candidate that measured
placement's search found (composer.measure.region_search), composed again from its node pins; then eager
and every distinct program are timed together, interleaved in blocks
(``composer.measure.latency.interleaved``), so every ratio in a row comes from one run. Programs that
lower to the same bytes are timed once. "best whole" is the fastest of each backend alone and
each stack's priority program.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import warnings

import torch

import composer
from composer.contract.errors import ComposerError
from composer.measure.latency import interleaved
from composer.models import zoo
from composer.run.compare import compare
from composer.run.runtime import LoadedProgram

MODELS = ("mlp", "cnn", "mobilenet", "transformer_block", "llama_block", "gru", "cumsum_mlp",
          "unet", "unet_bilinear")  # fmt: skip
STACKS = ("openvino,xnnpack", "xnnpack,openvino")
HEADER = (
    "| model | stack | eager us | xnnpack alone us | openvino alone us | priority us "
    "| measured chose | measured us | measured vs best single | measured vs priority "
    "| measured max abs error | per region: estimated us | per region us "
    "| per region vs best whole |"
)


def bench_model(name: str, stacks: list[list[str]], runs: int) -> list[dict]:
    """One model: compose every program, time them all with eager in one interleaved run."""
    model, inputs = zoo.load(name)
    singles = sorted({backend for stack in stacks for backend in stack})
    # Keyed by placement.Candidate labels: a measured choice that is the same configuration as
    # a program composed here is that program (an OpenVINO blob differs between two lowerings
    # of one model, so the bytes alone would not tell).
    programs = {}
    for backend in singles:
        try:
            programs[f"{backend} alone"] = composer.compose(model, [backend], inputs)
        except ComposerError:
            pass  # it cannot lower this model (the table says "does not lower")
    chosen = {}
    for stack in stacks:
        label = ",".join(stack)
        programs[f"{label} (priority)"] = composer.compose(model, stack, inputs)
    for stack in stacks:
        measured = composer.compose(model, stack, inputs, placement="measured", cache=False)
        chosen[",".join(stack)] = measured.plan.placement.to_dict()  # for the JSON rows
        programs.setdefault(measured.plan.placement.chosen, measured)
        mixed = next((c for c in measured.plan.placement.candidates if c.pins), None)
        if mixed is not None and mixed.candidate not in programs:
            # The search's candidate, composed as its config would: strict order, node pins.
            programs[mixed.candidate] = composer.compose(
                model, stack, inputs, placement="strict", never=mixed.pins
            )
    eager = copy.deepcopy(model)
    with torch.no_grad():
        expected = eager(*inputs)
    digests = {label: hashlib.sha256(c.buffer).hexdigest() for label, c in programs.items()}
    loaded, errors = {}, {}
    for label, composition in programs.items():
        digest = digests[label]
        if digest not in loaded:
            loaded[digest] = LoadedProgram(composition.buffer)
            _ok, errors[digest] = compare(loaded[digest].run(inputs), expected)
    calls = {"eager": lambda: eager(*inputs)}
    calls.update({digest: program.timed_call(inputs) for digest, program in loaded.items()})
    with torch.no_grad():
        timed = interleaved(calls, runs)
    us = {label: timed[digests[label]].median_us for label in programs}
    rows = []
    whole = [us[k] for k in us if k.endswith((" alone", " (priority)"))]
    for stack in stacks:
        label = ",".join(stack)
        best = min(us[f"{b} alone"] for b in stack if f"{b} alone" in us)
        kept = chosen[label]["chosen"]
        measured = us[kept]
        mixed = us.get(f"{label} (per region)")
        rows.append({
            "model": name,
            "stack": label,
            "eager_us": timed["eager"].median_us,
            **{f"{b}_alone_us": us.get(f"{b} alone") for b in singles},
            "priority_us": us[f"{label} (priority)"],
            "measured_chose": kept,
            "measured_us": measured,
            "measured_vs_best_single": best / measured,
            "measured_vs_priority": us[f"{label} (priority)"] / measured,
            "measured_max_abs_error": errors[digests[kept]],
            "per_region_estimated_us": chosen[label].get("regions", {}).get("estimated_us"),
            "per_region_us": mixed,
            "per_region_vs_best_whole": None if mixed is None else min(whole) / mixed,
            "runs": runs,
            "placement": chosen[label],
        })  # fmt: skip
    return rows


def _us(value: float | None, missing: str = "does not lower") -> str:
    return missing if value is None else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--stacks", default=";".join(STACKS))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    stacks = [stack.split(",") for stack in args.stacks.split(";")]
    # Other work on the machine moves absolute times a lot; the load says how much to trust them.
    print("load average (1, 5, 15 min) at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(HEADER)
    print("|---" * HEADER.count(" | ") + "|---|")
    rows = []
    for name in args.models.split(","):
        for row in bench_model(name, stacks, args.runs):
            rows.append(row)
            print(
                f"| {name} | {row['stack']} | {row['eager_us']:.1f} "
                f"| {_us(row.get('xnnpack_alone_us'))} | {_us(row.get('openvino_alone_us'))} "
                f"| {row['priority_us']:.1f} | {row['measured_chose']} | {row['measured_us']:.1f} "
                f"| {row['measured_vs_best_single']:.2f}x | {row['measured_vs_priority']:.2f}x "
                f"| {row['measured_max_abs_error']:.2g} | {_us(row['per_region_estimated_us'], '-')} "
                f"| {_us(row['per_region_us'], '-')} | {_x(row['per_region_vs_best_whole'])} |",
                flush=True,
            )
    print("load average (1, 5, 15 min) at end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
