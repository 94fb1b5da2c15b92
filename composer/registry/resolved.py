"""A stack resolved once: its backends found among the installed plugins, their options
checked and defaults filled in, and which of them can only be planned here."""

from __future__ import annotations

import attrs

from composer.contract.errors import BackendListError, as_typed
from composer.registry.discovery import Backend, Registry, default_registry
from composer.registry.stack import Stack


@attrs.frozen(eq=False)
class ResolvedStack:
    """What ``plan``, ``compose`` and the rest work from, made by :func:`resolve_stack`."""

    stack: Stack  # every backend's options checked, its plugin's defaults filled in
    backends: tuple[Backend, ...]  # the stack's backends, in priority order
    registry: Registry  # the plugins that resolved them
    # The backends that cannot lower on this machine, where that is allowed: a plan lowers
    # them to composer's stand-in.
    stand_ins: frozenset[str] = frozenset()
    # Why each backend that cannot lower on this machine cannot (by name).
    unavailable: dict[str, str] = attrs.field(factory=dict)

    def lowering(self, stack: Stack) -> ResolvedStack:
        """The same backends lowered with ``stack`` (a repair's: its pins added)."""
        return attrs.evolve(self, stack=stack)

    def lowering_backends(self) -> dict[str, Backend]:
        """The backends that really lower (no stand-in), by ExecuTorch backend id."""
        return {b.spec.backend_id: b for b in self.backends if b.name not in self.stand_ins}

    def planned(self) -> ResolvedStack:
        """Every backend a stand-in: what a plan lowers, on any machine."""
        return attrs.evolve(self, stand_ins=frozenset(b.name for b in self.backends))

    def narrowed(self, stack: Stack) -> ResolvedStack:
        """The resolved stack of ``stack``: some of these backends, in any order, with their
        settings (a measured placement's candidate), resolved as :func:`resolve_stack` would."""
        by_name = {backend.name: backend for backend in self.backends}
        backends = tuple(by_name[name] for name in stack.backends)
        return attrs.evolve(
            self,
            stack=stack.with_defaults(backends, self.registry),
            backends=backends,
            stand_ins=self.stand_ins & set(stack.backends),
        )

    def lowered_here(self) -> ResolvedStack:
        """This stack, where every backend can lower on this machine; else BackendListError."""
        for backend in self.backends:
            if backend.name in self.unavailable:
                raise _cannot_lower(backend.name, self.unavailable[backend.name])
        return self


def resolve_stack(
    stack: Stack, registry: Registry | None = None, *, must_lower_here: bool = True
) -> ResolvedStack:
    """``stack`` resolved through ``registry`` (default: the installed plugins).

    ``must_lower_here``: a backend that cannot lower on this machine raises
    BackendListError; otherwise it is named among the stand-ins."""
    registry = registry or default_registry()
    backends = tuple(registry.resolve(stack.backends))
    unavailable = {}
    for backend in backends:
        reason = registry.unavailable_reason(backend)
        if reason is None:
            continue
        if must_lower_here:
            raise _cannot_lower(backend.name, reason)
        unavailable[backend.name] = reason
    return ResolvedStack(
        stack.with_defaults(backends, registry),
        backends,
        registry,
        frozenset(unavailable),
        unavailable,
    )


def _cannot_lower(name: str, reason: str) -> BackendListError:
    plan = as_typed("composer.plan()", "`composer plan` with these arguments")
    return BackendListError(
        f"backend {name!r} cannot lower on this machine: {reason}. Run {plan} here for the "
        "plan, and compose on a machine that has it."
    )
