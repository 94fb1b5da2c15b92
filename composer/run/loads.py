"""Whether this process has loaded a program into a runtime: after that, XNNPACK's threadpool
is fixed (a loaded delegate keeps the pool it was loaded with; see composer.run.cpu_threads)."""

from __future__ import annotations

_loaded = False


def note_loaded() -> None:
    """Called where composer loads a program into a runtime: the pool is fixed from now on."""
    global _loaded
    _loaded = True


def has_loaded() -> bool:
    """Whether composer has loaded a program in this process."""
    return _loaded
