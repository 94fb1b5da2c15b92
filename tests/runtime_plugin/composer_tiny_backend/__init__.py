"""A small third-party backend, both halves: what it takes and how it lowers, and its runtime.

``tiny`` takes float32 elementwise ops (relu, tanh, sigmoid, add, sub, mul). Its ``preprocess``
writes a little program of steps (JSON: each op, its arguments, the constants it reads); its
runtime runs those steps with NumPy, not torch. So composer proves a ``tiny`` delegate against
its subgraph in float64 like any other, and a wrong kernel in the runtime is caught.

``TINY_RUNTIME_BUG=aten.tanh.default`` makes the runtime compute that op 1% high, to see the
proof find it (``*``: every op).
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

import composer
from composer.hookspecs import BackendPlugin

FORMAT = "composer-tiny/1"
KERNELS = {
    "aten.relu.default": lambda x: np.maximum(x, np.float32(0)),
    "aten.tanh.default": np.tanh,
    "aten.sigmoid.default": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "aten.add.Tensor": lambda a, b, alpha=1: a + b * np.float32(alpha),
    "aten.sub.Tensor": lambda a, b, alpha=1: a - b * np.float32(alpha),
    "aten.mul.Tensor": lambda a, b: a * b,
}


def _op(node) -> str:
    return composer.op_name(node)


class TinyBackend(BackendDetails):
    """Compiles a partition into a list of steps its runtime interprets."""

    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        signature = edge_program.graph_signature
        lifted = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
                  **signature.inputs_to_lifted_tensor_constants}  # fmt: skip
        program = {"format": FORMAT, "inputs": [], "constants": {}, "steps": [], "outputs": []}
        for node in edge_program.graph.nodes:
            if node.op == "placeholder" and node.name in lifted:
                target = lifted[node.name]
                value = edge_program.state_dict.get(target, edge_program.constants.get(target))
                program["constants"][node.name] = value.detach().double().tolist()
            elif node.op == "placeholder":
                program["inputs"].append(node.name)
            elif node.op == "call_function":
                args = [_argument(a) for a in node.args]
                kwargs = {k: _argument(v) for k, v in node.kwargs.items()}
                program["steps"].append([node.name, _op(node), args, kwargs])
            elif node.op == "output":
                program["outputs"] = [arg.name for arg in node.args[0]]
        return PreprocessResult(processed_bytes=json.dumps(program).encode())


def _argument(value):
    return {"ref": value.name} if isinstance(value, torch.fx.Node) else value


class TinySupport(composer.ExplainedSupport):
    def is_node_supported(self, submodules, node) -> bool:
        return self.reason_unsupported(node) is None

    def reason_unsupported(self, node) -> str | None:
        if _op(node) not in KERNELS:
            return "not an elementwise op tiny has a kernel for"
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
            return "tiny computes float32 only"
        return None


class TinyRuntime(composer.DelegateRuntime):
    """Runs a ``tiny`` delegate's steps with NumPy, in float32."""

    name = "tiny's NumPy runtime"

    def load(self, delegate):
        program = json.loads(delegate.processed_bytes)
        if program.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} program: {program.get('format')!r}")
        bug = os.environ.get("TINY_RUNTIME_BUG")
        constants = {k: np.asarray(v, dtype=np.float32) for k, v in program["constants"].items()}

        def run(operands):
            values = dict(constants)
            values.update(zip(program["inputs"], (t.numpy() for t in operands), strict=True))

            def value(argument):
                return values[argument["ref"]] if isinstance(argument, dict) else argument

            for name, op, args, kwargs in program["steps"]:
                result = KERNELS[op](*map(value, args), **{k: value(v) for k, v in kwargs.items()})
                values[name] = result * np.float32(1.01) if bug in (op, "*") else result
            return [torch.from_numpy(np.ascontiguousarray(values[o], dtype=np.float32))
                    for o in program["outputs"]]  # fmt: skip

        return run


class TinyPlugin(BackendPlugin):
    spec = composer.BackendSpec(
        "tiny", "TinyBackend", description="float32 elementwise ops, run by NumPy"
    )

    def composer_operator_support(self, backend, program, options):
        return TinySupport()

    def composer_runtime(self, backend):
        return TinyRuntime()


plugin = TinyPlugin()
