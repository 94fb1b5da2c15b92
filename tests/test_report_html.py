"""The HTML picture of a plan, checked on real plans for what a person would see."""

from __future__ import annotations

import html
import itertools
import re
import shutil
import subprocess
import warnings
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest
from PIL import Image, ImageColor

import composer
from composer.models import zoo
from composer.report.html import render_html
from composer.run import cpu_threads
from composer.scheduler.plans import PORTABLE

SVG = "{http://www.w3.org/2000/svg}"
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr"}
# llama_block needs sub-rows: two of its xnnpack partitions overlap in x.
CASES = [
    ("cumsum_mlp", ["tensorrt_stub", "xnnpack"]),
    ("transformer_block", ["xnnpack", "tensorrt_stub"]),
    ("llama_block", ["xnnpack", "tensorrt_stub"]),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: case[0])
def rendered(request):
    name, stack = request.param
    with warnings.catch_warnings():  # upstream deprecation chatter, as in conftest
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model, inputs = zoo.load(name)
        plan = composer.plan(model, stack, inputs)
    return name, plan, render_html(plan, title=f"{name} <plan> & co")


class TagBalance(HTMLParser):
    """Fails on a closing tag that does not close the innermost open element."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()


def svg_root(page: str) -> ET.Element:
    return ET.fromstring(page[page.index("<svg") : page.index("</svg>") + len("</svg>")])


def rect_of(group: ET.Element) -> tuple[float, float, float, float]:
    rect = group.find(f"{SVG}rect")
    x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def rect_of_fill(group: ET.Element) -> str:
    return group.find(f"{SVG}rect").get("fill")


def overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(inner, outer) -> bool:
    return (
        outer[0] <= inner[0]
        and outer[1] <= inner[1]
        and inner[2] <= outer[2]
        and inner[3] <= outer[3]
    )


def text_of(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))


def test_page_shows_every_node_partition_backend_and_fallback(rendered):
    name, plan, page = rendered
    balance = TagBalance()
    balance.feed(page)
    balance.close()
    assert balance.open == []
    assert page.startswith("<!DOCTYPE html>") and "&lt;plan&gt; &amp; co" in page
    assert "<plan>" not in page
    assert not re.search(r"<script|https?://(?!www\.w3\.org/2000/svg)", page), "must work offline"

    root = svg_root(page)
    nodes = {g.get("data-node"): g for g in root.iter(f"{SVG}g") if g.get("data-node")}
    assert set(nodes) == set(plan.node_backends)
    for node, group in nodes.items():
        assert group.get("id") == node
        assert group.find(f"{SVG}title").text.startswith(node)
    fills = {
        b: {rect_of_fill(nodes[n]) for n in plan.nodes_on(b)} for b in plan.node_backends.values()
    }
    assert all(len(f) == 1 for f in fills.values()), "one color per backend"
    assert len({next(iter(f)) for f in fills.values()}) == len(fills), "backends told apart"

    boxes = {
        g.get("data-partition"): rect_of(g) for g in root.iter(f"{SVG}g") if g.get("data-partition")
    }
    assert set(boxes) == {p.id for p in plan.partitions}
    for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
        assert not overlap(box_a, box_b), f"{a} and {b} overlap"
    for partition in plan.partitions:
        for node in partition.nodes:
            assert inside(rect_of(nodes[node]), boxes[partition.id]), f"{node} outside its box"
    for (a, box_a), (b, box_b) in itertools.combinations(
        ((n, rect_of(g)) for n, g in nodes.items()), 2
    ):
        assert not overlap(box_a, box_b), f"nodes {a} and {b} overlap"

    edges = [e for e in root.iter(f"{SVG}path") if e.get("data-from")]
    assert {(e.get("data-from"), e.get("data-to")) for e in edges} == set(plan.edges)
    crossings = set(plan.crossing_edges())
    for edge in edges:
        crossing = (edge.get("data-from"), edge.get("data-to")) in crossings
        assert ("crossing" in edge.get("class")) == crossing
    assert any("crossing" in e.get("class") for e in edges)

    legend = text_of(re.search(r'<ul class="legend">.*?</ul>', page, re.DOTALL).group())
    for backend in (*plan.backends, PORTABLE):
        assert backend in legend
    for label, value in [
        ("delegate calls", plan.delegate_calls),
        ("device crossings", plan.crossings),
        ("duplicated constant bytes", plan.duplicated_constant_bytes),
    ]:
        assert f"{label} <b>{value:,}</b>" in page

    fallbacks = {f.node: f for f in plan.fallbacks}
    if name == "cumsum_mlp":
        assert "aten_cumsum_default" in fallbacks
    for node, fallback in fallbacks.items():
        row = re.search(rf'<tr data-fallback="{node}">.*?</tr>', page, re.DOTALL)
        assert row, f"fallback {node} not listed"
        for backend, reason in fallback.reasons:
            assert reason in text_of(row.group())
            assert f"<th>why not {backend}</th>" in page


# Only the graph, at the page's top left, unclipped: then an SVG unit is a screen pixel, and
# the legend and tables, which use the same colors, cannot stand in for the nodes.
GRAPH_ONLY = (
    "<style>body { margin: 0 } body > :not(.graph) { display: none }"
    " .graph { border: 0; max-height: none; overflow: visible }</style>"
)


def screenshot(page: str, width: int, height: int, tmp_path) -> Image.Image:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium binary to take a screenshot with (.ci/run installs it)")
    (tmp_path / "plan.html").write_text(page, encoding="utf-8")
    shot = tmp_path / "plan.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            f"--window-size={width},{height}",
            (tmp_path / "plan.html").as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return Image.open(shot).convert("RGB")


def share_of(image: Image.Image, box: tuple[float, ...], color: str) -> float:
    """The share of the pixels inside ``box`` that have ``color`` (#rrggbb)."""
    x0, y0, x1, y1 = (round(v) for v in box)
    # One pixel in from the edges: rounded corners and anti-aliasing blend there.
    region = image.crop((x0 + 1, y0 + 1, x1 - 1, y1 - 1))
    want = ImageColor.getrgb(color)
    counts = {c: n for n, c in region.getcolors(region.width * region.height)}
    return counts.get(want, 0) / (region.width * region.height)


def test_screenshot_shows_every_node_box_in_its_backends_color(rendered, tmp_path):
    _, plan, page = rendered
    root = svg_root(page)
    width = min(int(float(root.get("width"))), 9000)
    height = min(int(float(root.get("height"))), 4000)
    image = screenshot(page.replace("</head>", GRAPH_ONLY + "</head>", 1), width, height, tmp_path)
    assert image.size == (width, height)
    nodes = [g for g in root.iter(f"{SVG}g") if g.get("data-node")]
    on_screen = [g for g in nodes if rect_of(g)[2] <= width and rect_of(g)[3] <= height]
    assert len(on_screen) == len(plan.node_backends), "every node fits on the screenshot"
    for group in on_screen:
        # The label covers part of the box; most of it is the fill.
        share = share_of(image, rect_of(group), rect_of_fill(group))
        assert share > 0.5, (
            f"node {group.get('data-node')} ({group.get('data-backend')}): only {share:.0%} of "
            f"its box is drawn in {rect_of_fill(group)}"
        )


def test_a_measured_plan_shows_every_candidate_each_region_and_each_partitions_time(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("COMPOSER_CACHE_DIR", str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model, inputs = zoo.load("cumsum_mlp")
        plan = composer.plan(model, ["xnnpack", "openvino"], inputs, placement="measured")
    page = render_html(plan)
    balance = TagBalance()
    balance.feed(page)
    balance.close()
    assert balance.open == []
    placement = plan.placement
    # The threads XNNPACK ran on while timing: the runtime's default here.
    assert f"on this machine, XNNPACK on {cpu_threads.current()} thread(s)." in text_of(page)
    rows = re.findall(r'<tr data-candidate="([^"]+)"( class="chosen")?>(.*?)</tr>', page)
    assert [label for label, _, _ in rows] == [c.candidate for c in placement.candidates]
    assert [label for label, chosen, _ in rows if chosen] == [placement.chosen]
    for (_, _, cells), candidate in zip(rows, placement.candidates):
        assert f"<td>{candidate.median_us:.1f}</td>" in cells

    # The per-region search: a row per region with its nodes, its time on each option, the
    # option chosen; then what a delegate call and a switch between places cost.
    searched = placement.regions
    assert searched.chosen, searched.notes
    assert "Per region" in text_of(page)
    header = re.search(r'<table class="regions"><tr>(.*?)</tr>', page).group(1)
    options = re.findall(r"<th>(\w+) us</th>", header)
    assert set(options) == {o for r in searched.regions for o in r.options}
    regions = re.findall(r'<tr data-region="(\d+)">(.*?)</tr>', page)
    assert [int(i) for i, _ in regions] == list(range(len(searched.regions)))
    for (_, cells), region, times, pick in zip(
        regions, searched.regions, searched.region_us, searched.chosen
    ):
        values = re.findall(r"<td[^>]*>(.*?)</td>", cells)
        assert values[1].startswith(region.nodes[0])
        assert values[-1] == pick
        for option, value in zip(options, values[2:-1]):
            assert value == (f"{times[option]:.1f}" if option in times else "\u2013")
        assert f'<td class="chosen">{times[pick]:.1f}</td>' in cells
    costs = {
        html.unescape(key): us
        for key, us in re.findall(r'<tr data-cost="([^"]+)"><td>[^<]*</td><td>([^<]+)</td>', page)
    }
    expected = {f"call:{b}": us for b, us in searched.call_us.items()}
    expected |= {f"switch:{a}->{b}": us for (a, b), us in searched.switch_us.items()}
    expected["switch"] = searched.between_us
    assert costs == {key: f"{us:.1f}" for key, us in expected.items()}
    assert any(key.startswith("call:") for key in costs)

    timed = re.findall(r'<tr data-partition="([^"]+)">(.*?)</tr>', page)
    assert [p for p, _ in timed] == [t.partition for t in placement.partitions]
    for (_, cells), item in zip(timed, placement.partitions):
        assert f"<td>{item.median_us:.1f}</td>" in cells
        for other in item.alternatives:
            assert f"{other.backend}: {other.median_us:.1f} us ({other.candidate}" in cells
    assert any(item.alternatives for item in placement.partitions)

    # Hovering a partition's box or a portable node says what it cost.
    titles = {
        g.get("data-partition") or g.get("data-node"): g.find(f"{SVG}title").text
        for g in svg_root(page).iter(f"{SVG}g")
        if g.get("data-partition") or (g.get("data-node") and g.get("data-backend") == PORTABLE)
    }
    for item in placement.partitions:
        assert f"measured: {item.median_us:.1f} us" in titles[item.partition]


def test_a_program_of_several_methods_is_one_page_with_a_section_per_method():
    from composer.report.html import render_methods_html

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        plans = {
            name: composer.plan(
                zoo.load(model)[0], ["tensorrt_stub", "xnnpack"], zoo.load(model)[1]
            )
            for name, model in (("prefill", "mlp"), ("decode", "mlp"), ("head", "cumsum_mlp"))
        }
    page = render_methods_html(plans, {"get_max_seq_len": 8}, title="llm <program>")
    balance = TagBalance()
    balance.feed(page)
    balance.close()
    assert balance.open == []
    text = text_of(page)
    assert "llm &lt;program&gt;" in text
    for name in plans:
        assert f"method {name}" in text
    assert "get_max_seq_len" in text and "8" in text
    # prefill and decode have the same nodes: each picture names them, ids stay unique.
    node_ids = [
        g.get("id")
        for svg in ET.fromstring(f"<r>{_svgs(page)}</r>")
        for g in svg.iter(f"{SVG}g")
        if g.get("class") == "node"
    ]
    assert len(node_ids) == len(set(node_ids)) == sum(len(p.node_backends) for p in plans.values())
    assert "prefill:aten_relu_default" in node_ids and "decode:aten_relu_default" in node_ids


def _svgs(page: str) -> str:
    return "".join(re.findall(r"<svg.*?</svg>", page, flags=re.DOTALL))
