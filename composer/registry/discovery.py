"""Discovering backend plugins and resolving a user's priority list."""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import pluggy

from composer.contract import hookspecs
from composer.contract.backend_spec import BackendSpec
from composer.contract.errors import BackendListError, ComposerError, ComposerWarning, PluginError
from composer.registry.names import backend_names

ENTRY_POINT_GROUP = "composer"
OWN_DISTRIBUTION = "executorch-composer"


@attrs.frozen
class PluginInfo:
    """Where a plugin came from: its entry-point name and distribution."""

    name: str
    distribution: str
    version: str


@attrs.frozen
class FailedPlugin:
    """A plugin that could not be loaded, and why."""

    name: str
    distribution: str
    error: str


@attrs.frozen
class Backend:
    """A backend found through a plugin: its spec and the plugin that declared it."""

    spec: BackendSpec
    plugin: Any
    origin: PluginInfo

    @property
    def name(self) -> str:
        return self.spec.name


def _load_order(entry_point: importlib.metadata.EntryPoint) -> tuple[int, str, str]:
    dist = entry_point.dist.name if entry_point.dist else ""
    return (0 if dist == OWN_DISTRIBUTION else 1, dist, entry_point.name)


class Registry:
    """The plugins and backends found in this environment.

    Plugins come from the ``composer`` entry-point group, composer's own first, the rest
    sorted by distribution and entry-point name; that order also decides which plugin keeps a
    backend name two of them declare. They are imported when first needed: a stack imports
    the plugins whose entry points bear its backends' names (a name no entry point bears
    imports the rest, since a plugin may declare backends under other names), and listing
    every backend imports them all. A plugin that imports ExecuTorch's compiler at module
    level costs seconds, which a stack that does not name it should not pay.
    """

    def __init__(self, plugins: Iterable[tuple[Any, PluginInfo]] = ()) -> None:
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs.BackendPlugin)
        self._failed: list[FailedPlugin] = []
        self._backends: dict[str, Backend] = {}
        self._unloaded: list[importlib.metadata.EntryPoint] = []
        for plugin, info in plugins:
            self.add_plugin(plugin, info)

    @classmethod
    def from_entry_points(cls) -> Registry:
        """The plugins of the ``composer`` entry-point group, each imported when first needed."""
        registry = cls()
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        registry._unloaded = sorted(entry_points, key=_load_order)
        return registry

    def _load(self, entry_point: importlib.metadata.EntryPoint) -> None:
        self._unloaded.remove(entry_point)
        dist = entry_point.dist
        info = PluginInfo(
            entry_point.name, dist.name if dist else "?", dist.version if dist else "?"
        )
        try:
            plugin = entry_point.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not stop the others
            self._skip(info, "failed to import", f"{type(error).__name__}: {error}")
            return
        self.add_plugin(plugin, info)

    def _load_all(self) -> None:
        for entry_point in list(self._unloaded):
            self._load(entry_point)

    def _find(self, name: str) -> Backend | None:
        """The backend ``name``, importing the plugin named after it, else every plugin."""
        if name not in self._backends:
            for entry_point in [e for e in self._unloaded if e.name == name]:
                self._load(entry_point)
        if name not in self._backends:
            self._load_all()
        return self._backends.get(name)

    @property
    def failed(self) -> list[FailedPlugin]:
        """The plugins that could not be loaded, every plugin imported to know."""
        self._load_all()
        return list(self._failed)

    def add_plugin(self, plugin: Any, info: PluginInfo) -> None:
        """Register ``plugin`` and the backends it declares; skip it if it breaks the contract.

        A plugin whose ``composer_backends`` raises or returns something else than a list of
        ``BackendSpec`` is left out with a warning, as one that fails to import is: a stack
        that does not name it must keep working.
        """
        try:
            specs = self._declared_backends(plugin, info)
        except PluginError as error:
            self._skip(info, "was skipped", str(error))
            return
        for spec in specs:
            existing = self._backends.get(spec.name)
            if existing is not None:
                warnings.warn(
                    f"backend {spec.name!r} is declared by plugin {existing.origin.name!r} "
                    f"({existing.origin.distribution}) and by plugin {info.name!r} "
                    f"({info.distribution}); keeping the first ({existing.origin.name!r}).",
                    ComposerWarning,
                    stacklevel=2,
                )
                continue
            self._backends[spec.name] = Backend(spec, plugin, info)

    def _declared_backends(self, plugin: Any, info: PluginInfo) -> list[BackendSpec]:
        self.plugin_manager.register(plugin, name=info.name)
        hook = self.plugin_manager.subset_hook_caller(
            "composer_backends",
            remove_plugins=[p for p in self.plugin_manager.get_plugins() if p is not plugin],
        )
        try:
            try:
                (declared,) = hook() or [None]
            except Exception as error:
                raise PluginError(
                    f"its composer_backends raised {type(error).__name__}: {error}"
                ) from error
            if not isinstance(declared, list | tuple) or not all(
                isinstance(spec, BackendSpec) for spec in declared
            ):
                raise PluginError(
                    f"its composer_backends returned {_short_repr(declared)}; it must return a "
                    "list of composer.BackendSpec"
                )
        except PluginError:
            self.plugin_manager.unregister(plugin)
            raise
        return list(declared)

    def _skip(self, info: PluginInfo, what: str, why: str) -> None:
        self._failed.append(FailedPlugin(info.name, info.distribution, why))
        warnings.warn(
            f"composer plugin {info.name!r} (from {info.distribution}) {what}: {why}. "
            "Fix or uninstall it; the other backends work.",
            ComposerWarning,
            stacklevel=3,
        )

    @property
    def backends(self) -> dict[str, Backend]:
        """Every backend of every plugin (which imports them all)."""
        self._load_all()
        return dict(self._backends)

    def resolve(self, names: str | Sequence[str]) -> list[Backend]:
        """Turn ``"a,b"`` or ``["a", "b"]`` into backends, in priority order."""

        names = list(backend_names(names))
        if not names:
            raise BackendListError(
                f"the backend list is empty; name at least one of: {self._known()}."
            )
        seen: set[str] = set()
        resolved = []
        for name in names:
            if name in seen:
                raise BackendListError(
                    f"backend {name!r} appears twice in the list {list(names)}; name each once, "
                    "in priority order."
                )
            seen.add(name)
            if self._find(name) is None:
                broken = [f.name for f in self.failed if f.name == name]
                hint = " (its plugin failed to load; see the warning)" if broken else ""
                raise BackendListError(
                    f"unknown backend {name!r}{hint}. Known backends: {self._known()}."
                )
            resolved.append(self._backends[name])
        return resolved

    def _known(self) -> str:
        self._load_all()
        return ", ".join(sorted(self._backends)) or "(none installed)"

    def call(self, hook_name: str, backend: Backend, **kwargs: Any) -> Any:
        """Call ``hook_name`` on the plugin that declared ``backend`` only."""
        others = [p for p in self.plugin_manager.get_plugins() if p is not backend.plugin]
        hook = self.plugin_manager.subset_hook_caller(hook_name, remove_plugins=others)
        try:
            return hook(backend=backend.spec, **kwargs)
        except ComposerError:
            raise  # the plugin's own message for the user (a bad option value), as it wrote it
        except Exception as error:
            raise PluginError(
                f"plugin {backend.origin.name!r} ({backend.origin.distribution}) raised in "
                f"{hook_name} for backend {backend.name!r}: {type(error).__name__}: {error}"
            ) from error

    def unavailable_reason(self, backend: Backend) -> str | None:
        reason = self.call("composer_unavailable_reason", backend)
        if reason is not None and not isinstance(reason, str):
            raise PluginError(
                f"plugin {backend.origin.name!r} returned {type(reason).__name__} from "
                "composer_unavailable_reason; it must return a string or None."
            )
        return reason


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


_default: Registry | None = None


def default_registry() -> Registry:
    """The registry of this environment's installed plugins, loaded once."""
    global _default
    if _default is None:
        _default = Registry.from_entry_points()
    return _default
