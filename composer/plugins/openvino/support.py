"""Which edge ops OpenVINO takes: ExecuTorch's own OpenVINO support check, made quiet."""

from __future__ import annotations

import contextlib
import io

import torch.fx
from torch.export import ExportedProgram
from torch.fx.passes.operator_support import OperatorSupportBase


class OpenvinoSupport(OperatorSupportBase):
    """ExecuTorch's ``OpenvinoOperatorsSupport``, with the quantization patterns its partitioner
    enables, minus the line it prints for every op it declines.

    Going through composer rather than ``OpenvinoPartitioner`` is what makes ``never`` pins
    and minimum partition sizes apply: the partitioner's ``op_types_to_skip`` is checked only
    after an op is already found supported, so it skips nothing OpenVINO can take.
    """

    def __init__(self, program: ExportedProgram) -> None:
        from executorch.backends.openvino.partitioner import (
            OpenvinoOperatorsSupport,
            OpenvinoPartitioner,
        )

        # The partitioner enables nncf's packed-weight patterns (stack of bitwise ops) by name.
        finder = OpenvinoPartitioner([])
        finder.capture_nncf_patterns(program.graph_module)
        self._support = OpenvinoOperatorsSupport(enabled_ops_by_name=finder._enabled_ops_by_name)

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        with contextlib.redirect_stdout(io.StringIO()):
            return bool(self._support.is_node_supported(submodules, node))

    def reason_unsupported(self, node: torch.fx.Node) -> str | None:
        return "not in OpenVINO's table of supported ops"


def takes_op(op: torch._ops.OpOverload) -> bool:
    """Whether ExecuTorch's OpenVINO support check takes a call of the ATen op ``op``.

    The check runs on the edge program, so it is asked about ``op``'s edge form (whose
    ``__name__`` is what it looks up in OpenVINO's table). It looks at the op alone, never
    at the arguments, so asking it about one call node answers for every call of ``op``
    (besides the table, nncf's packed-weight patterns enable bitwise ops by node name; the
    partitioner keeps none of those whole).
    """
    from executorch.backends.openvino.partitioner import OpenvinoOperatorsSupport
    from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge

    try:
        edge_op = aten_to_edge(op)
    except Exception:  # noqa: BLE001 - no edge form: not kept whole, it decomposes as usual
        return False
    graph = torch.fx.Graph()
    node = graph.call_function(edge_op, ())
    with contextlib.redirect_stdout(io.StringIO()):
        return bool(OpenvinoOperatorsSupport().is_node_supported({}, node))
