"""On the GPU machine: composer's CUDA programs in ExecuTorch's own C++ runtime (issue 26).

For each zoo model and stack it composes the program for real (AOTInductor compiles the CUDA
partitions), saves the .pte and its .ptd files, runs them in ``composer_et_runner`` (ExecuTorch's
C++ runtime with the CUDA and XNNPACK backends, built by build.sh; composer/run/cpp_runtime.py drives it), and
compares, on the same inputs:

- outputs: the C++ runtime's against eager on the CPU (fp32), and against composer's own host
  (``composer.aoti_host.piecewise_module(host="cpu")``: each CUDA delegate's .so run by libtorch,
  XNNPACK delegates in the torch-free runtime, the rest in Python);
- latency per call (inputs and outputs on the CPU, as the .pte takes and gives them): the C++
  runtime (timed inside the runner around ``Module::execute``), composer's host, eager on the
  GPU with the tensors already there, and eager on the GPU with copies from and to the CPU.

    python3 bench/et_runtime/gpu_et_runtime.py --runner PATH --out DIR [--json FILE]
    python3 bench/et_runtime/gpu_et_runtime.py --compose-only --out DIR   # fill composer's cache

XNNPACK runs on one thread in both runtimes (``--threads``), as in bench/RESULTS.md's H100 rows.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from composer.run import cpp_runtime as client

MODELS = ["mlp", "cnn", "transformer_block", "llama_decoder"]
# Models that keep state between calls: a decoding loop of steps, each its own inputs.
STEPS = {
    "llama_decoder": lambda: [
        (
            torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(step)),
            torch.arange(4 * step, 4 * step + 4),
        )
        for step in range(4)
    ],
}
STACKS = ["cuda", "xnnpack,cuda", "cuda,xnnpack"]


def composer_module(name: str):
    """A composer module by its last name, wherever the package keeps it now."""
    import pkgutil

    import composer

    try:
        return importlib.import_module(f"composer.{name}")
    except ImportError:
        for info in pkgutil.walk_packages(composer.__path__, "composer."):
            if info.name.rsplit(".", 1)[-1] == name:
                return importlib.import_module(info.name)
        raise


def flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in flat(item)]
    return []


def max_error(actual, expected) -> float:
    actual, expected = flat(actual), flat(expected)
    if len(actual) != len(expected):
        return float("inf")
    worst = 0.0
    for got, want in zip(actual, expected):
        if got is None or got.shape != want.shape:
            return float("inf")
        worst = max(
            worst, (got.detach().cpu().double() - want.detach().cpu().double()).abs().max().item()
        )
    return worst


def call_seconds(run, repeats: int, warmup: int) -> list[float]:
    """Seconds of each of ``repeats`` calls after ``warmup``, each followed by a GPU sync."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    return {
        "calls": len(seconds),
        "fastest_us": round(ordered[0] * 1e6, 1),
        "median_us": round(statistics.median(ordered) * 1e6, 1),
        "p90_us": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e6, 1),
    }


def eager_on_gpu(model, inputs):
    """The model on the GPU; where it makes CPU tensors itself, its exported graph with the
    factory ops moved there (as bench/gpu/gpu_check.py does)."""
    module = copy.deepcopy(model).to("cuda")
    try:
        with torch.no_grad():
            module(*[t.to("cuda") for t in inputs])
        return module, "nn.Module"
    except RuntimeError:
        aoti_host = composer_module("piecewise")
        exported = torch.export.export(copy.deepcopy(model), tuple(inputs), strict=False).module()
        aoti_host.retarget_factories(exported, "cuda")
        return exported.to("cuda"), "exported graph, factory ops on the GPU"


def delegates_of(buffer: bytes) -> dict[str, int]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    counts: dict[str, int] = {}
    for plan in deserialize_pte_binary(buffer).program.execution_plan:
        for delegate in plan.delegates:
            counts[delegate.id] = counts.get(delegate.id, 0) + 1
    return counts


def stateful_steps(args, model_name, composition, pte, data_files, aoti_host, zoo) -> dict:
    """A decoding loop: each step's inputs once, in order, state carried between them, in
    ExecuTorch's runtime, composer's host and eager, each from a fresh start."""
    steps = STEPS[model_name]()
    with torch.no_grad():
        eager = zoo.load(model_name)[0]
        expected = [eager(*step) for step in steps]
        hosted = aoti_host.piecewise_module(composition, host="cpu")
        host = [hosted(*step) for step in steps]
    result: dict = {"steps": len(steps)}
    try:
        report = client.run_pte_detailed(
            args.runner,
            pte,
            data_files,
            None,
            repeats=0,
            warmup=0,
            threads=args.threads,
            steps=steps,
        )
        runtime = report["step_outputs"]
        result["et_runtime_vs_eager"] = [max_error(a, b) for a, b in zip(runtime, expected)]
        result["et_runtime_vs_composer_host"] = [max_error(a, b) for a, b in zip(runtime, host)]
    except Exception as error:  # noqa: BLE001
        result["et_runtime_error"] = f"{type(error).__name__}: {str(error)[-2000:]}"
    result["composer_host_vs_eager"] = [max_error(a, b) for a, b in zip(host, expected)]
    # What a program that did not carry its cache would give: every step from the initial state.
    fresh = [zoo.load(model_name)[0](*step) for step in steps]
    result["eager_without_carried_state_vs_eager"] = [
        max_error(a, b) for a, b in zip(fresh, expected)
    ]
    return result


