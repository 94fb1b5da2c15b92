"""The GPU check: lower stacks with the real CUDA backend, run the compiled code, check it.

    python bench/gpu/gpu_check.py                      # on a machine with a CUDA GPU
    python bench/gpu/gpu_check.py --models mlp --stacks cuda --option cuda.max_autotune=OFF

For every model and stack it composes for real (AOTInductor compiles the CUDA partitions),
then checks: the .pte has one CudaBackend delegate per cuda partition, its .so among the .pte's
named data, and every weight its manifest lists in the .ptd with the manifest's size;
host<->device copies (et_copy._h2d_copy/_d2h_copy) sit exactly where a CUDA delegate meets
host data; the composed program run on the GPU by the reference executor (each delegate
executes its own subgraph with CUDA tensors) matches eager; and the composed program with each
CUDA delegate executed as its compiled .so (composer.run.piecewise: libtorch hosts it, weights
bound from the .ptd, the rest as the Python reference, on the CPU as in the .pte or all on the
GPU) matches eager, timed against eager on the GPU. It also times composer against
ExecuTorch's own to_edge_transform_and_lower with CudaPartitioner on the same model, in the
same run (unless --no-baseline).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import operator
import statistics
import sys
import time
import warnings

import torch
import torch.fx

import composer
from composer.models import zoo
from composer.plugins.cuda import manifest as cuda_manifest
from composer.run import named_data, piecewise
from composer.run.compare import compare, default_tolerance, flatten_tensors
from composer.run.piecewise import reference_on

STACKS = {
    "cuda": ["cuda"],
    "tensorrt_stub,cuda": ["tensorrt_stub", "cuda"],
    "xnnpack,cuda": ["xnnpack", "cuda"],
}
MODELS = ["mlp", "cnn", "transformer_block", "llama_block"]


def copy_check(composition) -> dict:
    """Where ExecuTorch put host<->device copies, against where CUDA delegates meet host data."""
    graph_module = composition.program.exported_program().graph_module
    cuda_calls = set()
    for node in graph_module.graph.nodes:
        is_call = node.op == "call_function" and "executorch_call_delegate" in str(node.target)
        if is_call and getattr(graph_module, node.args[0].target).backend_id == "CudaBackend":
            cuda_calls.add(node)
    h2d = [n for n in graph_module.graph.nodes if "_h2d_copy" in str(n.target)]
    d2h = [n for n in graph_module.graph.nodes if "_d2h_copy" in str(n.target)]
    on_gpu = (
        set(cuda_calls)
        | {
            n
            for n in graph_module.graph.nodes
            if n.target is operator.getitem and n.args[0] in cuda_calls
        }
        | set(h2d)
    )
    missing_h2d = [
        f"{arg.name}->{call.name}"
        for call in cuda_calls
        for arg in call.args[1:]
        if hasattr(arg, "op") and arg not in on_gpu
    ]
    stray_h2d = [n.name for n in h2d if not any(u in cuda_calls for u in n.users)]
    missing_d2h = [
        f"{n.name}->{u.name}"
        for n in on_gpu - set(h2d) - cuda_calls
        for u in n.users
        if u not in on_gpu and u not in d2h
    ]
    return {
        "cuda_delegates": len(cuda_calls),
        "h2d_copies": len(h2d),
        "d2h_copies": len(d2h),
        "missing_h2d": missing_h2d,
        "stray_h2d": stray_h2d,
        "missing_d2h": missing_d2h,
        "ok": not (missing_h2d or stray_h2d or missing_d2h),
    }


def pte_check(composition) -> dict:
    """One CudaBackend delegate per cuda partition; per delegate, its .so in the .pte and every
    weight its manifest lists in the .pte or .ptd named data, with the manifest's size."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(composition.buffer)
    in_pte = set(pte.named_data.pte_data) if pte.named_data is not None else set()
    delegates = pte.program.execution_plan[0].delegates
    manifests = cuda_manifest.cuda_manifests(composition.buffer)
    data = named_data.named_data(composition.buffer, composition.data_files)
    weights = []
    for manifest in manifests:
        problems = cuda_manifest.missing_weights(manifest, data)
        weights.append(
            {
                "so_key": manifest.so_blob_key[-24:],
                "so_in_pte": manifest.so_blob_key in in_pte,
                "constants": len(manifest.entries),
                "constant_bytes": sum(entry.storage_nbytes for entry in manifest.entries),
                "problems": problems[:5],
            }
        )
    so_found = sum(w["so_in_pte"] for w in weights)
    weights_found = sum(not w["problems"] for w in weights)
    cuda_partitions = len(composition.plan.partitions_of("cuda"))
    return {
        "delegates": [d.id for d in delegates],
        "cuda_delegates": len(manifests),
        "so_blobs_found": so_found,
        "weights_complete": weights_found,
        "weights": weights,
        "pte_bytes": len(composition.buffer),
        "data_files": {name: len(data) for name, data in composition.data_files.items()},
        "ok": len(manifests) == cuda_partitions == so_found == weights_found,
    }


