"""Writing several files so that either all of them appear or none does."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from composer.errors import ComposerError


def write_all(files: Mapping[Path, bytes]) -> None:
    """Write every file to a temporary beside it, then rename them all into place.

    A failure (or an interrupt) before the renames leaves no file, partial or whole.
    """
    for path in files:
        if not path.parent.is_dir():
            raise ComposerError(f"cannot write {path}: the directory {path.parent} does not exist.")
    written: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            written.append((_write_temporary(path, data), path))
        for temporary, path in written:
            os.replace(temporary, path)
    except BaseException:
        for temporary, _ in written:
            Path(temporary).unlink(missing_ok=True)
        raise


def _write_temporary(path: Path, data: bytes) -> str:
    try:
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
    except OSError as error:
        raise ComposerError(f"cannot write {path}: {error.strerror}.") from error
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return temporary
