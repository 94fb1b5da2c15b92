"""Sweeps: many models composed with many stacks, one job each, in local processes or on a
Ray cluster; one record a job in a results file, an HTML table, and the golden comparison
the pytest plugin makes.

    summary = composer.sweep(["zoo:mlp", "zoo:cnn"], ["xnnpack", "openvino,xnnpack"],
                             results="sweep.jsonl", golden="golden/")
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from composer.contract.errors import ComposerError, first_line
from composer.contract.quiet import quiet_call
from composer.fleet.jobs import Job, ResultsFile, jobs_of, run_job
from composer.lower.atomic import (
    FORCE_FLAG,
    InterruptedAfterWriting,
    check_ours,
    check_outputs,
    check_writable,
    write_all,
)
from composer.models.source_files import source_files
from composer.registry.stack import check_placement
from composer.report.golden import describe_golden_diff
from composer.report.sweep_html import differs_from_golden, sweep_counts, sweep_html

__all__ = ["Job", "SweepInterrupted", "SweepSummary", "jobs_of", "run_job", "sweep"]


@attrs.frozen
class SweepSummary:
    """What a sweep did: every job's record (those of earlier runs too, with ``resume``)."""

    records: tuple[dict[str, Any], ...]
    ran: int  # jobs run now
    skipped: int  # jobs whose record an earlier run wrote (resume)

    @property
    def ok(self) -> bool:
        """Every job composed and proven, and matched its golden plan where there is one."""
        return all(r["ok"] and not differs_from_golden(r) for r in self.records)

    def describe(self) -> str:
        counts = sweep_counts(self.records)
        return (
            f"{len(self.records)} job(s): {counts['composed']} composed, "
            f"{counts['failed']} failed, {counts['differ']} differ from their golden plan "
            f"({self.ran} run now, {self.skipped} from an earlier run)"
        )


