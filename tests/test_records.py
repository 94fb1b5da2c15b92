"""Records, not a diary: the product's pages and modules say why, not when.

A comment or a page that names the session or the issue that saw something says nothing git
does not, and a reader cannot tell today's numbers from old ones. A run is named by its date and
commit (``measured 2026-11-28 at 7e57a50``), and bench/results keeps what bench/RESULTS.md cites,
named by date, compressed where large, within a size a clone can carry.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RESULTS_LIMIT = 5 * 1024 * 1024  # bytes, the files' own sizes

# "session" or "issue" and its number (either capitalized), and an issue named as "#" and its
# number; not a repository's issue ("pytorch/executorch#16823"), nor a colour ("#222;", '"#777"').
DIARY = re.compile(
    r"\b[Ss]ession \d+\b"
    r"|\b[Ii]ssues? \d+\b"
    r"|(?<![\w/&#\"'-])#\d{1,5}\b(?![;\w\"'])"
)
# a record named by the session that made it: conformance_s34/, gpu_repairs_s26.jsonl
SESSION_NAME = re.compile(r"_s\d\d(?![0-9])|[Ss]ession")
INCLUDE = re.compile(r"^```\{include\}\s+(\S+)", re.MULTILINE)


def _docs_pages() -> list[Path]:
    pages = [
        p
        for p in sorted((ROOT / "docs").rglob("*"))
        if p.is_file() and p.suffix in {".md", ".rst", ".py", ".txt"} and "_build" not in p.parts
    ]
    # a page the site includes (docs/results-record.md includes bench/RESULTS.md) is a page too
    included = {
        (page.parent / target).resolve()
        for page in pages
        if page.suffix == ".md"
        for target in INCLUDE.findall(page.read_text(encoding="utf-8"))
    }
    return pages + sorted(p for p in included if p.is_file())


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _diary_lines(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in DIARY.finditer(line):
                where = path.relative_to(ROOT)
                found.append(f"{where}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return found


@pytest.mark.parametrize(
    "where",
    ["docs", "composer", "tests"],
)
def test_pages_and_modules_name_no_session_and_no_issue(where):
    paths = _docs_pages() if where == "docs" else _modules(where)
    assert paths, f"nothing to read under {where}/"
    found = _diary_lines(paths)
    assert not found, (
        "say why, not when: name a run by its date and commit, not the session or issue that "
        "saw it\n" + "\n".join(found)
    )


def test_the_diary_pattern_catches_a_session_and_an_issue_and_spares_colours(tmp_path):
    page = tmp_path / "page.md"
    # built from pieces, so that this module does not name a session or an issue itself
    session, issue, number = "ses" + "sion 32", "Iss" + "ue 57", "#" + "41"
    page.write_text(
        f"Fixed in {session}, seen in {issue}'s run, and see {number}.\n"
        'ExecuTorch\'s case (pytorch/executorch#16823); color: #222; fill="#777"; s27 + 1\n',
        encoding="utf-8",
    )
    found = [m.group(0) for m in DIARY.finditer(page.read_text(encoding="utf-8"))]
    assert found == [session, issue, number]


def test_the_docs_pages_read_include_what_the_site_includes():
    assert ROOT / "bench" / "RESULTS.md" in _docs_pages()


def test_records_are_named_by_date_not_by_session():
    named = [
        str(p.relative_to(RESULTS))
        for p in sorted(RESULTS.rglob("*"))
        if SESSION_NAME.search(p.name)
    ]
    assert not named, (
        "name a record by its date (and commit where one date has several), e.g. "
        "conformance_2026-11-28_7e57a50/: " + ", ".join(named)
    )


def test_bench_results_stays_small():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    largest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:5]
    assert size <= RESULTS_LIMIT, (
        f"bench/results holds {size / 2**20:.1f} MiB, over {RESULTS_LIMIT / 2**20:.0f} MiB: keep "
        "what bench/RESULTS.md cites, gzip what is large, drop what is superseded (git keeps it). "
        "Largest: "
        + ", ".join(f"{p.relative_to(RESULTS)} ({p.stat().st_size // 1024} KiB)" for p in largest)
    )
