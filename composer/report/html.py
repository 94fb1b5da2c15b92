"""A self-contained HTML picture of a plan: which backend took which op, and where data crosses."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from composer.lower.atomic import html_marker
from composer.report.placement_html import measured_placement
from composer.scheduler.plans import (
    PORTABLE,
    Partition,
    Plan,
    describe_dynamic_dims,
    describe_repair,
)

# Distinct hues, none of them red: red is reserved for device crossings.
PALETTE = (
    "#4477aa",
    "#ee8833",
    "#228833",
    "#aa3377",
    "#66ccee",
    "#ccbb44",
    "#8c564b",
    "#332288",
    "#44aa99",
    "#e377c2",
)
PORTABLE_COLOR = "#9e9e9e"
CROSSING_COLOR = "#d62728"

# Geometry in SVG units; COLUMN - NODE_W - 2 * PAD is the gap between neighbouring boxes.
COLUMN = 156
NODE_W, NODE_H = 124, 24
SLOT = 32
PAD = 8
LABEL_H = 20
ROW_GAP = 10
LANE_PAD = 10
GUTTER = 170
LABEL_CHARS = 19


@attrs.frozen
class _Group:
    """Nodes drawn together: one partition, or a lone node outside any partition."""

    partition: Partition | None
    nodes: tuple[str, ...]
    start: int
    end: int
    depth: int


@attrs.frozen
class _Lane:
    backend: str
    y: float
    height: float


@attrs.define
class _Layout:
    lanes: list[_Lane] = attrs.field(factory=list)
    boxes: list[tuple[Partition, float, float, float, float]] = attrs.field(factory=list)
    positions: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    width: float = 0.0
    height: float = 0.0


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short_op(op: str) -> str:
    # "addmm" from "aten.addmm.default": namespace and overload only repeat themselves.
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def _node_label(op: str) -> str:
    name = _short_op(op)
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "\u2026"


def _ranks(nodes: list[str], edges: tuple[tuple[str, str], ...]) -> dict[str, int]:
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in preds and b in preds and a != b:
            succs[a].append(b)
            preds[b].append(a)
    indegree = {n: len(preds[n]) for n in nodes}
    order = [n for n in nodes if indegree[n] == 0]
    for n in order:  # grows while iterating: Kahn's algorithm
        for s in succs[n]:
            indegree[s] -= 1
            if indegree[s] == 0:
                order.append(s)
    # A plan is acyclic, but a picture must not drop nodes if one ever is not.
    order += [n for n in nodes if indegree[n] > 0]
    rank: dict[str, int] = {}
    for n in order:
        rank[n] = max((rank[p] + 1 for p in preds[n] if p in rank), default=0)
    # A source drawn at the far left would stretch its partition's box across the page.
    for n in order:
        if not preds[n] and succs[n]:
            rank[n] = min(rank[s] for s in succs[n]) - 1
    return rank


def _lanes(plan: Plan) -> list[str]:
    seen = [*plan.backends]
    for backend in [*(p.backend for p in plan.partitions), *plan.node_backends.values()]:
        if backend not in seen and backend != PORTABLE:
            seen.append(backend)
    return [*seen, PORTABLE]


def _groups(plan: Plan, backend: str, rank: dict[str, int]) -> list[_Group]:
    members: list[tuple[Partition | None, tuple[str, ...]]] = [
        (p, tuple(n for n in p.nodes if n in rank)) for p in plan.partitions_of(backend)
    ]
    in_partition = {n for _, nodes in members for n in nodes}
    members += [(None, (n,)) for n in plan.nodes_on(backend) if n not in in_partition]
    groups = []
    for partition, nodes in members:
        if not nodes:
            continue
        ranks = [rank[n] for n in nodes]
        depth = max(Counter(ranks).values())
        groups.append(_Group(partition, nodes, min(ranks), max(ranks), depth))
    return groups


def _pack(groups: list[_Group]) -> list[list[_Group]]:
    """Groups into rows without x-overlap; first fit by start is optimal for intervals."""
    rows: list[list[_Group]] = []
    for group in sorted(groups, key=lambda g: (g.start, g.end)):
        row = next((r for r in rows if r[-1].end < group.start), None)
        if row is None:
            rows.append([group])
        else:
            row.append(group)
    return rows


def _layout(plan: Plan) -> _Layout:
    rank = _ranks(list(plan.node_backends), plan.edges)
    layout = _Layout()
    y = 0.0
    for backend in _lanes(plan):
        lane_top = y
        y += LANE_PAD
        rows = _pack(_groups(plan, backend, rank))
        for row in rows:
            # Only a boxed row needs room above its nodes for the partition id.
            top = LABEL_H if any(g.partition is not None for g in row) else 0
            row_h = top + (max(g.depth for g in row) - 1) * SLOT + NODE_H + PAD
            for group in row:
                stacked: Counter[int] = Counter()
                for n in group.nodes:
                    x = GUTTER + rank[n] * COLUMN
                    layout.positions[n] = (x, y + top + stacked[rank[n]] * SLOT)
                    stacked[rank[n]] += 1
                if group.partition is not None:
                    x0 = GUTTER + group.start * COLUMN - PAD
                    w = (group.end - group.start) * COLUMN + NODE_W + 2 * PAD
                    layout.boxes.append((group.partition, x0, y, w, row_h))
            y += row_h + ROW_GAP
        y = max(y, lane_top + 2 * LANE_PAD + LABEL_H + NODE_H) + LANE_PAD
        layout.lanes.append(_Lane(backend, lane_top, y - lane_top))
    last = max(rank.values(), default=0)
    layout.width = GUTTER + last * COLUMN + NODE_W + 3 * PAD
    layout.height = y
    return layout


def _colors(lanes: list[str]) -> dict[str, str]:
    backends = [b for b in lanes if b != PORTABLE]
    colors = {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(backends)}
    colors[PORTABLE] = PORTABLE_COLOR
    return colors


def _text_color(fill: str) -> str:
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "#111" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#fff"


def _svg(plan: Plan, layout: _Layout, colors: dict[str, str], ids: str = "") -> str:
    w, h = layout.width, layout.height
    header = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="system-ui, sans-serif" font-size="11">'
    )
    return "\n".join(
        [
            header,
            *_svg_arrowheads(),
            *_svg_lanes(plan, layout, colors),
            *_svg_partitions(plan, layout, colors),
            *_svg_edges(plan, layout),
            *_svg_nodes(plan, layout, colors, ids),
            "</svg>",
        ]
    )


def _svg_arrowheads() -> list[str]:
    """The markers that end an edge: grey, and the crossing colour for a device crossing."""
    out = ["<defs>"]
    for name, color in (("arrow", "#777"), ("arrow-crossing", CROSSING_COLOR)):
        out.append(
            f'<marker id="{name}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{color}"/>'
            "</marker>"
        )
    out.append("</defs>")
    return out


def _svg_lanes(plan: Plan, layout: _Layout, colors: dict[str, str]) -> list[str]:
    """One band per backend, captioned with its device and node count."""
    out = []
    for i, lane in enumerate(layout.lanes):
        band = "#f6f6f6" if i % 2 == 0 else "#ececec"
        stand_in = " (stand-in)" if lane.backend in plan.stand_ins else ""
        counts = f"{len(plan.nodes_on(lane.backend))} nodes"
        device = plan.device_of_backend(lane.backend)
        caption = f"{device} \u00b7 {counts}" if device else counts
        out.append(
            f'<g class="lane" data-backend="{_e(lane.backend)}">'
            f'<rect x="0" y="{lane.y:.0f}" width="{layout.width:.0f}" '
            f'height="{lane.height:.0f}" fill="{band}"/>'
            f'<rect x="0" y="{lane.y:.0f}" width="6" height="{lane.height:.0f}" '
            f'fill="{colors[lane.backend]}"/>'
            f'<text x="14" y="{lane.y + 22:.0f}" font-size="13" font-weight="bold">'
            f"{_e(lane.backend)}{_e(stand_in)}</text>"
            f'<text x="14" y="{lane.y + 38:.0f}" fill="#555">'
            f"{_e(caption)}</text></g>"
        )
    return out


def _svg_partitions(plan: Plan, layout: _Layout, colors: dict[str, str]) -> list[str]:
    """A box around each partition's nodes, its title saying what it cost where traced."""
    out = []
    for partition, x, y, bw, bh in layout.boxes:
        color = colors[partition.backend]
        out.append(
            f'<g class="partition" data-partition="{_e(partition.id)}">'
            f"<title>{_e(partition.id)} on {_e(partition.device)}: "
            f"{len(partition.nodes)} nodes{_e(_traced(plan, partition.nodes[0]))}</title>"
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{bw:.0f}" height="{bh:.0f}" rx="8" '
            f'fill="{color}" fill-opacity="0.12" stroke="{color}" stroke-width="1.5"/>'
            f'<text x="{x + 6:.0f}" y="{y + 14:.0f}" font-weight="bold" fill="{color}">'
            f"{_e(partition.id)}{' quantized' if partition.quantized else ''}</text></g>"
        )
    return out


