"""Discovering backend plugins and resolving a user's priority list."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from composer.contract import hookspecs
from composer.contract.backend_spec import BackendSpec
from composer.contract.errors import (
    BackendListError,
    ComposerError,
    ComposerWarning,
    PluginError,
    did_you_mean,
)
from composer.contract.options import Option
from composer.registry import answers
from composer.registry.asking import asking
from composer.registry.found import Backend, FailedPlugin, PluginInfo
from composer.registry.names import backend_names

if TYPE_CHECKING:
    import torch
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import Partitioner
    from torch.export import ExportedProgram
    from torchao.quantization.pt2e.quantizer import Quantizer

    from composer.contract.runtime import DelegateRuntime
    from composer.registry.answers import CheckedPluginSupport

ENTRY_POINT_GROUP = "composer"
OWN_DISTRIBUTION = "executorch-composer"


def _load_order(entry_point: importlib.metadata.EntryPoint) -> tuple[int, str, str]:
    dist = entry_point.dist.name if entry_point.dist else ""
    return (0 if dist == OWN_DISTRIBUTION else 1, dist, entry_point.name)


class Registry:
    """The plugins and backends found in this environment, and the one way composer asks them.

    Plugins come from the ``composer`` entry-point group, composer's own first, the rest
    sorted by distribution and entry-point name; that order also decides which plugin keeps a
    backend name two of them declare. They are imported when first needed: a stack imports
    the plugins whose entry points bear its backends' names (a name no entry point bears
    imports the rest, since a plugin may declare backends under other names), and listing
    every backend imports them all. A plugin that imports ExecuTorch's compiler at module
    level costs seconds, which a stack that does not name it should not pay.

    A backend's hooks are asked through one method each, named for what it returns
    (:meth:`options`, :meth:`operator_support`, :meth:`partitioner`, ...), of the one plugin
    that declared the backend; every answer is checked in :mod:`composer.registry.answers`.
    """

    def __init__(self, plugins: Iterable[tuple[Any, PluginInfo]] = ()) -> None:
        self._plugin_manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._plugin_manager.add_hookspecs(hookspecs.BackendPlugin)
        self._failed: list[FailedPlugin] = []
        self._backends: dict[str, Backend] = {}
        self._unloaded: list[importlib.metadata.EntryPoint] = []
        self._runtimes: dict[str, DelegateRuntime | None] = {}
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

        A plugin registered already is left as it is: the same module or object comes again
        when its entry point loads after it was added by hand (``check_plugin`` adds the
        plugin under test before the installed plugins load), and pluggy refuses an object
        registered twice.
        """
        if self.has_plugin(plugin):
            return
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
        # Two distributions may give their entry points one name (or a name of composer's own):
        # pluggy refuses a name twice, and composer asks plugins by object, never by name, so
        # the second gets a name of its own and only its backends' names may clash (warned).
        name = info.name
        if self._plugin_manager.has_plugin(name):
            name = f"{info.name} ({info.distribution}, {id(plugin):#x})"
        try:
            self._plugin_manager.register(plugin, name=name)
        except pluggy.PluginValidationError as error:  # an argument its hook spec lacks
            raise PluginError(f"pluggy refused it: {error}") from error
        try:
            self._check_hook_names(plugin)
            try:
                with asking(f"plugin {info.name!r}", "composer_backends"):
                    (declared,) = self._hook_of(plugin, "composer_backends")() or [None]
            except Exception as error:
                raise PluginError(
                    f"its composer_backends raised {type(error).__name__}: {error}"
                ) from error
            return answers.backends(declared)
        except PluginError:
            self._plugin_manager.unregister(plugin)
            raise

    def _check_hook_names(self, plugin: Any) -> None:
        """pluggy's ``check_pending``: a hook implementation of a name composer does not
        declare (a misspelling) would never be called; say which."""
        try:
            self._plugin_manager.check_pending()
        except pluggy.PluginValidationError as error:
            callers = self._plugin_manager.get_hookcallers(plugin) or []
            unknown = sorted(caller.name for caller in callers if not caller.has_spec())
            name = unknown[0] if unknown else str(error)
            raise PluginError(hookspecs.unknown_hook_message(f"its {name}", name)) from error

    def has_plugin(self, plugin: Any) -> bool:
        """Whether ``plugin`` (a module or object) is registered here."""
        return self._plugin_manager.is_registered(plugin)

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

    def in_order(self) -> list[Backend]:
        """Every backend, in the order plugins load (composer's own first, the rest by
        distribution and plugin name), each plugin's as it declares them. Which plugins a
        stack imported first does not change it."""
        backends = list(self.backends.values())
        rank = {id(backend): index for index, backend in enumerate(backends)}

        def order(backend: Backend) -> tuple:
            origin = backend.origin
            own = origin.distribution == OWN_DISTRIBUTION
            return (not own, origin.distribution, origin.name, rank[id(backend)])

        return sorted(backends, key=order)

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
                near = "" if broken else did_you_mean(name, self._backends)
                raise BackendListError(
                    f"unknown backend {name!r}{hint}{f'; {near}' if near else '. '}Known "
                    f"backends: {self._known()}."
                )
            resolved.append(self._backends[name])
        return resolved

    def _known(self) -> str:
        self._load_all()
        return ", ".join(sorted(self._backends)) or "(none installed)"

    # --- the hooks, one method each, every answer checked (composer.registry.answers) -------

    def options(self, backend: Backend) -> tuple[Option, ...]:
        """The options ``backend`` takes (``composer_options``); none when not implemented."""
        return answers.options(self._ask("composer_options", backend), backend)

    def unavailable_reason(self, backend: Backend) -> str | None:
        """Why ``backend`` cannot lower on this machine, or ``None`` if it can."""
        reason = self._ask("composer_unavailable_reason", backend)
        return answers.unavailable_reason(reason, backend)

    def operator_support(
        self, backend: Backend, program: ExportedProgram, options: Mapping[str, str]
    ) -> CheckedPluginSupport | None:
        """Which nodes of ``program`` ``backend`` takes, and why not the rest, every answer
        checked; ``None`` when the plugin leaves it to its partitioner."""
        support = self._ask("composer_operator_support", backend, program=program, options=options)
        return answers.operator_support(support, backend, program)

    def partitioner(self, backend: Backend, program: ExportedProgram) -> Partitioner | None:
        """The plugin's own ExecuTorch partitioner for ``backend``, if it has one."""
        native = self._ask("composer_partitioner", backend, program=program)
        return answers.partitioner(native, backend)

    def compile_specs(
        self, backend: Backend, method_name: str, options: Mapping[str, str]
    ) -> list[CompileSpec] | None:
        """The compile specs ``backend``'s ``preprocess`` gets; ``None``: the plugin gives none."""
        specs = self._ask(
            "composer_compile_specs", backend, method_name=method_name, options=options
        )
        return answers.compile_specs(specs, backend)

    def ops_to_not_decompose(
        self, backend: Backend, program: ExportedProgram, options: Mapping[str, str]
    ) -> list[torch._ops.OpOverload] | None:
        """The ATen ops ``backend`` wants whole; ``None``: the plugin does not say."""
        ops = self._ask("composer_ops_to_not_decompose", backend, program=program, options=options)
        return answers.ops_to_not_decompose(ops, backend)

    def rewrites(self, backend: Backend, options: Mapping[str, str]) -> list:
        """The passes ``backend`` rewrites ops it declines with, before partitioning."""
        return answers.rewrites(self._ask("composer_rewrites", backend, options=options), backend)

    def quantizer(self, backend: Backend, options: Mapping[str, str]) -> Quantizer | None:
        """A fresh PT2E quantizer for ``backend``'s integer kernels; ``None``: it runs float."""
        return answers.quantizer(self._ask("composer_quantizer", backend, options=options), backend)

    def runtime(self, backend: Backend) -> DelegateRuntime | None:
        """The runtime ``backend``'s plugin supplies for its delegates (``composer_runtime``),
        asked once; ``None``: the plugin supplies none."""
        if backend.name not in self._runtimes:
            answer = self._ask("composer_runtime", backend)
            self._runtimes[backend.name] = answers.runtime(answer, backend)
        return self._runtimes[backend.name]

    def runtime_of_id(self, backend_id: str) -> tuple[str, DelegateRuntime] | None:
        """The backend whose ExecuTorch id is ``backend_id`` and the runtime its plugin
        supplies; ``None`` where no installed plugin lowers that id or supplies a runtime."""
        # The plugins loaded already first (a compose loaded those of its stack); the rest,
        # whose loading imports every plugin's module, only where none of them lowers the id
        # (`composer run` of a program written elsewhere).
        lowering = [b for b in self._backends.values() if b.spec.backend_id == backend_id]
        if not lowering:
            self._load_all()
            lowering = [b for b in self._backends.values() if b.spec.backend_id == backend_id]
        for backend in lowering:
            found = self.runtime(backend)
            if found is not None:
                return backend.name, found
        return None

    def _hook_of(self, plugin: Any, hook_name: str) -> pluggy.HookCaller:
        """The hook ``hook_name`` of ``plugin`` alone."""
        others = [p for p in self._plugin_manager.get_plugins() if p is not plugin]
        return self._plugin_manager.subset_hook_caller(hook_name, remove_plugins=others)

    def _ask(self, hook_name: str, backend: Backend, **kwargs: Any) -> Any:
        """What the plugin that declared ``backend`` answers to ``hook_name``, unchecked."""
        hook = self._hook_of(backend.plugin, hook_name)
        try:
            with asking(f"plugin {backend.origin.name!r}", hook_name):
                return hook(backend=backend.spec, **kwargs)
        except ComposerError:
            raise  # the plugin's own message for the user (a bad option value), as it wrote it
        except Exception as error:
            raise PluginError(
                f"plugin {backend.origin.name!r} ({backend.origin.distribution}) raised in "
                f"{hook_name} for backend {backend.name!r}: {type(error).__name__}: {error}"
            ) from error


_default: Registry | None = None
# The registry of the compose in progress (``compose(..., registry=...)``): what the proof asks
# for a backend's runtime.
_in_use: contextvars.ContextVar[Registry | None] = contextvars.ContextVar(
    "composer_registry", default=None
)


@contextlib.contextmanager
def registry_in_use(registry: Registry) -> Iterator[None]:
    """Make ``registry`` the one :func:`current_registry` answers while the block runs."""
    token = _in_use.set(registry)
    try:
        yield
    finally:
        _in_use.reset(token)


def current_registry() -> Registry:
    """The registry of the compose in progress, else this environment's installed plugins."""
    return _in_use.get() or default_registry()


def default_registry() -> Registry:
    """The registry of this environment's installed plugins, loaded once."""
    global _default
    if _default is None:
        _default = Registry.from_entry_points()
    return _default
