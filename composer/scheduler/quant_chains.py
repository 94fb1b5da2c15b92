"""A quantized op goes to a backend together with the quantize/dequantize chains that feed it.

A quantized graph computes each quantized op from dequantized values: ``dequantize(weight)``
(through a ``permute`` for a linear) and ``dequantize(quantize(x))``, where a dynamically
quantized activation also has its ``choose_qparams``. A backend's integer kernel takes the op
with those chains (XNNPACK's partitioner groups them, pytorch/executorch#12845); split from its
op, a chain either runs on portable kernels, which have none for quantize/dequantize ("Missing
out variants" in ``to_executorch``), or hands the op's backend a float weight it cannot treat
as a constant. So, after each node's own support is asked:

- an op is taken only where every node of the chains feeding it is taken too: OpenVINO takes
  a dynamically quantized ``addmm`` and its weight's dequantize but not ``choose_qparams``, so
  the ``addmm`` goes on down the stack, to XNNPACK, which takes it with its chains. A static
  quantize of an activation is where a chain starts, not part of it: an integer-only backend
  (Ethos-U) takes int8 in, the quantize staying before its partition, as TOSA's partitioner
  leaves it;
- an op with a quantized weight (linear, convolution: what integer kernels match) takes its
  chains along: each is taken only where every such op it feeds is (OpenVINO takes the
  quantize and dequantize before ResNet-18's final linear, not the linear, which XNNPACK then
  would not take without them).

Chains feeding only ops without a quantized weight (an ``add`` after a quantized convolution)
stay where their own support put them: a delegate may output a dequantized float tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch.fx

from composer.contract.op_names import op_name
from composer.scheduler.plans import QUANTIZED_OPS
from composer.scheduler.quantized import PASS_THROUGH, short_op_name


def chains_kept_with_their_ops(
    graph: torch.fx.Graph,
    taken: set[torch.fx.Node],
    constants: Collection[torch.fx.Node],
    name_of: Callable[[torch.fx.Node], str] = op_name,
) -> dict[torch.fx.Node, str]:
    """Remove from ``taken`` (what a backend's support takes) the ops whose chains it does not
    all take and the weight chains whose ops it does not all take; returns why each went."""
    in_chain = _ChainMembers(name_of)
    chains = _chains_by_op(graph, in_chain)
    groups = _weight_groups(chains, _FromConstants(constants, in_chain), name_of)
    needs = _needs(chains, groups, constants, in_chain, name_of)
    return _dropped_until_settled(taken, needs, name_of)


# A node, the nodes it is taken only with, and why it goes where one of them is not taken
# (``{}``: the one missing).
_Need = tuple[torch.fx.Node, list[torch.fx.Node], str]


def _chains_by_op(graph: torch.fx.Graph, in_chain: _ChainMembers):
    """Each op that reads quantization plumbing, with the chain members it reads."""
    chains: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and not in_chain(node):
            chain = _upstream(node, in_chain)
            if chain:
                chains[node] = chain
    return chains


def _weight_groups(
    chains: dict[torch.fx.Node, list[torch.fx.Node]],
    is_weight: Callable[[torch.fx.Node], bool],
    name_of: Callable[[torch.fx.Node], str],
) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Each node of a quantized-weight op's group, with the ops whose group it is in."""
    # An op with a quantized weight (a linear, a convolution) is what integer kernels match,
    # with every chain feeding it and its output's quantize (XNNPACK's static quantized linear
    # is matched with it): those go only where it goes.
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for op, chain in chains.items():
        if any(map(is_weight, chain)):
            for node in [*chain, *(u for u in op.users if _quantizes(u, name_of))]:
                groups.setdefault(node, []).append(op)
    return groups


def _needs(chains, groups, constants, in_chain, name_of) -> list[_Need]:
    """An op needs the chains feeding it, from where each starts; a group's node, its ops."""

    def starts_a_chain(node: torch.fx.Node) -> bool:  # quantize(x, scale, zero point)
        return _quantizes(node, name_of) and not any(
            in_chain(arg) or arg in constants for arg in node.all_input_nodes
        )

    return [
        (
            op,
            [n for n in chain if not starts_a_chain(n)],
            "the quantization chain feeding it goes elsewhere ({} is not taken with it)",
        )
        for op, chain in chains.items()
    ] + [
        (node, ops, "it is in the quantization group of {}, which goes elsewhere")
        for node, ops in groups.items()
    ]


def _dropped_until_settled(
    taken: set[torch.fx.Node], needs: list[_Need], name_of: Callable[[torch.fx.Node], str]
) -> dict[torch.fx.Node, str]:
    """Drop from ``taken`` each node that misses a node it needs, until none does: a node
    dropped may be what another needs."""
    dropped: dict[torch.fx.Node, str] = {}
    changed = True
    while changed:
        changed = False
        for node, needed, why in needs:
            missing = next((n for n in needed if n not in taken), None)
            if node in taken and missing is not None:
                taken.discard(node)
                dropped[node] = why.format(f"{missing.name}, {name_of(missing)}")
                changed = True
    return dropped


def reads_quantized_values(node: torch.fx.Node, name_of=op_name) -> bool:
    """Whether ``node`` computes from a dequantize (directly or through views): a quantized op,
    which backends match whole (XNNPACK's dynamically quantized linear is a ``linear`` or an
    ``addmm`` reading the chains, not the ``view``/``mm`` pieces of a 3-D linear)."""
    return any(map(_ChainMembers(name_of), node.all_input_nodes))


class _ChainMembers:
    """Whether a node is quantization plumbing: a quantize, dequantize or choose_qparams op, or
    a view (or getitem) of one. Answers are kept: a graph asks about each node many times."""

    def __init__(self, name_of: Callable[[torch.fx.Node], str]) -> None:
        self.name_of = name_of
        self.known: dict[torch.fx.Node, bool] = {}

    def __call__(self, node: torch.fx.Node) -> bool:
        if node not in self.known:
            name = self.name_of(node) if node.op == "call_function" else ""
            self.known[node] = bool(name) and (
                name.startswith(QUANTIZED_OPS)
                or (short_op_name(name) in PASS_THROUGH and any(map(self, node.all_input_nodes)))
            )
        return self.known[node]


class _FromConstants:
    """Whether a chain member is computed from constants only: a quantized weight's chain.
    Answers are kept, as ``_ChainMembers``' are."""

    def __init__(self, constants: Collection[torch.fx.Node], in_chain: _ChainMembers) -> None:
        self.constants, self.in_chain = constants, in_chain
        self.known: dict[torch.fx.Node, bool] = {}

    def __call__(self, node: torch.fx.Node) -> bool:
        if node not in self.known:
            self.known[node] = all(
                arg in self.constants or (self.in_chain(arg) and self(arg))
                for arg in node.all_input_nodes
            )
        return self.known[node]


def _upstream(node: torch.fx.Node, in_chain) -> list[torch.fx.Node]:
    """The chain members ``node`` reads, directly or through other chain members."""
    found: list[torch.fx.Node] = []
    todo = [arg for arg in node.all_input_nodes if in_chain(arg)]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo.extend(arg for arg in current.all_input_nodes if in_chain(arg))
    return found


def _quantizes(node: torch.fx.Node, name_of) -> bool:
    name = name_of(node) if node.op == "call_function" else ""
    return name.startswith(QUANTIZED_OPS) and ".quantize_per" in name