def _svg_edges(plan: Plan, layout: _Layout) -> list[str]:
    """A curve per edge between drawn nodes; a device crossing dashed, in its own colour."""
    out = []
    for a, b in plan.edges:
        if a not in layout.positions or b not in layout.positions:
            continue
        (xa, ya), (xb, yb) = layout.positions[a], layout.positions[b]
        x1, y1, x2, y2 = xa + NODE_W, ya + NODE_H / 2, xb, yb + NODE_H / 2
        bend = max(30.0, (x2 - x1) / 2)
        crossing = plan.device_of(a) != plan.device_of(b)
        style = (
            f'class="edge crossing" stroke="{CROSSING_COLOR}" stroke-width="1.8" '
            'stroke-dasharray="5 3" marker-end="url(#arrow-crossing)"'
            if crossing
            else 'class="edge" stroke="#777" stroke-opacity="0.8" marker-end="url(#arrow)"'
        )
        out.append(
            f'<path data-from="{_e(a)}" data-to="{_e(b)}" {style} fill="none" '
            f'd="M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} '
            f'{x2:.0f},{y2:.0f}"><title>{_e(a)} \u2192 {_e(b)} '
            f"({_e(plan.device_of(a))} \u2192 {_e(plan.device_of(b))})</title></path>"
        )
    return out


