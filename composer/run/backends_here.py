"""What this machine does with each installed backend: lower its partitions, run its delegates.

A backend lowers here where its plugin says so (``composer_unavailable_reason``). Its delegates
run here where the runtime its plugin supplies (``composer_runtime``) can run, else where an
ExecuTorch runtime here has its backend: the pip runtime (built for this torch), the torch-free
runtime, or the C++ runner ``$COMPOSER_ET_RUNNER`` names, as the proof chooses them
(:func:`composer.run.proof.can_prove`). A backend that does both is proven here: composer runs
every program it writes with it before writing it. ``composer backends`` prints this.
"""

from __future__ import annotations

import inspect
from typing import Any

import attrs

from composer.contract.errors import ComposerError
from composer.contract.quiet import quiet_call
from composer.registry.discovery import Registry, default_registry
from composer.registry.found import Backend


@attrs.frozen
class BackendHere:
    """One installed backend, and whether it lowers and runs here (``None``: it does; else
    why not)."""

    name: str
    backend_id: str
    device: str
    description: str
    distribution: str
    version: str
    why_not_lower: str | None
    runs_in: str | None  # where its delegates run here, or None
    why_not_run: str | None

    @property
    def lowers_here(self) -> bool:
        return self.why_not_lower is None

    @property
    def runs_here(self) -> bool:
        return self.runs_in is not None

    @property
    def proves_here(self) -> bool:
        """Whether a program with this backend's delegates is both written and proven here."""
        return self.lowers_here and self.runs_here

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "backend_id": self.backend_id,
            "device": self.device,
            "distribution": self.distribution,
            "version": self.version,
            "lowers_here": self.lowers_here,
            "why_not_lower": self.why_not_lower,
            "runs_here": self.runs_here,
            "runs_in": self.runs_in,
            "why_not_run": self.why_not_run,
            "proves_here": self.proves_here,
        }


@quiet_call
def available_backends(registry: Registry | None = None) -> list[str]:
    """The names of the installed backends that lower on this machine, in the registry's order
    (composer's own first, then each other distribution's), as ONNX Runtime's
    ``get_available_providers()`` names its providers.

    A name here can be given to :func:`composer.compose`; the others plan anywhere
    (:func:`composer.plan`) and say why they cannot lower (``composer backends NAME``).
    ``registry``: default, the installed plugins."""
    registry = registry or default_registry()
    return [
        backend.name for backend in registry.in_order() if _why_not_lower(registry, backend) is None
    ]


@quiet_call
def provable_backends(registry: Registry | None = None) -> list[str]:
    """The names of the installed backends that lower on this machine and whose delegates run
    here, so that composer proves the programs it writes with them before writing them, in the
    order of :func:`available_backends`. A backend that lowers here but runs elsewhere (an
    accelerator this machine lacks) is written unproven, and the plan says so."""
    return [each.name for each in backends_here(registry) if each.proves_here]


def backends_here(registry: Registry | None = None) -> list[BackendHere]:
    """Every installed backend, in the registry's order, and what this machine does with it."""
    registry = registry or default_registry()
    found = []
    for backend in registry.in_order():
        runs_in, why_not_run = _where_it_runs(registry, backend)
        found.append(
            BackendHere(
                name=backend.name,
                backend_id=backend.spec.backend_id,
                device=backend.spec.device,
                description=describe(backend),
                distribution=backend.origin.distribution,
                version=backend.origin.version,
                why_not_lower=_why_not_lower(registry, backend),
                runs_in=runs_in,
                why_not_run=why_not_run,
            )
        )
    return found


def describe(backend: Backend) -> str:
    """What ``backend`` is, in a line: its spec's ``description``, else the first line of its
    plugin's own docstring."""
    if backend.spec.description:
        return backend.spec.description
    plugin = backend.plugin
    if inspect.ismodule(plugin):
        doc = plugin.__doc__
    else:  # its own class's, not one a base class (BackendPlugin) lends it
        doc = (plugin if isinstance(plugin, type) else type(plugin)).__dict__.get("__doc__")
    return (doc or "").strip().split("\n", 1)[0]


def _why_not_lower(registry: Registry, backend: Backend) -> str | None:
    try:
        return registry.unavailable_reason(backend)
    except ComposerError as error:  # one plugin's broken hook must not hide the others
        return str(error)


def _where_it_runs(registry: Registry, backend: Backend) -> tuple[str | None, str | None]:
    """(where ``backend``'s delegates run here, ``None``) or (``None``, why none runs them)."""
    from composer.run import cpp_runtime, torch_free_runtime
    from composer.run.runtime import registered_backends, torch_mismatch

    try:
        supplied = registry.runtime(backend)
    except ComposerError as error:
        return None, str(error)
    if supplied is not None:
        reason = supplied.unavailable_reason()
        if reason is None:
            return supplied.name, None
        return None, f"its runtime ({supplied.name}): {reason}"
    backend_id = backend.spec.backend_id
    if torch_mismatch() is None and backend_id in registered_backends():
        return "the ExecuTorch runtime", None
    if torch_mismatch() is not None and backend_id in torch_free_runtime.backends():
        return torch_free_runtime.DISTRIBUTION, None
    runner = cpp_runtime.runner_path()
    if runner is not None:
        return f"{cpp_runtime.EXECUTOR} ({runner})", None
    return None, f"no runtime here has {backend_id}"
