"""Two pieces of timm's deit_tiny that each broke a CUDA delegate on the GPU machine (session
24): the plan tests (test_aoti_plugins.py) and the runner tests (test_gpu.py) share them."""

from __future__ import annotations

import torch


class ClassToken(torch.nn.Module):
    """deit's first tokens: a class token, a parameter expanded to the batch, before the
    patches. Its expand alone is a partition that reads only a constant."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, 16))

    def forward(self, x):
        tokens = self.cls_token.expand(x.shape[0], -1, -1)
        return torch.cat([tokens, self.embed(x)], dim=1).relu()


class SqueezedSlices(torch.nn.Module):
    """deit's v: a squeeze_copy of a slice past its tensor's start, which Inductor hands out as
    that slice (its clone dropped as a no-op), beside a permute, which it copies."""

    def forward(self, x):
        y = torch.relu(x)
        return y[0:1].squeeze(0) + 1, y[2:3].squeeze(0), y[1:2].permute(0, 2, 1)