def _svg_nodes(plan: Plan, layout: _Layout, colors: dict[str, str], ids: str) -> list[str]:
    """A box per node in its backend's colour; ``ids`` prefixes the element ids, so that two
    pictures can share one page."""
    partition_of = {n: p.id for p in plan.partitions for n in p.nodes}
    out = []
    for node, backend in plan.node_backends.items():
        x, y = layout.positions[node]
        op = plan.node_ops.get(node, "?")
        where = partition_of.get(node, backend)
        out.append(
            f'<g class="node" id="{_e(ids + node)}" data-node="{_e(node)}" '
            f'data-backend="{_e(backend)}"><title>{_e(node)}\n{_e(op)} on {_e(where)} '
            f"({_e(plan.device_of(node))}){_e(_traced(plan, node))}</title>"
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="4" '
            f'fill="{colors.get(backend, PORTABLE_COLOR)}"/>'
            f'<text x="{x + NODE_W / 2:.0f}" y="{y + NODE_H / 2 + 4:.0f}" text-anchor="middle" '
            f'fill="{_text_color(colors.get(backend, PORTABLE_COLOR))}">'
            f"{_e(_node_label(op))}</text></g>"
        )
    return out


def _traced(plan: Plan, node: str) -> str:
    timed = plan.partition_time(node)
    return "" if timed is None else f"\nmeasured: {timed.median_us:.1f} us (median, traced)"


