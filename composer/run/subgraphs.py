"""A delegate's subgraph as a module Python can run: what the proof holds the delegate to."""

from __future__ import annotations

from typing import Any

import torch


def subgraph_module(lowered: Any) -> torch.nn.Module:
    """The subgraph ``lowered`` (a ``LoweredBackendModule``) was made from, callable, without
    torch's check of its inputs' sizes.

    ExecuTorch runs it so (``executorch_call_delegate`` in Python) with the check on, and the
    check refuses what it cannot solve: a partition's input whose size is derived from the
    model's (``(s27 + 1)//2`` after a stride-2 slice) at any size, since torch inverts no floor
    division ("Expected input ... to be of the form ((s27 + 1)//2)"). The model's own inputs
    were checked already; a size inside it is whatever the model computed.
    """
    module = lowered.original_module.module(check_guards=False)
    module.validate_inputs = False
    return module


def run_subgraph(lowered: Any, *operands: Any) -> Any:
    """What ``executorch_call_delegate(lowered, *operands)`` computes in Python."""
    return subgraph_module(lowered)(*operands)
