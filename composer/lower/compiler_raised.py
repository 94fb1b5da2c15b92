"""A backend's compiler raised on partitions composer handed it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from composer.contract.errors import first_line
from composer.scheduler.origins import origin_name


def handed_nodes(programs: Iterable) -> dict[str, str]:
    """The compute nodes of partition programs (which keep the names of the nodes they were
    cut from), each with the exported program's node it descends from. Read before the
    compiler runs: a compiler may rewrite the program it is given (OpenVINO's turns dim-order
    copies back into ``aten._to_copy``) and then raise."""
    return {
        node.name: origin_name(node)
        for program in programs
        for node in program.graph_module.graph.nodes
        if node.op == "call_function"
    }


class CompilerRaised(Exception):
    """Raised from composer's wrapper around a backend class's lowering
    (``composer.lower.partition_cache``) when the class's compiler raised. ``failures`` are
    the partitions it raised on, each as the nodes composer handed it (``handed_nodes``) and
    the compiler's error: every partition that failed where the class lowers them one at a
    time (ExecuTorch's default ``preprocess_multimethod``: the others are still tried, so
    that one repair moves them all); where it lowers all at once (ExecuTorch's CUDA backend),
    those that fail lowered alone, or all of them as one where none does.
    ``nodes`` is their union, ``error`` (and ``__cause__``) the first error.

    Which partition failed is known from what composer handed over, whatever the backend
    raised and wherever, not from the traceback: a repair moves exactly those partitions."""

    def __init__(
        self,
        backend_class: type,
        failures: Sequence[tuple[Mapping[str, str], BaseException]],
    ) -> None:
        self.failures = [(dict(nodes), error) for nodes, error in failures]
        self.nodes = {name: o for nodes, _ in self.failures for name, o in nodes.items()}
        self.error = self.failures[0][1]
        more = len(self.failures) - 1
        super().__init__(
            f"{backend_class.__name__}.preprocess raised {said(self.error)}"
            + (f" (and on {more} more of the partitions it was handed)" if more else "")
        )


def said(error: BaseException, limit: int = 240) -> str:
    """An error in one line a report can hold: its type and first line, cut at ``limit``, and
    the error it wraps where it wraps one (a pass manager's "An error occurred when running
    the 'DecomposeLayerNormPass' pass after the following passes: [...]" names a hundred
    passes and not what went wrong)."""

    def clipped(one: BaseException) -> str:
        line = first_line(one)
        return f"{type(one).__name__}: " + (line if len(line) <= limit else line[:limit] + "...")

    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    return clipped(error) + ("" if root is error else f" (from {clipped(root)})")