def _op_summary(ops: Counter[str]) -> str:
    return ", ".join(f"{_short_op(op)} \u00d7{n}" for op, n in ops.most_common()) or "\u2013"


def _tables(plan: Plan, lanes: list[str], colors: dict[str, str]) -> str:
    rows = []
    for backend in lanes:
        partitions = "\u2013" if backend == PORTABLE else plan.partition_count(backend)
        rows.append(
            f'<tr data-backend="{_e(backend)}"><td><span class="swatch" '
            f'style="background:{colors[backend]}"></span>{_e(backend)}</td>'
            f"<td>{_e(plan.device_of_backend(backend) or '')}</td>"
            f"<td>{len(plan.nodes_on(backend))}</td><td>{partitions}</td>"
            f"<td>{_e(_op_summary(plan.ops_on(backend)))}</td></tr>"
        )
    parts = [
        "<h2>Backends</h2>",
        (
            '<table class="backends"><tr><th>backend</th><th>device</th><th>nodes</th>'
            "<th>partitions</th><th>ops</th></tr>"
        ),
        *rows,
        "</table>",
        "<h2>Fallbacks to portable CPU kernels</h2>",
    ]
    if not plan.fallbacks:
        parts.append("<p>None: every node was taken by a backend.</p>")
        return "\n".join(parts)
    header = "".join(f"<th>why not {_e(b)}</th>" for b in plan.backends)
    parts.append(f'<table class="fallbacks"><tr><th>node</th><th>op</th>{header}</tr>')
    for fallback in plan.fallbacks:
        reasons = dict(fallback.reasons)
        cells = "".join(f"<td>{_e(reasons.get(b, ''))}</td>" for b in plan.backends)
        parts.append(
            f'<tr data-fallback="{_e(fallback.node)}"><td>{_e(fallback.node)}</td>'
            f"<td>{_e(fallback.op)}</td>{cells}</tr>"
        )
    parts.append("</table>")
    return "\n".join(parts)


def _legend(plan: Plan, lanes: list[str], colors: dict[str, str]) -> str:
    items = [
        f'<li data-backend="{_e(b)}"><span class="swatch" style="background:{colors[b]}">'
        f"</span>{_e(b)}{' (stand-in)' if b in plan.stand_ins else ''}</li>"
        for b in lanes
    ]
    items.append(
        f'<li><span class="dash" style="border-color:{CROSSING_COLOR}"></span>'
        "edge between devices</li>"
    )
    return f'<ul class="legend">{"".join(items)}</ul>'


_CSS = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 16px; margin: 20px 0 6px; }
.totals span { margin-right: 20px; } .totals b { font-size: 16px; }
.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 6px 18px; }
.swatch { display: inline-block; width: 14px; height: 14px; border-radius: 3px;
  vertical-align: -2px; margin-right: 6px; }
.dash { display: inline-block; width: 24px; border-top: 2px dashed; vertical-align: 3px;
  margin-right: 6px; }
