"""What a repair keeps: nodes left on each backend of the stack after the proof's repairs, with
narrowing (a wrong delegate narrowed to its wrong operators, composer.pipeline.narrowing) and
without it (its whole partition moved, as before), and what each compose took.

A case with no repair runs once: narrowing acts only inside a repair, so without one the two
composes are the same program. Cases:

- ``tiny``: tests/runtime_plugin's third-party ``tiny`` backend, whose NumPy runtime computes
  ``tanh`` 1% high (``TINY_RUNTIME_BUG``), in a partition of four ops, with xnnpack after it;
- ``avgpool_int8``: ExecuTorch's backend suite case avgpool1d (ceil_mode) quantized for
  OpenVINO, whose int8 pooling is wrong at its last window;
- the zoo, and the smaller torchvision models of ExecuTorch's backend suite
  (``executorch.backends.test.suite.models.test_torchvision``), on ``openvino,xnnpack``.

    .venv/bin/python bench/narrowing.py [--cases tiny,avgpool_int8,zoo,suite] > out.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import composer
from composer.pipeline import narrowing

ROOT = Path(__file__).resolve().parent.parent
SUITE_MODELS = ("mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x1_0", "squeezenet1_1",
                "mnasnet1_0", "resnet50")  # fmt: skip


@contextlib.contextmanager
def narrowing_off() -> Iterator[None]:
    """Repairs as before narrowing: each culprit's whole partition moves."""
    saved = narrowing.Narrowing.narrowed
    narrowing.Narrowing.narrowed = lambda self, culprit, plan, deadline: culprit
    try:
        yield
    finally:
        narrowing.Narrowing.narrowed = saved


def _tiny():
    sys.path[:0] = [str(ROOT / "tests" / "runtime_plugin"), str(ROOT / "tests")]
    from composer_tiny_backend import TinyPlugin
    from plugins_for_tests import registry_with
    from test_runtime_contract import GatedMlp  # the model the runtime contract's tests use

    os.environ["TINY_RUNTIME_BUG"] = "aten.tanh.default"
    torch.manual_seed(0)
    model = GatedMlp().eval()
    yield (
        "tiny",
        model,
        (torch.randn(4, 8),),
        "tiny,xnnpack",
        {"registry": registry_with(TinyPlugin())},
    )


def _avgpool_int8():
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, inputs = torch.nn.AvgPool1d(3, 2, 1, ceil_mode=True).eval(), (torch.randn(1, 8, 100),)
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), OpenVINOQuantizer())
    prepared(*inputs)
    program = torch.export.export(convert_pt2e(prepared), inputs)
    yield "avgpool_int8", program, None, "openvino", {}


def _zoo():
    from composer.models import zoo

    for name in zoo.ZOO:
        model, inputs = zoo.load(name)
        yield f"zoo:{name}", model, inputs, "openvino,xnnpack", {}


def _suite():
    import torchvision

    for name in SUITE_MODELS:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)().eval()
        yield f"suite:{name}", model, (torch.randn(1, 3, 224, 224),), "openvino,xnnpack", {}


CASES = {"tiny": _tiny, "avgpool_int8": _avgpool_int8, "zoo": _zoo, "suite": _suite}


def _compose(model, inputs, stack, settings) -> dict:
    started = time.perf_counter()
    try:
        composition = composer.compose(model, stack, inputs, cache=False, **settings)
    except composer.ComposerError as error:
        return {"seconds": round(time.perf_counter() - started, 1), "refused": str(error)[:300]}
    plan = composition.plan
    kept = {b: sum(plan.ops_on(b).values()) for b in (*plan.backends, "portable")}
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "nodes": kept,
        "repairs": [
            {
                "backend": r.backend,
                "partition": r.partition,
                "moved": len(r.nodes),
                "moved_to": dict(r.moved_to),
                "why": r.why[:300],
            }
            for r in plan.repairs
        ],
        "proof": plan.proof[:300],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="tiny,avgpool_int8,zoo,suite")
    args = parser.parse_args()
    for group in args.cases.split(","):
        for name, model, inputs, stack, settings in CASES[group]():
            row = {
                "case": name,
                "stack": stack,
                "narrowing": _compose(model, inputs, stack, settings),
            }
            if row["narrowing"].get("repairs"):
                with narrowing_off():
                    row["whole_partition"] = _compose(model, inputs, stack, settings)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
