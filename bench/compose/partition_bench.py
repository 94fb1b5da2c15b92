"""Planner benchmark: composer's partitioner against torch.fx's CapabilityBasedPartitioner.

    .venv/bin/python bench/compose/partition_bench.py            # everything (several minutes)
    .venv/bin/python bench/compose/partition_bench.py --quick    # small sizes, anchor capped at 20 s

Prints, in one run and on the same graphs with the same support: partition counts and times
for several graph shapes; composer planning 100k nodes with three backends; peak memory; and
end to end on real models, composer against ExecuTorch's own to_edge_transform_and_lower with
the same partitioners. The anchor runs in a subprocess and is stopped at --anchor-cap seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable

import torch
import torch.fx
from torch.fx.passes.operator_support import OperatorSupportBase

from composer.models.synthetic import (
    AllButCumsum,
    chain_with_residuals,
    transformer_like,
    wide_branching,
)
from composer.scheduler.convex import partition_convex
from composer.scheduler.validate import find_tag_cycle

SHAPES: dict[str, Callable[[int, int | None], torch.fx.GraphModule]] = {
    "chain+residual": chain_with_residuals,
    "wide branching": lambda n, k: wide_branching(n, 8, k),
    "transformer-like": transformer_like,
}


def _anchor_worker(shape: str, nodes: int, island_every: int | None, queue) -> None:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    graph_module = SHAPES[shape](nodes, island_every)
    start = time.perf_counter()
    partitions = CapabilityBasedPartitioner(
        graph_module, AllButCumsum(), allows_single_node_partition=True
    ).propose_partitions()
    queue.put((time.perf_counter() - start, len(partitions)))


def anchor(shape: str, nodes: int, island_every: int | None, cap: float):
    """(seconds, partitions) for CapabilityBasedPartitioner, or (None, None) past the cap."""
    queue = multiprocessing.get_context("fork").Queue()
    process = multiprocessing.get_context("fork").Process(
        target=_anchor_worker, args=(shape, nodes, island_every, queue)
    )
    process.start()
    process.join(cap)
    if process.is_alive():
        process.kill()
        process.join()
        return None, None
    return queue.get()


def timed(function, repeat: int = 3):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def shapes_table(sizes: list[int], cap: float) -> list[dict]:
    rows = []
    for shape, build in SHAPES.items():
        for island_every in (7, 200, None):
            for nodes in sizes:
                graph_module = build(nodes, island_every)
                seconds, partitions = timed(
                    lambda gm=graph_module: partition_convex(gm, AllButCumsum())
                )
                tags = {n: i for i, p in enumerate(partitions) for n in p}
                assert find_tag_cycle(graph_module.graph, tags) is None
                anchor_seconds, anchor_partitions = anchor(shape, nodes, island_every, cap)
                row = {
                    "shape": shape,
                    "islands every": island_every or "none",
                    "nodes": len(graph_module.graph.nodes),
                    "composer s": round(seconds, 4),
                    "composer partitions": len(partitions),
                    "anchor s": round(anchor_seconds, 2) if anchor_seconds else f"> {cap:g}",
                    "anchor partitions": anchor_partitions if anchor_partitions else "-",
                    "speed-up": (
                        f"{anchor_seconds / seconds:,.0f}x"
                        if anchor_seconds
                        else f"> {cap / seconds:,.0f}x"
                    ),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


class OpsOf(OperatorSupportBase):
    """Supports the listed torch functions, and nothing an earlier backend already took."""

    def __init__(self, targets, taken: set) -> None:
        self.targets = set(targets)
        self.taken = taken

    def is_node_supported(self, submodules, node) -> bool:
        return node.target in self.targets and node not in self.taken


def three_backends(nodes: int) -> dict:
    """Plan a graph of ``nodes`` nodes over three backends, as the scheduler stacks them."""
    graph_module = transformer_like(nodes, island_every=29)
    backends = [
        OpsOf({torch.relu, torch.add}, set()),
        OpsOf({torch.tanh, torch.sigmoid}, set()),
        OpsOf({torch.relu, torch.tanh, torch.sigmoid, torch.neg, torch.add}, set()),
    ]

    def plan() -> list[int]:
        taken: set = set()
        counts = []
        for support in backends:
            support.taken = taken
            partitions = partition_convex(graph_module, support)
            counts.append(len(partitions))
            taken.update(n for p in partitions for n in p)
        return counts

    tracemalloc.start()
    start = time.perf_counter()
    counts = plan()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    seconds_untraced, _ = timed(plan, repeat=1)
    row = {
        "nodes": len(graph_module.graph.nodes),
        "partitions per backend": counts,
        "seconds": round(seconds_untraced, 2),
        "peak MiB (tracemalloc, traced run)": round(peak / 2**20, 1),
        "traced run seconds": round(seconds, 2),
    }
    print(json.dumps(row), flush=True)
    return row


def _best_of(functions: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    for function in functions.values():
        function()  # warm-up: first-call imports and caches count for none of them
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeat):  # interleaved, so drift hits all alike
        for name, function in functions.items():
            times[name].append(timed(function, 1)[0])
    return {name: min(values) for name, values in times.items()}


def end_to_end(names: list[str], repeat: int) -> list[dict]:
    """composer.compose([xnnpack]) against to_edge_transform_and_lower([XnnpackPartitioner()])."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    import composer
    from composer.models import zoo

    rows = []
    for name in names:
        model, inputs = zoo.load(name)
        program = torch.export.export(model, inputs)

        def executorch(program=program, config=None) -> None:
            with torch.no_grad():
                to_edge_transform_and_lower(
                    program, partitioner=[XnnpackPartitioner()], compile_config=config
                ).to_executorch()

        best = _best_of(
            {
                "executorch": executorch,
                # composer skips the edge IR validity check (backends keep non-core ops
                # whole); ExecuTorch timed the same way too, for a like-for-like ratio.
                "executorch, no IR check": lambda p=program: executorch(
                    p, EdgeCompileConfig(_check_ir_validity=False)
                ),
                "composer": lambda p=program: composer.compose(p, ["xnnpack"]),
            },
            repeat,
        )
        row = {
            "model": name,
            "edge ops": sum(1 for n in program.graph.nodes if n.op == "call_function"),
            **{f"{k} s": round(v, 3) for k, v in best.items()},
            "composer / executorch": round(best["composer"] / best["executorch"], 3),
            "composer / executorch (no IR check)": round(
                best["composer"] / best["executorch, no IR check"], 3
            ),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _llama_stack(blocks: int):
    from composer.models.zoo import LlamaBlock

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[LlamaBlock() for _ in range(blocks)]).eval()
    with torch.no_grad():
        return torch.export.export(model, (torch.randn(2, 8, 32),))


