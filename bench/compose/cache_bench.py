"""Composing again with composer's cache (issue 15): every number from fresh processes.

    .venv/bin/python bench/compose/cache_bench.py                        # llama_decoder with xnnpack
    .venv/bin/python bench/compose/cache_bench.py --model transformer_block --backends xnnpack,openvino

Each step runs in a new Python process against one temporary cache folder, as a user's
second `composer lower` would, and reports the seconds `composer.compose` (or `plan`) took
inside it (imports excluded and shown apart):

1. cold: an empty cache; 2. warm: the same model again (whole program from the cache);
3. one layer edited: the model with one layer's weights changed (lowered partitions reused);
4. plan, cold and warm, against the cold compose; 5. serial against parallel lowering
(``jobs``), cache off. The .pte bytes of steps 1 and 2 and of the serial and parallel
programs are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP = r"""
import hashlib, json, sys, time
started = time.perf_counter()
import torch
import composer
from composer.models import zoo
imported = time.perf_counter() - started
spec = json.loads(sys.argv[1])
model, inputs = zoo.load(spec["model"])
if spec.get("edit"):
    layer = getattr(model, "layers", None)
    target = layer[len(layer) - 1] if layer is not None else model
    with torch.no_grad():
        list(target.parameters())[-1].mul_(1.5)
lines = []
started = time.perf_counter()
if spec["what"] == "plan":
    composer.plan(model, spec["backends"], inputs, cache=spec["cache"], progress=lines.append)
    digest = None
else:
    composition = composer.compose(model, spec["backends"], inputs, cache=spec["cache"],
                                   jobs=spec["jobs"], progress=lines.append)
    digest = hashlib.sha256(composition.buffer).hexdigest()
print(json.dumps({"seconds": time.perf_counter() - started, "imports": imported,
                  "sha256": digest, "cache_lines": [l for l in lines if "cache" in l]}))
"""


def step(folder: str, **spec) -> dict:
    env = {**os.environ, "COMPOSER_CACHE_DIR": folder, "PYTHONWARNINGS": "ignore"}
    spec = {"cache": True, "jobs": 1, "what": "compose", **spec}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", STEP, json.dumps(spec)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    process = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process": process}


def command(folder: str, *args: str) -> float:
    """Seconds a whole command takes, as a user waits for it."""
    env = {**os.environ, "COMPOSER_CACHE_DIR": folder}
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama_decoder")
    parser.add_argument("--backends", default="xnnpack")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    common = {"model": args.model, "backends": args.backends.split(",")}
    with tempfile.TemporaryDirectory() as folder:
        # Untimed: the first process after a while pays for reading torch from disk.
        step(folder, model="mlp", backends=["xnnpack"], cache=False)
        rows = {
            "compose, cold cache": step(folder, **common),
            "compose again (warm)": step(folder, **common),
            "compose, one layer edited": step(folder, edit=True, **common),
        }
    with tempfile.TemporaryDirectory() as folder:
        rows["plan, cold cache"] = step(folder, what="plan", **common)
        rows["plan again (warm)"] = step(folder, what="plan", **common)
    with tempfile.TemporaryDirectory() as folder:
        rows["compose, no cache, jobs=1"] = step(folder, cache=False, **common)
        rows[f"compose, no cache, jobs={args.jobs}"] = step(
            folder, cache=False, jobs=args.jobs, **common
        )
    cli = [str(Path(sys.executable).parent / "composer"), "lower", f"zoo:{args.model}",
           "--backends", args.backends, "--quiet"]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "m.pte")
        commands = {
            "python -c 'import torch'": command(folder, sys.executable, "-c", "import torch"),
            "composer lower, cold cache": command(folder, *cli, "-o", out),
            "composer lower again (warm)": command(folder, *cli, "-o", out),
        }
    cold = rows["compose, cold cache"]["seconds"]
    print(f"{args.model} with {args.backends}; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| step | seconds in the call | cold / this | imports (s) | whole process (s) | cache |")
    print("|---|---:|---:|---:|---:|---|")
    for name, row in rows.items():
        lines = "; ".join(row["cache_lines"]) or "-"
        print(f"| {name} | {row['seconds']:.2f} | {cold / row['seconds']:.1f}x | "
              f"{row['imports']:.2f} | {row['process']:.2f} | {lines} |")  # fmt: skip
    print("\n| command | seconds |\n|---|---:|")
    for name, seconds in commands.items():
        print(f"| {name} | {seconds:.2f} |")
    same = rows["compose, cold cache"]["sha256"] == rows["compose again (warm)"]["sha256"]
    serial, parallel = (rows[k]["sha256"] for k in rows if k.startswith("compose, no cache"))
    print(f"\nwarm .pte byte-identical to cold: {same}; parallel identical to serial: "
          f"{serial == parallel}")  # fmt: skip


if __name__ == "__main__":
    main()
