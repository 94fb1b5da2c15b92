"""Measured placements kept between runs: the key (program, stack, versions, machine, threads)
and the choice as JSON in the cache folder (``placement/``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from composer.lower.atomic import write_all
from composer.lower.fingerprint import Unfingerprintable, digest, program_digest, versions
from composer.measure.candidates import Candidate
from composer.measure.choice import Choice, Measurement
from composer.measure.latency import Latency
from composer.run import cpu_threads
from composer.scheduler.measured_placement import Placement, TimedCandidate

VERSIONED = ("executorch-composer", "executorch", "torch", "openvino")


def cache_key(
    program,
    backends: Sequence[str],
    settings: Mapping[str, Any],
    runs: int,
    runner: str | None = None,
) -> str | None:
    """What a measurement depends on: the program (graph and weights), the stack, the runs,
    the versions of what compiles and runs it, and the machine. None: not to be cached."""
    import torch

    try:
        program_part = program_digest(program)
    except Unfingerprintable:
        return None
    libraries = {}
    for distribution in VERSIONED:
        try:
            libraries[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            libraries[distribution] = None
    facts = {
        "backends": list(backends),
        "settings": {k: _plain(v) for k, v in sorted(settings.items())},
        "runs": runs,
        "runner": runner,  # where the candidates were timed: the C++ runtime, or here
        "search": "whole programs, then per region",  # what a cached choice was chosen among
        "versions": libraries,
        "machine": [platform.machine(), platform.processor(), os.cpu_count()],
        "threads": torch.get_num_threads(),
        "runtime_threads": cpu_threads.current(),
    }
    return digest(versions(), program_part, json.dumps(facts, sort_keys=True))[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple | set | frozenset):
        return sorted(_plain(v) for v in value)
    return value


def read_cache(folder: Path | None, key: str | None) -> Choice | None:
    if folder is None or key is None:
        return None
    path = folder / "placement" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        recorded = Placement.from_dict(data)
        runs = data["runs"]
        measurements = tuple(_measurement(item, runs) for item in recorded.candidates)
        # The choice as made, which a second round may have changed: not recomputed.
        chosen = next(m.candidate for m in measurements if m.candidate.label == recorded.chosen)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
        return None  # no entry, or one this version cannot read: measure again
    return Choice(
        chosen, measurements, True, recorded.partitions, recorded.traced, recorded.regions,
        {b: list(p) for b, p in recorded.never.items()}, recorded.threads, recorded.threads_set,
    )  # fmt: skip


def _measurement(item: TimedCandidate, runs: int) -> Measurement:
    """A candidate's measurement as the cache recorded it."""
    return Measurement(
        Candidate(item.backends, item.placement, tuple(item.pins.items()), item.keep_whole),
        item.delegate_calls,
        None
        if item.median_us is None
        else Latency(item.median_us, item.p90_us, runs, item.best_us),
        item.note,
        None
        if item.confirmed_median_us is None
        else Latency(
            item.confirmed_median_us, item.confirmed_median_us, runs, item.confirmed_best_us
        ),
    )


def write_cache(folder: Path | None, key: str | None, choice: Choice) -> None:
    if folder is None or key is None:
        return

    target = folder / "placement" / f"{key}.json"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        runs = next((m.latency.runs for m in choice.measurements if m.latency), 0)
        data = {**choice.placement().to_dict(), "runs": runs}
        write_all({target: (json.dumps(data, indent=2) + "\n").encode()})
    except Exception:  # noqa: BLE001 - a cache that cannot be written only costs a re-measure
        return
