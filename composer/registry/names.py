"""How a stack's backends and counts are spelt: ``"a,b"`` or a list of names; whole numbers >= 1."""

from __future__ import annotations

from collections.abc import Iterable

from composer.contract.errors import BackendListError


def is_count(value: object) -> bool:
    """Whether ``value`` is a whole number >= 1 (``True`` is an int to Python, not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# The most threads composer gives the runtime's threadpool: it starts them all at once, and
# ten billion (a slip of the keyboard) is no request the runtime can meet.
MAX_THREADS = 1024


def is_thread_count(value: object) -> bool:
    """Whether ``value`` is a count of threads the runtime can be given: 1 to MAX_THREADS."""
    return is_count(value) and value <= MAX_THREADS


def backend_names(value: str | Iterable[str]) -> tuple[str, ...]:
    """Backend names from ``"a, b"`` or ``["a", "b"]``, stripped, blanks dropped."""
    value = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(name, str) for name in value):
        raise BackendListError(f"backends must be backend names (a list, or 'a,b'), not {value!r}.")
    # An empty stack is refused when resolved, with the installed backends' names.
    return tuple(name.strip() for name in value if name.strip())
