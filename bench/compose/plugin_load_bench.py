"""Composing again in a new process with a heavy third-party plugin installed (issue 24).

    .venv/bin/python bench/compose/plugin_load_bench.py [--model mlp] [--backends xnnpack]

A third-party plugin that imports ``executorch.exir`` at module level is installed into a
temporary folder (a dist-info with its entry point, on ``PYTHONPATH``), as ``pip install``
would. Each step is a new Python process against one temporary cache folder, as a user's
second ``composer lower`` is; each reports its wall time from start to composed, imports
included, the seconds of ``composer.compose`` alone (the plugins a stack names are imported
inside it), and whether the heavy plugin was imported:

1. first compose (empty cache), 2. the same again (the program from the cache), 3. the same
again after listing every backend (``composer backends`` does: every plugin imported), which
is what every compose paid before plugins were loaded by name.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PLUGIN = """
import executorch.exir  # noqa: F401 - the heavy import at module level this bench is about
import composer
from composer.hookspecs import hookimpl


@hookimpl
def composer_backends():
    return [composer.BackendSpec("heavy", "HeavyBackend", description="imports exir at import")]
"""

STEP = r"""
import json, sys, time
started = time.perf_counter()
import composer
from composer.models import zoo
spec = json.loads(sys.argv[1])
model, inputs = zoo.load(spec["model"])
composing = time.perf_counter()
if spec["list_all"]:  # as every compose did before plugins were loaded by name
    composer.default_registry().backends
composition = composer.compose(model, spec["backends"], inputs)
print(json.dumps({"seconds": time.perf_counter() - started,
                  "compose_seconds": time.perf_counter() - composing,
                  "from_cache": composition.from_cache,
                  "heavy_imported": "composer_heavy_plugin" in sys.modules}))
"""


def install_heavy_plugin(folder: Path) -> None:
    (folder / "composer_heavy_plugin.py").write_text(PLUGIN)
    info = folder / "composer_heavy_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: composer-heavy-plugin\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text("[composer]\nheavy = composer_heavy_plugin\n")


def step(env: dict, model: str, backends: str, list_all: bool) -> dict:
    spec = json.dumps({"model": model, "backends": backends, "list_all": list_all})
    done = subprocess.run([sys.executable, "-c", STEP, spec], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--backends", default="xnnpack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as site, tempfile.TemporaryDirectory() as cache:
        install_heavy_plugin(Path(site))
        env = {**os.environ, "COMPOSER_CACHE_DIR": cache,
               "PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))}  # fmt: skip
        first = step(env, args.model, args.backends, list_all=False)
        again = step(env, args.model, args.backends, list_all=False)
        every = step(env, args.model, args.backends, list_all=True)
    print(f"{args.model} with {args.backends}, a plugin importing executorch.exir installed:")
    for label, result in (("first compose", first), ("again, from the cache", again),
                          ("again, every plugin imported", every)):  # fmt: skip
        print(f"  {label:30} {result['seconds']:6.2f} s in all, compose {result['compose_seconds']:6.2f}"
              f" s   from cache: {result['from_cache']!s:5}"
              f"   heavy plugin imported: {result['heavy_imported']}")  # fmt: skip
    for what, key in (("in all", "seconds"), ("compose alone", "compose_seconds")):
        print(
            f"first / again, {what}: {first[key] / again[key]:.1f}x;  with every plugin "
            f"imported: {first[key] / every[key]:.1f}x"
        )


if __name__ == "__main__":
    main()
