"""Ops left to ExecuTorch's portable kernels computed in float32 where the model is bf16 or fp16.

Portable kernels compute a reduced-precision op in its own dtype, accumulations included, where
eager (on a CPU or a GPU) accumulates in float32 and rounds the op's result: a bf16 network
whose matmuls or convolutions no backend of the stack takes misses the proof's bound there (a
bf16 MLP left wholly to portable kernels erred 8x eager; a bf16 transposed convolution a CUDA
stack declines, 6x). Each such op here reads its inputs cast to float32 and rounds its result
back, as eager does; the program's inputs, outputs and delegates keep their dtypes.

It is an ExecuTorch ``ExportPass``: it retraces the program, so every value's metadata (a
dynamic size's upper bound included) is ExecuTorch's own.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from composer.lower.pending_symbols import shape_envs

REDUCED = (torch.bfloat16, torch.float16)
WIDE = torch.float32


def widened(edge):
    """``edge`` (an ``EdgeProgramManager``, delegates lowered) with every op left to portable
    kernels in bf16 or fp16 computed in float32, and how many ops that was."""
    widen = _widen_pass()
    ranges = _ranges(edge.exported_program())
    result = edge.transform([widen])
    # The retrace runs torch's convolution meta kernel in float32, which guards on the example's
    # sizes to pick a CPU algorithm and so narrows a dynamic size's range (a transposed
    # convolution's length, 8..400, became 8..320, and the program refused 400). No kernel
    # here depends on that choice: the ranges the user exported with stand, and the proof runs
    # the program at their bounds.
    program = result.exported_program()
    for shape_env in shape_envs([program]):
        shape_env.var_to_range.update(ranges)
    program._range_constraints = {**program.range_constraints, **ranges}
    return result, widen.count


def _ranges(program: ExportedProgram) -> dict:
    return {sym: r for env in shape_envs([program]) for sym, r in env.var_to_range.items()}


def computes_reduced(program: ExportedProgram) -> bool:
    """Whether an op outside the delegates of ``program`` (an edge program, or the one
    ``to_executorch`` left with out variants) computes in bf16 or fp16."""
    return any(
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and _dtype(node.meta.get("val")) in REDUCED
        for node in program.graph.nodes
    )


def _dtype(value: object) -> torch.dtype | None:
    return value.dtype if isinstance(value, torch.Tensor) else None


def _widen_pass():
    # Imported here: the proof asks computes_reduced on every compose, and a cache hit
    # imports no compiler.
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.dialects.edge._ops import EdgeOpOverload
    from executorch.exir.pass_base import ExportPass, ProxyValue

    cast_op = exir_ops.edge.dim_order_ops._to_dim_order_copy.default

    class WidenPortable(ExportPass):
        """Each edge op whose float tensors, in and out, are all of one reduced dtype, and
        whose output dtype follows its inputs' (no ``dtype`` argument: a cast or a factory is
        left as it is), computes in float32."""

        count = 0

        def call_operator(self, op, args, kwargs, meta):
            if not self._widens(op, args, kwargs, meta):
                return super().call_operator(op, args, kwargs, meta)
            self.count += 1
            reduced = _dtype(meta["val"])
            wide = torch.utils._pytree.tree_map(
                lambda a: self._cast(a, WIDE, meta) if self._reduced(a) else a, (args, kwargs)
            )
            out = super().call_operator(op, *wide, meta)
            return self._cast(out, reduced, meta)

        def _widens(self, op, args, kwargs, meta) -> bool:
            if not isinstance(op, EdgeOpOverload) or op is cast_op:
                return False
            if any(arg.name == "dtype" for arg in op._schema.arguments):
                return False
            values = [a.to_tensor() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(a, ProxyValue) and isinstance(a.data, torch.Tensor)]  # fmt: skip
            floats = {v.dtype for v in values if v.dtype.is_floating_point}
            out = _dtype(meta["val"])
            return out in REDUCED and floats == {out}

        @staticmethod
        def _reduced(value) -> bool:
            return isinstance(value, ProxyValue) and _dtype(value.data) in REDUCED

        def _cast(self, value, dtype, meta):
            order = list(range(value.to_tensor().dim()))
            return super().call_operator(
                cast_op, (value,), {"dtype": dtype, "dim_order": order}, meta
            )

    return WidenPortable()
