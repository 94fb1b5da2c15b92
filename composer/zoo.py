"""Small built-in models with random weights, for the demo, the tests and ``zoo:NAME``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, 8)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class SmallCNN(nn.Module):
    """conv, batch norm, relu, pooling, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


class TransformerBlock(nn.Module):
    """Pre-norm attention (SDPA) and a GELU MLP, with residuals."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        shape = (batch, seq, self.heads, dim // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """A Llama-style decoder block: RMSNorm, rotary embedding, causal SDPA, SwiGLU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        head_dim = dim // heads
        inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inverse_frequencies", torch.cat((inverse, inverse)))

    def forward(self, x):
        batch, seq, dim = x.shape
        angles = torch.arange(seq, dtype=x.dtype)[:, None] * self.inverse_frequencies[None, :]
        cos, sin = torch.cos(angles), torch.sin(angles)
        h = self.attention_norm(x)
        shape = (batch, seq, self.heads, dim // self.heads)
        q, k, v = (w(h).reshape(shape).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attention.transpose(1, 2).reshape(batch, seq, dim))
        h = self.mlp_norm(x)
        return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


class CumsumMLP(nn.Module):
    """An op no shipped backend takes (cumsum) between two supported stretches."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        return self.fc2(torch.cumsum(y, dim=-1)) + y


ZOO: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mlp": lambda: (MLP(), (torch.randn(4, 16),)),
    "cnn": lambda: (SmallCNN(), (torch.randn(2, 3, 16, 16),)),
    "transformer_block": lambda: (TransformerBlock(), (torch.randn(2, 8, 32),)),
    "cumsum_mlp": lambda: (CumsumMLP(), (torch.randn(4, 16),)),
    "llama_block": lambda: (LlamaBlock(), (torch.randn(2, 8, 32),)),
}


def load(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A zoo model in eval mode with seeded random weights, and its example inputs."""
    if name not in ZOO:
        from composer.errors import ModelError

        raise ModelError(f"no zoo model {name!r}; choose one of: {', '.join(sorted(ZOO))}.")
    torch.manual_seed(seed)
    model, inputs = ZOO[name]()
    return model.eval(), inputs
