"""One job of a sweep: a model composed with a stack, proven, timed if asked; its result as a
plain record; and the results file each record is written to once.

A job runs in whichever process its executor gives it (a local worker process, a Ray task on
another node): it loads the model as the command line names it, composes with composer's cache
(content-addressed, so workers sharing a cache folder share lowered partitions safely) and
returns data only, never an exception.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from composer.contract.environment import shortened
from composer.contract.errors import ComposerError, first_line


@attrs.frozen
class Job:
    """A model as the command line names it (``zoo:mlp``, ``model.pt2``, ``module:function``)
    and a stack (``"openvino,xnnpack"``)."""

    model: str
    stack: str

    @property
    def key(self) -> str:
        return f"{self.model} @ {self.stack}"

    @property
    def golden_name(self) -> str:
        """The golden file's name: ``zoo_mlp.openvino-xnnpack.json``."""
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.model)
        return f"{safe}.{self.stack.replace(',', '-')}.json"


def jobs_of(models: Sequence[str], stacks: Sequence[str]) -> list[Job]:
    """Every (model, stack) pair, models first; a model ending in ``.txt`` is a manifest: one
    model a line, ``#`` starting a comment."""
    named: list[str] = []
    for model in models:
        if model.endswith(".txt"):
            for line in _manifest_lines(Path(model)):
                line = line.split("#", 1)[0].strip()
                if line:
                    named.append(line)
        else:
            named.append(model)
    if not named or not stacks:
        raise ComposerError("a sweep needs at least one model and one stack.")
    # a stack named twice ("xnnpack xnnpack", "xnnpack, openvino" and "xnnpack,openvino") is
    # one job: its one record would otherwise be counted twice
    unique = dict.fromkeys(",".join(b.strip() for b in s.split(",")) for s in stacks)
    return [Job(model, stack) for model in dict.fromkeys(named) for stack in unique]


