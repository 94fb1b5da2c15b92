"""composer's environment variables, each parsed and checked here, in one place.

A variable set to nonsense (``COMPOSER_CACHE_SIZE=inf``, ``COMPOSER_SLOW_ANSWER_S=abc``) is one
``ComposerError`` naming the variable, its value and what it must be, never a traceback from
wherever the value happens to be used first. The command line checks them all as it starts
(:func:`check_all`), so a wrong one stops every command before any work; each reader calls the
same parser where it uses the value.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable

from composer.contract.errors import ComposerError

CACHE_SIZE = "COMPOSER_CACHE_SIZE"
SLOW_ANSWER_S = "COMPOSER_SLOW_ANSWER_S"
NO_CACHE = "COMPOSER_NO_CACHE"
NATIVE_LOG = "COMPOSER_NATIVE_LOG"
DEBUG = "COMPOSER_DEBUG"
CACHE_DIR = "COMPOSER_CACHE_DIR"
ET_RUNNER = "COMPOSER_ET_RUNNER"

_SWITCH_ON = ("1", "true", "yes", "on")
_SWITCH_OFF = ("", "0", "false", "no", "off")
_SCALES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _wrong(name: str, text: str, must: str) -> ComposerError:
    return ComposerError(f"{name}={text!r} is not {must}; set it so, or unset it.")


def size(name: str, default: int) -> int:
    """Bytes: ``123``, ``500K``, ``500M``, ``2G`` (unset or empty: ``default``)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    scale = _SCALES.get(text[-1].upper(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and 0 <= value * scale < 2**63):
        raise _wrong(name, text, "a size: bytes, or a number with K, M, G or T (e.g. 2G)")
    return int(value * scale)


def seconds(name: str, default: float) -> float:
    """A finite number of seconds > 0 (unset or empty: ``default``)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise _wrong(name, text, "a number of seconds > 0 (e.g. 5)")
    return value


def switch(name: str) -> bool:
    """On (``1``, ``true``, ``yes``, ``on``) or off (unset, empty, ``0``, ``false``, ``no``,
    ``off``); anything else is refused rather than guessed at."""
    text = os.environ.get(name, "")
    if text.strip().lower() in _SWITCH_ON:
        return True
    if text.strip().lower() in _SWITCH_OFF:
        return False
    raise _wrong(name, text, "a switch: 1 or 0 (also true/false, yes/no, on/off)")


def folder(name: str) -> str | None:
    """A path to a folder composer may make (unset or empty: ``None``)."""
    text = os.environ.get(name, "")
    if not text:
        return None
    if too_long(text):
        raise _wrong(name, shortened(text), "a path this system can name (it is too long)")
    return text


def too_long(path: str) -> bool:
    """Whether the system refuses ``path`` as longer than it can name (the whole path beyond
    PATH_MAX, or one of its names beyond NAME_MAX): asked of the system, not guessed."""
    try:
        os.lstat(path)
    except OSError as error:
        return error.errno == errno.ENAMETOOLONG
    return False


def executable(name: str, how: str) -> str | None:
    """The path of an executable file (unset or empty: ``None``); ``how``: how to get one."""
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        found = os.path.isfile(text) and os.access(text, os.X_OK)
    except (OSError, ValueError):
        found = False
    if not found:
        raise ComposerError(
            f"${name} is {shortened(text)!r}, which is no executable file: {how}, or unset it."
        )
    return text


def shortened(text: str, keep: int = 60) -> str:
    """``text``, or its start and end around the number of characters left out: a path of
    thousands of characters stays one readable line."""
    if len(text) <= keep:
        return text
    half = keep // 2
    return f"{text[:half]}...({len(text) - keep} more characters)...{text[-half:]}"


RUNNER_HOW = "build the runner with bench/et_runtime/build.sh"

# Each variable composer reads, with how it is read: what check_all runs.
READERS: dict[str, Callable[[], object]] = {
    CACHE_SIZE: lambda: size(CACHE_SIZE, 0),
    SLOW_ANSWER_S: lambda: seconds(SLOW_ANSWER_S, 1.0),
    NO_CACHE: lambda: switch(NO_CACHE),
    NATIVE_LOG: lambda: switch(NATIVE_LOG),
    DEBUG: lambda: switch(DEBUG),
    CACHE_DIR: lambda: folder(CACHE_DIR),
    ET_RUNNER: lambda: executable(ET_RUNNER, RUNNER_HOW),
}


def check_all() -> None:
    """Refuse the first of composer's variables whose value is wrong."""
    for read in READERS.values():
        read()
