"""What measured placement costs next to one priority compose (issue 42 item 3).

    .venv/bin/python bench/placement/placement_cost_bench.py [--models transformer_block,mlp,cnn,gru] \
        [--stack openvino,xnnpack] [--json bench/results/placement_cost_NAME.json] [--profile]

For each zoo model, in one process: ``composer.compose(model, stack, inputs, cache=False)`` (a
priority compose, as a user waits for it: export, lowering, ``to_executorch``, the proof), the
same again (an A/A control: what one compose's time varies by), then the same with
``placement="measured"``. Every compose gets a fresh, empty ``$COMPOSER_CACHE_DIR``, so nothing
an earlier compose (or an earlier run of this script) left on disk helps it. The measured
compose's progress lines are timestamped, and summed into phases (composing candidates, the
region search, timing rounds, traces, the chosen program's proof) to say where its time went;
``--profile`` adds cProfile's top functions by cumulative time.

Prints a table (priority s, priority again s, measured s, measured / priority, the chosen
candidate) and writes the rows, with the phases, as JSON.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import tempfile
import time
import warnings
from pathlib import Path

MODELS = "transformer_block,mlp,cnn,gru"
STACK = "openvino,xnnpack"

# The progress line that starts each phase of a measured compose, by its first words; a phase
# lasts until the next line (the last, until the compose returns).
PHASES = (
    ("placement: composing", "composing candidates"),
    ("placement: ranking", "ranking candidates"),
    ("placement: regions: what each", "regions: plans"),
    ("placement: regions: composing", "regions: composing layouts"),
    ("placement: regions: tracing", "regions: tracing"),
    ("placement: regions: chose", "regions: choosing"),
    ("placement: timing", "timing round 1"),
    ("placement: confirming", "timing round 2"),
    ("placement: tracing", "traces of candidates"),
    ("placement: proving", "proving the chosen program"),
)


def _phase(line: str) -> str:
    for start, name in PHASES:
        if line.startswith(start):
            return name
    return "other"


def _fresh_cache(root: Path, name: str) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["COMPOSER_CACHE_DIR"] = str(folder)


def bench_model(name: str, stack: str, root: Path, profile: bool) -> dict:
    import composer
    from composer.models import zoo

    model, inputs = zoo.load(name)
    seconds = {}
    for side in ("priority", "priority_again"):
        _fresh_cache(root, f"{name}-{side}")
        started = time.perf_counter()
        composer.compose(copy.deepcopy(model), stack, inputs, cache=False)
        seconds[side] = time.perf_counter() - started
    _fresh_cache(root, f"{name}-measured")
    lines: list[tuple[float, str]] = []
    started = time.perf_counter()

    def progress(line: str) -> None:
        if line.startswith("placement:"):
            lines.append((time.perf_counter() - started, line))

    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    composition = composer.compose(
        copy.deepcopy(model), stack, inputs, cache=False, placement="measured", progress=progress
    )
    seconds["measured"] = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
    phases: dict[str, float] = {}
    ends = [t for t, _ in lines[1:]] + [seconds["measured"]]
    for (at, line), end in zip(lines, ends, strict=True):
        phases[_phase(line)] = phases.get(_phase(line), 0.0) + end - at
    if lines:
        phases["before the first candidate"] = lines[0][0]
    placement = composition.plan.placement.to_dict()  # the plan's JSON form
    row = {
        "model": name,
        "stack": stack,
        "priority_s": round(seconds["priority"], 2),
        "priority_again_s": round(seconds["priority_again"], 2),
        "measured_s": round(seconds["measured"], 2),
        "ratio": round(seconds["measured"] / seconds["priority"], 2),
        "chosen": placement["chosen"],
        "proof": composition.plan.proof,
        "candidates": [
            {k: c[k] for k in ("candidate", "median_us", "confirmed_median_us", "note")}
            for c in placement["candidates"]
        ],
        "regions_chosen": placement["regions"].get("chosen"),
        "phases_s": {k: round(v, 2) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])},
        "progress": [(round(t, 2), line) for t, line in lines],
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        row["profile"] = text.getvalue()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--stack", default=STACK)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import composer
    from composer.models import zoo

    # One compose first, not timed: imports and the runtime's first load are not a compose's.
    model, inputs = zoo.load("mlp")
    with tempfile.TemporaryDirectory() as warm:
        os.environ["COMPOSER_CACHE_DIR"] = warm
        composer.compose(model, args.stack, inputs, cache=False)
    rows = []
    print("| model | priority s | priority again s | measured s | measured / priority | chose |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for name in args.models.split(","):
            row = bench_model(name, args.stack, Path(root), args.profile)
            rows.append(row)
            print(f"| {name} | {row['priority_s']:.2f} | {row['priority_again_s']:.2f} | "
                  f"{row['measured_s']:.2f} | {row['ratio']:.2f}x | {row['chosen']} |",
                  flush=True)  # fmt: skip
    for row in rows:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in row["phases_s"].items())
        print(f"{row['model']}: {phases}")
        if "profile" in row:
            print(row["profile"])
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"machine": platform.processor() or platform.machine(),
                  "cores": os.cpu_count(), "rows": rows}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
