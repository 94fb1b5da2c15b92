"""The stack a project keeps in ``[tool.composer]`` of pyproject.toml or in composer.toml.

[tool.composer]                      # in composer.toml: the same keys at top level
backends = ["tensorrt_stub", "xnnpack"]

[tool.composer.options.cuda]         # per-backend options
max_autotune = "OFF"

[tool.composer.min_partition_size]   # overrides a backend's own minimum
tensorrt_stub = 3

[tool.composer.never]                # pins: ops a backend must not take
tensorrt_stub = ["aten._softmax.default"]
xnnpack = ["node:aten_linear_default_2"]   # or one node of the edge program, by name

A pin ``"node:NAME"`` keeps the one edge-program node ``NAME`` (as ``composer plan --json``
and ``composer explain`` name it) off the backend. Measured placement writes a per-region
choice this way, with ``placement = "strict"``; the names belong to one model, stack and
torch version, and a pin that names no node of the program is warned about.

``placement = "strict"`` (top level) keeps plain priority order: no island is handed over;
``"priority"``, the default, moves a host island between accelerator partitions to the
accelerator; ``"measured"`` times candidates on this machine (composer.measure.placement), composing
them for at most ``tune_budget`` seconds, with XNNPACK on ``threads`` threads if set (the
runtime's default is one per core). ``consolidate = false`` is the older spelling of
``placement = "strict"``. ``keep_whole = "any"`` keeps whole every op any backend asks to
keep whole, so every order of the stack decomposes the model alike (a per-region choice's node
pins need it); ``"priority"``, the default, decomposes such an op where a backend ahead takes
its pieces and not the whole. What is read becomes a ``composer.registry.stack.Stack``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from composer.contract.environment import shortened
from composer.contract.errors import ComposerError
from composer.registry.names import MAX_THREADS, backend_names, is_thread_count
from composer.registry.stack import KEEP_WHOLE, PLACEMENTS, Stack

KEYS = {
    "backends",
    "options",
    "min_partition_size",
    "never",
    "consolidate",
    "placement",
    "tune_budget",
    "threads",
    "keep_whole",
    "repair_time",
}


def stack_from(
    path: Path | None,
    backends: str | None = None,
    options: Sequence[str] = (),
    placement: str | None = None,
    tune_budget: float | None = None,
    threads: int | None = None,
    repair_time: float | None = None,
) -> Stack:
    """The stack of the config at ``path`` (None: no config), with the command line's
    ``--backends a,b``, ``--option BACKEND.NAME=VALUE``, ``--placement``, ``--tune-budget``
    and ``--threads`` winning over it."""
    fields = load_config(path)
    merged = {name: dict(values) for name, values in fields.get("options", {}).items()}
    for item in options:
        key, equals, value = item.partition("=")
        backend, dot, name = key.partition(".")
        if not (equals and dot and backend and name):
            raise ComposerError(f"--option takes BACKEND.NAME=VALUE, not {item!r}.")
        merged.setdefault(backend, {})[name] = value
    fields["options"] = merged
    if backends:
        fields["backends"] = backends
    if placement is not None:
        fields["placement"] = placement
    if tune_budget is not None:
        fields["tune_budget"] = tune_budget
    if threads is not None:
        fields["threads"] = threads
    if repair_time is not None:
        fields["repair_time"] = repair_time
    if not fields.get("backends"):
        raise ComposerError(
            "no backends given: pass --backends a,b or set backends in [tool.composer] of "
            "pyproject.toml or in composer.toml."
        )
    return Stack(**fields)


def find_config(directory: Path) -> Path | None:
    """composer.toml, else a pyproject.toml with a [tool.composer] table, in ``directory``."""
    if (directory / "composer.toml").is_file():
        return directory / "composer.toml"
    pyproject = directory / "pyproject.toml"
    if pyproject.is_file() and _composer_table(_read(pyproject), pyproject) is not None:
        return pyproject
    return None


def load_config(path: Path | None) -> dict[str, Any]:
    """The fields of a ``Stack`` that ``path`` sets, their types checked; no path: none."""
    if path is None:
        return {}
    data = _read(path)
    if path.name == "pyproject.toml":
        data = _composer_table(data, path) or {}
    return _fields(data, path)


def stack_from_text(text: str, where: str = "the config text") -> Stack:
    """The stack that composer.toml text sets: e.g. what measured placement prints to reproduce
    its choice (``plan.placement.config``), to compose or check with it without measuring."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ComposerError(f"cannot read {where}: {error}") from error
    fields = _fields(table, where)
    if not fields.get("backends"):
        raise ComposerError(f"{where} names no backends.")
    return Stack(**fields)