@quiet_call
def sweep(
    models: Sequence[str],
    stacks: Sequence[str],
    *,
    results: str | os.PathLike = "sweep.jsonl",
    html: str | os.PathLike | None = None,
    golden: str | os.PathLike | None = None,
    update_golden: bool = False,
    resume: bool = False,
    workers: int | None = None,
    ray: str | None = None,
    bench: int = 0,
    device_resource: str | None = None,
    placement: str = "priority",
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> SweepSummary:
    """Compose every model with every stack, each a job; write one record a job to ``results``
    (JSON lines) as it finishes, and ``html`` at the end. ``golden``: compare each plan with
    ``golden/<job>.json`` (``update_golden``: write them). ``resume``: skip the jobs
    ``results`` already holds. Jobs run in ``workers`` local processes (default: half the
    cores, at least one), or as Ray tasks on the cluster at ``ray`` ("auto" or an address);
    ``device_resource`` is a custom Ray resource every job asks for (``device:h100``).
    ``placement``: each job's (``"measured"``: its candidates composed and timed on the node
    that runs the job, so with ``device_resource`` they are timed on that device).
    ``results``, ``html`` and golden files replace only composer's own files of their kind,
    unless ``force``; a file the sweep reads (a manifest, a model) is never replaced."""
    check_placement(placement)
    _check_before_any_work(workers, bench, golden, ray, device_resource)
    say = progress or (lambda line: None)
    jobs = jobs_of(models, stacks)
    _check_outputs(jobs, models, results, html, golden, update_golden, force)
    if ray is not None:
        from composer.fleet.on_ray import connect

        connect(ray)  # before the results file is opened: a wrong address loses no results
    file = ResultsFile(results, resume=resume)
    if file.damaged:
        say(f"{len(file.damaged)} damaged record(s) in {results} ({file.damaged[0]}): their "
            "job(s) run again")  # fmt: skip
    todo = [job for job in jobs if not file.has(job)]
    skipped = len(jobs) - len(todo)
    written = 0

    def done(record: dict[str, Any]) -> None:
        nonlocal written
        if golden is not None and record["ok"]:
            record["golden_check"] = _golden_check(record, Path(golden), update_golden, force)
        if file.write(record):
            written += 1
            verdict = "ok" if record["ok"] else f"FAILED: {record.get('error', '')[:200]}"
            check = f" ({record['golden_check']})" if "golden_check" in record else ""
            say(f"{record['model']} @ {record['stack']}: {verdict}{check}")

    if skipped:
        say(f"{skipped} job(s) already in {results}: skipped")
    try:
        _run(todo, ray, workers, bench, done, device_resource, placement)
    except KeyboardInterrupt as interrupt:
        raise SweepInterrupted(results, written, skipped, len(todo) - written) from interrupt
    records = tuple(file.of(jobs))
    if html is not None:
        write_all({Path(html): sweep_html(records).encode()})
    return SweepSummary(records, len(todo), skipped)


class SweepInterrupted(InterruptedAfterWriting):
    """Ctrl-C during a sweep: what it wrote before, and how to go on."""

    def __init__(self, results: str | os.PathLike, written: int, earlier: int, left: int) -> None:
        # the message, not a list of paths, is what `composer` prints after "interrupted after
        # writing"; the results file is the one path written
        beside = f" (beside {earlier} from an earlier run)" if earlier else ""
        KeyboardInterrupt.__init__(
            self, f"{written} record(s) to {results}{beside}; {left} job(s) not done: the same "
            "command with --resume runs them",
        )  # fmt: skip
        self.paths = [Path(results)]


def _run(todo, ray, workers, bench, done, device_resource, placement) -> None:
    """The jobs on Ray where ``ray`` names a cluster, else in local processes."""
    if todo and ray is not None:
        from composer.fleet.on_ray import run_on_ray

        run_on_ray(todo, ray, bench, done, lambda job: _resources(job, device_resource),
                   placement)  # fmt: skip
    elif todo:
        from composer.fleet.local import run_locally

        processes = workers or max(1, (os.cpu_count() or 2) // 2)
        run_locally(todo, processes, bench, done, placement)


def _check_before_any_work(workers, bench, golden, ray, device_resource) -> None:
    """Refuse what would fail only after the jobs ran (or lose the results file's records)."""
    if workers is not None and workers < 1:
        raise ComposerError(f"--workers must be 1 or more, not {workers}.")
    if bench < 0:
        raise ComposerError(f"--bench must be 1 or more (calls timed a program), not {bench}.")
    if device_resource is not None and ray is None:
        raise ComposerError("--device-resource asks Ray for a resource: pass --ray too.")
    if ray is not None:
        from composer.fleet.on_ray import check_address

        check_address(ray)  # before Ray is imported: it takes a wrong address for minutes
    if golden is not None:
        folder = Path(golden)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            check_writable([folder / "golden.json"])
        except (OSError, ComposerError) as error:
            why = f"{error.strerror}." if isinstance(error, OSError) else str(error)
            raise ComposerError(
                f"cannot write the golden plans to {folder}: {why} Pass another --golden."
            ) from error


def _check_outputs(jobs, models, results, html, golden, update_golden, force) -> None:
    """Refuse, before any job runs, an output that is a file the sweep reads, two outputs of
    one path, an existing file that is not composer's own of the kind it would be replaced by
    (unless ``force``), and a golden file that cannot be compared with."""
    outputs = [(Path(results), "results")]
    if html is not None:
        outputs.append((Path(html), "sweep page"))
    try:  # the results file's folder is made for it, as it always was
        Path(results).parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ComposerError(f"cannot write the results to {results}: {error.strerror}. "
                            "Pass another --results.") from error  # fmt: skip
    reads = source_files([*models, *(job.model for job in jobs)])
    check_outputs(outputs, reads, force=force, remedy=FORCE_FLAG)
    if golden is None:
        return
    goldens = [Path(golden) / job.golden_name for job in jobs]
    written = [path for path, _ in outputs]
    check_writable([*written, *(p for p in goldens if update_golden or not p.exists())])
    for path in goldens:
        if update_golden and not force:
            check_ours(path, "golden", "remove it, or pass --force to replace it.")
        elif not update_golden:  # read, to compare each plan with
            check_ours(path, "golden", "remove it, or pass --update-golden to write it again.")


def _golden_check(record: dict[str, Any], folder: Path, update: bool, force: bool) -> str:
    """How the job's plan compares with its golden file, or that it was written; a golden file
    spoiled while the sweep ran is said in the record, which is kept."""
    path = folder / Job(record["model"], record["stack"]).golden_name
    try:
        if update or not path.is_file():
            if not force:
                check_ours(path, "golden", "remove it, or pass --force to replace it.")
            text = json.dumps(record["golden"], indent=2, sort_keys=True) + "\n"
            write_all({path: text.encode()})
            return f"golden written: {path.name}"
        moved = describe_golden_diff(json.loads(path.read_text()), record["golden"])
    except ComposerError as error:
        return f"differs from {path.name}: not compared, {first_line(error)}"
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:
        return (
            f"differs from {path.name}: not compared, {type(error).__name__}: {first_line(error)}"
        )
    return f"differs from {path.name}: {'; '.join(moved)}" if moved else "matches its golden plan"


def _resources(job: Job, device_resource: str | None) -> dict[str, Any]:
    """What a job asks Ray for: a GPU where a backend of its stack runs on one, the named
    device resource where the sweep times on a device."""
    from composer.registry.discovery import default_registry

    asks: dict[str, Any] = {}
    try:
        devices = {b.spec.device for b in default_registry().resolve(job.stack.split(","))}
    except ComposerError:
        devices = set()  # the job itself will say what is wrong with the stack
    if "cuda" in devices:
        asks["num_gpus"] = 1
    if device_resource:
        asks["resources"] = {device_resource: 1}
    return asks