def run_case(args, model_name: str, stack: str) -> dict:
    import composer

    zoo = composer_module("zoo")
    aoti_host = composer_module("piecewise")
    row: dict = {"model": model_name, "stack": stack}
    model, inputs = zoo.load(model_name)
    start = time.perf_counter()
    composition = composer.compose(model, stack.split(","), inputs)
    row["compose_s"] = round(time.perf_counter() - start, 2)
    folder = Path(args.out) / f"{model_name}__{stack.replace(',', '_')}"
    folder.mkdir(parents=True, exist_ok=True)
    pte = composition.save(folder / "program.pte")
    data_files = sorted(str(p) for p in folder.glob("*.ptd"))
    row["pte_bytes"] = len(composition.buffer)
    row["ptd"] = {Path(p).name: Path(p).stat().st_size for p in data_files}
    row["delegates"] = delegates_of(composition.buffer)
    row["partitions"] = {
        b: len(composition.plan.partitions_of(b)) for b in composition.plan.backends
    }
    if args.compose_only:
        return row

    with torch.no_grad():
        expected = zoo.load(model_name)[0](*inputs)

    # ExecuTorch's C++ runtime.
    try:
        report = client.run_pte_detailed(
            args.runner,
            pte,
            data_files,
            inputs,
            repeats=args.repeats,
            warmup=args.warmup,
            threads=args.threads,
        )
        stderr = report["stderr"].splitlines()
        row["et_runtime"] = {
            "executor": report["executor"],
            "max_abs_error_vs_eager": max_error(report["outputs"], expected),
            "program_load_s": report["program_load_s"],
            "method_load_s": report["method_load_s"],
            **summary(report["seconds"]),
            "stderr_lines": len(stderr),
            "stderr_bound": [line for line in stderr if "bound " in line and "ETCUDAFQN3" in line],
        }
        et_outputs = report["outputs"]
    except Exception as error:  # noqa: BLE001 - reported in the row
        row["et_runtime"] = {"error": f"{type(error).__name__}: {str(error)[-3000:]}"}
        et_outputs = None
    if "CudaBackend" in row["delegates"]:
        # The same, with the CUDA memory pool keeping what it frees (the backend's tensors come
        # from cudaMallocAsync; by default the pool releases freed memory at each sync).
        try:
            report = client.run_pte_detailed(
                args.runner,
                pte,
                data_files,
                inputs,
                repeats=args.repeats,
                warmup=args.warmup,
                threads=args.threads,
                mempool_keep=True,
            )
            row["et_runtime_mempool_keep"] = {
                "max_abs_error_vs_eager": max_error(report["outputs"], expected),
                **summary(report["seconds"]),
            }
        except Exception as error:  # noqa: BLE001
            row["et_runtime_mempool_keep"] = {
                "error": f"{type(error).__name__}: {str(error)[-2000:]}"
            }
    if model_name in STEPS:
        row["steps"] = stateful_steps(
            args, model_name, composition, pte, data_files, aoti_host, zoo
        )

    # composer's host: CUDA delegates' .so through libtorch, the rest as composer runs it.
    try:
        with torch.no_grad():
            hosted = aoti_host.piecewise_module(composition, host="cpu")
            host_outputs = hosted(*inputs)
            row["composer_host"] = {
                "executor": aoti_host.EXECUTOR,
                "in_runtime": [list(x) for x in hosted.meta.get("in_runtime", [])],
                "in_python": [list(x) for x in hosted.meta.get("in_python", [])],
                "max_abs_error_vs_eager": max_error(host_outputs, expected),
                **summary(call_seconds(lambda: hosted(*inputs), args.repeats, args.warmup)),
            }
        if et_outputs is not None:
            row["et_runtime_vs_composer_host_max_abs"] = max_error(et_outputs, host_outputs)
    except Exception as error:  # noqa: BLE001
        row["composer_host"] = {"error": f"{type(error).__name__}: {str(error)[-2000:]}"}

    # Eager on the GPU.
    with torch.no_grad():
        eager, kind = eager_on_gpu(model, inputs)
        cuda_inputs = [t.to("cuda") for t in inputs]
        row["eager_gpu"] = {
            "module": kind,
            **summary(call_seconds(lambda: eager(*cuda_inputs), args.repeats, args.warmup)),
        }
        row["eager_gpu_cpu_io"] = summary(
            call_seconds(
                lambda: [t.cpu() for t in flat(eager(*[t.to("cuda") for t in inputs]))],
                args.repeats,
                args.warmup,
            )
        )
        cpu_model = zoo.load(model_name)[0]
        row["eager_cpu"] = summary(
            call_seconds(lambda: cpu_model(*inputs), args.repeats, args.warmup)
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runner", help="composer_et_runner (build.sh prints its path)")
    parser.add_argument("--out", required=True, help="folder for the .pte/.ptd files")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--stacks", default=";".join(STACKS))
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="XNNPACK's threads, both runtimes")
    parser.add_argument("--compose-only", action="store_true")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if not args.compose_only:
        composer_module("cpu_threads").set_threads(args.threads)
    import importlib.metadata

    environment = {
        "torch": torch.__version__,
        "executorch_wheel": importlib.metadata.version("executorch"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "threads": args.threads,
        "repeats": args.repeats,
        "warmup": args.warmup,
    }
    print(json.dumps(environment), flush=True)
    rows = []
    for model_name in args.models.split(","):
        for stack in args.stacks.split(";"):
            try:
                row = run_case(args, model_name, stack)
            except Exception as error:  # noqa: BLE001 - reported, then the next case runs
                row = {
                    "model": model_name,
                    "stack": stack,
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                Path(args.json).write_text(
                    json.dumps({"environment": environment, "rows": rows}, indent=2)
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
