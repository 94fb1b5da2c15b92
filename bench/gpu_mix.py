"""Is there room for ``[xnnpack, cuda]`` on the GPU machine? A model that mixes op types as
sequence models do: a GRU encoder over a short sequence (many small sequential steps: cheap
on the host's cores, a chain of kernel launches on the GPU), then a wide MLP head (large
matmuls: the GPU's work).

    source bench/gpu_setup.sh
    python3 bench/gpu_mix.py [--width 4096] [--steps 16] [--batch 64] [--runs 200]

Composes it three ways, each lowered for real: xnnpack alone, cuda alone, and
``[xnnpack, cuda]`` with node pins (``Stack.never``) that keep the head off xnnpack and the
rest off cuda, so XNNPACK runs the GRU and CUDA the head. Then times the three together, interleaved, hosted as
measured placement times a stack with CUDA in it (``composer.aoti_host``: CUDA delegates as
their ``.so``, XNNPACK ones in an ExecuTorch runtime), and checks each against eager.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
from torch import nn

import composer
from composer.aoti_host import program_runner
from composer.latency import interleaved
from composer.verification import compare


class GRUThenWideHead(nn.Module):
    def __init__(self, features: int, hidden: int, width: int, classes: int) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(hidden, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


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
        "--plan-only", action="store_true", help="print the mix's plan, lower nothing"
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = GRUThenWideHead(32, 64, args.width, 1000).eval()
    inputs = (torch.randn(args.batch, args.steps, 32),)
    head, rest = split_nodes(composer.plan(model, ["xnnpack"], inputs, cache=False))
    # The head only on cuda; the GRU's ops XNNPACK does not take (split, squeeze) stay on
    # portable kernels, as in xnnpack alone, rather than crossing to the GPU and back.
    # (zeros, the GRU's first hidden state, is not among the plan's compute nodes: by op.)
    never = {"xnnpack": [f"node:{n}" for n in head],
             "cuda": ["aten.zeros.default", *(f"node:{n}" for n in rest)]}  # fmt: skip
    mix = composer.Stack(["xnnpack", "cuda"], never=never)
    stacks = {"xnnpack alone": composer.Stack(["xnnpack"]),
              "cuda alone": composer.Stack(["cuda"]),
              "xnnpack,cuda, head pinned off xnnpack": mix}  # fmt: skip
    if args.plan_only:
        plan = composer.plan(model, mix, inputs, cache=False)
        print({b: len(plan.partitions_of(b)) for b in plan.backends}, dict(plan.ops_on("cuda")))
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
    print(f"model: GRU (32->64, {args.steps} steps, batch {args.batch}) then "
          f"64->{args.width}->{args.width}->1000")  # fmt: skip
    for label, latency in times.items():
        print(f"  {label:<40} median {latency.median_us:9.1f} us  fastest "
              f"{latency.best_us:9.1f} us  vs best single backend "
              f"{best_single / latency.median_us:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
