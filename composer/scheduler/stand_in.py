"""The stand-in backend that plan mode lowers to: same partitions, no compilation."""

from __future__ import annotations

import json

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from composer.contract.backend_spec import BackendSpec
from composer.contract.op_names import op_name

STAND_IN_BACKEND_ID = "ComposerStandInBackend"
_BACKEND_KEY = "composer_backend"


def stand_in_compile_specs(spec: BackendSpec) -> list[CompileSpec]:
    return [CompileSpec(_BACKEND_KEY, spec.name.encode())]


def stand_in_backend_name(compile_specs: list[CompileSpec]) -> str | None:
    for compile_spec in compile_specs:
        if compile_spec.key == _BACKEND_KEY:
            return bytes(compile_spec.value).decode()
    return None


class ComposerStandInBackend(BackendDetails):
    """Lowers nothing: records which backend would have taken the subgraph."""

    @staticmethod
    def preprocess(edge_program, compile_specs: list[CompileSpec]) -> PreprocessResult:
        ops = [
            op_name(node)
            for node in edge_program.graph_module.graph.nodes
            if node.op == "call_function"
        ]
        blob = {"stand_in_for": stand_in_backend_name(compile_specs), "ops": ops}
        return PreprocessResult(processed_bytes=json.dumps(blob).encode())
