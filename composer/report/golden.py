"""Golden plans: the parts of a plan a regression test pins, and what moved between two of
them, in words (the pytest plugin and ``composer sweep --golden`` compare by these)."""

from __future__ import annotations

from typing import Any

from composer.scheduler.plans import PORTABLE, Plan


def golden_summary(plan: Plan) -> dict[str, Any]:
    """The parts of a plan a golden file pins: where ops went, partitions, calls, crossings.

    Node names are left out on purpose: they change with torch versions while the
    composition does not.
    """
    return {
        "backends": list(plan.backends),
        "ops": {
            backend: dict(sorted(plan.ops_on(backend).items()))
            for backend in (*plan.backends, PORTABLE)
            if plan.ops_on(backend)
        },
        "partitions": [{"backend": p.backend, "ops": p.op_counts} for p in plan.partitions],
        "delegate_calls": plan.delegate_calls,
        "crossings": plan.crossings,
    }


def describe_golden_diff(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """What moved, in words: ops between backends, partition counts, calls, crossings."""
    lines = []
    if expected.get("backends") != actual.get("backends"):
        lines.append(f"backend stack: {expected.get('backends')} -> {actual.get('backends')}")
    ops = sorted(
        {op for side in (expected, actual) for counts in side["ops"].values() for op in counts}
    )
    for op in ops:
        before = {b: c[op] for b, c in expected["ops"].items() if op in c}
        after = {b: c[op] for b, c in actual["ops"].items() if op in c}
        if before != after:
            lines.append(f"{op}: {_where(before)} -> {_where(after)}")
    for backend in dict.fromkeys([*expected["ops"], *actual["ops"], *actual["backends"]]):
        before = sum(1 for p in expected["partitions"] if p["backend"] == backend)
        after = sum(1 for p in actual["partitions"] if p["backend"] == backend)
        if before != after:
            lines.append(f"partitions on {backend}: {before} -> {after}")
    if not lines and expected["partitions"] != actual["partitions"]:
        lines.append("the same ops per backend, grouped into partitions differently")
    for key in ("delegate_calls", "crossings"):
        if expected[key] != actual[key]:
            lines.append(f"{key.replace('_', ' ')}: {expected[key]} -> {actual[key]}")
    return lines


def _where(counts: dict[str, int]) -> str:
    return ", ".join(f"{backend} x{n}" for backend, n in counts.items()) or "nowhere"
