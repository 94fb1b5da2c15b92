"""Backend options: the schema a plugin declares (``composer.Option``) and the check against it.

composer checks every backend's options once, before any work, so a misspelt option is an
error for every backend, not only for those whose plugin happened to look.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from composer.contract.errors import ComposerError, did_you_mean

# What a value may be given as: the command line and the config give strings; Python callers
# write 1 or True as naturally as "1". Anything else (a list, a dict) is a mistake.
SCALARS = (str, int, float, bool)


def _choices(value: Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):  # ("ON") is a string, and "ON" in it would accept "N"
        raise TypeError(f"choices must be a sequence of strings, not the string {value!r}")
    return tuple(str(choice) for choice in value)


@attrs.frozen
class Option:
    """An option a backend takes: ``--option BACKEND.NAME=VALUE`` or ``options={BACKEND: {...}}``.

    ``choices``: the values allowed (matched ignoring case, passed on as spelt here), or
    ``None`` for any string. ``default``: the value the plugin's hooks see when the user sets
    none (``None``: the option is then absent). ``help``: one line for ``composer backends``.
    """

    name: str = attrs.field(
        validator=[attrs.validators.instance_of(str), attrs.validators.min_len(1)]
    )
    choices: tuple[str, ...] | None = attrs.field(default=None, converter=_choices)
    default: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    help: str = ""

    def __attrs_post_init__(self) -> None:
        if (
            self.choices is not None
            and self.default is not None
            and self.default not in self.choices
        ):
            raise ValueError(
                f"option {self.name!r}: default {self.default!r} is not one of its choices "
                f"{', '.join(self.choices)}"
            )

    def check(self, backend: str, value: Any) -> str:
        """``value`` as the plugin receives it; a value outside ``choices`` is a ComposerError."""
        if not isinstance(value, SCALARS):
            raise ComposerError(
                f"option {self.name!r} of backend {backend!r} must be a string, not "
                f"{type(value).__name__} {value!r}."
            )
        text = str(value)
        if self.choices is None:
            return text
        for choice in self.choices:
            if choice.upper() == text.upper():
                return choice
        raise ComposerError(
            f"option {self.name!r} of backend {backend!r} must be one of "
            f"{', '.join(self.choices)}, not {text!r}."
        )


def check_options(
    backend: str, declared: Sequence[Option], given: Mapping[str, Any] | None
) -> dict[str, str]:
    """``given`` checked against ``declared``, with defaults filled in.

    An unknown name or a value outside an option's choices is a ComposerError naming the
    known options or the allowed values. Checking the result again returns it unchanged.
    """
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise ComposerError(
            f"options for backend {backend!r} must map option names to values, not "
            f"{type(given).__name__} {given!r}."
        )
    by_name = {option.name: option for option in declared}
    checked = {
        name: option.default for name, option in by_name.items() if option.default is not None
    }
    for name, value in given.items():
        option = by_name.get(name)
        if option is None:
            known = ", ".join(by_name) or "none"
            near = did_you_mean(str(name), by_name)
            raise ComposerError(
                f"unknown option {name!r} for backend {backend!r}; {near}known: {known}."
            )
        checked[name] = option.check(backend, value)
    return checked
