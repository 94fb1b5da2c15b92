"""What one backend says it can take in one program: the single path that asks its plugin.

Both the stack's assignment and the backend's own partitioning read a backend's support from
here, so a plugin that breaks the contract gets the same ``PluginError`` whichever asks first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Container, Mapping

import attrs
import torch
import torch.fx
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram
from torch.fx.passes.operator_support import OperatorSupportBase

from composer.contract.errors import ComposerWarning, PluginError
from composer.contract.op_names import op_name
from composer.contract.support import asks_at_boundary
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


def plugin_label(backend: Backend) -> str:
    origin = backend.origin
    return f"plugin {origin.name!r} ({origin.distribution})"


def native_partitioner(
    backend: Backend, registry: Registry, program: ExportedProgram
) -> Partitioner | None:
    """The plugin's own ExecuTorch partitioner for ``backend``, if it has one."""
    native = registry.call("composer_partitioner", backend, program=program)
    if native is not None and not isinstance(native, Partitioner):
        raise PluginError(
            f"plugin {backend.origin.name!r} returned {type(native).__name__} from "
            "composer_partitioner; it must return an ExecuTorch Partitioner or None."
        )
    return native


def evaluate_support(
    backend: Backend,
    registry: Registry,
    program: ExportedProgram,
    guarded: set[torch.fx.Node],
    *,
    options: Mapping[str, str],
    native: Callable[[], Partitioner | None],
) -> Support:
    """What ``backend`` says it can take in ``program``, every answer checked.

    ``native`` gives the plugin's own partitioner, asked only when the plugin offers no
    ``OperatorSupport``; a native partitioner runs on ``program`` and its tags are taken off.
    """
    support = registry.call("composer_operator_support", backend, program=program, options=options)
    if support is None:
        return _native_support(backend, native(), program, guarded)
    if not isinstance(support, OperatorSupportBase):
        raise PluginError(
            f"{plugin_label(backend)} returned {type(support).__name__} from "
            "composer_operator_support; it must return a "
            "torch.fx.passes.operator_support.OperatorSupportBase or None."
        )
    submodules = dict(program.graph_module.named_modules())
    explain = getattr(support, "reason_unsupported", None)
    who = f"{plugin_label(backend)}: {type(support).__name__}"

    def takes(node: torch.fx.Node) -> bool:
        try:
            return bool(support.is_node_supported(submodules, node))
        except Exception as error:
            raise PluginError(
                f"{who}.is_node_supported raised on node {node.name} ({op_name(node)}): "
                f"{type(error).__name__}: {error}"
            ) from error

    def why_not(node: torch.fx.Node) -> str:
        if explain is None:
            return "unsupported op"
        try:
            reason = explain(node)
        except Exception as error:
            raise PluginError(
                f"{who}.reason_unsupported raised on node {node.name} ({op_name(node)}): "
                f"{type(error).__name__}: {error}"
            ) from error
        if reason is not None and not isinstance(reason, str):
            raise PluginError(
                f"{who}.reason_unsupported returned {type(reason).__name__} for node "
                f"{node.name}; it must return a string or None."
            )
        return reason or "unsupported op"

    return Support(takes, why_not, [], set(), _boundary_check(support, who))


def _boundary_check(support: OperatorSupportBase, who: str) -> BoundaryCheck | None:
    """The support object's ``reason_unsupported_at_boundary``, every answer checked."""
    if not asks_at_boundary(support):
        return None
    explain = support.reason_unsupported_at_boundary

    def refuses(node: torch.fx.Node, partition: Container[torch.fx.Node]) -> str | None:
        try:
            reason = explain(node, partition)
        except Exception as error:
            raise PluginError(
                f"{who}.reason_unsupported_at_boundary raised on node {node.name}: "
                f"{type(error).__name__}: {error}"
            ) from error
        if reason is not None and not isinstance(reason, str):
            raise PluginError(
                f"{who}.reason_unsupported_at_boundary returned {type(reason).__name__} for "
                f"node {node.name}; it must return a string or None."
            )
        return reason or None

    return refuses


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
    return Support(
        lambda node: node in tagged,
        lambda node: f"not tagged by {name}",
        list(specs[0]) if specs else [],
        wanted,
        native=True,
    )
