"""Backend plugins that exist only for the tests: greedy, and deliberately misbehaving ones.

They use a real pure-Python ExecuTorch backend (``ComposerTestBackend``): it lowers for real
and its delegates run through the Python reference, not the runtime.
"""

from __future__ import annotations

import json

import torch.fx
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.delegate import executorch_call_delegate
from torch.fx.passes.operator_support import OperatorSupportBase

from composer import BackendSpec, Registry
from composer.contract.hookspecs import hookimpl
from composer.registry.discovery import PluginInfo


class ComposerTestBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        ops = [
            str(n.target) for n in edge_program.graph_module.graph.nodes if n.op == "call_function"
        ]
        return PreprocessResult(processed_bytes=json.dumps({"ops": ops}).encode())


class Everything(OperatorSupportBase):
    """Says yes to every node, delegates of other backends included."""

    def is_node_supported(self, submodules, node) -> bool:
        return True


class GreedyPlugin:
    """A backend that takes every op it is offered, like ExecuTorch's AOTInductor ones."""

    def __init__(self, name: str = "greedy") -> None:
        self.spec = BackendSpec(name, "ComposerTestBackend", device="cuda")

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_operator_support(self, backend, program):
        return Everything()


class TagEverything(Partitioner):
    """A careless native partitioner: one tag on every node, delegates and constants too."""

    def __init__(self, op_filter=lambda node: True) -> None:
        super().__init__()
        self.op_filter = op_filter
        self.delegation_spec = DelegationSpec("ComposerTestBackend", [])

    def partition(self, exported_program) -> PartitionResult:
        for node in exported_program.graph_module.graph.nodes:
            if node.op in ("call_function", "placeholder", "get_attr") and self.op_filter(node):
                node.meta["delegation_tag"] = "careless"
        return PartitionResult(exported_program, {"careless": self.delegation_spec})


class CarelessPlugin:
    """A plugin whose own partitioner tags what it must not (a misbehaving third party)."""

    def __init__(self, name: str = "careless", op_filter=lambda node: True) -> None:
        self.spec = BackendSpec(name, "ComposerTestBackend")
        self.op_filter = op_filter

    @hookimpl
    def composer_backends(self):
        return [self.spec]

    @hookimpl
    def composer_partitioner(self, backend, program):
        return TagEverything(self.op_filter)


def registry_with(*plugins) -> Registry:
    """The installed plugins plus ``plugins``, as a third-party install would add them."""
    registry = Registry.from_entry_points()
    for plugin in plugins:
        name = plugin.spec.name
        registry.add_plugin(plugin, PluginInfo(name, f"composer-test-{name}", "0"))
    return registry


def is_delegate_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is executorch_call_delegate