def numerics(composition, model, inputs) -> dict:
    with torch.no_grad():
        expected = model(*inputs)
        actual = reference_on(composition, "cuda")(*[t.to("cuda") for t in inputs])
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple | list) else (actual,)
    worst, ok = 0.0, True
    for got, want in zip(actual, expected):
        got = got.to("cpu", want.dtype)
        atol, rtol = default_tolerance(want.dtype)
        atol, rtol = max(atol, 1e-3), max(rtol, 1e-3)  # TF32 matmuls on the GPU
        worst = max(worst, (got.double() - want.double()).abs().max().item())
        ok = ok and torch.allclose(got, want, atol=atol, rtol=rtol)
    return {"max_abs_error": worst, "ok": ok, "device": torch.cuda.get_device_name()}


def median_ms(run, repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``run()`` in ms, each call GPU-synchronized."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def eager_on_gpu(model, inputs):
    """Eager on the GPU: the module moved there, or, where the module makes CPU tensors
    itself (llama_block's arange), its exported graph with factory ops moved there."""
    cuda_inputs = [t.to("cuda") for t in inputs]
    module = copy.deepcopy(model).to("cuda")
    try:
        module(*cuda_inputs)
        return module, "nn.Module"
    except RuntimeError:
        module = torch.export.export(copy.deepcopy(model), tuple(inputs), strict=False).module()
        piecewise.retarget_factories(module, "cuda")
        return module.to("cuda"), "exported graph, factory ops on the GPU"


def compiled_run(composition, model, inputs, repeats: int) -> dict:
    """The composed program with each CUDA delegate run as its .so, against eager: error and
    median latency, the rest on the CPU (as the .pte runs it) and all on the GPU."""
    row: dict = {"executor": piecewise.EXECUTOR}
    with torch.no_grad():
        expected = copy.deepcopy(model)(*inputs)
        for host in ("cpu", "cuda"):
            hosted = piecewise.piecewise_module(composition, host=host)
            row["compiled_delegates"] = sum(
                isinstance(m, piecewise.PluginDelegate) for m in hosted.modules()
            )
            host_inputs = [t.to(host) for t in inputs]
            actual = [t.cpu() for t in flatten_tensors(hosted(*host_inputs))]
            ok, worst = compare(actual, expected)
            row[f"rest_on_{host}"] = {
                "max_abs_error": worst,
                "ok": ok,
                "median_ms": round(median_ms(functools.partial(hosted, *host_inputs), repeats), 4),
            }
        eager, kind = eager_on_gpu(model, inputs)
        cuda_inputs = [t.to("cuda") for t in inputs]
        ok, worst = compare([t.cpu() for t in flatten_tensors(eager(*cuda_inputs))], expected)
        row["eager_gpu"] = {
            "module": kind,
            "max_abs_error_vs_cpu": worst,
            "median_ms": round(median_ms(lambda: eager(*cuda_inputs), repeats), 4),
        }
        cpu_model = copy.deepcopy(model)
        row["eager_cpu_median_ms"] = round(median_ms(lambda: cpu_model(*inputs), repeats), 4)
    row["ok"] = row["rest_on_cpu"]["ok"] and row["rest_on_cuda"]["ok"]
    return row


def environment() -> dict:
    """Which torch, ExecuTorch, triton and GPU ran this."""
    import importlib.metadata
    import platform

    import triton

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "executorch": importlib.metadata.version("executorch"),
        "gpu": torch.cuda.get_device_name(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


def warm_up() -> None:
    """Compile one tiny CUDA program so imports and Triton start-up count for neither side."""
    model, inputs = zoo.load("mlp")
    composer.compose(model, ["cuda"], inputs)


def executorch_baseline_seconds(model, inputs) -> float:
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import to_edge_transform_and_lower

    start = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(model, inputs, strict=False)
        spec = [CudaBackend.generate_method_name_compile_spec("forward")]
        to_edge_transform_and_lower(program, partitioner=[CudaPartitioner(spec)]).to_executorch()
    return time.perf_counter() - start


PROBES = {
    "cumsum": lambda x: torch.cumsum(x, 0) * 2,
    "slice": lambda x: x[..., :4] * 2,
    "chunk": lambda x: x.chunk(2, dim=-1)[1] * 2,
    "sort": lambda x: torch.sort(x, dim=-1).values * 2,
}


class _Probe(torch.nn.Module):
    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


def probe_predictions() -> list[dict]:
    """For ops composer predicts or not as CUDA fallbacks: does ExecuTorch's own lowering work?"""
    rows = []
    for name, function in PROBES.items():
        model, inputs = _Probe(function), (torch.randn(4, 8),)
        plan = composer.plan(model, ["cuda"], inputs)
        predicted = not plan.ops_on("portable")
        try:
            executorch_baseline_seconds(model, inputs)
            lowered, error = True, ""
        except Exception as failure:  # noqa: BLE001
            lowered, error = False, f"{type(failure).__name__}: {str(failure)[:300]}"
        rows.append({"probe": name, "composer_predicts_cuda_takes_it": predicted,
                     "executorch_cuda_lowering_succeeded": lowered, "error": error})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--stacks", default=";".join(STACKS))
    parser.add_argument("--option", action="append", default=[], help="cuda.NAME=VALUE")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--probe", action="store_true", help="check the fallback predictions")
    parser.add_argument(
        "--save-fixture", metavar="DIR", help="write zoo:mlp composed with [cuda] (.pte, .ptd)"
    )
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per executor")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible; nothing to check")
        return 0
    options: dict[str, dict[str, str]] = {}
    for item in args.option:
        key, _, value = item.partition("=")
        backend, _, name = key.partition(".")
        options.setdefault(backend, {})[name] = value
    env = environment()
    print(json.dumps(env), flush=True)
    if args.save_fixture:
        # tests/test_piecewise.py reads this on CPU: a real CUDA manifest and .ptd.
        model, inputs = zoo.load("mlp")
        saved = composer.compose(model, ["cuda"], inputs).save(f"{args.save_fixture}/mlp_cuda.pte")
        print(f"wrote {saved} and its .ptd", flush=True)
    warm_up()
    if args.probe:
        probe_predictions()
    results = []
    failures = 0
    for model_name in args.models.split(","):
        for stack_name in args.stacks.split(";"):
            stack = STACKS.get(stack_name, stack_name.split(","))
            model, inputs = zoo.load(model_name)
            row = {"model": model_name, "stack": stack}
            if stack == ["cuda"] and not args.no_baseline:
                # ExecuTorch's own lowering first, so any cache it warms helps composer's
                # run after it only as much as composer's would help it.
                try:
                    baseline = executorch_baseline_seconds(*zoo.load(model_name))
                    row["executorch_seconds"] = round(baseline, 2)
                except Exception as error:  # noqa: BLE001
                    row["executorch_error"] = f"{type(error).__name__}: {str(error)[:500]}"
            start = time.perf_counter()
            try:
                composition = composer.compose(
                    model, stack, inputs, options={k: v for k, v in options.items() if k in stack}
                )
            except Exception as error:  # noqa: BLE001 - reported, then the next case runs
                row["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
                failures += 1
                results.append(row)
                print(json.dumps(row), flush=True)
                continue
            row["composer_seconds"] = round(time.perf_counter() - start, 2)
            row["plan"] = {
                b: len(composition.plan.partitions_of(b)) for b in composition.plan.backends
            }
            row["portable_ops"] = dict(composition.plan.ops_on("portable"))
            row["crossings"] = composition.plan.crossings
            for key, check in (("pte", pte_check), ("copies", copy_check)):
                try:
                    row[key] = check(composition)
                except Exception as error:  # noqa: BLE001
                    row[key] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            try:
                row["numerics"] = numerics(composition, model, inputs)
            except Exception as error:  # noqa: BLE001
                row["numerics"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            try:
                row["compiled"] = compiled_run(composition, model, inputs, args.repeats)
            except Exception as error:  # noqa: BLE001
                row["compiled"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            if "executorch_seconds" in row:
                row["composer_over_executorch"] = round(
                    row["composer_seconds"] / row["executorch_seconds"], 3
                )
            ok = all(row[key]["ok"] for key in ("pte", "copies", "numerics", "compiled"))
            row["ok"] = ok
            failures += not ok
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"environment": env, "rows": results}, out, indent=2)
    print(f"{len(results) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
