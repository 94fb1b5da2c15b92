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


def summary_table(plan: Plan, verbose: bool = True) -> str:
    """A plain-text table: one row per backend, then the totals and what else the plan records.
    ``verbose=False`` (``composer lower`` without ``--verbose``) states a measured placement's
    choice in one line and counts the fallbacks instead of listing them."""
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
        lines.extend(placement_lines(plan.placement) if verbose else choice_lines(plan.placement))
    lines.extend(f"moved: {describe_repair(r)}" for r in plan.repairs)
    if plan.proof:
        lines.append(f"proof: {plan.proof}")
    # Only the compilers that compiled something: "compiled with: openvino" where
    # OpenVINO took no node misleads.
    used = {b: lib for b, lib in plan.libraries.items() if plan.nodes_on(b)}
    if used:
        lines.append("compiled with: " + ", ".join(f"{b}: {lib}" for b, lib in used.items()))
    if verbose:
        lines.extend(_fallback_lines(plan))
    elif plan.fallbacks:
        lines.append(
            f"fallbacks: {len(plan.fallbacks)} node(s) no backend of the stack took, on portable "
            "kernels (--verbose says why each)"
        )
    return "\n".join(lines)


def _fallback_lines(plan: Plan) -> list[str]:
    return [
        f"fallback {f.node} ({f.op}): " + "; ".join(f"{b}: {r}" for b, r in f.reasons)
        for f in plan.fallbacks
    ]


def choice_lines(placement: Placement) -> list[str]:
    """A measured placement's choice, stated once: the chosen candidate's time beside the
    fastest other's, and the noise they were measured under (how far a candidate's two rounds
    differed), then the configuration that reproduces it."""
    timed = {c.candidate: c for c in placement.candidates if c.median_us is not None}
    line = _chose(placement)
    chosen = timed.get(placement.chosen)
    others = sorted((c for n, c in timed.items() if n != placement.chosen), key=_median)
    if chosen is not None and others:
        other = others[0]
        us = _median(other)
        ratio = us / _median(chosen)
        rounds = "" if other.confirmed_median_us is not None else ", one round"
        line += (
            f": median {_median(chosen):.1f} us; the fastest other, {other.candidate}, "
            f"{us:.1f} us ({ratio:.2f}x{rounds})"
        )
        noise = _noise(placement)
        if noise is not None:
            line += f"; a candidate's two rounds differed by up to {noise:.0%}"
            if abs(ratio - 1) <= noise:
                line += " (within that: either is as fast here)"
    lines = [
        line,
        f"  {len(timed)} candidates timed (--verbose: each, and each partition and region)",
    ]
    config = placement.config.strip()
    return lines + (_config_block(config) if config else [])


def _chose(placement: Placement) -> str:
    source = " (from the cache)" if placement.cached else ""
    return f"placement: measured{source}, chose {placement.chosen}"


def _config_block(config: str) -> list[str]:
    """The composer.toml lines that reproduce a measured choice, as they go in the file."""
    return ["  to reproduce without measuring, in composer.toml:"] + [
        f"    {line}" for line in config.splitlines()
    ]


def _noise(placement: Placement) -> float | None:
    """The largest relative difference between a candidate's two rounds (``None``: no candidate
    ran twice): what the machine's noise did to one program's median."""
    return max(
        (abs(c.confirmed_median_us - c.median_us) / c.median_us for c in placement.candidates
         if c.confirmed_median_us is not None and c.median_us),
        default=None,
    )  # fmt: skip


def _median(candidate) -> float:
    again = candidate.confirmed_median_us
    return candidate.median_us if again is None else again


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
    lines = [_chose(placement)]
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
        lines += _config_block(config)
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
