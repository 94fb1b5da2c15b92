"""Jobs as Ray tasks, on every node of a cluster (``composer sweep --ray auto|ADDRESS``).

Ray is an optional extra (``executorch-composer[ray]``). A task whose node dies is run again
elsewhere (``max_retries``); the driver writes each job's record once, as it comes. A job that
needs a GPU asks Ray for one (``num_gpus``), and a sweep timed on a named device asks every job
for the custom resource the node that has it declares (``ray start --resources
'{"device:h100": 1}'``), so CPU nodes compose while device nodes time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from composer.contract.errors import ComposerError
from composer.fleet.jobs import Job, run_job

RETRIES = 3  # runs of a task whose worker or node died, beyond the first


def run_on_ray(
    jobs: Sequence[Job],
    address: str,
    bench: int,
    done: Callable[[dict[str, Any]], None],
    resources: Callable[[Job], Mapping[str, Any]],
) -> None:
    """Run ``jobs`` on the Ray cluster at ``address`` ("auto": the one this machine joined),
    handing each record to ``done`` as it comes."""
    try:
        import ray
    except ImportError as error:
        raise ComposerError(
            "--ray needs Ray: pip install 'executorch-composer[ray]' (or ray==2.60.0), or leave "
            "--ray out to run the jobs in local processes."
        ) from error
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
        except ConnectionError as error:
            raise ComposerError(
                f"no Ray cluster at {address!r}: start one with `ray start --head` (workers join "
                f"with `ray start --address HEAD:6379`), or leave --ray out. ({error})"
            ) from error
    task = ray.remote(max_retries=RETRIES)(run_job)
    pending = {
        task.options(**resources(job)).remote({"model": job.model, "stack": job.stack}, bench): job
        for job in jobs
    }
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            job = pending.pop(ref)
            try:
                record = ray.get(ref)
            except ray.exceptions.RayError as error:  # its retries spent
                record = {"model": job.model, "stack": job.stack, "ok": False,
                          "error": f"the Ray task failed: {type(error).__name__}: {error}"[:2000]}  # fmt: skip
            done(record)
