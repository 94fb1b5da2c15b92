"""A fast check that partitioning and validation stay near-linear (bench/ has the numbers)."""

from __future__ import annotations

import gc
import time

from composer.scheduler.convex import partition_convex
from composer.scheduler.validate import find_tag_cycle
from composer.synthetic import AllButCumsum, chain_with_residuals


def cpu_seconds(function) -> float:
    gc.collect()
    gc.disable()  # a collection landing in one run only would skew the ratio
    try:
        # CPU time of this process: other test workers on the same cores barely move it.
        start = time.process_time()
        function()
        return time.process_time() - start
    finally:
        gc.enable()


def plan_and_check(graph_module) -> None:
    partitions = partition_convex(graph_module, AllButCumsum())
    tags = {node: index for index, members in enumerate(partitions) for node in members}
    assert find_tag_cycle(graph_module.graph, tags) is None


def test_doubling_the_nodes_at_most_doubles_and_a_half_the_time():
    small, large = chain_with_residuals(25_000, 7), chain_with_residuals(50_000, 7)
    times: dict[str, list[float]] = {"small": [], "large": []}
    for _ in range(7):  # interleaved, best of each
        times["small"].append(cpu_seconds(lambda: plan_and_check(small)))
        times["large"].append(cpu_seconds(lambda: plan_and_check(large)))
    ratio = min(times["large"]) / min(times["small"])
    print(f"50k/25k nodes time ratio: {ratio:.2f}")
    assert ratio <= 2.5
