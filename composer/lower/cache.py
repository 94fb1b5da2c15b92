"""Where composer keeps what it can reuse between runs, and how to see or empty it.

Kinds of entries: measured placements (``placement/``, see :mod:`composer.measure.placement`), whole
composed programs and plans (``program/``, ``plan/``, and ``module/`` pointing a model's digest
at them; see :mod:`composer.lower.program_cache`), and lowered partitions (``partition/``, see
:mod:`composer.lower.partition_cache`). The folder is ``$COMPOSER_CACHE_DIR``, else
``$XDG_CACHE_HOME/composer``, else ``~/.cache/composer``; ``$COMPOSER_CACHE_SIZE`` bounds it
(``500M``, ``2G``; default 2G), the least recently used entries going first;
``$COMPOSER_NO_CACHE=1`` turns it off.

An entry is written to a temporary file and renamed into place, so a reader sees a whole
entry or none, whatever other processes (pytest-xdist workers, a second terminal) do at the
same time. It carries its own key and a sha256 of key and payload: a damaged entry, or one
found under another key's name, is dropped with a warning and its work done again.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import attrs

from composer.contract import environment
from composer.contract.errors import ComposerWarning

KINDS = ("placement", "program", "module", "plan", "partition")  # the subfolders composer writes
MAGIC = b"composer-cache 2\n"  # 2: the entry holds its key
DEFAULT_SIZE = 2 << 30
STALE_TEMPORARY_S = 3600  # a writer that died left its temporary file: removed after an hour


class DamagedEntryWarning(ComposerWarning):
    """A cache entry failed its checksum: about this run's cache, not about the model, so a
    result from the cache does not say it again."""


def cache_dir() -> Path:
    """``$COMPOSER_CACHE_DIR``, else ``$XDG_CACHE_HOME/composer``, else ``~/.cache/composer``."""
    explicit = environment.folder(environment.CACHE_DIR)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "composer"


def cache_enabled() -> bool:
    """False when ``$COMPOSER_NO_CACHE`` is on (``1``, ``true``, ``yes``, ``on``): every compose
    and plan then works as with ``cache=False``, e.g. to time a suite without it."""
    return not environment.switch(environment.NO_CACHE)


def size_bound() -> int:
    """``$COMPOSER_CACHE_SIZE`` in bytes (``123``, ``500K``, ``500M``, ``2G``), else 2 GiB."""
    return environment.size(environment.CACHE_SIZE, DEFAULT_SIZE)


@attrs.define
class Store:
    """Content-addressed entries of one kind: ``get`` a payload by key, ``put`` one."""

    folder: Path  # the cache folder; entries live in folder/kind/
    kind: str
    max_bytes: int = attrs.field(factory=size_bound)

    def _path(self, key: str) -> Path:
        return self.folder / self.kind / f"{key}.entry"

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None; a damaged entry is dropped."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head = len(MAGIC) + 32
        body = data[head:]
        stored_key, _, payload = body.partition(b"\n")
        if data[: len(MAGIC)] != MAGIC or hashlib.sha256(body).digest() != data[len(MAGIC) : head]:
            return self._drop(path, "a damaged")
        if stored_key != key.encode():  # whole, but another key's: never this key's answer
            return self._drop(path, "a misplaced (another key's)")
        try:
            os.utime(path)  # least recently used goes first: a hit counts as a use
        except OSError:
            pass
        return payload

    def _drop(self, path: Path, what: str) -> None:
        warnings.warn(
            f"dropped {what} {self.kind} cache entry ({path}); doing that work again",
            DamagedEntryWarning,
            stacklevel=3,
        )
        path.unlink(missing_ok=True)

    def load(self, key: str) -> Any | None:
        """The object pickled under ``key``, or None (also for an entry this version of
        composer or its libraries cannot read: the work is done again)."""
        payload = self.get(key)
        if payload is None:
            return None
        try:
            return pickle.loads(payload)
        except Exception:  # noqa: BLE001
            return None

    def put(self, key: str, payload: bytes) -> bool:
        """Store ``payload`` under ``key`` (``evict`` keeps the cache within its bound);
        whether it was stored. A cache that cannot be written only costs the work again, so
        failures are not errors."""
        if len(payload) > self.max_bytes:
            return False
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                body = key.encode() + b"\n" + payload
                with os.fdopen(handle, "wb") as file:
                    file.write(MAGIC + hashlib.sha256(body).digest() + body)
                os.replace(temporary, path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError:
            return False
        return True

    def evict(self) -> int:
        """Keep the whole cache within ``max_bytes``: once per compose, not once per entry,
        since it lists every entry."""
        return evict(self.folder, self.max_bytes)


def _entries(folder: Path) -> list[Path]:
    return [p for kind in KINDS for p in (folder / kind).glob("*.entry")]


def evict(folder: Path, max_bytes: int) -> int:
    """Remove least recently used entries until the cache holds at most ``max_bytes``;
    returns how many went. Another process may remove the same files: that is fine."""
    now = time.time()
    for kind in KINDS:
        for temporary in (folder / kind).glob(".tmp-*"):
            try:
                if now - temporary.stat().st_mtime > STALE_TEMPORARY_S:
                    temporary.unlink()
            except OSError:
                pass
    stats = []
    for path in _entries(folder):
        try:
            stat = path.stat()
        except OSError:
            continue
        stats.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in stats)
    removed = 0
    for _mtime, size, path in sorted(stats, key=lambda s: s[0]):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed += 1
    return removed


@attrs.frozen
class CacheInfo:
    """The cache folder and, per kind of entry, how many there are and their bytes."""

    folder: Path
    entries: dict[str, tuple[int, int]]  # kind -> (files, bytes)
    max_bytes: int = DEFAULT_SIZE

    def __str__(self) -> str:
        total = sum(size for _, size in self.entries.values())
        lines = [f"cache: {self.folder} ({total:,} of at most {self.max_bytes:,} bytes)"]
        for kind, (files, size) in self.entries.items():
            lines.append(f"  {kind}: {files} entr{'y' if files == 1 else 'ies'}, {size:,} bytes")
        return "\n".join(lines)


def info(folder: Path | None = None) -> CacheInfo:
    """Count what the cache holds."""
    folder = folder or cache_dir()
    entries = {}
    for kind in KINDS:
        # Placements predate the store and are plain JSON files.
        pattern = "*.json" if kind == "placement" else "*.entry"
        files = [p for p in (folder / kind).glob(pattern) if p.is_file()]
        entries[kind] = (len(files), sum(p.stat().st_size for p in files))
    return CacheInfo(folder, entries, size_bound())


def clear(folder: Path | None = None) -> CacheInfo:
    """Remove composer's entries (only its own subfolders); returns what was there."""
    folder = folder or cache_dir()
    before = info(folder)
    for kind in KINDS:
        shutil.rmtree(folder / kind, ignore_errors=True)
    return before