def _executorch_xnnpack_then_aoti(blocks: int, queue) -> None:
    warnings.filterwarnings("ignore")
    from executorch.backends.aoti.aoti_partitioner import AotiPartitioner
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    from composer.plugins.cuda import plugin as cuda
    from composer.scheduler.stand_in import STAND_IN_BACKEND_ID, stand_in_compile_specs

    program = _llama_stack(blocks)
    start = time.perf_counter()
    with torch.no_grad():
        # CudaPartitioner's logic (AotiPartitioner) lowering to the same stand-in as composer's
        # plan, since CUDA cannot compile on this machine.
        aoti = AotiPartitioner(STAND_IN_BACKEND_ID, stand_in_compile_specs(cuda.spec))
        to_edge_transform_and_lower(
            program,
            partitioner=[XnnpackPartitioner(), aoti],
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
    queue.put(time.perf_counter() - start)


def xnnpack_then_cuda(blocks_list: list[int], cap: float) -> list[dict]:
    """Deep models with XNNPACK first and the CUDA partitioner second (CUDA as a stand-in)."""
    from composer.lower.priority import lower_in_order
    from composer.registry.resolved import resolve_stack
    from composer.registry.stack import Stack

    # Without a GPU cuda is a stand-in (the backends that cannot lower here).
    resolved = resolve_stack(Stack(["xnnpack", "cuda"]), must_lower_here=False)
    rows = []
    for blocks in blocks_list:
        program = _llama_stack(blocks)
        start = time.perf_counter()
        _edge, plan = lower_in_order(program, resolved)
        seconds = time.perf_counter() - start
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        process = context.Process(target=_executorch_xnnpack_then_aoti, args=(blocks, queue))
        process.start()
        process.join(cap)
        if process.is_alive():
            process.kill()
            process.join()
            anchor_seconds = None
        else:
            anchor_seconds = queue.get()
        row = {
            "llama blocks": blocks,
            "edge ops": len(plan.node_backends),
            "partitions (xnnpack, cuda)": [len(plan.partitions_of(b)) for b in ("xnnpack", "cuda")],
            "executorch s": round(anchor_seconds, 2) if anchor_seconds else f"> {cap:g}",
            "composer s": round(seconds, 2),
            "composer / executorch": round(seconds / anchor_seconds, 3) if anchor_seconds else "-",
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, short caps")
    parser.add_argument("--anchor-cap", type=float, default=None, help="seconds per anchor run")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--sections",
        default="shapes,three,e2e,stack",
        help="comma-separated: shapes, three (backends at 100k), e2e, stack (xnnpack then cuda)",
    )
    parser.add_argument("--blocks", default=None, help="llama blocks for 'stack', e.g. 4,16")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    cap = args.anchor_cap or (20.0 if args.quick else 240.0)
    sizes = [500, 1000] if args.quick else [1000, 2000, 4000]
    blocks = [int(b) for b in args.blocks.split(",")] if args.blocks else None
    sections = {
        "shapes": lambda: shapes_table(sizes, cap),
        "three": lambda: [
            three_backends(n) for n in ([20_000] if args.quick else [50_000, 100_000])
        ],
        "e2e": lambda: end_to_end(
            ["mlp", "cnn", "transformer_block", "llama_block"], 3 if args.quick else 7
        ),
        "stack": lambda: xnnpack_then_cuda(
            blocks or ([2, 4] if args.quick else [4, 8, 16, 32]), cap
        ),
    }
    results = {name: sections[name]() for name in args.sections.split(",")}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
