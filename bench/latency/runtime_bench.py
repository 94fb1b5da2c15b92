"""CPU runtime benchmark: each zoo model as eager, on each backend alone, and composed.

    .venv/bin/python bench/latency/runtime_bench.py                       # the default models
    .venv/bin/python bench/latency/runtime_bench.py --models mlp,cnn --runs 300 --json out.json

For every model it composes `xnnpack` alone, `openvino` alone, `xnnpack,openvino` and
`openvino,xnnpack`, runs each .pte in the pip ExecuTorch runtime (the compiled XNNPACK and
OpenVINO code executes), and times them together with eager in one interleaved loop, so the
ratios within a model hold on a noisy machine. Prints a markdown table: delegate calls,
median and p90 microseconds, speed against eager, and the largest error against eager.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import warnings

import torch

import composer
from composer.measure.latency import interleaved
from composer.models import zoo
from composer.run.compare import compare
from composer.run.runtime import LoadedProgram

STACKS = (["xnnpack"], ["openvino"], ["xnnpack", "openvino"], ["openvino", "xnnpack"])
MODELS = ("mlp", "cnn", "mobilenet", "transformer_block", "llama_block", "gru", "cumsum_mlp")


def bench_model(name: str, runs: int) -> list[dict]:
    model, inputs = zoo.load(name)
    eager = copy.deepcopy(model).eval()
    with torch.no_grad():
        expected = eager(*inputs)
    programs: dict[str, LoadedProgram] = {}
    rows: dict[str, dict] = {"eager": {"program": "eager", "delegate_calls": None, "error": 0.0}}
    for stack in STACKS:
        label = ",".join(stack)
        composition = composer.compose(model, stack, inputs)
        loaded = LoadedProgram(composition.buffer)
        ok, error = compare(loaded.run(inputs), expected, composition.plan.tolerance())
        programs[label] = loaded
        rows[label] = {
            "program": label,
            "delegate_calls": composition.plan.delegate_calls,
            "portable_ops": len(composition.plan.nodes_on("portable")),
            "error": error,
            "ok": ok,
        }
    candidates = {"eager": lambda: eager(*inputs)}
    candidates.update({label: loaded.timed_call(inputs) for label, loaded in programs.items()})
    with torch.no_grad():
        timed = interleaved(candidates, runs)
    for label, latency in timed.items():
        rows[label].update(median_us=latency.median_us, p90_us=latency.p90_us)
    return [dict(row, model=name) for row in rows.values()]


def markdown(results: list[dict]) -> str:
    lines = [
        (
            "| model | program | delegate calls | portable ops | median us | p90 us "
            "| speed vs eager | max abs error |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        eager = next(r for r in results if r["model"] == row["model"] and r["program"] == "eager")
        calls = "-" if row["delegate_calls"] is None else row["delegate_calls"]
        lines.append(
            f"| {row['model']} | {row['program']} | {calls} | {row.get('portable_ops', '-')} "
            f"| {row['median_us']:.0f} | {row['p90_us']:.0f} "
            f"| {eager['median_us'] / row['median_us']:.2f}x | {row['error']:.2g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    results = []
    for name in args.models.split(","):
        print(f"{name}...", file=sys.stderr, flush=True)
        results += bench_model(name, args.runs)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} torch threads, {args.runs} runs")  # fmt: skip
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