def _fields(table: dict[str, Any], path: Path | str) -> dict[str, Any]:
    unknown = set(table) - KEYS
    if unknown:
        raise ComposerError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KEYS))}."
        )
    fields: dict[str, Any] = {"placement": _placement(table, path)}
    backends = table.get("backends", ())
    if isinstance(backends, str):
        backends = list(backend_names(backends))
    fields["backends"] = tuple(_strings(backends, path, "backends"))
    fields["options"] = {
        name: {key: str(value) for key, value in _table(values, path, f"options.{name}").items()}
        for name, values in _table(table.get("options", {}), path, "options").items()
    }
    fields["min_partition_size"] = {
        name: _positive(size, path, name)
        for name, size in _table(
            table.get("min_partition_size", {}), path, "min_partition_size"
        ).items()
    }
    fields["never"] = {
        name: tuple(_strings(ops, path, f"never.{name}"))
        for name, ops in _table(table.get("never", {}), path, "never").items()
    }
    if "tune_budget" in table:
        budget = table["tune_budget"]
        if isinstance(budget, bool) or not isinstance(budget, int | float) or budget < 0:
            raise ComposerError(f"{path}: tune_budget must be a number of seconds >= 0.")
        fields["tune_budget"] = float(budget)
    if "repair_time" in table:
        repair = table["repair_time"]
        if isinstance(repair, bool) or not isinstance(repair, int | float) or repair < 0:
            raise ComposerError(
                f"{path}: repair_time must be a number >= 0 (times the first compose)."
            )
        fields["repair_time"] = float(repair)
    if "keep_whole" in table:
        if table["keep_whole"] not in KEEP_WHOLE:
            raise ComposerError(
                f"{path}: keep_whole must be one of {', '.join(KEEP_WHOLE)}, "
                f"not {table['keep_whole']!r}."
            )
        fields["keep_whole"] = table["keep_whole"]
    if "threads" in table:
        if not is_thread_count(table["threads"]):
            raise ComposerError(
                f"{path}: threads must be a whole number from 1 to {MAX_THREADS}, not "
                f"{shortened(repr(table['threads']))}."
            )
        fields["threads"] = table["threads"]
    return fields


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ComposerError(
            f"cannot read {path}: it is not UTF-8 text (byte {error.start} is "
            f"{error.object[error.start : error.start + 1]!r}); TOML is UTF-8: save it so."
        ) from error
    except OSError as error:
        raise ComposerError(f"cannot read {path}: {error.strerror}.") from error
    except tomllib.TOMLDecodeError as error:
        raise ComposerError(f"cannot read {path}: {error}") from error


def _composer_table(data: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """pyproject.toml's ``[tool.composer]``, None where it has none; ``tool`` or
    ``tool.composer`` that is no table is refused (``tool = 3``)."""
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise ComposerError(
            f"{path}: tool must be a table ([tool.NAME] sections), not {shortened(repr(tool))}."
        )
    table = tool.get("composer")
    if table is not None and not isinstance(table, dict):
        raise ComposerError(
            f"{path}: tool.composer must be a table (a [tool.composer] section of keys such as "
            f"backends = [...]), not {shortened(repr(table))}."
        )
    return table


def _table(value: Any, path: Path | str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ComposerError(f"{path}: {key} must be a table.")
    return value


def _strings(value: Any, path: Path | str, key: str) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ComposerError(f"{path}: {key} must be a list of strings.")
    return list(value)


def _placement(table: dict[str, Any], path: Path | str) -> str:
    placement = table.get("placement", "priority")
    if placement not in PLACEMENTS:
        raise ComposerError(
            f"{path}: placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}."
        )
    if not _boolean(table.get("consolidate", True), path):
        if "placement" in table and placement != "strict":
            raise ComposerError(
                f"{path}: consolidate = false and placement = {placement!r} contradict each "
                'other; keep placement = "strict" alone.'
            )
        return "strict"
    return placement


def _boolean(value: Any, path: Path | str) -> bool:
    if not isinstance(value, bool):
        raise ComposerError(f"{path}: consolidate must be true or false.")
    return value


def _positive(value: Any, path: Path | str, key: str) -> int:
    if not isinstance(value, int) or value < 1:
        raise ComposerError(f"{path}: min_partition_size.{key} must be a whole number >= 1.")
    return value
