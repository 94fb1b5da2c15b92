"""A cache hit costs a file read, not a compiler: the promise's guard, counted, not timed.

A second compose of an unchanged model in a new process reads the program from the cache.
Importing ExecuTorch's compiler (``executorch.exir``: seconds for its edge dialect's YAML), a
backend's partitioner or Inductor on that path made a hit cost half a first compose (once,
by one module-level import in ``run/piecewise.py``); what the hit imported says so on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# What only lowering needs; a hit must not import any of them.
COMPILERS = ("executorch.exir", "executorch.backends.", "openvino", "nncf", "torch._inductor")

COMPOSE = """
import json, sys
import composer
from composer.models import zoo
model, inputs = zoo.load(sys.argv[1])
lines = []
composition = composer.compose(model, sys.argv[2], inputs, progress=lines.append)
print(json.dumps({
    "lines": lines,
    "from_cache": composition.from_cache,
    "proof": str(composition.plan.proof),
    "compilers": sorted(m for m in sys.modules if m.startswith(tuple(sys.argv[3:]))),
}))
"""


def _compose_in_a_new_process(model: str, backends: str, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", COMPOSE, model, backends, *COMPILERS],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("model", "backends"), [("mlp", "xnnpack"), ("cnn", "openvino,xnnpack")])
def test_a_cache_hit_in_a_new_process_imports_no_compiler(model, backends, tmp_path):
    env = {**_environ(), "COMPOSER_CACHE_DIR": str(tmp_path / "cache")}
    first = _compose_in_a_new_process(model, backends, env)
    assert not first["from_cache"]
    # The miss lowered: the guard below would pass vacuously if nothing here counted.
    assert any(m.startswith("executorch.exir") for m in first["compilers"])
    second = _compose_in_a_new_process(model, backends, env)
    assert second["from_cache"], second["lines"]
    assert second["compilers"] == []
    # The program read back is the proven one, and says so.
    assert second["proof"] == first["proof"]


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "COMPOSER_NO_CACHE"}
