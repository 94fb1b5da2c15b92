"""The Python examples of the README and of the docs (docs/*.md) run as written: each
block is executed, in a folder of its own; the plugin guide's blocks become a real plugin module
that ``check_plugin`` checks. The two that name a user's own model (``my_models``, a measured
plan) are compiled only."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Each block, with the page it is on (the file its tracebacks name).
PAGE_OF = {
    block: page
    for page in PAGES
    for block in re.findall(
        r"^```python\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.MULTILINE
    )
}
BLOCKS = list(PAGE_OF)
PLUGIN, OPTIONS, PLUGIN_TEST = (
    next(b for b in BLOCKS if b.startswith("# composer_mybackend/plugin.py")),
    next(b for b in BLOCKS if "options = (composer.Option" in b),
    next(b for b in BLOCKS if b.startswith("# test_contract.py, in composer-mybackend's tests")),
)
USERS_OWN = [b for b in BLOCKS if "my_models" in b or "measured_plan" in b]
RUNNABLE = [b for b in BLOCKS if b not in (PLUGIN, OPTIONS, PLUGIN_TEST, *USERS_OWN)]


def _name(block: str) -> str:
    line = next(line for line in block.splitlines() if line and not line.startswith("import"))
    return f"{PAGE_OF[block].stem}: {line[:40]}"


def test_the_readme_has_the_blocks_this_test_knows():
    assert len(BLOCKS) == len(RUNNABLE) + 3 + len(USERS_OWN)
    assert len(RUNNABLE) >= 5 and len(USERS_OWN) == 2
    # A block on two pages would run once here: each example lives on one page.
    found = [re.findall(r"^```python\n", page.read_text(), flags=re.MULTILINE) for page in PAGES]
    assert sum(len(blocks) for blocks in found) == len(BLOCKS)


# CI time: export_llama's block (2 minutes on 2 cores) is test_llm.py's flow, run there.
@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=pytest.mark.slow) if "llama.exported" in b else b for b in RUNNABLE],
    ids=[_name(b) for b in RUNNABLE],
)
def test_a_readme_example_runs(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(PAGE_OF[block]), "exec"), {"__name__": "readme_example"})  # noqa: S102
    printed = capsys.readouterr().out
    if "proof" in block:
        assert "ran and matched eager" in printed
    if "dynamic_shapes" in block or "llama" in block:
        assert "ran and matched eager at 4 sizes" in printed


def test_the_plugin_guide_makes_a_plugin_check_plugin_accepts(tmp_path, monkeypatch):
    package = tmp_path / "composer_mybackend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # The options block extends the guide's class ("..." stands for what the first block has).
    options = OPTIONS.replace("(composer.BackendPlugin):\n    ...\n", "(MyPlugin):\n")
    assert options != OPTIONS, "the plugin guide's options block no longer extends MyPlugin"
    (package / "plugin.py").write_text(f"{PLUGIN}\n\n{options}\n\nplugin = MyPlugin()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        namespace: dict = {"__name__": "readme_plugin_test"}
        exec(compile(PLUGIN_TEST, str(PAGE_OF[PLUGIN_TEST]), "exec"), namespace)  # noqa: S102
        namespace["test_mybackend_keeps_composer_s_contract"]()
    finally:
        for name in [m for m in sys.modules if m.startswith("composer_mybackend")]:
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.mark.parametrize("block", USERS_OWN, ids=[_name(b) for b in USERS_OWN])
def test_an_example_about_your_own_model_is_valid_python(block):
    compile(block, str(PAGE_OF[block]), "exec")
