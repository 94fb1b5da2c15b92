"""The files a model named on the command line is read from (a ``.pt2``, a manifest, the module
of ``pkg.mod:factory``), found without importing anything: what a command must never write
over."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path


def source_files(models: Iterable[str]) -> list[Path]:
    """The existing files ``models`` (as the command line names them) are read from."""
    found: list[Path] = []
    for source in models:
        if source.startswith(("zoo:", "corpus:")):
            continue
        if Path(source).is_file():
            found.append(Path(source))
        elif ":" in source:
            found += _module_file(source.partition(":")[0])
    return found


def _module_file(module: str) -> list[Path]:
    """The file ``import module`` would read: looked for in the working folder first (the
    command line imports a factory from there), then along ``sys.path``."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return []
    for root in [Path(), *(Path(entry) for entry in sys.path if entry)]:
        folder = root.joinpath(*parts[:-1])
        for candidate in (folder / f"{parts[-1]}.py", folder / parts[-1] / "__init__.py"):
            if candidate.is_file():
                return [candidate]
    return []
