"""composer's partitioning as drop-in ExecuTorch partitioners, for existing export scripts.

to_edge_transform_and_lower(ep, partitioner=[
    composer.partitioner("tensorrt_stub"), composer.guard(XnnpackPartitioner()),
])

A composer partitioner keeps whole every op another partitioner of its list keeps whole
(``ComposerPartitioner.ops_to_not_decompose``), so it needs to know that list.
``listed(...)`` tells it; a plain list makes it read the list off ExecuTorch's call stack.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import attrs
from executorch.exir.backend.partitioner import Partitioner

from composer.contract.errors import ComposerError
from composer.contract.options import check_options
from composer.registry.discovery import Registry, default_registry
from composer.scheduler.guarded import GuardedPartitioner
from composer.scheduler.partitioner import ComposerPartitioner


def partitioner(name: str, *, registry: Registry | None = None, **options: str) -> Partitioner:
    """An ExecuTorch ``Partitioner`` running composer's guarded, convex partitioning for ``name``.

    ``options`` are the backend's options (``composer.partitioner("cuda", max_autotune="OFF")``).
    """

    registry = registry or default_registry()
    (backend,) = registry.resolve([name])
    checked = check_options(backend.name, registry.options(backend), options)
    return DropInPartitioner(backend, registry, options=checked)


def listed(*partitioners: Partitioner) -> list[Partitioner]:
    """The list for ``to_edge_transform_and_lower``, each composer partitioner told the others."""
    together = list(partitioners)
    for each in partitioners:
        if isinstance(each, ComposerPartitioner):
            # Made before the list was: each is told it here, in a lowering of its own (the
            # one it was made with may be seated already).
            each.lowering = attrs.evolve(each.lowering)
            each.lowering.seat(together)
    return together


class DropInPartitioner(ComposerPartitioner):
    """``composer.partitioner(name)``: in a list that composer may not have been told about."""

    def listed_with(self) -> Sequence[Partitioner]:
        if self.lowering.seated:
            return self.lowering.partitioners
        return _partitioners_listed_with(self)


def _partitioners_listed_with(partitioner: Partitioner) -> list[Partitioner]:
    """The partitioners of the running ``to_edge_transform_and_lower``, in list order.

    ExecuTorch 1.5.1 gives a partitioner no way to learn the rest of its list: the list is a
    local of the function that asks it (``_gen_edge_manager_for_partitioners``). XNNPACK's
    partitioner inspects the call stack too, to learn which API called it. Only drop-ins not
    passed through ``listed`` come here; not found, or not in that list: nothing else is listed.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_gen_edge_manager_for_partitioners":
            listed = frame.f_locals.get("partitioners_for_program") or []
            return listed if any(other is partitioner for other in listed) else []
        frame = frame.f_back
    return []


def guard(inner: Partitioner) -> Partitioner:
    """Wrap any ExecuTorch ``Partitioner`` in composer's guards and convex repair."""
    if not isinstance(inner, Partitioner):
        raise ComposerError(
            f"composer.guard wraps an ExecuTorch Partitioner, not {type(inner).__name__}."
        )
    return GuardedPartitioner(inner)
