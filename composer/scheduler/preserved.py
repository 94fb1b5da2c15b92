"""Which of the ops a backend asks to keep whole ExecuTorch keeps whole, and its lines about
the others."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import torch

_ASKED = "was requested for preservation by partitioner"


def preserved(ops: Sequence[torch._ops.OpOverload]) -> list[torch._ops.OpOverload]:
    """``ops`` less those ExecuTorch ignores when a partitioner lists them in
    ``ops_to_not_decompose``: mutable ops, ops whose output aliases an input, its blocklist
    (add, mul, ...). What it keeps whole is what composer reads as kept whole."""
    try:
        from executorch.exir.program._program import _remove_invalid_ops_for_not_decompose
    except ImportError:  # a later ExecuTorch: every op listed counts
        return list(ops)
    with unsaid_preservation_warnings():
        return _remove_invalid_ops_for_not_decompose(list(ops))


@contextlib.contextmanager
def unsaid_preservation_warnings() -> Iterator[None]:
    """Drop ExecuTorch's root-logger lines about ops it will not keep whole ("Op aten.add.Tensor
    was requested for preservation by partitioner. This request is ignored ...").

    A backend may list every op it takes whole (the CUDA plugin does, and ExecuTorch's own
    partitioner tests expect it of Metal's), and ExecuTorch says so once per op and lowering:
    11 lines per ``composer plan`` of llama_decoder with cuda. The answer stays as the
    backend gave it; only the lines go.
    """
    root = logging.getLogger()
    dropped = _DropAsked()
    root.addFilter(dropped)
    try:
        yield
    finally:
        root.removeFilter(dropped)


class _DropAsked(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _ASKED not in record.getMessage()
