"""The measured-placement part of a plan's HTML page: every candidate's time, the per-region
search and each partition's time (composer.report.html places it below the picture)."""

from __future__ import annotations

import html

from composer.scheduler.measured_placement import Placement, Region, RegionSearch
from composer.scheduler.plans import PORTABLE, Plan

DASH = "\u2013"  # an empty cell


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def measured_placement(plan: Plan) -> str:
    """How a measured placement chose: every candidate's time, then each partition's."""
    placement = plan.placement
    if placement is None:
        return ""
    parts = ["<h2>Measured placement</h2>", *_candidates(placement)]
    if placement.regions is not None:
        parts.append(_region_search(placement.regions))
    parts += _partition_times(placement)
    return "\n".join(parts)


def _candidates(placement: Placement) -> list[str]:
    """What was timed how, and the table of every candidate's times."""
    source = " (measurements from the cache)" if placement.cached else ""
    threads = placement.threads
    on = f", XNNPACK on {threads} thread(s)" if threads else ""
    parts = [
        (
            f"<p>Chose <b>{_e(placement.chosen)}</b>{_e(source)}: the candidates were composed "
            f"and timed together in the ExecuTorch runtime on this machine{_e(on)}. A candidate "
            "that beat the declared order was timed again with it and each backend alone (second "
            "round), and kept only if it won again.</p>"
        ),
        (
            '<table class="candidates"><tr><th>candidate</th><th>delegate calls</th>'
            "<th>median us</th><th>p90 us</th><th>second round median us</th><th>note</th></tr>"
        ),
    ]
    for item in placement.candidates:
        chosen = ' class="chosen"' if item.candidate == placement.chosen else ""
        median = DASH if item.median_us is None else f"{item.median_us:.1f}"
        p90 = DASH if item.p90_us is None else f"{item.p90_us:.1f}"
        calls = DASH if item.delegate_calls is None else item.delegate_calls
        again = DASH if item.confirmed_median_us is None else f"{item.confirmed_median_us:.1f}"
        parts.append(
            f'<tr data-candidate="{_e(item.candidate)}"{chosen}>'
            f"<td>{_e(item.candidate)}</td><td>{calls}</td><td>{median}</td>"
            f"<td>{p90}</td><td>{again}</td><td>{_e(item.note)}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _partition_times(placement: Placement) -> list[str]:
    """Each partition of the chosen program traced, beside what its nodes cost elsewhere; or
    why there are no such times."""
    timed = placement.partitions
    traced = placement.traced
    if not timed or traced is None:
        return ["<p>No per-partition times: the chosen program could not be traced.</p>"]
    parts = [
        (
            f"<p>Per partition of the chosen program, traced over {traced.runs} runs "
            f"({_e(traced.timed_by)}), medians. The whole call took "
            f"{traced.execute_median_us:.1f} us, "
            f"{traced.between_calls_us:.1f} us of it between the delegate and kernel calls. "
            "Elsewhere: the same nodes as another candidate ran them.</p>"
        ),
        (
            '<table class="partition-times"><tr><th>partition</th><th>backend</th><th>nodes</th>'
            "<th>median us</th><th>p90 us</th><th>elsewhere</th></tr>"
        ),
    ]
    for item in timed:
        elsewhere = "<br>".join(
            f"{_e(a.backend)}: {a.median_us:.1f} us ({_e(a.candidate)}"
            + (f", {a.extra_nodes} more nodes in that partition" if a.extra_nodes else "")
            + ")"
            for a in item.alternatives
        )
        parts.append(
            f'<tr data-partition="{_e(item.partition)}"><td>{_e(item.partition)}</td>'
            f"<td>{_e(item.backend)}</td><td>{item.nodes}</td>"
            f"<td>{item.median_us:.1f}</td><td>{item.p90_us:.1f}</td>"
            f"<td>{elsewhere or DASH}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _region_search(searched: RegionSearch) -> str:
    """The per-region search (composer.measure.region_search): each region's time on every option, the
    choice, and what a call and a switch between places cost."""
    regions = searched.regions or ()
    notes = "".join(f'<p class="note">{_e(note)}</p>' for note in searched.notes)
    if not regions:
        return f"<h2>Per region</h2>{notes}" if notes else ""
    estimate = searched.estimated_us
    seen = dict.fromkeys(o for region in regions for o in region.options)
    options = sorted(seen, key=lambda option: option == PORTABLE)  # the backends, then portable
    parts = [
        "<h2>Per region</h2>",
        (
            f"<p>The graph cut into {len(regions)} regions (intervals of a topological order), "
            "each timed on every option that takes it in programs traced together ("
            + _e(searched.timed_by)
            + "), medians in us. Dynamic programming over the "
            "regions picked an option per region, charging each call's fixed cost and each "
            "switch"
            + ("" if estimate is None else f", estimated {estimate:.1f} us for the call")
            + "; the per-region candidate above is that choice, composed and timed whole.</p>"
        ),
        '<table class="regions"><tr><th>region</th><th>nodes</th>'
        + "".join(f"<th>{_e(o)} us</th>" for o in options)
        + "<th>chosen</th></tr>",
    ]
    times = searched.region_us or ()
    chosen = searched.chosen or ()
    for index, region in enumerate(regions):
        cost = times[index] if index < len(times) else {}
        pick = chosen[index] if index < len(chosen) else None
        parts.append(_region_row(index, region, options, cost, pick))
    parts.append("</table>")
    parts += _call_and_switch_costs(searched)
    parts.append(notes)
    return "\n".join(parts)


def _region_row(index: int, region: Region, options, cost, pick: str | None) -> str:
    """A region's row: its nodes, then its time on each option (chosen marked)."""
    nodes = region.nodes
    named = nodes[0] + (f" .. {nodes[-1]} ({len(nodes)} nodes)" if len(nodes) > 1 else "")
    cells = []
    for option in options:
        mark = ' class="chosen"' if option == pick else ""
        if option not in region.options:
            cells.append(f"<td>{DASH}</td>")
        elif option in cost:
            cells.append(f"<td{mark}>{cost[option]:.1f}</td>")
        else:
            cells.append(f"<td{mark}>not timed</td>")
    return (
        f'<tr data-region="{index}"><td>{index}</td>'
        f'<td title="{_e(", ".join(nodes))}">{_e(named)}</td>{"".join(cells)}'
        f"<td>{_e(pick or DASH)}</td></tr>"
    )


def _call_and_switch_costs(searched: RegionSearch) -> list[str]:
    """The table of a delegate call's fixed cost per backend and what each switch adds."""
    saved = "fixed (saved when two regions become one call)"
    costs = [
        (f"call:{backend}", f"a delegate call on {backend}, {saved}", us)
        for backend, us in (searched.call_us or {}).items()
    ]
    if searched.between_us is not None:
        costs.append(("switch", "a switch between places: the runtime's own time",
                      searched.between_us))  # fmt: skip
    for (before, after), us in (searched.switch_us or {}).items():
        costs.append((f"switch:{before}->{after}",
                      f"a call on {after} right after one on {before}, more", us))  # fmt: skip
    if not costs:
        return []
    return [
        "<p>What a call and a switch cost, from the same traces:</p>",
        '<table class="region-costs"><tr><th>cost</th><th>us</th></tr>',
        *(
            f'<tr data-cost="{_e(key)}"><td>{_e(what)}</td><td>{us:.1f}</td></tr>'
            for key, what, us in costs
        ),
        "</table>",
    ]
