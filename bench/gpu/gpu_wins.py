"""Issue 42 item 2 on the GPU machine: where composing backends wins, measured in ExecuTorch's
own C++ runtime (bench/et_runtime's runner, ``$COMPOSER_ET_RUNNER``).

For each model, composer composes it with each stack (``xnnpack``, ``cuda``, ``xnnpack,cuda``,
``cuda,xnnpack``, and measured placement over ``xnnpack,cuda``), each program proven in the
runner as composer proves it; then every program of the model, and eager on the GPU, is timed
in rounds that take turns (``--rounds`` of ``--repeats`` calls each, the median per round),
with an A/A control: the ``cuda`` program timed a second time as if it were another program.

    source bench/gpu_setup.sh; export COMPOSER_ET_RUNNER=/tmp/etb/build/composer_runner/composer_et_runner
    python3 bench/gpu/gpu_wins.py compose --models mlp,gru --out /tmp/wins   # one process a model
    python3 bench/gpu/gpu_wins.py time --out /tmp/wins                       # the table
    python3 bench/gpu/gpu_wins.py device --models corpus:bert,corpus:ghostnet --parallel 4 \
        --limit 300 --stacks "xnnpack;cuda;xnnpack,cuda" --out /tmp/wins      # both, bounded

Programs with Vulkan delegates are proven and timed in ``$COMPOSER_VULKAN_RUNNER`` (a runner
built with ``ET_VULKAN=ON``, NVIDIA's Vulkan through its EGL ICD: ``source
bench/et_runtime/vulkan/setup.sh``), the others in ``$COMPOSER_ET_RUNNER``'s.

A stack ``plain:BACKENDS`` is plain ExecuTorch beside composer: ``to_edge_transform_and_lower``
with those backends' own partitioners in that order (``plain:vulkan,xnnpack``:
``[VulkanPartitioner(), XnnpackPartitioner()]``, as ExecuTorch's LLM export stacks ``-V -X``),
written as is (no proof); its first run in the runner is compared with eager and recorded.

Models: ``corpus:NAME`` (``composer.models.corpus``: torchvision, timm, transformers), zoo
names (``composer.models.zoo``) and bench/gpu/gpu_mix.py's models built to mix (``cell``,
``rnn64``, ``segmenter``, ``hybrid``), as bench/gpu/gpu_placement.py loads them. Results: one JSON
object a line in ``OUT/wins.jsonl``; the table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from processes import run_at_most  # beside this script

# Measured placement last: the slowest, the one a time limit cuts.
STACKS = ("xnnpack", "cuda", "xnnpack,cuda", "cuda,xnnpack", "vulkan", "vulkan,xnnpack",
          "measured:xnnpack,cuda")  # fmt: skip
CACHE_HELP = (
    "each model composed with a cache of its own: measured placement's candidates "
    "are then the stacks composed before it, from that cache (its compose time is "
    "not a cold one)"
)
# A runner built with the Vulkan backend (bench/et_runtime/vulkan), for the programs with
# Vulkan delegates: proven and timed there, the others in $COMPOSER_ET_RUNNER's (CUDA) runner.
VULKAN_RUNNER = "COMPOSER_VULKAN_RUNNER"


# The (CUDA) runner named at start: compose sets $COMPOSER_ET_RUNNER per stack.
CUDA_RUNNER = os.environ.get("COMPOSER_ET_RUNNER", "")


def runner_for(stack: str) -> str:
    if "vulkan" in stack and os.environ.get(VULKAN_RUNNER):
        return os.environ[VULKAN_RUNNER]
    return CUDA_RUNNER


def load(name: str):
    if name.startswith("corpus:"):  # a model nobody here wrote (composer.models.corpus)
        from composer.models import corpus

        return corpus.load(name.removeprefix("corpus:"))
    if name == "hybrid":
        import torch
        from gpu_mix import ConvStemTransformer

        torch.manual_seed(0)
        return ConvStemTransformer().eval(), (torch.randn(1, 3, 224, 224),)
    from gpu_placement import load as load_placement_model

    return load_placement_model(name)


def emit(out: Path, record: dict) -> None:
    line = json.dumps({"t": round(time.time(), 1), **record}, default=str)
    with open(out / "wins.jsonl", "a") as file:
        file.write(line + "\n")
    print(line, flush=True)


def folder_of(out: Path, model: str, stack: str) -> Path:
    return out / "programs" / model / stack.replace(":", "_").replace(",", "_")


def cmd_compose(args) -> None:
    import composer
    from composer.report.plan_text import summary_table
    from composer.run import cpp_runtime

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for model_name in args.models.split(","):
        model, inputs = load(model_name)
        if args.cache:  # a model's own cache: its later stacks reuse its earlier ones' lowerings
            os.environ["COMPOSER_CACHE_DIR"] = str(out / "cache" / model_name.replace(":", "_"))
        for stack in args.stacks.split(";"):
            if stack.startswith("plain:"):
                _compose_plain(out, model_name, model, inputs, stack)
                continue
            measured = stack.startswith("measured:")
            backends = stack.removeprefix("measured:")
            start = time.perf_counter()
            os.environ[cpp_runtime.RUNNER_VARIABLE] = runner_for(stack)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    composition = composer.compose(
                        model, backends, inputs, cache=args.cache,
                        placement="measured" if measured else "priority",
                        **({"tune_budget": args.tune_budget} if measured else {}),
                    )  # fmt: skip
                seconds = time.perf_counter() - start
                folder = folder_of(out, model_name, stack)
                folder.mkdir(parents=True, exist_ok=True)
                composition.save(folder / "program.pte")
                plan = composition.plan
                emit(out, {"kind": "compose", "model": model_name, "stack": stack, "ok": True,
                           "s": round(seconds, 1), "cache": args.cache, "proof": plan.proof,
                           "chose": plan.placement.chosen if measured else None,
                           "candidates": [c.to_dict() for c in plan.placement.candidates]
                           if measured else None,
                           "delegates": dict(_delegates(composition)),
                           "repairs": len(plan.repairs), "table": summary_table(plan)})  # fmt: skip
            except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
                emit(out, {"kind": "compose", "model": model_name, "stack": stack, "ok": False,
                           "s": round(time.perf_counter() - start, 1),
                           "error": f"{type(error).__name__}: {error}"[:1500],
                           "where": traceback.format_exc()[-600:]})  # fmt: skip


def _plain_partitioner(backend: str):
    if backend == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        return VulkanPartitioner()
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()
    raise SystemExit(f"plain: no partitioner for {backend!r} here (vulkan, xnnpack)")


def _compose_plain(out: Path, model_name: str, model, inputs, stack: str) -> None:
    """Plain ExecuTorch's program for ``stack``, written and run once in the runner."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    from composer.run import cpp_runtime

    backends = stack.removeprefix("plain:").split(",")
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(model, inputs)
            lowered = to_edge_transform_and_lower(
                program, partitioner=[_plain_partitioner(b) for b in backends]
            ).to_executorch()
        seconds = time.perf_counter() - start
        folder = folder_of(out, model_name, stack)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "program.pte").write_bytes(lowered.buffer)
        record = {"kind": "compose", "model": model_name, "stack": stack, "ok": True,
                  "s": round(seconds, 1)}  # fmt: skip
        try:
            report = cpp_runtime.run_pte_detailed(
                runner_for(stack), folder / "program.pte", [], list(inputs), repeats=1, warmup=0
            )
            with torch.no_grad():
                expected = model(*inputs)
            got = report["outputs"][0]
            record["max_abs_vs_eager"] = float((got - expected).abs().max())
        except Exception as error:  # noqa: BLE001 - plain's program may not load: recorded
            record["runs"] = False
            record["run_error"] = f"{type(error).__name__}: {error}"[:800]
        emit(out, record)
    except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
        emit(out, {"kind": "compose", "model": model_name, "stack": stack, "ok": False,
                   "s": round(time.perf_counter() - start, 1),
                   "error": f"{type(error).__name__}: {error}"[:1500]})  # fmt: skip


