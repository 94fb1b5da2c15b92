"""A convolution's dilation as its node holds it: the sixth argument (``aten.convolution``,
``conv1d``, ``conv2d``, ``conv3d`` alike), an int or one a spatial dim, 1 when left out."""

from __future__ import annotations

import torch.fx


def is_dilated(node: torch.fx.Node) -> bool:
    """Whether the convolution ``node`` has a dilation other than 1 in any dim."""
    dilation = node.args[5] if len(node.args) > 5 else node.kwargs.get("dilation", 1)
    return any(d != 1 for d in (dilation if isinstance(dilation, (list, tuple)) else [dilation]))
