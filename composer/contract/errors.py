"""Errors a user can cause. Every message says what to do next."""

from __future__ import annotations

import contextvars
import difflib
from collections.abc import Iterable


class ComposerError(Exception):
    """Base class: a problem with the model, the backend list, a plugin or a path."""


class BackendListError(ComposerError):
    """The priority list names an unknown backend, repeats one, or is empty."""


class PluginError(ComposerError):
    """A plugin failed to load, raised in a hook, or broke the plugin contract."""


class PreprocessFailed(PluginError):
    """A backend's ``preprocess`` raised: ``backend`` and the edge program's ``nodes`` it was
    given, which another backend may still take; ``origins`` maps each to the node of the
    exported program it descends from (its name survives a re-decomposition). ``partitions``
    splits ``nodes`` by the partition that failed, each with what its compiler raised (one,
    the whole message, unless given). ``safer_options``: the options the backend declares
    safer (``BackendSpec.safer_options``), for a repair to try before it moves the nodes."""

    def __init__(
        self,
        message: str,
        backend: str,
        nodes: tuple[str, ...],
        origins: dict[str, str] | None = None,
        partitions: tuple[tuple[tuple[str, ...], str], ...] = (),
        safer_options: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.backend, self.nodes, self.origins = backend, nodes, dict(origins or {})
        self.partitions = partitions or ((nodes, message),)
        self.safer_options = dict(safer_options or {})


class ModelError(ComposerError):
    """The model could not be loaded or exported."""


class PartitionError(ComposerError):
    """A partition is not convex, or the stacked program would contain a cycle."""


class ComposerWarning(UserWarning):
    """Something composer worked around (a plugin skipped, a tag removed); it says what."""


class StalePinWarning(ComposerWarning):
    """A pin names no node (``node:NAME``) of the program being composed."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name where it has none): what a
    one-line report of it says."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"did you mean xnnpack? "``: the one of ``known`` nearest ``name`` (a misspelling, another
    case), as the start of a sentence that goes on to list them; ``""`` where none is near."""
    by_folded = {str(each).casefold(): str(each) for each in known}
    near = difflib.get_close_matches(name.casefold(), list(by_folded), n=1)
    return f"did you mean {by_folded[near[0]]}? " if near else ""


# What the user typed to reach composer: its command line sets this (composer.cli), so that a
# message names what to run there (`composer plan`), not the Python call (composer.plan()).
_COMMAND_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "composer_command_line", default=False
)


def from_command_line() -> None:
    """Say, for the rest of this context, that composer runs as the ``composer`` command."""
    _COMMAND_LINE.set(True)


def as_typed(python: str, command_line: str) -> str:
    """``command_line`` where composer runs as the ``composer`` command, else ``python``: what
    a message tells the user to run, in the words they use."""
    return command_line if _COMMAND_LINE.get() else python
