"""Is there room for ``[xnnpack, cuda]`` on the GPU machine? Models that mix op types:

- ``--model gru``: a GRU encoder over a short sequence (many small sequential steps: cheap on
  the host's cores, a chain of kernel launches on the GPU), then a wide MLP head (large
  matmuls: the GPU's work); ``cell``: the same with the GRU cell written out, so that the
  recurrence is one XNNPACK delegate; ``rnn``: an Elman RNN written out (five small ops a
  step), then the same head;
- ``--model segmenter``: convolutions, then the logits upsampled back to the input's size
  (the upsampling on XNNPACK, so that only the small logits cross);
- ``--model hybrid``: a convolution stem, then transformer blocks (the stem on XNNPACK).

    source bench/gpu_setup.sh
    python3 bench/gpu/gpu_mix.py [--model gru] [--width 4096] [--steps 16] [--batch 64] [--size 512]
                             [--threads 1]

Composes each three ways, each lowered for real: xnnpack alone, cuda alone, and
``[xnnpack, cuda]`` with node pins (``Stack.never``) that split the model between them as
said. Then times the three together, interleaved, hosted as measured placement times a stack
with CUDA in it (``composer.run.piecewise``: CUDA delegates as their ``.so``, XNNPACK ones in an
ExecuTorch runtime), and checks each against eager. ``--threads N`` gives XNNPACK N threads
(``Stack.threads``; the runtime's default is one per core). Results: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import warnings

import torch
from torch import nn

import composer
from composer.measure.latency import interleaved
from composer.run import cpu_threads
from composer.run.compare import compare
from composer.run.piecewise import program_runner


def wide_head(hidden: int, width: int, classes: int) -> nn.Sequential:
    """Large matmuls after a small recurrence: the GPU's work in the models that mix."""
    return nn.Sequential(
        nn.Linear(hidden, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, classes),
    )  # fmt: skip


