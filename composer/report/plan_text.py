"""A plan as plain text: one row per backend, the totals, and then what else the plan records
(precision, dynamic dims, state, a measured placement, repairs, the proof, fallbacks). What
``composer plan`` and ``composer lower`` print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from composer.scheduler.measured_placement import Placement, RegionSearch
from composer.scheduler.plans import (
    PORTABLE,
    Plan,
    describe_dynamic_dims,
    describe_partition_time,
    describe_region,
    describe_repair,
)


def summary_table(plan: Plan) -> str:
    """A plain-text table: one row per backend, then the totals."""
    rows = [("backend", "nodes", "partitions", "ops")]
    for backend in (*plan.backends, PORTABLE):
        ops = plan.ops_on(backend)
        top = ", ".join(f"{op} x{n}" for op, n in ops.most_common(4))
        more = len(ops) - 4
        rows.append(
            (
                backend + (" (stand-in)" if backend in plan.stand_ins else ""),
                str(len(plan.nodes_on(backend))),
                "-" if backend == PORTABLE else plan.partition_count(backend),
                top + (f", +{more} more" if more > 0 else ""),
            )
        )
    lines = tabulate(
        rows[1:], headers=rows[0], tablefmt="plain", disable_numparse=True
    ).splitlines()
    lines.append(
        f"delegate calls: {plan.delegate_calls}   device crossings: {plan.crossings}   "
        f"duplicated constant bytes: {plan.duplicated_constant_bytes}"
    )
    for backend, tolerance in plan.tolerances.items():
        lines.append(
            f"precision {backend}: "
            + (f"judged against eager in {tolerance.precision}" if tolerance.precision
               else "the model's")
            + (f" ({tolerance.reason})" if tolerance.reason else "")
        )  # fmt: skip
    if plan.dynamic_dims:
        lines.append(f"dynamic: {describe_dynamic_dims(plan.dynamic_dims)}")
    lines.extend(f"state kept in {p.id}: {', '.join(p.state)}" for p in plan.partitions if p.state)
    if plan.quantization is not None:
        lines.append(f"quantized: {plan.quantization.reason}")
    if plan.placement is not None:
        lines.extend(placement_lines(plan.placement))
    lines.extend(f"moved: {describe_repair(r)}" for r in plan.repairs)
    if plan.proof:
        lines.append(f"proof: {plan.proof}")
    # Only the compilers that compiled something: "compiled with: openvino" where
    # OpenVINO took no node misleads.
    used = {b: lib for b, lib in plan.libraries.items() if plan.nodes_on(b)}
    if used:
        lines.append("compiled with: " + ", ".join(f"{b}: {lib}" for b, lib in used.items()))
    for fallback in plan.fallbacks:
        why = "; ".join(f"{b}: {r}" for b, r in fallback.reasons)
        lines.append(f"fallback {fallback.node} ({fallback.op}): {why}")
    return "\n".join(lines)


def methods_summary_table(
    plans: Mapping[str, Plan], constant_methods: Mapping[str, Any] | None = None
) -> str:
    """A program of several methods (``MethodsComposition.plans`` and its
    ``constant_methods``): each method's table under its name, then the constant methods."""
    parts = [f"method {name}:\n{summary_table(plan)}" for name, plan in plans.items()]
    if constant_methods:
        values = ", ".join(f"{k}={v!r}" for k, v in constant_methods.items())
        parts.append(f"constant methods: {values}")
    return "\n\n".join(parts)


def placement_lines(placement: Placement) -> list[str]:
    """How a measured placement chose: every candidate's time, each partition's, the
    per-region search, and the configuration that reproduces the choice."""
    source = " (from the cache)" if placement.cached else ""
    lines = [f"placement: measured{source}, chose {placement.chosen}"]
    if placement.threads:
        lines.append(f"  timed with XNNPACK on {placement.threads} thread(s)")
    for item in placement.candidates:
        if item.median_us is None:
            lines.append(f"  {item.candidate}: {item.note}")
        else:
            again = item.confirmed_median_us
            lines.append(
                f"  {item.candidate}: {item.delegate_calls} delegate call(s), median "
                f"{item.median_us:.1f} us, p90 {item.p90_us:.1f} us"
                + ("" if again is None else f"; second round median {again:.1f} us")
            )
    traced = placement.traced
    if placement.partitions and traced is not None:
        lines.append(
            f"  per partition, traced over {traced.runs} runs ({traced.timed_by}), median: "
            f"the call {traced.execute_median_us:.1f} us, {traced.between_calls_us:.1f} us of "
            "it between delegate and kernel calls"
        )
        lines += [f"    {describe_partition_time(t)}" for t in placement.partitions]
    if placement.regions is not None:
        lines += _region_lines(placement.regions)
    config = placement.config.strip()
    if "\n[" in config:  # with a table of pins: as it goes in the file
        lines.append("  to reproduce without measuring, in composer.toml:")
        lines += [f"    {line}" for line in config.splitlines()]
    elif config:
        lines.append(
            f"  to reproduce without measuring, in composer.toml: {config.replace(chr(10), ', ')}"
        )
    return lines


def _region_lines(searched: RegionSearch) -> list[str]:
    """The per-region search (composer.measure.region_search): each region's time per
    option, the choice."""
    regions = searched.regions or ()
    if not regions:
        return [f"  per region: {note}" for note in searched.notes]
    estimate = searched.estimated_us
    lines = [
        f"  per region: {len(regions)} regions, each timed on every option ({searched.timed_by})"
        + (
            ""
            if estimate is None
            else f"; chosen by dynamic programming, estimated {estimate:.1f} us"
        )
    ]
    lines += [f"    {describe_region(searched, index)}" for index in range(len(regions))]
    calls = searched.call_us or {}
    switches = searched.switch_us or {}
    if calls or switches:
        lines.append(
            "    a call's fixed cost: "
            + (", ".join(f"{b} {us:.1f} us" for b, us in calls.items()) or "-")
            + f"; a switch: {searched.between_us or 0.0:.1f} us"
            + "".join(f", {a}->{b} +{us:.1f} us" for (a, b), us in switches.items())
        )
    lines += [f"    {note}" for note in searched.notes]
    return lines
