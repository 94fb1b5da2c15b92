"""What a backend takes, node by node, and why it declines the rest: the object a plugin's
``composer_operator_support`` returns."""

from __future__ import annotations

from collections.abc import Container, Mapping

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


def asks_at_boundary(support: OperatorSupportBase) -> bool:
    """Whether ``support`` answers ``reason_unsupported_at_boundary`` (overrides the default
    that refuses nothing, or defines it without this base)."""
    method = getattr(type(support), "reason_unsupported_at_boundary", None)
    return method is not None and method is not ExplainedSupport.reason_unsupported_at_boundary
