"""The bf16 TCN of gpu_repairs.py (dilated and depthwise Conv1d, length 16..512) on ``cuda``,
its dilated convolutions rewritten as undilated ones (composer.plugins.cuda.undilated), timed in
ExecuTorch's C++ runtime beside eager on the GPU (eager timed twice: the A/A control).

On the GPU machine, after ``source bench/gpu_setup.sh``:

    python3 bench/gpu/tcn_undilated.py --compose-only --out /tmp/programs
    python3 bench/gpu/tcn_undilated.py --runner $ET_ROOT/build/composer_runner/composer_et_runner \
        --out /tmp/programs

One JSON object a line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_repairs import _case

import composer
from composer.run import cpp_runtime

LENGTHS = (16, 200, 512)


def compose(out: str) -> dict:
    model, inputs, shapes, stack = _case("tcn_cuda")
    started = time.perf_counter()
    composition = composer.compose(model, stack, inputs, dynamic_shapes=shapes, cache=False)
    plan = composition.plan
    path = composition.save(os.path.join(out, "tcn.pte"))
    return {
        "compose_s": round(time.perf_counter() - started, 1),
        "ops_on": {b: dict(plan.ops_on(b)) for b in (*plan.backends, "portable")},
        "fallbacks": len(plan.fallbacks),
        "repairs": [r.why[:200] for r in plan.repairs],
        "proof": plan.proof[:400],
        "written": [str(path), *(str(Path(out) / n) for n in composition.data_files)],
    }


def _eager_ms(model, x, repeats: int) -> float:
    with torch.no_grad():
        for _ in range(5):
            model(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def timed(runner: str, out: str, repeats: int) -> list[dict]:
    model, _inputs, _shapes, _stack = _case("tcn_cuda")
    model = model.cuda()
    pte = os.path.join(out, "tcn.pte")
    data = [os.path.join(out, n) for n in os.listdir(out) if n.endswith(".ptd")]
    rows = []
    for length in LENGTHS:
        torch.manual_seed(length)
        x = torch.randn(1, 80, length, dtype=torch.bfloat16)
        eager_a = _eager_ms(model, x.cuda(), repeats)
        outputs, seconds = cpp_runtime.run_pte(runner, pte, data, [x], repeats=repeats)
        eager_b = _eager_ms(model, x.cuda(), repeats)
        with torch.no_grad():
            want = model.double()(x.cuda().double()).float().cpu()
            model.to(torch.bfloat16)
        got = outputs[0].float()
        runtime_ms = statistics.median(seconds) * 1e3
        rows.append({
            "length": length, "et_runtime_ms": round(runtime_ms, 3),
            "eager_ms": round(eager_a, 3), "eager_again_ms": round(eager_b, 3),
            "ratio": round(runtime_ms / min(eager_a, eager_b), 2),
            "max_abs_vs_fp64": float((got - want).abs().max()),
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/programs")
    parser.add_argument("--compose-only", action="store_true")
    parser.add_argument("--runner")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.compose_only or not os.path.exists(os.path.join(args.out, "tcn.pte")):
        print(json.dumps(compose(args.out)), flush=True)
    if args.runner:
        for row in timed(args.runner, args.out, args.repeats):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
