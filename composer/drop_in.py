"""composer's partitioning as drop-in ExecuTorch partitioners, for existing export scripts.

to_edge_transform_and_lower(ep, partitioner=[
    composer.partitioner("tensorrt_stub"), composer.guard(XnnpackPartitioner()),
])
"""

from __future__ import annotations

from executorch.exir.backend.partitioner import Partitioner

from composer.registry import Registry, default_registry
from composer.scheduler.guarded import GuardedPartitioner
from composer.scheduler.partitioner import ComposerPartitioner


def partitioner(name: str, *, registry: Registry | None = None, **options: str) -> Partitioner:
    """An ExecuTorch ``Partitioner`` running composer's guarded, convex partitioning for ``name``.

    ``options`` are the backend's options (``composer.partitioner("cuda", max_autotune="OFF")``).
    """
    from composer.options import check_options, declared_options

    registry = registry or default_registry()
    (backend,) = registry.resolve([name])
    checked = check_options(backend.name, declared_options(backend), options)
    return ComposerPartitioner(backend, registry, options=checked)


def guard(inner: Partitioner) -> Partitioner:
    """Wrap any ExecuTorch ``Partitioner`` in composer's guards and convex repair."""
    if not isinstance(inner, Partitioner):
        from composer.errors import ComposerError

        raise ComposerError(
            f"composer.guard wraps an ExecuTorch Partitioner, not {type(inner).__name__}."
        )
    return GuardedPartitioner(inner)