class GRUThenWideHead(nn.Module):
    def __init__(self, features: int, hidden: int, width: int, classes: int) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = wide_head(hidden, width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class CellThenWideHead(nn.Module):
    """A GRU cell written out with linears, sigmoid and tanh, as streaming speech and
    time-series models unroll one (one matmul for every step's input gates, then a small
    recurrent matmul per step), then the same wide head. Every op of it is one XNNPACK takes,
    so the recurrence is one delegate, not one per step."""

    def __init__(self, features: int, hidden: int, steps: int, width: int, classes: int) -> None:
        super().__init__()
        self.hidden, self.steps = hidden, steps
        self.inputs = nn.Linear(features, 3 * hidden)
        self.recurrent = nn.Linear(hidden, 3 * hidden)
        self.head = wide_head(hidden, width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, size = x.shape[0], self.hidden
        gates = self.inputs(x)
        # Slices and reshapes, not x[:, t] (select, which XNNPACK leaves to portable kernels).
        h = torch.tanh(gates[:, 0:1, 2 * size :].reshape(batch, size))
        for t in range(1, self.steps):
            g = gates[:, t : t + 1].reshape(batch, 3 * size)
            r = self.recurrent(h)
            z = torch.sigmoid(g[:, :size] + r[:, :size])
            reset = torch.sigmoid(g[:, size : 2 * size] + r[:, size : 2 * size])
            n = torch.tanh(g[:, 2 * size :] + reset * r[:, 2 * size :])
            h = n + z * (h - n)
        return self.head(h)


class RNNThenWideHead(nn.Module):
    """An Elman RNN written out (``h = tanh(W x_t + U h)``, the input projection for every step
    as one matmul), as small streaming encoders and time-series models run, then the same wide
    head. Each step is five ops to XNNPACK (slice, view, linear, add, tanh): few and tiny, where
    a GPU pays a kernel launch or two per step."""

    def __init__(self, features: int, hidden: int, steps: int, width: int, classes: int) -> None:
        super().__init__()
        self.hidden, self.steps = hidden, steps
        self.inputs = nn.Linear(features, hidden)
        self.recurrent = nn.Linear(hidden, hidden, bias=False)
        self.head = wide_head(hidden, width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        projected = self.inputs(x)
        h = torch.tanh(projected[:, 0:1].reshape(batch, self.hidden))
        for t in range(1, self.steps):
            step = projected[:, t : t + 1].reshape(batch, self.hidden)
            h = torch.tanh(step + self.recurrent(h))
        return self.head(h)


class Segmenter(nn.Module):
    """A small fully convolutional segmenter ending as torchvision's FCN and DeepLabV3 do:
    per-class logits at 1/8 of the input's size, upsampled (bilinear) back to the input's.
    The GPU's work is the convolutions; the upsampled logits are 64x the bytes of the ones
    before, and they are what comes back to the host."""

    def __init__(self, classes: int = 21) -> None:
        super().__init__()

        def block(inputs: int, outputs: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(inputs, outputs, 3, stride, 1), nn.ReLU())

        self.backbone = nn.Sequential(
            block(3, 32, 2), block(32, 64, 2), block(64, 128, 2), block(128, 128, 1),
            block(128, 128, 1), nn.Conv2d(128, classes, 1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.backbone(x)
        return nn.functional.interpolate(
            logits, size=x.shape[-2:], mode="bilinear", align_corners=False
        )


class ConvStemTransformer(nn.Module):
    """A hybrid vision model as MobileViT and other conv-stem transformers are built: a
    convolution stem (batch norm, ReLU) down to 1/16 of the image, its pixels as tokens,
    transformer blocks (attention, GELU MLP), mean pooling and a linear head."""

    def __init__(self, dim: int = 192, blocks: int = 2, classes: int = 1000) -> None:
        super().__init__()
        from composer.models.zoo import TransformerBlock

        widths = [3, 32, 64, 128, dim]
        self.stem = nn.Sequential(*(
            nn.Sequential(nn.Conv2d(a, b, 3, 2, 1), nn.BatchNorm2d(b), nn.ReLU())
            for a, b in itertools.pairwise(widths)
        ))  # fmt: skip
        self.blocks = nn.Sequential(*(TransformerBlock(dim, 4) for _ in range(blocks)))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(tokens).mean(dim=1))


def split_nodes(plan) -> tuple[list[str], list[str]]:
    """(the head's nodes, the rest): the head is the last three linears and the two relus;
    the GRU's 1 + ``steps`` linears come first (edge names count up in program order)."""

    def number(name: str) -> int:
        tail = name.rsplit("_", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    linears = sorted((n for n in plan.node_backends if n.startswith("aten_linear")), key=number)
    head = linears[-3:] + [n for n in plan.node_backends if n.startswith("aten_relu")]
    return head, [n for n in plan.node_backends if n not in head]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--model", choices=("gru", "cell", "rnn", "segmenter", "hybrid"), default="gru"
    )
    parser.add_argument("--threads", type=int, help="XNNPACK's threads (default: one per core)")
    parser.add_argument("--size", type=int, default=512, help="the image size (segmenter, hybrid)")
    parser.add_argument(
        "--plan-only", action="store_true", help="print the mix's plan, lower nothing"
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    if args.model == "gru":
        model = GRUThenWideHead(32, 64, args.width, 1000).eval()
    elif args.model == "cell":
        model = CellThenWideHead(32, 64, args.steps, args.width, 1000).eval()
    elif args.model == "rnn":
        model = RNNThenWideHead(32, 64, args.steps, args.width, 1000).eval()
    elif args.model == "segmenter":
        model = Segmenter().eval()
    else:
        model = ConvStemTransformer().eval()
    if args.model == "hybrid":
        inputs = (torch.randn(args.batch, 3, args.size, args.size),)
        # The stem's ops (no transformer block has them) pinned off cuda by op; every other
        # node pinned off xnnpack by name, as the mixed stack's edge program names them.
        stem = ("aten.conv2d.default", "aten.convolution.default", "aten.relu.default",
                "aten._native_batch_norm_legit_no_training.default")  # fmt: skip
        plan = composer.plan(model, ["xnnpack", "cuda"], inputs, cache=False)
        head = [n for n, op in plan.node_ops.items() if op not in stem]
        rest = list(stem)
    elif args.model == "segmenter":
        inputs = (torch.randn(args.batch, 3, args.size, args.size),)
        plan = composer.plan(model, ["xnnpack"], inputs, cache=False)
        # The other way round: the upsampling on xnnpack, the convolutions on cuda.
        rest = [n for n in plan.node_backends if "upsample" in plan.node_ops[n]]
        head = [n for n in plan.node_backends if n not in rest]
    else:
        inputs = (torch.randn(args.batch, args.steps, 32),)
        head, rest = split_nodes(composer.plan(model, ["xnnpack"], inputs, cache=False))
    # The head only on cuda; the GRU's ops XNNPACK does not take (split, squeeze) stay on
    # portable kernels, as in xnnpack alone, rather than crossing to the GPU and back.
    # (zeros, the GRU's first hidden state, is not among the plan's compute nodes: by op.)
    never = {"xnnpack": [f"node:{n}" for n in head],
             "cuda": ["aten.zeros.default", *(n if n.startswith("aten.") else f"node:{n}"
                                              for n in rest)]}  # fmt: skip
    threads = args.threads
    mix = composer.Stack(["xnnpack", "cuda"], never=never, threads=threads)
    stacks = {"xnnpack alone": composer.Stack(["xnnpack"], threads=threads),
              "cuda alone": composer.Stack(["cuda"], threads=threads),
              "xnnpack,cuda, pinned mix": mix}  # fmt: skip
    if args.plan_only:
        plan = composer.plan(model, mix, inputs, cache=False)
        print({b: len(plan.partitions_of(b)) for b in plan.backends}, dict(plan.ops_on("cuda")))
        print(dict(plan.ops_on("xnnpack")), dict(plan.ops_on("portable")))
        return 0
    with torch.no_grad():
        expected = model(*inputs)
    calls = {}
    for label, stack in stacks.items():
        composition = composer.compose(model, stack, inputs, cache=False)
        runner = program_runner(composition, hosted=True)
        ok, worst = compare(runner.run(inputs), expected)
        print(f"{label}: {composition.plan.delegate_calls} delegate calls, "
              f"{ {b: len(composition.plan.partitions_of(b)) for b in stack.backends} }, "
              f"max |err| {worst:.2g} {'OK' if ok else 'MISMATCH'}", flush=True)  # fmt: skip
        calls[label] = runner.timed_call(inputs)
    eager_inputs = tuple(t.cuda() for t in inputs)
    gpu_model = model.cuda()

    def eager_cuda():
        with torch.no_grad():
            out = gpu_model(*eager_inputs)
        torch.cuda.synchronize()
        return out

    calls["torch eager on the GPU"] = eager_cuda
    times = interleaved(calls, args.runs)
    best_single = min(times[k].median_us for k in ("xnnpack alone", "cuda alone"))
    if args.model in ("segmenter", "hybrid"):
        print(f"model: {args.model}, batch {args.batch}, {args.size}x{args.size}")
    else:
        kind = {"gru": "GRU", "cell": "GRU cell", "rnn": "Elman RNN"}[args.model]
        print(f"model: {kind} (32->64, {args.steps} steps, batch {args.batch}) then "
              f"64->{args.width}->{args.width}->1000; XNNPACK on "
              f"{cpu_threads.current()} thread(s)")  # fmt: skip
    for label, latency in times.items():
        print(f"  {label:<40} median {latency.median_us:9.1f} us  fastest "
              f"{latency.best_us:9.1f} us  vs best single backend "
              f"{best_single / latency.median_us:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
