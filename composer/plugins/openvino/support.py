"""Which edge ops OpenVINO takes: ExecuTorch's own OpenVINO support check, made quiet."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Container

import torch.fx
from torch.export import ExportedProgram

from composer.contract.op_names import op_name
from composer.contract.support import ExplainedSupport

# Ops in OpenVINO's table that ExecuTorch 1.5.1's OpenVINO preprocess cannot convert, and why.
NEVER_CONVERTED = {
    "aten.as_strided_copy.default": (
        "OpenVINO converts as_strided only from its input's strides in meta['tensor_meta'], "
        "which ExecuTorch's OpenVINO preprocess has dropped (its DimOrderOpsRevertPass, an "
        "ExportPass, leaves tensor_meta None): preprocess would raise OpConversionFailure"
    ),
}


class OpenvinoSupport(ExplainedSupport):
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
        if node.op == "call_function" and op_name(node) in NEVER_CONVERTED:
            return False
        with contextlib.redirect_stdout(io.StringIO()):
            return bool(self._support.is_node_supported(submodules, node))

    def reason_unsupported(self, node: torch.fx.Node) -> str | None:
        return NEVER_CONVERTED.get(op_name(node), "not in OpenVINO's table of supported ops")

    def reason_unsupported_at_boundary(
        self, node: torch.fx.Node, partition: Container[torch.fx.Node]
    ) -> str | None:
        """Why the tensor ``node`` produces cannot enter or leave the OpenVINO delegate made of
        ``partition``'s nodes, or ``None`` if it can (composer keeps partitions to these)."""
        value = node.meta.get("val")
        refusal = boundary_refusal(value)
        if refusal is None and node in partition and passes_through(node, partition):
            return (
                "a delegate input passed through unchanged (an alias or a clone of it): "
                "OpenVINO compiles that to no op and its runtime never writes such an output "
                "(wrong values)"
            )
        if isinstance(value, torch.SymInt) and node not in partition:
            return (
                "a size computed at run time (a SymInt) entering the delegate: OpenVINO's "
                "compile takes tensors only (openvino_compile: 'SymInt' object has no attribute "
                "'type')"
            )
        if refusal is None and node in partition and _of_dynamic_size(value):
            return (
                f"an output of dynamic size {list(value.shape)}: OpenVINO's runtime binds a "
                "delegate's outputs at the sizes ExecuTorch planned (the upper bounds) and never "
                "resizes them, so at any other size the output keeps the upper bound's shape"
            )
        return refusal


# Ops OpenVINO's PyTorch frontend turns into no op at all: the output is the input.
ALWAYS_IDENTITY = frozenset(
    {
        "aten.alias_copy.default",
        "aten.clone.default",
        "dim_order_ops._clone_dim_order.default",
        "aten.detach_copy.default",
        "aten.lift_fresh_copy.default",
    }
)
# Casts, identities where they keep the dtype (the dim order OpenVINO ignores).
IDENTITY_WHEN_SAME_DTYPE = frozenset(
    {"aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default"}
)


def passes_through(node: torch.fx.Node, partition: Container[torch.fx.Node]) -> bool:
    """Whether ``node``'s output is a tensor from outside ``partition``, unchanged: ``node`` and
    the nodes between it and that tensor are identities to OpenVINO."""
    while _is_identity(node):
        source = node.args[0]
        if source not in partition:
            return True
        node = source
    return False


def _is_identity(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    name = op_name(node)
    if name in ALWAYS_IDENTITY:
        return True
    if name in IDENTITY_WHEN_SAME_DTYPE:
        out, source = node.meta.get("val"), node.args[0].meta.get("val")
        return (
            isinstance(out, torch.Tensor)
            and isinstance(source, torch.Tensor)
            and out.dtype == source.dtype
        )
    return False


# The dtypes ExecuTorch's OpenVINO runtime binds (OpenvinoBackend.cpp,
# convert_to_openvino_type); any other fails the delegate call.
BOUNDARY_DTYPES = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def boundary_refusal(value: object) -> str | None:
    """Why ExecuTorch 1.5.1's OpenVINO runtime cannot bind ``value`` (a node's ``meta["val"]``)
    as a delegate input or output, or ``None`` if it can.

    ``OpenvinoBackend::execute`` wraps each delegate tensor for OpenVINO by its sizes and data
    pointer alone (``create_ov_tensor``): a 0-d tensor fails there (OpenVINO's C API
    ``ov_shape_create`` takes rank 1 or more) and the call fails with error 0x1; a tensor in a
    dim order other than contiguous is read and written as if contiguous, which gives wrong
    values without an error. Inside a delegate neither matters. Non-tensors (an int input)
    are bound as they are.
    """
    if not isinstance(value, torch.Tensor):
        return None
    if value.dim() == 0:
        return (
            "a 0-d tensor, which OpenVINO's runtime cannot bind (ov_shape_create takes rank 1 "
            "or more; the delegate call would fail with error 0x1)"
        )
    if value.dtype not in BOUNDARY_DTYPES:
        return f"a {value.dtype} tensor, a dtype OpenVINO's runtime does not bind"
    if not _laid_out_contiguous(value):
        order = tuple(value.dim_order())
        return (
            f"a tensor in dim order {order}, which OpenVINO's runtime would read and write as "
            "contiguous (wrong values)"
        )
    return None


def _of_dynamic_size(value: object) -> bool:
    # OpenvinoBackend::execute (ExecuTorch 1.5.1) wraps each output tensor by its current sizes
    # and data pointer and never calls resize_tensor: inputs of dynamic size are bound at the
    # size they have, outputs at the upper bound they were planned at.
    return isinstance(value, torch.Tensor) and any(
        isinstance(size, torch.SymInt) for size in value.shape
    )


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

    if str(op) in NEVER_CONVERTED:
        return False
    try:
        edge_op = aten_to_edge(op)
    except Exception:  # noqa: BLE001 - no edge form: not kept whole, it decomposes as usual
        return False
    graph = torch.fx.Graph()
    node = graph.call_function(edge_op, ())
    with contextlib.redirect_stdout(io.StringIO()):
        return bool(OpenvinoOperatorsSupport().is_node_supported({}, node))


def _laid_out_contiguous(value: torch.Tensor) -> bool:
    """Whether ``value``'s memory is laid out as a contiguous tensor of its sizes (dims of
    size 1 aside: a (1, C, 1, 1) tensor is, in either dim order)."""
    try:
        return bool(value.is_contiguous())
    except Exception:  # noqa: BLE001 - symbolic sizes it cannot decide: go by the dim order
        return list(value.dim_order()) == list(range(value.dim()))
