"""Issue 43 item 4, in part: sweep throughput with 1 and 2 local worker processes on this machine,
beside the jobs' own compose time: jobs per minute, and the executor's overhead per job (a
worker's wall time per job less the job's own seconds: process start, imports, hand-over).

    .venv/bin/python bench/fleet/fleet_bench.py [--models zoo:mlp,zoo:cnn,...] [--workers 1,2]

Each run has its own empty composer cache (COMPOSER_CACHE_DIR), so no run reuses another's
lowered partitions. The Ray executor is measured beside these by bench/fleet/ray_scale_bench.py, on a
loopback cluster (composer.fleet.on_ray.loopback_cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

MODELS = (
    "zoo:mlp,zoo:cnn,zoo:cumsum_mlp,zoo:cond,zoo:gru,zoo:resnet,zoo:mobilenet,zoo:transformer_block"
)


def run(models: list[str], workers: int) -> dict:
    import composer

    os.environ["COMPOSER_CACHE_DIR"] = tempfile.mkdtemp(prefix="fleet_bench_cache_")
    started = time.perf_counter()
    summary = composer.sweep(models, ["xnnpack"], results=tempfile.mktemp(suffix=".jsonl"),
                             workers=workers)  # fmt: skip
    wall = time.perf_counter() - started
    own = [r["seconds"] for r in summary.records]
    return {
        "workers": workers,
        "jobs": len(own),
        "ok": sum(r["ok"] for r in summary.records),
        "wall_s": round(wall, 1),
        "jobs_per_min": round(60 * len(own) / wall, 2),
        "job_s_median": round(statistics.median(own), 2),
        "overhead_per_job_s": round((wall * workers - sum(own)) / len(own), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    rows = [run(args.models.split(","), int(n)) for n in args.workers.split(",")]
    for row in rows:
        print(json.dumps(row), flush=True)
    base = rows[0]["jobs_per_min"]
    for row in rows:
        print(f"{row['workers']} worker(s): {row['jobs_per_min']} jobs/min "
              f"({row['jobs_per_min'] / base:.2f}x), job median {row['job_s_median']} s, "
              f"overhead {row['overhead_per_job_s']} s/job")  # fmt: skip


if __name__ == "__main__":
    main()
