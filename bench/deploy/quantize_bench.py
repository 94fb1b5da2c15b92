"""Quantize for the stack (issue 34): an int8 backend beside a float one in one program, against
the all-float and all-int8 programs and ExecuTorch's own ``ExportRecipe.combine``.

    .venv/bin/python bench/deploy/quantize_bench.py                    # every model below
    .venv/bin/python bench/deploy/quantize_bench.py --models transformer_block --runs 200

For each model (composer.models.zoo, seeded; ``MODELS``, with its pins), with 8 random calibration
batches:

- ``float``: ``compose(model, "xnnpack,openvino")``;
- ``int8 xnnpack``: ``compose(quantize(model, "xnnpack"), "xnnpack")``: every node XNNPACK's;
- ``per region``: ``compose(quantize(model, "xnnpack,openvino"), "xnnpack,openvino")``:
  XNNPACK's nodes int8 by its quantizer, OpenVINO's float;
- ``recipe combine``: ``ExportRecipe.combine([XNNPACK's PT2E_INT8_STATIC_PER_CHANNEL recipe,
  an OpenVINO float recipe])``, whose quantizer applies to the whole model, lowered by plain
  ExecuTorch (``executorch.export.export``) and by composer (``compose(model, recipe)``'s two
  steps, calibrated alike). Every quantized program is calibrated on the same 8 batches.

Accuracy: the largest |program - float eager| over 8 held-out random inputs, and that over the
largest |float eager|. Latency: all programs interleaved (``composer.measure.latency``), with
the float program loaded a second time as the A/A control. One JSON line per model to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch

import composer
from composer.measure.latency import interleaved
from composer.models import zoo
from composer.pipeline.recipes import recipe_backends, recipe_program
from composer.run.runtime import LoadedProgram

STACK = "xnnpack,openvino"
# name -> (zoo model, pins): cnn_convs_on_openvino pins the convolutions off XNNPACK, so the
# float backend takes ops XNNPACK's quantizer annotates (the case per-region quantization is for).
MODELS = {
    "transformer_block": ("transformer_block", {}),
    "llama_block": ("llama_block", {}),
    "cnn_convs_on_openvino": ("cnn", {"xnnpack": ["aten.convolution.default"]}),
}


def _batches(inputs, count: int, seed: int) -> list[tuple]:
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(x.shape, generator=generator) for x in inputs) for _ in range(count)]


def _recipe():
    from executorch.backends.openvino import OpenvinoPartitioner
    from executorch.backends.xnnpack.recipes.xnnpack_recipe_types import XNNPackRecipeType
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.export import ExportRecipe, LoweringRecipe

    xnnpack = ExportRecipe.get_recipe(XNNPackRecipeType.PT2E_INT8_STATIC_PER_CHANNEL)
    openvino = ExportRecipe(
        name="openvino_fp32",
        lowering_recipe=LoweringRecipe(
            partitioners=[OpenvinoPartitioner([CompileSpec("device", b"CPU")])]
        ),
    )
    return ExportRecipe.combine([xnnpack, openvino], recipe_name="xnnpack_int8+openvino")


def _plain_recipe(model, inputs, calibration, recipe) -> bytes:
    from executorch.export import export

    return export(model, [inputs, *calibration], recipe).get_pte_buffer()


def _timed(what: str, row: dict, build):
    started = time.perf_counter()
    try:
        result = build()
    except Exception as error:  # noqa: BLE001 - a bench records every failure
        row.setdefault("errors", {})[what] = f"{type(error).__name__}: {str(error)[:300]}"
        return None
    row.setdefault("compose_s", {})[what] = round(time.perf_counter() - started, 2)
    return result


def _where(composition) -> dict:
    plan = composition.plan
    return {
        b: {"nodes": len(plan.nodes_on(b)), "partitions": plan.partition_count(b)}
        for b in (*plan.backends, "portable")
    }


def run_model(name: str, runs: int) -> dict:
    zoo_name, never = MODELS[name]
    model, inputs = zoo.load(zoo_name)
    stack = composer.Stack(STACK, never=never)
    calibration = _batches(inputs, 8, seed=1)
    held_out = _batches(inputs, 8, seed=2)
    row: dict = {"model": name, "stack": STACK, "never": never}
    programs: dict[str, bytes] = {}
    builds = {
        "float": lambda: composer.compose(model, stack, inputs, cache=False),
        "int8 xnnpack": lambda: composer.compose(
            composer.quantize(model, "xnnpack", inputs, calibration=calibration),
            "xnnpack", inputs, cache=False,
        ),
        "per region": lambda: composer.compose(
            composer.quantize(model, stack, inputs, calibration=calibration),
            stack, inputs, cache=False,
        ),
        # What compose(model, recipe, inputs) does, with the same calibration as the others.
        "recipe combine, composer": lambda: composer.compose(
            recipe_program(_recipe(), model, inputs, calibration=calibration),
            composer.Stack(recipe_backends(_recipe()), never=never), inputs, cache=False,
        ),
    }  # fmt: skip
    for what, build in builds.items():
        composition = _timed(what, row, build)
        if composition is not None:
            programs[what] = composition.buffer
            row.setdefault("where", {})[what] = _where(composition)
            row.setdefault("proof", {})[what] = composition.plan.proof
    plain = _timed(
        "recipe combine, plain", row, lambda: _plain_recipe(model, inputs, calibration, _recipe())
    )
    if plain is not None:
        programs["recipe combine, plain"] = plain
    with torch.no_grad():
        scale = max(model(*x)[0].abs().max().item() for x in held_out)
        for what, buffer in programs.items():
            try:
                loaded = LoadedProgram(buffer)
                worst = max(
                    (loaded.run(list(x))[0] - model(*x)).abs().max().item() for x in held_out
                )
            except Exception as error:  # noqa: BLE001
                row.setdefault("errors", {})[f"{what} run"] = f"{type(error).__name__}: {error}"
                continue
            row.setdefault("accuracy", {})[what] = {
                "max_abs_error": worst,
                "relative": worst / scale,
            }
    runnable = {w: b for w, b in programs.items() if w in row.get("accuracy", {})}
    if "float" in runnable:
        loaded = {w: LoadedProgram(b) for w, b in runnable.items()}
        loaded["float again"] = LoadedProgram(runnable["float"])
        timed = interleaved({w: p.timed_call(list(inputs)) for w, p in loaded.items()}, runs)
        row["latency_us"] = {w: t.median_us for w, t in timed.items()}
        row["over_float"] = {
            w: t.median_us / timed["float"].median_us for w, t in timed.items() if w != "float"
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", default="bench/results/quantize_cpu.jsonl")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    with open(args.out, "a") as out:
        for name in args.models.split(","):
            row = run_model(name, args.runs)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{name}:")
            for what in (*row.get("accuracy", {}), *row.get("errors", {})):
                accuracy = row.get("accuracy", {}).get(what)
                if accuracy is None:
                    print(f"  {what:26} error: {row['errors'][what][:150]}")
                    continue
                ratio = row.get("over_float", {}).get(what)
                print(
                    f"  {what:26} max |out - float eager| {accuracy['max_abs_error']:.4f} "
                    f"({accuracy['relative']:.1%} of the largest output); latency "
                    f"{row['latency_us'].get(what, float('nan')):8.1f} us"
                    + (f" ({ratio:.2f}x float)" if ratio else "")
                )
            if "float again" in row.get("over_float", {}):
                print(f"  A/A control (float loaded twice): {row['over_float']['float again']:.2f}")


if __name__ == "__main__":
    main()
