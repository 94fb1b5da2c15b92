"""A third-party backend: takes ReLU and cumsum, lowers to a real pure-Python BackendDetails."""

import json

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from torch.fx.passes.operator_support import OperatorSupportBase

import composer
from composer.contract.hookspecs import hookimpl


class SampleBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        ops = [str(n.target) for n in edge_program.graph.nodes if n.op == "call_function"]
        return PreprocessResult(processed_bytes=json.dumps(ops).encode())


class SampleSupport(OperatorSupportBase):
    def is_node_supported(self, submodules, node):
        return any(name in str(node.target) for name in ("relu", "cumsum"))


@hookimpl
def composer_backends():
    return [composer.BackendSpec("sample", "SampleBackend", description="relu and cumsum")]


@hookimpl
def composer_operator_support(backend, program):
    return SampleSupport()
