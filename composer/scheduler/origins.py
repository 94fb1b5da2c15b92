"""Which node of the exported program a node of a later program descends from: names change
as programs are decomposed and lowered, origins do not. A module of its own because the proof
of a program read from the cache needs it, and none of ExecuTorch's compiler."""

from __future__ import annotations

import torch.fx


def origin_name(node: torch.fx.Node) -> str:
    """The name of the node of the first exported program that ``node`` descends from.

    The same in the program ``ops_to_not_decompose``'s filter sees and in the edge program a
    partitioner sees, where the node's own name differs (upsample_nearest2d, then
    aten_upsample_nearest2d_vec). A node kept whole is its origin's only descendant of its op.
    """
    sources = node.meta.get("from_node")
    if not sources:
        return node.name
    source = sources[-1]
    while source.from_node:
        source = source.from_node[-1]
    return source.name
