"""The install page's promise (docs/install.md): composer installs from its wheel like any package,
and the installed copy finds its backends through its entry points and composes.

The wheel is built from this checkout's files (copied, so setuptools' build/ of the checkout is
neither read nor written) and installed with pip into a fresh virtualenv. That venv sees this
environment's packages (torch, ExecuTorch, OpenVINO: gigabytes that the check does not download
again) through links, every one but composer's own editable install, so what imports as
`composer` there is the wheel's copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# composer's editable install in this environment: hidden from the fresh venv.
EDITABLE = ("executorch_composer", "__editable__")


def _run(argv: list[str], cwd: Path, timeout: int = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        argv, cwd=cwd, env=env, check=False, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    )
    return done.stdout


def _checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "composer", "pyproject.toml", "README.md"]
        + ["LICENSE"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [name for name in listed if (ROOT / name).is_file()]


@pytest.fixture
def installed(tmp_path_factory) -> Path:
    """A fresh venv with composer installed from its wheel; its bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    # --no-build-isolation: setuptools from this environment (the dev extra), no download.
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "."]
        + ["-w", str(work / "dist")],
        cwd=source,
    )
    (wheel,) = (work / "dist").glob("executorch_composer-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    packages = Path(sysconfig.get_paths()["purelib"])
    venv_packages = Path(
        sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    )
    for entry in packages.iterdir():
        if not entry.name.startswith(EDITABLE):
            (venv_packages / entry.name).symlink_to(entry)
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], work
    )
    return venv / "bin"


# One test, so that pytest-xdist's workers do not each build the wheel and the venv.
def test_the_wheel_installs_a_composer_that_finds_its_backends_and_composes(installed, tmp_path):
    where = _run(
        [str(installed / "python"), "-c", "import composer; print(composer.__file__)"],
        cwd=tmp_path,
    ).strip()
    assert Path(where).is_relative_to(installed.parent), where
    # What pip show and PyPI show: the license, with its text, and who wrote it.
    code = "from importlib.metadata import metadata; print(metadata('executorch-composer'))"
    metadata = _run([str(installed / "python"), "-c", code], cwd=tmp_path)
    assert "\nLicense-Expression: Apache-2.0\n" in metadata, metadata
    assert "\nLicense-File: LICENSE\n" in metadata
    assert "\nAuthor: composer's authors\n" in metadata
    code = (
        "from importlib.metadata import files; "
        "print(next(f for f in files('executorch-composer') if f.name == 'LICENSE').read_text())"
    )
    licensed = _run([str(installed / "python"), "-c", code], cwd=tmp_path)
    assert licensed.startswith(" " * 33 + "Apache License\n"), licensed[:200]
    # The console script, and the in-tree plugins registered through the wheel's entry points.
    listing = _run([str(installed / "composer"), "backends"], cwd=tmp_path)
    for backend in ("xnnpack", "openvino", "tensorrt_stub", "cuda", "vulkan"):
        assert backend in listing, listing
    program = tmp_path / "mlp.pte"
    printed = _run(
        [str(installed / "composer"), "lower", "zoo:mlp", "--backends", "xnnpack"]
        + ["-o", str(program)],
        cwd=tmp_path,
    )
    assert "proof: ran and matched eager" in printed, printed
    assert program.stat().st_size > 0
