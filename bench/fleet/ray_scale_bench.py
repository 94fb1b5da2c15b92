"""Issue 43 item 4: sweep throughput on Ray with 1 and 2 worker nodes of one CPU each, beside the
local-process executor with 1 and 2 workers, and Ray's overhead per job beside the job itself.

    .venv/bin/python bench/fleet/ray_scale_bench.py [--models zoo:mlp,...] \
        [--runs ray:1,ray:2,local:1,local:2,ray:1,ray:2] [--out bench/results/ray_scale_cpu.json]

Each Ray run starts its own cluster on the loopback address (composer.fleet.on_ray's
loopback_cluster: a head node of no CPUs, N nodes of one CPU), and each run of either executor
has its own empty composer cache (COMPOSER_CACHE_DIR, set before the nodes or worker processes
start), so every job composes. The sweep's wall time is from ``composer.sweep`` being called to
its return; the cluster's start is timed apart (a real cluster is up before a sweep).

Overhead per job: each worker's share of the wall time that its jobs did not spend in their own
seconds, ``(wall * workers - sum of job seconds) / jobs``; and, from the jobs' start times
(``started`` in each record) and worker pids, where it goes: sweep start to a worker's first job
(worker start, imports, scheduling), the gap between a job's end and the next on the same
worker (hand-over), and the last job's end to the sweep's return.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime

MODELS = (
    "zoo:mlp,zoo:cnn,zoo:cumsum_mlp,zoo:cond,zoo:gru,zoo:resnet,zoo:mobilenet,zoo:transformer_block"
)


def timeline(records: list[dict], began: float, ended: float) -> dict:
    """Where each worker's time went, from the jobs' own start times and seconds."""
    by_worker: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        by_worker[(record["host"], record["pid"])].append(record)
    first, gaps, last = [], [], []
    for jobs in by_worker.values():
        jobs.sort(key=lambda r: r["started"])
        first.append(jobs[0]["started"] - began)
        gaps += [b["started"] - (a["started"] + a["seconds"]) for a, b in itertools.pairwise(jobs)]
        last.append(ended - (jobs[-1]["started"] + jobs[-1]["seconds"]))
    return {
        "worker_processes": len(by_worker),
        "jobs_per_worker": sorted(len(jobs) for jobs in by_worker.values()),
        "to_first_job_s": round(statistics.mean(first), 2),
        "between_jobs_s_median": round(statistics.median(gaps), 3) if gaps else None,
        "between_jobs_s_max": round(max(gaps), 3) if gaps else None,
        "after_last_job_s": round(statistics.mean(last), 2),
    }


def run(models: list[str], executor: str, workers: int) -> dict:
    import composer

    os.environ["COMPOSER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ray_scale_cache_")
    results = tempfile.mktemp(suffix=".jsonl")
    load = os.getloadavg()[0]
    row: dict = {"executor": executor, "workers": workers, "load_at_start": round(load, 2)}
    if executor.startswith("ray"):
        from composer.fleet.on_ray import loopback_cluster

        # Ray starts its workers at nice 15 (RAY_worker_niceness): on a machine shared with
        # other work (the driver at 0, here another session's benchmarks) they get the rest
        os.environ.pop("RAY_worker_niceness", None)
        if executor == "ray-nice0":
            os.environ["RAY_worker_niceness"] = "0"

        started = time.perf_counter()
        with loopback_cluster(worker_nodes=workers) as cluster:
            row["cluster_start_s"] = round(time.perf_counter() - started, 1)
            if executor == "ray-warm":
                started = time.perf_counter()
                row["warm_pids"] = _warm_workers(cluster.address, workers)
                row["warm_s"] = round(time.perf_counter() - started, 1)
            began, started = time.time(), time.perf_counter()
            summary = composer.sweep(models, ["xnnpack"], results=results, ray=cluster.address)
            wall, ended = time.perf_counter() - started, time.time()
    else:
        began, started = time.time(), time.perf_counter()
        summary = composer.sweep(models, ["xnnpack"], results=results, workers=workers)
        wall, ended = time.perf_counter() - started, time.time()
    records = list(summary.records)
    own = [r["seconds"] for r in records]
    row.update(
        jobs=len(own),
        ok=sum(r["ok"] for r in records),
        wall_s=round(wall, 1),
        jobs_per_min=round(60 * len(own) / wall, 2),
        job_s_median=round(statistics.median(own), 2),
        job_s_sum=round(sum(own), 1),
        overhead_per_job_s=round((wall * workers - sum(own)) / len(own), 2),
        timeline=timeline(records, began, ended),
        job_s={r["model"]: r["seconds"] for r in records},
    )
    failed = [f"{r['model']}: {r.get('error', '')[:200]}" for r in records if not r["ok"]]
    if failed:
        row["failed"] = failed
    return row


def _a_first_job() -> int:
    """What a worker's first job pays beyond the job itself (imports, torch.export's and
    ExecuTorch's first calls: zoo:mlp took 6 s as a worker's first job, 1-2 s later), paid
    on a job that is not in the sweep: zoo:mlp composed without the cache."""
    import executorch.exir  # noqa: F401 - what composer.fleet.jobs.run_job imports first

    from composer.models.model_source import load_model
    from composer.pipeline.compose import compose

    model, inputs = load_model("zoo:mlp")
    compose(model, "xnnpack", inputs, cache=False)
    return os.getpid()


def _warm_workers(address: str, workers: int) -> list[int]:
    """One first job a node (:func:`_a_first_job`), all at once (one CPU each: one a node),
    so the sweep's jobs find their workers started and warm, as a driver's second sweep does:
    Ray keeps a driver's worker processes between tasks. Returns their pids."""
    import ray

    ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    task = ray.remote(num_cpus=1)(_a_first_job)
    return sorted(ray.get([task.remote() for _ in range(workers)]))


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], capture_output=True, text=True, check=False
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--runs", default="ray:1,ray:2,local:1,local:2,ray:1,ray:2,local:1,local:2",
                        help="EXECUTOR:WORKERS, each executor ray, ray-warm (its workers started "
                        "and through a first job before the sweep), ray-nice0 (Ray's workers at "
                        "nice 0, as local ones) or local")  # fmt: skip
    parser.add_argument("--out", default="bench/results/ray_scale_cpu.json")
    args = parser.parse_args()
    models = args.models.split(",")
    rows = []
    for spec in args.runs.split(","):
        executor, workers = spec.split(":")
        rows.append(run(models, executor, int(workers)))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "job_s"}), flush=True)
    commit = _git("rev-parse", "--short", "HEAD")
    if _git("status", "--porcelain"):
        commit += " + changes"
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "cores": os.cpu_count(),
        "models": models,
        "stack": "xnnpack",
        "runs": rows,
    }
    with open(args.out, "w") as file:
        json.dump(out, file, indent=1)
    print()
    print("| executor | workers | wall s | jobs/min | job median s | overhead s/job | "
          "to first job s | between jobs s | load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        # against the mean of the same executor's one-worker runs
        ones = [r["jobs_per_min"] for r in rows
                if r["executor"] == row["executor"] and r["workers"] == 1]  # fmt: skip
        base = statistics.mean(ones) if ones else row["jobs_per_min"]
        line = row["timeline"]
        timeline_cells = f"{line['to_first_job_s']} | {line['between_jobs_s_median']}"
        print(f"| {row['executor']} | {row['workers']} | {row['wall_s']} | {row['jobs_per_min']} "
              f"({row['jobs_per_min'] / base:.2f}x) | {row['job_s_median']} | "
              f"{row['overhead_per_job_s']} | {timeline_cells} | {row['load_at_start']} |")  # fmt: skip


if __name__ == "__main__":
    main()