def _delegates(composition):
    from collections import Counter

    return Counter(p.backend for p in composition.plan.partitions)


def cmd_time(args) -> None:
    import torch

    from composer.run import cpp_runtime

    out = Path(args.out)
    rows = []
    for model_dir in sorted((out / "programs").iterdir()):
        model_name = model_dir.name
        model, inputs = load(model_name)
        programs = {}
        for stack_dir in sorted(model_dir.iterdir()):
            pte = stack_dir / "program.pte"
            if pte.exists():
                programs[stack_dir.name] = (pte, sorted(stack_dir.glob("*.ptd")))
        for control in ("cuda", "vulkan_xnnpack"):  # A/A: one program timed as two
            if control in programs:
                programs[f"{control}#AA"] = programs[control]
        gpu_model = model.to("cuda")
        gpu_inputs = tuple(i.to("cuda") if isinstance(i, torch.Tensor) else i for i in inputs)
        medians: dict[str, list[float]] = {name: [] for name in [*programs, "eager_gpu"]}
        for _round in range(args.rounds):
            for name, (pte, data) in programs.items():
                try:
                    report = cpp_runtime.run_pte_detailed(
                        runner_for(name), pte, data, list(inputs), repeats=args.repeats, warmup=10,
                        threads=args.threads or None,
                    )  # fmt: skip
                    medians[name].append(statistics.median(report["seconds"]) * 1e6)
                except Exception as error:  # noqa: BLE001
                    emit(out, {"kind": "time_error", "model": model_name, "program": name,
                               "error": str(error)[:800]})  # fmt: skip
            try:  # a zoo model that makes CPU tensors in forward (llama_block's arange) fails
                medians["eager_gpu"].append(_eager_us(gpu_model, gpu_inputs, args.repeats))
            except RuntimeError as error:
                emit(out, {"kind": "time_error", "model": model_name, "program": "eager_gpu",
                           "error": str(error)[:300]})  # fmt: skip
        row = {name: round(statistics.median(v), 1) for name, v in medians.items() if v}
        singles = [row[s] for s in ("xnnpack", "cuda") if s in row]
        best_single = min(singles) if singles else None
        measured = row.get("measured_xnnpack_cuda")
        emit(out, {"kind": "row", "model": model_name, "median_us": row,
                   "aa_ratio": round(row["cuda#AA"] / row["cuda"], 3) if "cuda#AA" in row else None,
                   "aa_ratio_vulkan_xnnpack": round(
                       row["vulkan_xnnpack#AA"] / row["vulkan_xnnpack"], 3
                   ) if "vulkan_xnnpack#AA" in row else None,
                   "best_single_us": best_single,
                   "measured_vs_best_single": round(best_single / measured, 3)
                   if best_single and measured else None})  # fmt: skip
        rows.append((model_name, row, best_single, measured))
    print("| model | eager GPU us | xnnpack us | cuda us (A/A) | xnnpack,cuda us | cuda,xnnpack us "
          "| measured us | measured vs best single | vulkan us | vulkan,xnnpack us "
          "| plain vulkan,xnnpack us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model_name, row, best, measured in rows:

        def cell(key, row=row):
            return f"{row[key]:,.0f}" if key in row else "-"

        aa = f" ({row['cuda#AA']:,.0f})" if "cuda#AA" in row else ""
        ratio = f"{best / measured:.2f}x" if best and measured else "-"
        print(f"| {model_name} | {cell('eager_gpu')} | {cell('xnnpack')} | {cell('cuda')}{aa} | "
              f"{cell('xnnpack_cuda')} | {cell('cuda_xnnpack')} | {cell('measured_xnnpack_cuda')} "
              f"| {ratio} | {cell('vulkan')} | {cell('vulkan_xnnpack')} "
              f"| {cell('plain_vulkan_xnnpack')} |")  # fmt: skip


def cmd_device(args) -> None:
    """The one device command: each model composed in a process of its own, ``--parallel`` at
    a time (eight at once with every runner on all cores slowed a proof 180x), each given
    ``--limit`` seconds; then every program timed."""
    me = [sys.executable, str(Path(__file__).resolve())]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_at_most(
        [(me + ["compose", "--models", model, "--stacks", args.stacks, "--out", str(out),
                "--tune-budget", str(args.tune_budget)] + (["--cache"] if args.cache else []),
          out / f"compose_{model.replace(':', '_')}.log")
         for model in args.models.split(",")],
        args.parallel, each=args.limit,
    )  # fmt: skip
    subprocess.run(me + ["time", "--out", str(out), "--rounds", str(args.rounds),
                         "--repeats", str(args.repeats)], check=False)  # fmt: skip


def _eager_us(model, inputs, repeats: int) -> float:
    import torch

    times = []
    with torch.no_grad():
        for index in range(repeats + 10):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(*inputs)
            torch.cuda.synchronize()
            if index >= 10:
                times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _compose_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """What ``compose`` takes, and ``device`` hands on to it."""
    parser.add_argument("--models", required=True)
    parser.add_argument("--stacks", default=";".join(STACKS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--tune-budget", type=float, default=120)
    parser.add_argument("--cache", action="store_true", help=CACHE_HELP)
    return parser


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = _compose_arguments(sub.add_parser("compose"))
    p.set_defaults(run=cmd_compose)
    p = sub.add_parser("time")
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument(
        "--threads", type=int, default=0, help="XNNPACK threads (0: the runtime default)"
    )
    p.set_defaults(run=cmd_time)
    p = _compose_arguments(sub.add_parser("device"))
    p.add_argument("--parallel", type=int, default=4, help="models composed at once")
    p.add_argument("--limit", type=float, default=300, help="seconds of composing a model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=100)
    p.set_defaults(run=cmd_device)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
