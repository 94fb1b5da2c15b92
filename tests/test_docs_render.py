"""The docs site as a reader sees it: defects that build without a Sphinx warning (so -W passes)
but show on the page. attrs' sentinel in a signature ("= NOTHING"), a property docstring that
Napoleon reads as "type: description" (a "TYPE:" field), and an inline literal that does not
close where its author meant ("``Option``s" runs on as code until the next pair of backticks).

The site is built once per test session, or not at all where `scripts/test` has just built it:
build/docs is reused when every page there is newer than every input of the site."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / "build" / "docs"
# What a page is made of: the pages, the README and bench/RESULTS.md they include, and the
# docstrings autodoc reads.
INPUTS = ("docs", "README.md", "bench/RESULTS.md", "composer")

CODE = re.compile(r'<code class="docutils literal[^"]*">(.*?)</code>', re.DOTALL)
TAG = re.compile(r"<[^>]+>")
# Napoleon's reading of "The program as Python: delegates run..." on a property: a "Type" field
# (furo writes field names in capitals, so the reader sees "TYPE:").
TYPE_FIELD = re.compile(r'<dt class="field-\w+">Type<span class="colon">')
# A docstring's inline literal longer than this is prose run on as code.
LONGEST_LITERAL = 120


def _text(markup: str) -> str:
    return html.unescape(TAG.sub("", markup))


def _snippet(markup: str) -> str:
    return " ".join(_text(markup.split('<dt class="sig')[0]).split())[:160]


def _newest_input() -> float:
    newest = 0.0
    for name in INPUTS:
        path = ROOT / name
        files = [path] if path.is_file() else path.rglob("*")
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                newest = max(newest, file.stat().st_mtime)
    return newest


def _fresh(site: Path) -> bool:
    pages = list(site.glob("*.html"))
    return bool(pages) and min(p.stat().st_mtime for p in pages) > _newest_input()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if _fresh(BUILT):
        return BUILT
    out = tmp_path_factory.mktemp("docs")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return out


def _api_descriptions(page: str) -> list[str]:
    """The autodoc blocks (``<dl class="py ...">``) of a page, outermost ones, as markup."""
    blocks, depth, start = [], 0, 0
    for tag in re.finditer(r'<dl class="py\b|<dl\b|</dl>', page):
        if depth == 0 and not tag.group().startswith('<dl class="py'):
            continue
        if depth == 0:
            start = tag.start()
        depth += -1 if tag.group() == "</dl>" else 1
        if depth == 0:
            blocks.append(page[start : tag.end()])
    return blocks


def defects(page: str) -> list[str]:
    """What a reader of this page would see wrong, each with a snippet."""
    found = []
    text = _text(page)
    for match in re.finditer(r"\bNOTHING\b", text):
        found.append(f"attrs' NOTHING: ...{text[max(0, match.start() - 60) : match.end()]}")
    for match in TYPE_FIELD.finditer(page):
        found.append(f"a 'TYPE:' field: {_snippet(page[match.start() : match.end() + 300])}")
    for literal in map(_text, CODE.findall(page)):
        if "``" in literal:
            found.append(f"an inline literal that ran on: {literal[:200]}")
    for block in _api_descriptions(page):
        for literal in map(_text, CODE.findall(block)):
            if len(literal) > LONGEST_LITERAL and "``" not in literal:
                found.append(f"a docstring literal of {len(literal)} characters: {literal[:200]}")
    prose = _text(re.sub(r"<(pre|code)\b.*?</\1>", "", page, flags=re.DOTALL))
    for match in re.finditer(r"``", prose):
        found.append(
            f"backticks left in the text: ...{prose[max(0, match.start() - 60) : match.end() + 60]}"
        )
    return found


def test_the_built_pages_show_no_signature_sentinels_type_fields_or_runaway_literals(site):
    pages = sorted(site.glob("*.html"))
    assert any(p.name == "api.html" for p in pages), f"no API page in {site}"
    report = [f"{p.name}: {d}" for p in pages for d in defects(p.read_text(encoding="utf-8"))]
    assert not report, "\n".join(report)


@pytest.mark.parametrize(
    "page, defect",
    [
        (
            '<dt class="sig"><em>options</em> = <span class="pre">NOTHING</span></dt>',
            "attrs' NOTHING",
        ),
        (
            (
                '<dl class="field-list simple"><dt class="field-odd">Type<span class="colon">:'
                "</span></dt><dd>The lowered program as Python</dd></dl>"
            ),
            "a 'TYPE:' field",
        ),
        (
            (
                '<p>set <code class="docutils literal notranslate">composer.Option``s it takes), '
                "override ``composer_operator_support</code></p>"
            ),
            "an inline literal that ran on",
        ),
        (
            '<dl class="py class"><dd><code class="docutils literal">'
            + "x " * 80
            + "</code></dd></dl>",
            "a docstring literal of 160 characters",
        ),
        ("<p>the ``options`` it takes</p>", "backticks left in the text"),
    ],
)
def test_each_defect_is_found(page, defect):
    assert any(d.startswith(defect) for d in defects(page)), defects(page)


def test_a_long_command_on_a_guide_page_is_no_defect():
    command = "x " * 80
    assert defects(f'<p><code class="docutils literal notranslate">{command}</code></p>') == []
