"""What one backend says it can take in one program: the single path that asks its plugin.

Both the stack's assignment and the backend's own partitioning read a backend's support from
here; the registry checks every answer the plugin gives (:mod:`composer.registry.answers`), so
a plugin that breaks the contract gets the same ``PluginError`` whichever asks first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import attrs
import torch
import torch.fx
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from composer.contract.errors import ComposerWarning, PluginError
from composer.contract.op_names import op_name
from composer.registry.discovery import Backend, Registry
from composer.scheduler.boundary import BoundaryCheck
from composer.scheduler.guards import clean_foreign_tags, take_tags
from composer.scheduler.validate import describe_path, find_tag_cycle


@attrs.frozen
class Support:
    """What one backend says it can take in one program, and why it declines the rest."""

    takes: Callable[[torch.fx.Node], bool]
    why_not: Callable[[torch.fx.Node], str]
    compile_specs: list[CompileSpec]  # those of the plugin's native partitioner, if any
    wanted_constants: set[torch.fx.Node]  # constants its native partitioner tagged
    # why a tensor (named by the node producing it) cannot enter or leave this backend's
    # delegate of the given partition's nodes, or None if it can (composer.scheduler.boundary);
    # None: every tensor can
    refuses_at_boundary: BoundaryCheck | None = None
    # its native partitioner answered, constants included (composer.scheduler.guards)
    native: bool = False

    def names(self, graph: torch.fx.Graph, guarded: set[torch.fx.Node]) -> set[str]:
        """Names of the ops of ``graph`` it takes, partition sizes aside."""
        return {
            node.name
            for node in graph.nodes
            if node.op == "call_function"
            and node not in guarded
            and op_name(node) != "getitem"
            and self.takes(node)
        }


def evaluate_support(
    backend: Backend,
    registry: Registry,
    program: ExportedProgram,
    guarded: set[torch.fx.Node],
    *,
    options: Mapping[str, str],
    native: Callable[[], Partitioner | None],
) -> Support:
    """What ``backend`` says it can take in ``program``, every answer checked by the registry.

    ``native`` gives the plugin's own partitioner, asked only when the plugin offers no
    ``OperatorSupport``; a native partitioner runs on ``program`` and its tags are taken off.
    """
    support = registry.operator_support(backend, program, options)
    if support is None:
        return _native_support(backend, native(), program, guarded)
    boundary = support.refuses_at_boundary if support.asks_at_boundary else None
    return Support(support.takes, support.why_not, [], set(), boundary)


def _native_support(
    backend: Backend,
    native: Partitioner | None,
    program: ExportedProgram,
    guarded: set[torch.fx.Node],
) -> Support:
    """Run the plugin's own partitioner; keep what it tagged, minus what it must not."""
    plugin = backend.origin.name
    if native is None:
        raise PluginError(
            f"plugin {plugin!r} answers neither composer_operator_support nor "
            f"composer_partitioner for backend {backend.name!r}; it must implement one."
        )
    graph = program.graph_module.graph
    take_tags(graph)
    try:
        result = native.partition(program)
    except Exception as error:
        raise PluginError(
            f"the partitioner {type(native).__name__} of plugin {plugin!r} raised: "
            f"{type(error).__name__}: {error}"
        ) from error
    who = f"{type(native).__name__} of plugin {plugin!r}"
    kept = clean_foreign_tags(program, take_tags(graph), guarded, who)
    tagged = {node for node in kept if node.op == "call_function"}
    wanted = {node for node in kept if node.op == "placeholder"}
    native_cycle = find_tag_cycle(graph, {n: t for n, t in kept.items() if n in tagged})
    if native_cycle is not None:
        warnings.warn(
            f"the partitioner {who} tagged a non-convex set (path "
            f"{describe_path(native_cycle)} leaves a partition and re-enters it); composer "
            "split it into convex partitions.",
            ComposerWarning,
            stacklevel=2,
        )
    specs = [spec.compile_specs for spec in result.partition_tags.values()]
    name = type(native).__name__
    explained = getattr(native, "reason_unsupported", lambda node: None)
    return Support(
        lambda node: node in tagged,
        lambda node: explained(node) or f"not tagged by {name}",
        list(specs[0]) if specs else [],
        wanted,
        native=True,
    )
