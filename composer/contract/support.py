"""What a backend takes, node by node, and why it declines the rest: the object a plugin's
``composer_operator_support`` returns."""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping

import torch
import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase


class ExplainedSupport(OperatorSupportBase):
    """torch.fx's ``OperatorSupportBase`` with the two further questions composer asks.

    Subclass it and answer ``is_node_supported``; override the others where your backend can
    say more. A plain ``OperatorSupportBase`` is taken too: composer then asks only
    ``is_node_supported``, and the plan says "unsupported op" for every node declined.
    """

    def is_node_supported(
        self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node
    ) -> bool:
        """Whether the backend takes ``node``, one ``call_function`` node of the edge program
        (never a delegate call, a placeholder or the output)."""
        raise NotImplementedError

    def reason_unsupported(self, node: torch.fx.Node) -> str | None:
        """Why the backend declines ``node``, shown in the plan's fallbacks and in ``composer
        explain`` ("int64 inputs", "dynamic dim on the weight"); ``None``: "unsupported op"."""
        return None

    def reason_unsupported_at_boundary(
        self, node: torch.fx.Node, partition: Container[torch.fx.Node]
    ) -> str | None:
        """Why the backend's runtime cannot bind the tensor ``node`` produces at the edge of a
        delegate made of ``partition`` (``node`` is in it and its output leaves, or outside
        and its output enters), else ``None``. OpenVINO's runtime cannot take a 0-d tensor
        there. A refused constant joins the partition; otherwise composer leaves nodes out of
        the partition until no refused tensor crosses its edge. Not overridden: composer does
        not ask, and spends nothing on it."""
        return None


# Why a backend declines a node, or ``None`` where it takes it: the unit support is built from.
WhyNot = Callable[[torch.fx.Node], str | None]


class ReasonedSupport(ExplainedSupport):
    """Support from one ``why_not(node)``: ``None`` takes the node, a string declines it and is
    the reason the plan shows (torch.fx's ``create_op_support``, with reasons). Each node is
    asked once."""

    def __init__(self, why_not: WhyNot) -> None:
        self._why_not = why_not
        self._reasons: dict[torch.fx.Node, str | None] = {}

    def _ask(self, node: torch.fx.Node) -> str | None:
        return self._why_not(node)

    def reason_unsupported(self, node: torch.fx.Node) -> str | None:
        if node not in self._reasons:
            self._reasons[node] = self._ask(node)
        return self._reasons[node]

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return self.reason_unsupported(node) is None


def chain(*checks: WhyNot) -> WhyNot:
    """Takes a node every check takes; declines with the first decline's reason (torch.fx's
    ``chain``)."""

    def why_not(node: torch.fx.Node) -> str | None:
        return next((r for check in checks if (r := check(node)) is not None), None)

    return why_not


def any_chain(*checks: WhyNot) -> WhyNot:
    """Takes a node any check takes; declines with the last check's reason, so order them from
    the general to the one that says most (torch.fx's ``any_chain``)."""

    def why_not(node: torch.fx.Node) -> str | None:
        reason = None
        for check in checks:
            reason = check(node)
            if reason is None:
                return None
        return reason

    return why_not


def asks_at_boundary(support: OperatorSupportBase) -> bool:
    """Whether ``support`` answers ``reason_unsupported_at_boundary`` (overrides the default
    that refuses nothing, or defines it without this base)."""
    method = getattr(type(support), "reason_unsupported_at_boundary", None)
    return method is not None and method is not ExplainedSupport.reason_unsupported_at_boundary
