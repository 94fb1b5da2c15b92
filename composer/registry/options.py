"""The options a backend's plugin declares (``composer_options``), asked of the plugin and checked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from composer.contract import hookspecs
from composer.contract.errors import ComposerError, PluginError
from composer.contract.options import Option

if TYPE_CHECKING:
    from composer.registry.discovery import Backend


def declared_options(backend: Backend) -> tuple[Option, ...]:
    """The options ``backend``'s plugin declares through ``composer_options`` (none without it).

    A hook that raises, or answers something else than a list of ``Option`` with distinct
    names, is a PluginError naming the plugin.
    """
    # The hook is called through pluggy, as every hook is, so an implementation may leave out
    # the ``backend`` argument; a manager of its own because callers hold the backend, not
    # the registry that loaded it.
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs.BackendPlugin)
    manager.register(backend.plugin, name=backend.origin.name)
    where = f"plugin {backend.origin.name!r} ({backend.origin.distribution})"
    try:
        answer = manager.hook.composer_options(backend=backend.spec)
    except ComposerError:
        raise
    except Exception as error:
        raise PluginError(
            f"{where} raised in composer_options for backend {backend.name!r}: "
            f"{type(error).__name__}: {error}"
        ) from error
    if answer is None:
        return ()
    if not isinstance(answer, list | tuple) or not all(isinstance(o, Option) for o in answer):
        raise PluginError(
            f"{where} returned {type(answer).__name__} from composer_options for backend "
            f"{backend.name!r}; it must return a list of composer.Option (or None: no options)."
        )
    names = [option.name for option in answer]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PluginError(
            f"{where} declares option {repeated[0]!r} twice in composer_options for backend "
            f"{backend.name!r}; name each option once."
        )
    return tuple(answer)
