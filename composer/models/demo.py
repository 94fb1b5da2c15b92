"""The demo's model (``scripts/demo``): a speech front end's 1-D convolutions over a length that
varies at run time. Plain ExecuTorch's ``[OpenvinoPartitioner, XnnpackPartitioner]`` writes a
program of it that computes wrong at most lengths (``bench/results/deploy_cpu.jsonl``, case
``signal``); ``composer lower --beside-plain`` shows that beside composer's proven program."""

from __future__ import annotations

import torch
from torch import nn


def speech_frontend() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """16 feature channels in, 8 out, over ``length`` frames (export with it dynamic)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv1d(32, 8, 3, padding=1)
    )
    return model.eval(), (torch.randn(1, 16, 50),)
