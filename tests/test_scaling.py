"""Partitioning and validation stay near-linear in the graph's size.

The work is counted, not timed: CPU time on a shared 2-core CI machine swings with its
neighbours and caches (CI once saw a 2.64 ratio for linear code), while the lines of Python
the algorithm executes are the same on every run and exactly double with the graph when it
is linear; a quadratic step in Python shows as a ratio near 4. A quadratic step inside one
builtin call (``list.index`` in a loop) is not seen here; bench/compose/partition_bench.py times it.
"""

from __future__ import annotations

import sys

from composer.models.synthetic import AllButCumsum, chain_with_residuals
from composer.scheduler.convex import partition_convex
from composer.scheduler.validate import find_tag_cycle


def lines_run(function) -> int:
    """Lines of Python executed while ``function`` runs (generators' included)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        return trace

    sys.settrace(trace)
    try:
        function()
    finally:
        sys.settrace(None)
    return count


def plan_and_check(graph_module) -> None:
    partitions = partition_convex(graph_module, AllButCumsum())
    tags = {node: index for index, members in enumerate(partitions) for node in members}
    assert find_tag_cycle(graph_module.graph, tags) is None


def test_doubling_the_nodes_at_most_doubles_the_work():
    small, large = chain_with_residuals(10_000, 7), chain_with_residuals(20_000, 7)
    ratio = lines_run(lambda: plan_and_check(large)) / lines_run(lambda: plan_and_check(small))
    print(f"20k/10k nodes lines ratio: {ratio:.3f}")
    assert ratio <= 2.1
