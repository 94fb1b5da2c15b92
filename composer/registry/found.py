"""What discovery finds: a backend, the plugin it came from, a plugin that failed to load."""

from __future__ import annotations

from typing import Any

import attrs

from composer.contract.backend_spec import BackendSpec


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
