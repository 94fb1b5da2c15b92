"""A real ExecuTorch ``BackendDetails`` whose blob describes the subgraph it was given."""

from __future__ import annotations

import json

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

from composer.contract.op_names import op_name

BLOB_FORMAT = "composer.tensorrt_stub/1"


def _describe(value) -> dict | None:
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    return None


class TensorRTStubBackend(BackendDetails):
    """Stands in for a TensorRT engine: stores a JSON description instead of an engine."""

    @staticmethod
    def preprocess(edge_program, compile_specs) -> PreprocessResult:
        graph = edge_program.graph_module.graph
        user_inputs = set(edge_program.graph_signature.user_inputs)
        inputs = [
            _describe(node.meta.get("val"))
            for node in graph.nodes
            if node.op == "placeholder" and node.name in user_inputs
        ]
        output = next(node for node in graph.nodes if node.op == "output")
        outputs = [_describe(arg.meta.get("val")) for arg in output.args[0]]
        blob = {
            "format": BLOB_FORMAT,
            "ops": [op_name(n) for n in graph.nodes if n.op == "call_function"],
            "inputs": inputs,
            "outputs": outputs,
            "constants": len(edge_program.graph_signature.inputs_to_parameters)
            + len(edge_program.graph_signature.inputs_to_buffers),
        }
        return PreprocessResult(processed_bytes=json.dumps(blob, sort_keys=True).encode())
