"""The machine's errors, told apart from a backend's.

A compiler that raises on a partition refuses it, and a repair moves the partition to the next
backend. But an error of the machine (no process or thread to be had, no memory, no disk
space, a child process killed) says nothing about the backend: taken for a refusal, it made
the program written depend on how busy the machine was (XNNPACK's lowering raised
``BlockingIOError: [Errno 11]`` on a loaded 2-core machine and 6 nodes moved to OpenVINO). So
such an error is retried once, and then ends the compose with one :class:`MachineError`, never
a repair.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TypeVar

from composer.contract.errors import ComposerError, first_line

T = TypeVar("T")

# What each errno is short of, as the error says it (EWOULDBLOCK is EAGAIN).
_SHORT_OF = {
    errno.EAGAIN: "processes or threads (the machine is busy)",
    errno.ENOMEM: "memory",
    errno.ENOSPC: "disk space",
    # a file bigger than the process may write (a file-size limit: ulimit -f), as XNNPACK's
    # temporary flatbuffer files meet it
    errno.EFBIG: "file size (a limit on the files it may write)",
    errno.EDQUOT: "disk quota",
    errno.EMFILE: "open files",
    errno.ENFILE: "open files",
}


class KilledChild(Exception):
    """Mixed into an error saying a child process composer ran was killed (by the kernel's
    out-of-memory killer, as a rule), not that it failed."""


class MachineError(ComposerError):
    """The machine failed composer twice (no memory, no disk space, no process to start), as
    opposed to a backend refusing what it was given: nothing was moved, nothing written."""


def machine_error(error: BaseException | None) -> BaseException | None:
    """The error of the machine in ``error`` or the errors it was raised from, or ``None``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if short_of(error) is not None:
            return error
        # what it was raised from, or while handling, as a traceback shows them
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return None


def short_of(error: BaseException) -> str | None:
    """What the machine was short of where ``error`` is one of its errors, else ``None``."""
    if isinstance(error, MachineError):
        return "what it needed"
    if isinstance(error, MemoryError):
        return "memory"
    if isinstance(error, KilledChild) or type(error).__name__ == "BrokenProcessPool":
        return "memory, or a child process was killed"
    if isinstance(error, OSError) and error.errno in _SHORT_OF:
        return _SHORT_OF[error.errno]
    return None


def retried_once(call: Callable[[], T], doing: str) -> T:
    """``call()``; where the machine failed it, ``call()`` once more; where the machine fails
    it again, a :class:`MachineError` saying what ``doing`` (``"lowering a partition with
    XnnpackBackend"``) was short of. Any other error is raised as it is."""
    for attempt in (1, 2):
        try:
            return call()
        except MachineError:
            raise
        except Exception as error:
            if machine_error(error) is None:
                raise
            if attempt == 2:
                raise failed_twice(error, doing) from error
    raise AssertionError("unreachable: the second attempt returns or raises")


def failed_twice(error: BaseException, doing: str, *, retried: bool = True) -> MachineError:
    """The one error a compose ends with where the machine failed ``doing``."""
    if isinstance(error, MachineError):
        return error
    cause = machine_error(error) or error
    said = f"{type(cause).__name__}: {first_line(cause)}"
    again = ", and again when retried" if retried else ""
    return MachineError(
        f"the machine ran short of {short_of(cause)} while {doing} ({said}){again}. This is "
        "not the backend refusing: nothing was moved to another backend and nothing was "
        "written. Free what it lacks (or run fewer jobs at once) and compose again."
    )
