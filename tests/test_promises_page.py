"""docs/promises.md names a guard for each promise; each guard it names must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUARD = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_guard_the_promises_page_names_exists():
    page = (ROOT / "docs" / "promises.md").read_text()
    named = GUARD.findall(page)
    assert len(named) >= 10, named  # the table, not a stray mention
    missing = [
        f"{file}::{test}" if test else file
        for file, test in named
        if not (ROOT / file).is_file() or (test and test not in _tests_in(ROOT / file))
    ]
    assert not missing, f"docs/promises.md names guards that do not exist: {missing}"


def test_every_promise_has_a_guard():
    page = (ROOT / "docs" / "promises.md").read_text()
    sections = page.split("\n## ")[1:]
    assert len(sections) >= 8
    for section in sections:
        assert GUARD.search(section), f"a promise without a guard: {section.splitlines()[0]}"
        assert "Fails when" in section, f"a guard that says not what it catches: {section[:80]}"
