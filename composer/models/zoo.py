"""Small built-in models with random weights, for the demo, the tests and ``zoo:NAME``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from composer.contract.errors import ModelError, did_you_mean


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


class BasicBlock(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn plus an identity or 1x1 projection skip."""

    def __init__(self, inputs: int, outputs: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.skip = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNet(nn.Module):
    """A small ResNet: conv stem, an identity block, a projection block, pooling, linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.blocks = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def conv_bn_relu6(inputs: int, outputs: int, kernel: int, stride: int = 1, groups: int = 1):
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU6(),
    )


class MobileNet(nn.Module):
    """A small MobileNet (v1): depthwise 3x3 then pointwise 1x1 convolutions, with ReLU6."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        layers = [conv_bn_relu6(3, 8, 3, stride=2)]
        for inputs, outputs, stride in ((8, 16, 1), (16, 16, 2)):
            layers.append(conv_bn_relu6(inputs, inputs, 3, stride, groups=inputs))
            layers.append(conv_bn_relu6(inputs, outputs, 1))
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.head(x)


def conv_bn_relu(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU()
    )


class UNet(nn.Module):
    """A small U-Net for semantic segmentation: a conv encoder with max pooling, a decoder of
    transposed convs joined with the encoder's maps, and per-pixel class probabilities.

    Its last op is what segmentation models end with at inference, a softmax over the class
    channel (dim 1). XNNPACK takes softmax only over the last dim, so alone it leaves that op
    to ExecuTorch's scalar portable kernel, which costs more than its whole conv trunk, while
    OpenVINO runs it in one more call. ``upsample="bilinear"`` upsamples as FPN and DeepLab
    decoders do, which OpenVINO alone cannot lower in ExecuTorch 1.5.1. What measured
    placement makes of both: bench/RESULTS.md.
    """

    def __init__(self, classes: int = 21, width: int = 8, upsample: str = "transposed") -> None:
        super().__init__()
        self.down1 = conv_bn_relu(3, width)
        self.down2 = conv_bn_relu(width, 2 * width)
        self.bottom = conv_bn_relu(2 * width, 2 * width)
        self.up2 = _upsampler(upsample, 2 * width)
        self.join2 = conv_bn_relu(4 * width, width)
        self.up1 = _upsampler(upsample, width)
        self.join1 = conv_bn_relu(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.down1(x)
        second = self.down2(nn.functional.max_pool2d(first, 2))
        y = self.bottom(nn.functional.max_pool2d(second, 2))
        y = self.join2(torch.cat((self.up2(y), second), dim=1))
        y = self.join1(torch.cat((self.up1(y), first), dim=1))
        return torch.softmax(self.head(y), dim=1)


def _upsampler(kind: str, channels: int) -> nn.Module:
    if kind == "bilinear":
        return nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
    return nn.ConvTranspose2d(channels, channels, 2, stride=2)


class CachedAttention(nn.Module):
    """Llama attention with rotary embedding over a KV cache updated in place at input_pos."""

    def __init__(self, dim: int, heads: int, max_seq: int, batch: int = 1) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        cache = torch.zeros(batch, heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", cache.clone())
        self.register_buffer("v_cache", cache.clone())

    def forward(self, x, cos, sin, mask, input_pos) -> torch.Tensor:
        batch, seq, dim = x.shape
        shape = (batch, seq, self.heads, self.head_dim)
        q, k, v = (w(x).reshape(shape).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # As ExecuTorch's Llama export: write this step's keys and values into the cache.
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        attention = nn.functional.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask
        )
        return self.wo(attention.transpose(1, 2).reshape(batch, seq, dim))


class DecoderLayer(nn.Module):
    """A Llama decoder layer: RMSNorm, cached attention, RMSNorm, SwiGLU MLP, residuals."""

    def __init__(self, dim: int, heads: int, hidden: int, max_seq: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = CachedAttention(dim, heads, max_seq)
        self.mlp_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x, cos, sin, mask, input_pos) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
        h = self.mlp_norm(x)
        return x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))


class LlamaDecoder(nn.Module):
    """A tiny Llama: embedding, decoder layers with a KV cache, final RMSNorm, vocab head."""

    def __init__(
        self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, max_seq: int = 16
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, 64, max_seq) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.arange(max_seq).float()[:, None] * torch.cat((inverse, inverse))[None, :]
        self.register_buffer("cos", torch.cos(angles), persistent=False)
        self.register_buffer("sin", torch.sin(angles), persistent=False)
        causal = torch.full((max_seq, max_seq), float("-inf")).triu(1)
        self.register_buffer("mask", causal, persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        cos, sin, mask = self.cos[input_pos], self.sin[input_pos], self.mask[input_pos]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        return self.head(self.norm(x))


class GRUClassifier(nn.Module):
    """A GRU sequence model with a linear head on the last step."""

    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class CondMLP(nn.Module):
    """Data-dependent control flow: torch.cond picks one of two branches between linears."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y = torch.cond(y.sum() > 0, lambda t: torch.relu(t) * 2, lambda t: torch.tanh(t) - 1, (y,))
        return self.fc2(y)


class TiedLM(nn.Module):
    """A tiny language model whose embedding and output head share one weight."""

    def __init__(self, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.head(x + self.mlp(x))


ZOO: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mlp": lambda: (MLP(), (torch.randn(4, 16),)),
    "cnn": lambda: (SmallCNN(), (torch.randn(2, 3, 16, 16),)),
    "transformer_block": lambda: (TransformerBlock(), (torch.randn(2, 8, 32),)),
    "cumsum_mlp": lambda: (CumsumMLP(), (torch.randn(4, 16),)),
    "llama_block": lambda: (LlamaBlock(), (torch.randn(2, 8, 32),)),
    "resnet": lambda: (ResNet(), (torch.randn(1, 3, 32, 32),)),
    "mobilenet": lambda: (MobileNet(), (torch.randn(1, 3, 32, 32),)),
    "llama_decoder": lambda: (
        LlamaDecoder(),
        (torch.randint(0, 64, (1, 4)), torch.arange(4)),
    ),
    "gru": lambda: (GRUClassifier(), (torch.randn(1, 6, 8),)),
    "cond": lambda: (CondMLP(), (torch.randn(4, 16),)),
    "tied_lm": lambda: (TiedLM(), (torch.randint(0, 64, (1, 6)),)),
    "unet": lambda: (UNet(), (torch.randn(1, 3, 64, 64),)),
    "unet_bilinear": lambda: (UNet(upsample="bilinear"), (torch.randn(1, 3, 64, 64),)),
}


def load(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A zoo model in eval mode with seeded random weights, and its example inputs."""
    if name not in ZOO:
        near = did_you_mean(name, ZOO)
        raise ModelError(f"no zoo model {name!r}; {near}choose one of: {', '.join(sorted(ZOO))}.")
    torch.manual_seed(seed)
    model, inputs = ZOO[name]()
    return model.eval(), inputs
