"""The HTML picture of a plan, checked on real plans for what a person would see."""

from __future__ import annotations

import itertools
import re
import shutil
import struct
import subprocess
import warnings
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser

import pytest

import composer
from composer import zoo
from composer.plan import PORTABLE
from composer.report_html import render_html

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
    assert all(len(f) == 1 for f in fills.values()), "one colour per backend"
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

    device = {n: "cpu" for n in plan.node_backends} | {
        n: p.device for p in plan.partitions for n in p.nodes
    }
    edges = [e for e in root.iter(f"{SVG}path") if e.get("data-from")]
    assert {(e.get("data-from"), e.get("data-to")) for e in edges} == set(plan.edges)
    for edge in edges:
        crossing = device[edge.get("data-from")] != device[edge.get("data-to")]
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


def png_colours(data: bytes) -> set[tuple[int, ...]]:
    """Distinct pixel colours of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    assert depth == 8 and colour_type in (2, 6) and interlace == 0
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    previous, colours = bytearray(stride), set()
    for y in range(height):
        kind, row = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            left = row[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                row[i] = (
                    row[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)
                ) & 0xFF
        colours.update(bytes(row[i : i + 3]) for i in range(0, stride, bpp))
        previous = row
    return {tuple(c) for c in colours}


def test_screenshot_shows_the_backend_colours(rendered, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium binary to take a screenshot with")
    _, plan, page = rendered
    root = svg_root(page)
    # Wide enough for the whole graph, so every lane's nodes can be on screen.
    width = min(int(float(root.get("width"))) + 200, 9000)
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
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            f"--window-size={width},900",
            (tmp_path / "plan.html").as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    colours = png_colours(shot.read_bytes())
    assert len(colours) > 20
    visible = {
        g.get("data-backend"): rect_of_fill(g)
        for g in root.iter(f"{SVG}g")
        if g.get("data-node") and rect_of(g)[2] < width - 100
    }
    assert set(visible) == set(plan.node_backends.values())
    for backend, fill in visible.items():
        rgb = tuple(int(fill[i : i + 2], 16) for i in (1, 3, 5))
        assert rgb in colours, f"{backend}'s colour {fill} not on screen"
