"""A fast check that partitioning and validation stay near-linear (bench/ has the numbers)."""

from __future__ import annotations

import gc
import time

from composer.scheduler import find_tag_cycle, partition_convex
from composer.synthetic import AllButCumsum, chain_with_residuals


def best_seconds(function, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()  # a collection landing in one run only would skew the ratio
        try:
            start = time.perf_counter()
            function()
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best


def plan_and_check(graph_module) -> None:
    partitions = partition_convex(graph_module, AllButCumsum())
    tags = {node: index for index, members in enumerate(partitions) for node in members}
    assert find_tag_cycle(graph_module.graph, tags) is None


def test_doubling_the_nodes_at_most_doubles_and_a_half_the_time():
    small, large = chain_with_residuals(25_000, 7), chain_with_residuals(50_000, 7)
    ratio = best_seconds(lambda: plan_and_check(large)) / best_seconds(
        lambda: plan_and_check(small)
    )
    print(f"50k/25k nodes time ratio: {ratio:.2f}")
    assert ratio <= 2.5