def _manifest_lines(path: Path) -> list[str]:
    """A manifest's lines: one model a line, UTF-8 text as every list of names composer reads."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ComposerError(f"no such manifest: {path}") from None
    except UnicodeDecodeError as error:
        raise ComposerError(
            f"cannot read the manifest {path}: it is not UTF-8 text (byte {error.start} is "
            f"{error.object[error.start : error.start + 1]!r}); save it as UTF-8, one model a line."
        ) from error
    except OSError as error:
        raise ComposerError(
            f"cannot read the manifest {shortened(str(path))}: {error.strerror}."
        ) from error


def run_job(job: Mapping[str, str], bench: int = 0, placement: str = "priority") -> dict[str, Any]:
    """Compose ``job`` (``{"model": ..., "stack": ...}``) with its proof and ``placement``
    ("measured": its candidates composed and timed here, where the job runs), time it with
    ``bench`` calls if asked; the result as a record. Errors are recorded, not raised: a sweep
    goes on."""
    # ExecuTorch's exir first: its edge dialect parses a YAML file as it is imported, which took
    # 2 to 3 times as long after composer's other modules (in a Ray worker, with Ray's on the
    # heap too): a worker's first job waited about 8 s for its imports on Ray rather than 4, and
    # 5 s rather than 4 in a local worker (bench/fleet/ray_scale_bench.py, 2 cores). Turning the
    # collector off recovered only part of it; why the order matters so much is not settled.
    import executorch.exir  # noqa: F401

    from composer.models.model_source import load_model
    from composer.pipeline.compose import compose
    from composer.report.golden import golden_summary

    record: dict[str, Any] = {"model": job["model"], "stack": job["stack"], "ok": False}
    if placement != "priority":
        record["placement"] = placement
    record["started"] = round(time.time(), 3)  # epoch seconds: beside its worker's other jobs
    started = time.perf_counter()
    try:
        model, inputs = load_model(job["model"])
        composition = compose(model, job["stack"], inputs, placement=placement)
        plan = composition.plan
        record.update(
            ok=True,
            proof=plan.proof,
            digest=hashlib.sha256(composition.buffer).hexdigest()[:16],
            program_bytes=len(composition.buffer),
            from_cache=composition.from_cache,
            golden=golden_summary(plan),
            plan=plan.to_dict(),
        )
        if plan.placement is not None:
            record["chose"] = plan.placement.chosen
        if bench:
            record["latency_us"] = _latency(composition, bench)
    except ComposerError as error:
        record["error"] = f"{type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 - an internal error is a result too, with its name
        record["error"] = f"internal error, {type(error).__name__}: {first_line(error)}"
    record["seconds"] = round(time.perf_counter() - started, 2)
    record["host"], record["pid"] = socket.gethostname(), os.getpid()
    return record


def _latency(composition, runs: int) -> dict[str, float] | str:
    """Median and fastest call of the program in the pip runtime, or why it cannot run here."""
    from composer.measure.latency import interleaved
    from composer.run.inputs import flat_inputs
    from composer.run.runtime import LoadedProgram, runtime_can_run

    runnable, why = runtime_can_run(composition.buffer)
    if not runnable:
        return f"not timed: {why}"
    loaded = LoadedProgram(composition.buffer)
    inputs = flat_inputs(composition.example_inputs)
    timed = interleaved({"program": lambda: loaded.method.execute(inputs)}, runs)["program"]
    return {"median_us": round(timed.median_us, 1), "best_us": round(timed.best_us or 0.0, 1)}


class ResultsFile:
    """One JSON record a line, each job's written once, flushed to disk as it comes: a sweep
    whose driver is killed keeps every result it had, and ``resume`` skips those jobs (not
    those whose worker died running them: they were never done)."""

    def __init__(self, path: str | os.PathLike, *, resume: bool) -> None:
        self.path = Path(path)
        self.damaged: list[str] = []  # where and why, of records resume runs again
        self.records: dict[str, dict[str, Any]] = self._read() if resume else {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not resume:
                self.path.write_text("")
            else:  # the file as read: whole lines only, a torn last line not left before new ones
                self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records.values()))
        except OSError as error:
            raise ComposerError(
                f"cannot write the results to {self.path}: {error.strerror}. Pass another "
                "--results."
            ) from error

    def _read(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        try:
            text = self.path.read_text() if self.path.exists() else ""
        except (OSError, UnicodeDecodeError) as error:
            raise ComposerError(f"cannot read the results in {self.path} to resume: {error}. "
                                "Pass another --results.") from error  # fmt: skip
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line a killed driver was writing
            if not _is_record(record):
                raise ComposerError(
                    f'{self.path} line {number} is not a sweep record (no "model" and '
                    '"stack"): pass another --results, or remove the line to resume.'
                )
            damage = damaged(record)
            if damage is not None:  # its job was not done as far as anyone can tell
                self.damaged.append(f"line {number}: {damage}")
            elif not lost(record):
                found.setdefault(Job(record["model"], record["stack"]).key, record)
        return found

    def has(self, job: Job) -> bool:
        return job.key in self.records

    def write(self, record: dict[str, Any]) -> bool:
        """Append ``record`` unless its job has one; whether it was written."""
        key = Job(record["model"], record["stack"]).key
        if key in self.records:
            return False
        try:
            with self.path.open("a") as out:
                out.write(json.dumps(record) + "\n")
                out.flush()
                os.fsync(out.fileno())
        except OSError as error:  # a full disk: what was written stays, and --resume goes on
            raise ComposerError(
                f"cannot write the results to {self.path}: {error.strerror}; the "
                f"{len(self.records)} record(s) before are kept. Free space there, then run the "
                "same command with --resume."
            ) from error
        self.records[key] = record
        return True

    def of(self, jobs: Iterable[Job]) -> list[dict[str, Any]]:
        return [self.records[job.key] for job in jobs if job.key in self.records]


def _is_record(record: Any) -> bool:
    return isinstance(record, dict) and all(
        isinstance(record.get(field), str) for field in ("model", "stack")
    )


# The fields a record is read back by (the summary, the page, --resume), and their types.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "ok": bool, "error": str, "proof": str, "golden_check": str, "from_cache": bool,
    "worker_died": bool, "golden": dict, "latency_us": (dict, str), "digest": str,
}  # fmt: skip


def damaged(record: Mapping[str, Any]) -> str | None:
    """What is wrong with a record of a job (one edited, or cut by hand), or None: such a record
    is not counted as done."""
    if "ok" not in record:
        return 'no "ok"'
    for field, types in _FIELD_TYPES.items():
        if field in record and not isinstance(record[field], types):
            return f'"{field}" is {json.dumps(record[field])[:40]}'
    ops = record.get("golden", {}).get("ops", {})
    if not isinstance(ops, dict) or not all(
        isinstance(counts, dict) and all(isinstance(n, int) for n in counts.values())
        for counts in ops.values()
    ):
        return '"golden" has no op counts'
    latency = record.get("latency_us")
    if isinstance(latency, dict) and not isinstance(latency.get("median_us"), int | float):
        return '"latency_us" has no median'
    return None


def lost(record: Mapping[str, Any]) -> bool:
    """A job whose worker died running it: never done, so ``resume`` runs it again. Older
    sweeps wrote such a job as failed with this error."""
    return bool(record.get("worker_died")) or str(record.get("error", "")).startswith(
        "the worker process died"
    )
