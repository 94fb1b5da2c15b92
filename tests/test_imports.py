"""Light imports: `composer --help` and the pytest plugin (loaded by every pytest run wherever
composer is installed) must not import torch or ExecuTorch, which take seconds."""

from __future__ import annotations

import subprocess
import sys

import pytest

import composer

HEAVY = ("torch", "executorch")


def _modules_loaded_by(code: str) -> set[str]:
    script = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_pytest_plugin_imports_neither_torch_nor_executorch():
    loaded = _modules_loaded_by("import composer.testing")
    assert "composer.testing" in loaded
    assert not {m.split(".")[0] for m in loaded} & set(HEAVY)


@pytest.mark.parametrize("argv", [["--help"], ["lower", "--help"], ["plan", "--help"]])
def test_help_imports_neither_torch_nor_executorch(argv):
    code = f"""
import contextlib, io
from composer.cli import main
try:
    with contextlib.redirect_stdout(io.StringIO()):
        main({argv!r})
except SystemExit as exit:
    assert exit.code == 0, exit.code
"""
    loaded = _modules_loaded_by(code)
    assert "composer.cli" in loaded
    assert not {m.split(".")[0] for m in loaded} & set(HEAVY)


def test_public_names_load_on_use_and_match_all():
    for name in composer.__all__:
        assert getattr(composer, name) is not None
    assert sorted(composer.__all__) == sorted(composer._MODULE_OF)
    assert set(composer.__all__) <= set(dir(composer))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        composer.nope  # noqa: B018


@pytest.mark.parametrize(
    "first",
    [
        "import composer.scheduler.plans",
        "from composer.scheduler.plans import Plan",
        "import composer.pipeline.compose",
        "from composer.run.composition import Composition",
        "composer.Plan",
    ],
)
def test_plan_and_compose_are_the_functions_whatever_was_imported_first(first):
    # Importing a submodule makes the import system set it as an attribute of the package.
    code = f"""
import importlib
import composer
{first}
assert composer.plan.__module__ == "composer.pipeline.compose", composer.plan
assert composer.compose.__module__ == "composer.pipeline.compose", composer.compose
assert importlib.import_module("composer.scheduler.plans").Plan is composer.Plan
assert importlib.import_module("composer.run.composition").Composition is composer.Composition
"""
    _modules_loaded_by(code)
