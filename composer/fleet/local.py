"""Jobs in local worker processes: the default, with nothing beyond composer's own install."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from composer.fleet.jobs import Job, run_job


def run_locally(
    jobs: Sequence[Job],
    workers: int,
    bench: int,
    done: Callable[[dict[str, Any]], None],
    placement: str = "priority",
) -> None:
    """Run ``jobs`` in ``workers`` processes, handing each record to ``done`` as it comes.
    Processes are spawned, not forked: each imports torch and ExecuTorch afresh, as a job on
    another machine would."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {
            pool.submit(run_job, {"model": job.model, "stack": job.stack}, bench, placement): job
            for job in jobs
        }
        for future in as_completed(futures):
            job = futures[future]
            try:
                record = future.result()
            except BrokenProcessPool as error:
                # a worker died (out of memory, a crash in a backend's native code)
                record = {"model": job.model, "stack": job.stack, "ok": False,
                          "error": f"the worker process died: {error}"}  # fmt: skip
            done(record)