.graph { overflow: auto; border: 1px solid #ccc; max-height: 80vh; }
.graph svg { display: block; }
.note { color: #666; font-size: 12px; margin: 4px 0; }
tr.chosen td, td.chosen { font-weight: bold; }
table { border-collapse: collapse; } td, th { border: 1px solid #ddd; padding: 3px 8px;
  text-align: left; vertical-align: top; } th { background: #f3f3f3; }
"""


def _backend_facts(plan: Plan) -> str:
    """Which library compiled each backend's delegates, the tolerances verification uses, the
    dynamic dims, the partitions moved and how the program was proven."""
    items = [f"<li>{_e(b)} compiled with {_e(lib)}</li>" for b, lib in plan.libraries.items()]
    items += [
        f"<li>{_e(b)} verified within atol {t.atol:g}, rtol {t.rtol:g}"
        + (f" ({_e(t.reason)})" if t.reason else "")
        + "</li>"
        for b, t in plan.tolerances.items()
    ]
    if plan.quantization is not None:
        q = plan.quantization
        items.append(
            f"<li>quantized: verified within atol {q.atol:g}, rtol {q.rtol:g} "
            f"({_e(q.reason)}); {sum(p.quantized for p in plan.partitions)} of "
            f"{len(plan.partitions)} partitions compute on quantized values</li>"
        )
    if plan.dynamic_dims:
        items.append(f"<li>dynamic: {_e(describe_dynamic_dims(plan.dynamic_dims))}</li>")
    items += [
        f"<li>state kept in {_e(p.id)}: {_e(', '.join(p.state))}</li>"
        for p in plan.partitions
        if p.state
    ]
    items += [f"<li>moved: {_e(describe_repair(r))}</li>" for r in plan.repairs]
    if plan.proof:
        items.append(f"<li>proof: {_e(plan.proof)}</li>")
    return f'<ul class="facts">{"".join(items)}</ul>' if items else ""


def render_html(plan: Plan, title: str = "composer plan") -> str:
    """A complete, offline HTML page picturing ``plan``: the graph by backend, partitions,
    device crossings, per-backend summary and fallbacks, and how a measured placement chose."""
    return _page(title, _plan_body(plan))


def render_methods_html(
    plans: Mapping[str, Plan],
    constant_methods: Mapping[str, Any] | None = None,
    title: str = "composer program",
) -> str:
    """One page for a program of several methods: each method's plan as ``render_html``
    pictures it, under the method's name, then the constant methods."""
    contents = "".join(f'<li><a href="#method-{_e(name)}">{_e(name)}</a></li>' for name in plans)
    parts = [f'<ul class="facts">{contents}</ul>']
    for name, plan in plans.items():
        # Node names repeat between methods; their elements' ids must not.
        parts += [
            f'<section class="method" id="method-{_e(name)}">',
            f"<h2>method {_e(name)}</h2>",
            _plan_body(plan, ids=f"{name}:"),
            "</section>",
        ]
    if constant_methods:
        rows = "".join(
            f"<tr><td>{_e(name)}</td><td>{_e(repr(value))}</td></tr>"
            for name, value in constant_methods.items()
        )
        parts.append(
            f"<h2>constant methods</h2><table><tr><th>method</th><th>value</th></tr>{rows}</table>"
        )
    return _page(title, "\n".join(parts))


def _page(title: str, body: str) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            f'<html lang="en"><head><meta charset="utf-8">{html_marker("report")}',
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            body,
            "</body></html>",
        ]
    )


def _plan_body(plan: Plan, ids: str = "") -> str:
    lanes = _lanes(plan)
    colors = _colors(lanes)
    layout = _layout(plan)
    return "\n".join(
        [
            f"<p>Backends in priority order: {_e(', '.join(plan.backends))}</p>",
            _backend_facts(plan),
            (
                '<p class="totals">'
                f"<span>delegate calls <b>{plan.delegate_calls}</b></span>"
                f"<span>device crossings <b>{plan.crossings}</b></span>"
                "<span>duplicated constant bytes "
                f"<b>{plan.duplicated_constant_bytes:,}</b></span>"
                f"<span>nodes <b>{len(plan.node_backends)}</b></span></p>"
            ),
            _legend(plan, lanes, colors),
            f'<div class="graph">{_svg(plan, layout, colors, ids)}</div>',
            (
                '<p class="note">Hover a node for its full name. Red dashed edges cross devices; '
                "the device-crossing total also counts graph inputs and outputs.</p>"
            ),
            _tables(plan, lanes, colors),
            measured_placement(plan),
        ]
    )
