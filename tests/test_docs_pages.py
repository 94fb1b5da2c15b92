"""The docs site is for users: grouped as tutorials, how-to guides, reference and explanation,
and naming nothing a user of the wheel lacks.

A page for users points at the public API (``composer.compose``,
``composer.testing.check_plugin``) and the commands, not at a file of the source repository
(``composer/run/proof.py``, ``tests/...``, ``bench/...``, ``scripts/...``), which a wheel does
not have. Contributor material (the scripts, the test tiers, the benchmarks, the layout of the
source) is on one page, docs/contributing.md; the promises page names each promise's guards,
which are tests by their path. That a page names no session and no issue is
tests/test_records.py's check, over these pages and the files they include.
Cheap: the Markdown is read, nothing is built.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_promises_page import GUARD

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONTRIBUTOR_PAGES = {"contributing.md"}
# A path of the source repository: a top-level folder of it, as a word of its own (not the
# tail of a URL or of another path: `../bench/RESULTS.md`, `~/.cache/composer/`).
SOURCE_PATH = re.compile(r"(?<![\w./~-])(?:composer|tests|bench|scripts)/[\w./*:-]*")
TOCTREE = re.compile(r"^```\{toctree\}\n(.*?)^```", re.MULTILINE | re.DOTALL)
CAPTIONS = ("Tutorials", "How-to guides", "Reference", "Explanation")


def _user_pages() -> list[Path]:
    return [p for p in sorted(DOCS.glob("*.md")) if p.name not in CONTRIBUTOR_PAGES]


def _source_paths(page: Path) -> list[str]:
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if page.name == "promises.md":
            line = GUARD.sub("", line)  # its guards are tests, named by path on purpose
        found += [f"{page.name}:{number}: {m.group(0)}" for m in SOURCE_PATH.finditer(line)]
    return found


def _toctrees() -> list[str]:
    return TOCTREE.findall((DOCS / "index.md").read_text(encoding="utf-8"))


def test_no_user_page_names_a_file_of_the_source_repository():
    found = [hit for page in _user_pages() for hit in _source_paths(page)]
    assert not found, (
        "a wheel user has no such file: name the public API (composer.compose, "
        "composer.testing.check_plugin) or a command, or move contributor material to "
        "docs/contributing.md\n" + "\n".join(found)
    )


def test_the_path_pattern_catches_source_paths_and_spares_others():
    line = (
        "see composer/run/proof.py, `tests/test_zoo.py` and (bench/RESULTS.md) or scripts/demo; "
        "not ../bench/RESULTS.md, ~/.cache/composer/ nor https://x.org/tests/a"
    )
    found = SOURCE_PATH.findall(line)
    assert found == [
        "composer/run/proof.py",
        "tests/test_zoo.py",
        "bench/RESULTS.md",
        "scripts/demo",
    ]


@pytest.mark.parametrize("caption", CAPTIONS)
def test_the_index_groups_the_pages_under_the_four_kinds(caption):
    captions = [
        line.split(":caption:", 1)[1].strip()
        for tree in _toctrees()
        for line in tree.splitlines()
        if line.startswith(":caption:")
    ]
    assert caption in captions, f"docs/index.md has no toctree captioned {caption!r}: {captions}"


def test_every_page_is_in_the_index_and_contributing_is_linked():
    listed = {
        line.strip().split("<")[-1].rstrip(">").strip()
        for tree in _toctrees()
        for line in tree.splitlines()
        if line.strip() and not line.startswith(":")
    }
    orphans = {
        p.stem
        for p in DOCS.glob("*.md")
        if p.read_text(encoding="utf-8").startswith("---\norphan: true")
    }
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"} - orphans
    assert pages <= listed, f"pages not in docs/index.md's toctrees: {sorted(pages - listed)}"
    assert "contributing" in listed
