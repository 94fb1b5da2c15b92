"""Where composer keeps what it can reuse between runs, and how to see or empty it.

Today that is measured placements (``placement/``, see :mod:`composer.placement`). The folder
is ``$COMPOSER_CACHE_DIR``, else ``$XDG_CACHE_HOME/composer``, else ``~/.cache/composer``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import attrs

KINDS = ("placement",)  # the subfolders composer writes; nothing else is touched


def cache_dir() -> Path:
    """``$COMPOSER_CACHE_DIR``, else ``$XDG_CACHE_HOME/composer``, else ``~/.cache/composer``."""
    explicit = os.environ.get("COMPOSER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "composer"


@attrs.frozen
class CacheInfo:
    """The cache folder and, per kind of entry, how many there are and their bytes."""

    folder: Path
    entries: dict[str, tuple[int, int]]  # kind -> (files, bytes)

    def __str__(self) -> str:
        lines = [f"cache: {self.folder}"]
        for kind, (files, size) in self.entries.items():
            lines.append(f"  {kind}: {files} entr{'y' if files == 1 else 'ies'}, {size:,} bytes")
        return "\n".join(lines)


def info(folder: Path | None = None) -> CacheInfo:
    """Count what the cache holds."""
    folder = folder or cache_dir()
    entries = {}
    for kind in KINDS:
        files = [p for p in (folder / kind).glob("*.json") if p.is_file()]
        entries[kind] = (len(files), sum(p.stat().st_size for p in files))
    return CacheInfo(folder, entries)


def clear(folder: Path | None = None) -> CacheInfo:
    """Remove composer's entries (only its own subfolders); returns what was there."""
    folder = folder or cache_dir()
    before = info(folder)
    for kind in KINDS:
        shutil.rmtree(folder / kind, ignore_errors=True)
    return before
