"""Issue 32 item 4c, on the GPU machine: export_llama's tiny KV-cache decoder in bf16, composed
with ``cuda`` and ``xnnpack,cuda`` and lowered by plain ExecuTorch (CudaPartitioner), run in
ExecuTorch's own C++ runtime (bench/et_runtime's ``composer_et_runner``): a 5-token prefill then
decode steps, logits against eager on the GPU at each step, decode tokens per second beside
eager on the GPU and beside plain ExecuTorch's program, with an A/A control.

Exports of the same seeded weights (``composer.models.llama.exported(TINY, *flags)``), bf16:

- ``A``: ``composer.models.llama.DECODER_FLAGS`` with ``-d bf16`` (export_llama's custom SDPA and cache
  update ops, ``--use_sdpa_with_kv_cache``), as the issue asks; ``A32``: the same in fp32;
- ``B``: the same less ``--use_sdpa_with_kv_cache`` (aten SDPA, ``index_copy`` cache updates,
  a dynamic token dimension: what ExecuTorch's CUDA backend swaps its bf16 Triton SDPA into);
- ``C``: ``B`` with ``--disable_dynamic_shape`` (one token a call: the prefill is 5 calls);
- ``Xoff``: variant X lowered with the CUDA backend's ``triton_kernel_mode`` OFF (composer:
  ``options={"cuda": {"triton_kernel_mode": "OFF"}}``; plain: ``CompileSpec("triton_kernel_mode",
  b"OFF")``).

The eager reference is the model export_llama prepared and exported (its KV caches, RoPE tables
and masks made from the seeded checkpoint ``composer.models.llama.exported`` writes), captured by
wrapping ``_prepare_for_llama_export``; until 2026-11-26 the script wrapped composer's
``_initialize``, which since seeds a model without KV caches (eager then failed with "input_pos
is unused when use_kv_cache is False").

Subcommands (the first is the one device command; the others are what it runs):

    python3 bench/gpu/gpu_llama.py device [--measure] [--pytest] --limit 555 --tree DIR --commit C
        [--early "TASKS TASKS ..."] [--late "..."] [--programs-carry programs.tar.xz]
    python3 bench/gpu/gpu_llama.py lower --tasks "compose:Coff:cuda;plain:Coff:plain"
    python3 bench/gpu/gpu_llama.py measure --runner PATH       # GPU_LLAMA_ROUNDS=8 for more rounds
    python3 bench/gpu/gpu_llama.py pytest --tree DIR           # tests/test_gpu.py -m gpu there

A task is ``compose:VARIANT:STACK``, ``plain:VARIANT[:RECIPE]`` (``plain``: the issue's
``to_edge_transform_and_lower(program, partitioner=[CudaPartitioner([...])])``;
``dinov2_recipe``: ExecuTorch's examples/models/dinov2 configs) or ``export:VARIANT``.

The device command (bench/gpu_llama_carry/, ignored, holds ``git archive`` of the composer commit
measured and its name; bench/et_runtime/carry/runner.tar.xz the runner an earlier call built;
carry those two, ``bench/et_runtime/src``, ``.whl`` and ``.whl-llama``):

    C=bench/gpu_llama_carry; mkdir -p /tmp/head && tar -xf $C/head.tar -C /tmp/head
    [ -f bench/et_runtime/carry/runner.tar.xz ] && tar -xJf bench/et_runtime/carry/runner.tar.xz -C /
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl .whl-llama/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site /tmp/head
    PYTHONPATH=/tmp/site python3 bench/gpu/gpu_llama.py device --measure --limit 555 --tree /tmp/head \
        --commit $(cat $C/COMMIT) --early "..." --late "..."

Results: one JSON object a line in ``$OUT/gpu_llama.jsonl`` (``kind`` says what each is);
bench/results/gpu_llama_h100.jsonl.gz holds the four calls of 2026-11-25 (``run`` 1-4).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("GPU_LLAMA_WORK", "/tmp/gl"))
PROGRAMS = WORK / "programs"
RESULTS = WORK / "gpu_llama.jsonl"
LOG = WORK / "log.txt"
ET_ROOT = Path(os.environ.get("ET_ROOT", "/tmp/etb"))
RUNNER = ET_ROOT / "build" / "composer_runner" / "composer_et_runner"

PREFILL = [1, 7, 42, 9, 100]
DECODE = [3, 77, 500, 12, 256, 31, 8, 400]  # teacher-forced, positions 5..12
TIMED_TOKEN = 99  # the timed decode call: this token at position 13, repeated
WARMUP, REPEATS = 20, 200
ROUNDS = int(os.environ.get("GPU_LLAMA_ROUNDS", "3"))
THREADS = 1  # XNNPACK's threads in the runner (as bench/et_runtime's H100 rows)


# --------------------------------------------------------------------------- helpers
def emit(record: dict) -> None:
    record = {"t": round(time.time(), 1), **record}
    line = json.dumps(record, default=str)
    WORK.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as out:
        out.write(line + "\n")
    print(line, flush=True)


def error_text(error: BaseException, limit: int = 4000) -> str:
    text = f"{type(error).__name__}: {error}"
    tb = traceback.format_exc()
    return (text[:limit] + ("\n--- traceback tail:\n" + tb[-limit:] if tb else ""))[: 2 * limit]


def base_variant(variant: str) -> str:
    """``Xoff``: variant X's export, lowered with the CUDA backend's ``triton_kernel_mode`` OFF
    (no Triton SDPA swap: SDPA decomposes, or compiles through the MATH backend)."""
    return variant.removesuffix("off")


def triton_off(variant: str) -> bool:
    return variant.endswith("off")


def flags_of(variant: str) -> list[str]:
    import composer.models.llama as L

    variant = base_variant(variant)
    flags = ["bf16" if f == "fp32" else f for f in L.DECODER_FLAGS]
    if variant in ("B", "C"):
        flags = [f for f in flags if f != "--use_sdpa_with_kv_cache"]
    if variant == "C":
        flags.append("--disable_dynamic_shape")
    elif variant == "A32":
        flags = list(L.DECODER_FLAGS)
    return flags


_CAPTURED: list = []


def _capture_prepared() -> None:
    from executorch.examples.models.llama import export_llama_lib as lib

    if getattr(lib._prepare_for_llama_export, "_gpu_llama", False):
        return
    original = lib._prepare_for_llama_export

    def prepared(config):
        manager = original(config)
        _CAPTURED.append(manager.model)
        return manager

    prepared._gpu_llama = True
    lib._prepare_for_llama_export = prepared


def export(variant: str):
    """(program, metadata, eager nn.Module, seconds) of one variant, buffers initialized."""
    import composer.models.llama as L

    _capture_prepared()
    start = time.perf_counter()
    program, metadata = L.exported(L.TINY, *flags_of(variant))
    seconds = time.perf_counter() - start
    model = copy.deepcopy(_CAPTURED[-1]).eval()
    return program, metadata, model, seconds


def steps_inputs(variant: str = "B"):
    """The decoding loop: a 5-token prefill (``C``, static shapes: one token a call, as
    export_llama's runner prefills without a dynamic token dimension), then DECODE one token a
    step; and the timed decode call."""
    import torch

    if base_variant(variant) == "C":
        steps = [(torch.tensor([[t]]), torch.tensor([i])) for i, t in enumerate(PREFILL)]
    else:
        steps = [(torch.tensor([PREFILL]), torch.tensor([0]))]
    steps += [(torch.tensor([[t]]), torch.tensor([len(PREFILL) + i])) for i, t in enumerate(DECODE)]
    timed = (torch.tensor([[TIMED_TOKEN]]), torch.tensor([len(PREFILL) + len(DECODE)]))
    return steps, timed


def delegates_of(buffer: bytes) -> dict:
    from executorch.exir._serialize._program import deserialize_pte_binary

    out = {}
    for plan in deserialize_pte_binary(buffer).program.execution_plan:
        counts: dict[str, int] = {}
        for delegate in plan.delegates:
            counts[delegate.id] = counts.get(delegate.id, 0) + 1
        out[plan.name] = counts
    return out


def write_program(folder: Path, buffer: bytes, data_files: dict) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "program.pte").write_bytes(buffer)
    sizes = {}
    for name, data in data_files.items():
        path = folder / (name if name.endswith(".ptd") else f"{name}.ptd")
        path.write_bytes(bytes(data))
        sizes[path.name] = path.stat().st_size
    return {"pte_bytes": len(buffer), "ptd": sizes}


# --------------------------------------------------------------------------- lower
def plain_name(variant: str, recipe: str | None) -> str:
    return f"plain_cuda_{variant}" if recipe in (None, "plain") else f"plain_cuda_recipe_{variant}"


def lower_plain(variant: str, program, metadata, only: str | None = None) -> dict:
    """Plain ExecuTorch: to_edge_transform_and_lower with CudaPartitioner, as the issue says;
    if that fails, ExecuTorch's own CUDA example recipe (export_dinov2.py's configs)."""
    import torch
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    attempts = []
    recipes = [("plain", {}, {}),
               ("dinov2_recipe", {"compile_config": EdgeCompileConfig(_check_ir_validity=False,
                                                                      _skip_dim_order=True)},
                "recipe")]  # fmt: skip
    for label, lower_kwargs, et_config in recipes:
        if only and label != only:
            continue
        start = time.perf_counter()
        try:
            specs = [CudaBackend.generate_method_name_compile_spec("forward")]
            if triton_off(variant):
                from executorch.exir.backend.compile_spec_schema import CompileSpec

                specs.append(CompileSpec("triton_kernel_mode", b"OFF"))
            partitioner = [CudaPartitioner(specs)]
            edge = to_edge_transform_and_lower(copy.deepcopy(program), partitioner=partitioner,
                                               constant_methods=dict(metadata), **lower_kwargs)  # fmt: skip
            if et_config == "recipe":
                from executorch.exir import ExecutorchBackendConfig
                from executorch.exir.passes import MemoryPlanningPass

                config = ExecutorchBackendConfig(
                    extract_delegate_segments=True,
                    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
                    do_quant_fusion_and_const_prop=True,
                )
                with torch.no_grad():
                    et = edge.to_executorch(config=config)
            else:
                with torch.no_grad():
                    et = edge.to_executorch()
            info = write_program(PROGRAMS / plain_name(variant, only), et.buffer,
                                 dict(et._tensor_data or {}))  # fmt: skip
            attempts.append(
                {"recipe": label, "ok": True, "s": round(time.perf_counter() - start, 1)}
            )
            return {"ok": True, "attempts": attempts, "delegates": delegates_of(et.buffer), **info}
        except Exception as error:  # noqa: BLE001
            attempts.append({"recipe": label, "ok": False, "s": round(time.perf_counter() - start, 1),
                             "error": error_text(error)})  # fmt: skip
    return {"ok": False, "attempts": attempts}


def lower_composer(variant: str, stack: str, program, metadata) -> dict:
    import composer
    from composer.report.plan_text import summary_table

    start = time.perf_counter()
    options = {"cuda": {"triton_kernel_mode": "OFF"}} if triton_off(variant) else {}
    composed = composer.compose({"forward": copy.deepcopy(program)}, stack,
                                constant_methods=dict(metadata), options=options)  # fmt: skip
    seconds = time.perf_counter() - start
    name = f"composer_{stack.replace(',', '_')}_{variant}"
    info = write_program(PROGRAMS / name, composed.buffer, composed.data_files)
    plan = composed.plans["forward"]
    return {
        "ok": True, "s": round(seconds, 1), "delegates": delegates_of(composed.buffer),
        "plan": summary_table(plan), "proof": plan.proof,
        "repairs": [{k: (v if k != "nodes" else len(v)) for k, v in r.to_dict().items()}
                    for r in (plan.repairs or ())],
        **info,
    }  # fmt: skip


def cmd_lower(args) -> None:
    import torch

    exported: dict = {}
    for task in [t for t in args.tasks.split(";") if t]:
        kind, variant, *rest = task.split(":")
        stack = rest[0] if rest else None
        if kind == "export":
            if variant not in exported:
                try:
                    program, metadata, _model, seconds = export(variant)
                    exported[variant] = (program, metadata)
                    emit({"kind": "export", "variant": variant, "flags": flags_of(variant),
                          "ok": True, "s": round(seconds, 1)})  # fmt: skip
                except Exception as error:  # noqa: BLE001
                    exported[variant] = None
                    emit({"kind": "export", "variant": variant, "flags": flags_of(variant),
                          "ok": False, "error": error_text(error)})  # fmt: skip
            continue
        name = (plain_name(variant, stack) if kind == "plain"
                else f"composer_{(stack or '').replace(',', '_')}_{variant}")  # fmt: skip
        if (PROGRAMS / name / "program.pte").exists():
            emit({"kind": "lower", "name": name, "skipped": "already lowered (carried)"})
            continue
        if variant not in exported:
            try:
                program, metadata, _model, seconds = export(variant)
                exported[variant] = (program, metadata)
                emit({"kind": "export", "variant": variant, "flags": flags_of(variant),
                      "ok": True, "s": round(seconds, 1), "metadata": metadata,
                      "dtypes": sorted({str(p.dtype) for p in program.state_dict.values()}),
                      "torch": torch.__version__})  # fmt: skip
            except Exception as error:  # noqa: BLE001
                exported[variant] = None
                emit({"kind": "export", "variant": variant, "flags": flags_of(variant),
                      "ok": False, "error": error_text(error)})  # fmt: skip
        if exported[variant] is None:
            emit({"kind": "lower", "name": name, "ok": False, "error": "export failed"})
            continue
        program, metadata = exported[variant]
        start = time.perf_counter()
        try:
            if kind == "plain":
                result = lower_plain(variant, program, metadata, stack)
            else:
                result = lower_composer(variant, stack, program, metadata)
        except Exception as error:  # noqa: BLE001
            result = {"ok": False, "s": round(time.perf_counter() - start, 1),
                      "error": error_text(error)}  # fmt: skip
        emit({"kind": "lower", "name": name, "variant": variant,
              "stack": f"CudaPartitioner ({stack or 'all recipes'})" if kind == "plain" else stack,
              "runner_for_proof": os.environ.get("COMPOSER_ET_RUNNER"), **result})  # fmt: skip


# --------------------------------------------------------------------------- measure
def max_err(got, want) -> float:
    if got is None or tuple(got.shape) != tuple(want.shape):
        return float("inf")
    return (got.detach().cpu().double() - want.detach().cpu().double()).abs().max().item()


def first(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return first(value[0])
    raise TypeError(type(value))


def eager_steps(model, device: str, steps, timed=None, warmup=WARMUP, repeats=REPEATS):
    """Each step's logits (float, CPU) of a fresh copy of ``model`` on ``device``, then the
    seconds of ``repeats`` timed decode calls (inputs from the CPU, logits back to it)."""
    import torch

    module = copy.deepcopy(model).to(device)
    outputs, seconds = [], []
    with torch.no_grad():
        for tokens, position in steps:
            out = first(module(tokens.to(device), {"input_pos": position.to(device)}))
            outputs.append(out.float().cpu())
        if timed is not None:
            tokens, position = timed
            for call in range(warmup + repeats):
                start = time.perf_counter()
                out = first(module(tokens.to(device), {"input_pos": position.to(device)}))
                out = out.cpu()
                if device == "cuda":
                    torch.cuda.synchronize()
                if call >= warmup:
                    seconds.append(time.perf_counter() - start)
    return outputs, seconds


def stats(seconds) -> dict:
    ordered = sorted(seconds)
    median = statistics.median(ordered)
    return {"calls": len(ordered), "median_us": round(median * 1e6, 2),
            "fastest_us": round(ordered[0] * 1e6, 2),
            "p10_us": round(ordered[int(0.1 * (len(ordered) - 1))] * 1e6, 2),
            "p90_us": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e6, 2),
            "tokens_per_s": round(1.0 / median, 1)}  # fmt: skip


def variant_of(name: str) -> str:
    return name.rsplit("_", 1)[-1]


def cmd_measure(args) -> None:
    import torch

    from composer.run import cpp_runtime

    programs = sorted(p.parent for p in PROGRAMS.glob("*/program.pte"))
    variants = sorted({base_variant(variant_of(p.name)) for p in programs} | {"B"})
    _, timed = steps_inputs()
    emit({"kind": "measure_env", "torch": torch.__version__, "cuda": torch.version.cuda,
          "device": torch.cuda.get_device_name(0), "runner": args.runner,
          "programs": [p.name for p in programs],
          "steps": {"prefill": PREFILL, "decode": DECODE, "timed_token": TIMED_TOKEN,
                    "timed_position": int(timed[1])},
          "warmup": WARMUP, "repeats": REPEATS, "rounds": ROUNDS, "xnnpack_threads": THREADS})  # fmt: skip
    # References: each variant's eager model on the GPU, bf16, same weights (A's custom ops
    # have CPU and Meta kernels only, and do not load under this torch: no A here).
    models, refs = {}, {}
    for variant in variants:
        try:
            _program, _metadata, model, _s = export(variant)
            models[variant] = model
            refs[variant], _ = eager_steps(model, "cuda", steps_inputs(variant)[0])
            cpu, _ = eager_steps(model, "cpu", steps_inputs(variant)[0])
            emit({"kind": "eager_ref", "variant": variant,
                  "finite": [bool(torch.isfinite(o).all()) for o in refs[variant]],
                  "absmax": [round(o.abs().max().item(), 4) for o in refs[variant]],
                  "eager_cpu_vs_eager_gpu": [max_err(c, g) for c, g in zip(cpu, refs[variant])]})  # fmt: skip
        except Exception as error:  # noqa: BLE001
            emit({"kind": "eager_ref", "variant": variant, "ok": False, "error": error_text(error)})
    if "B" in refs and "C" in refs:  # C's step 4 + i is B's step i (C prefills a token a call)
        emit({"kind": "eager_ref", "variant": "C vs B (aligned steps)",
              "max_abs_err": [max_err(c, b) for c, b in zip(refs["C"][len(PREFILL) - 1:], refs["B"])]})  # fmt: skip

    # Logits at each step, each program from a fresh load, against its variant's eager on GPU.
    usable = []
    for folder in programs:
        variant = variant_of(folder.name)
        steps = steps_inputs(variant)[0]
        data = sorted(str(p) for p in folder.glob("*.ptd"))
        try:
            report = cpp_runtime.run_pte_detailed(
                args.runner, folder / "program.pte", data, None, repeats=0, warmup=0,
                threads=THREADS, steps=[list(s) for s in steps], timeout=300,
            )  # fmt: skip
            outs = [first(o) for o in report["step_outputs"]]
            row = {"kind": "steps", "name": folder.name, "ok": True,
                   "program_load_s": report.get("program_load_s"),
                   "method_load_s": report.get("method_load_s"),
                   "dtype": str(outs[0].dtype), "shape": list(outs[0].shape),
                   "finite": [bool(torch.isfinite(o.float()).all()) for o in outs]}  # fmt: skip
            if base_variant(variant) in refs:
                row["max_abs_err_vs_eager_gpu"] = [
                    max_err(o, r) for o, r in zip(outs, refs[base_variant(variant)])
                ]
            emit(row)
            usable.append(folder)
        except Exception as error:  # noqa: BLE001
            emit({"kind": "steps", "name": folder.name, "ok": False, "error": error_text(error)})

    # Decode timing, interleaved rounds; the A/A control runs one program twice a round.
    prefer = [
        "composer_cuda_B",
        "composer_cuda_C",
        "composer_cuda_Coff",
        "plain_cuda_B",
        "plain_cuda_C",
        "plain_cuda_Coff",
        "plain_cuda_recipe_C",
    ]
    aa = next((f for n in prefer for f in usable if f.name == n), usable[0] if usable else None)
    order = [(f"eager_gpu_{v}", v)
             for v in sorted({base_variant(variant_of(f.name)) for f in usable} | {"B"})
             if v in models]  # fmt: skip
    order += [(f.name, f) for f in usable]
    if aa is not None:
        order.append((f"{aa.name}#AA2", aa))
    times: dict[str, list[float]] = {}
    for round_index in range(ROUNDS):
        for label, what in order:
            try:
                if isinstance(what, str):
                    _outs, seconds = eager_steps(models[what], "cuda", steps_inputs(what)[0], timed)
                else:
                    steps = steps_inputs(variant_of(what.name))[0]
                    data = sorted(str(p) for p in what.glob("*.ptd"))
                    report = cpp_runtime.run_pte_detailed(
                        args.runner, what / "program.pte", data, list(timed), repeats=REPEATS,
                        warmup=WARMUP, threads=THREADS, steps=[list(s) for s in steps],
                        timeout=300,
                    )  # fmt: skip
                    seconds = report["seconds"]
                times.setdefault(label, []).extend(seconds)
                emit(
                    {"kind": "timing_round", "name": label, "round": round_index, **stats(seconds)}
                )
            except Exception as error:  # noqa: BLE001
                emit({"kind": "timing_round", "name": label, "round": round_index, "ok": False,
                      "error": error_text(error)})  # fmt: skip
    summary = {label: stats(seconds) for label, seconds in times.items() if seconds}
    aa_ratio = None
    if aa is not None and aa.name in summary and f"{aa.name}#AA2" in summary:
        aa_ratio = summary[f"{aa.name}#AA2"]["median_us"] / summary[aa.name]["median_us"]
    emit({"kind": "timing_summary", "device": torch.cuda.get_device_name(0),
          "aa_program": aa.name if aa else None,
          "aa_ratio_median": round(aa_ratio, 4) if aa_ratio else None, "per_program": summary})  # fmt: skip


# --------------------------------------------------------------------------- pytest
def cmd_pytest(args) -> None:
    tree = Path(args.tree)
    log = WORK / "pytest_gpu.log"
    env = dict(os.environ)
    command = [sys.executable, "-m", "pytest", "tests/test_gpu.py", "tests/test_cpp_runtime.py",
               "-m", "gpu", "-p",
               "no:hydra_pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-v", "-rA",
               "--durations=12"]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=args.timeout, check=False)  # fmt: skip
        text, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        text = (
            (error.stdout or b"").decode()
            if isinstance(error.stdout, bytes)
            else (error.stdout or "")
        )
        rc = "timeout"
    log.write_text(text)
    tail = [line for line in text.splitlines() if " passed" in line or " failed" in line
            or line.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED"))]  # fmt: skip
    emit({"kind": "pytest", "command": " ".join(command[1:]), "cwd": str(tree), "rc": rc,
          "s": round(time.perf_counter() - start, 1), "runner": env.get("COMPOSER_ET_RUNNER"),
          "summary": tail[-40:]})  # fmt: skip


# --------------------------------------------------------------------------- device
def cmd_device(args) -> None:
    start = time.time()
    deadline = start + args.limit
    left = lambda: deadline - time.time()
    WORK.mkdir(parents=True, exist_ok=True)
    PROGRAMS.mkdir(parents=True, exist_ok=True)
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    if args.programs_carry and Path(args.programs_carry).is_file():
        with tarfile.open(args.programs_carry) as tar:
            tar.extractall(WORK)
    gpu = subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True, check=False
    ).stdout.strip()
    git = subprocess.run(["git", "-C", args.tree, "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True, check=False).stdout.strip()  # fmt: skip
    emit({"kind": "env", "gpu": gpu, "nproc": os.cpu_count(), "composer_tree": args.tree,
          "composer_commit": args.commit or git, "limit_s": args.limit})  # fmt: skip
    me = [sys.executable, str(Path(__file__).resolve())]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("COMPOSER_ET_RUNNER", None)
    logf = open(LOG, "a")  # noqa: SIM115 - the subprocesses' output, closed at the end

    build = None
    if not RUNNER.exists():
        build = subprocess.Popen(["bash", "bench/et_runtime/build.sh"], cwd=REPO, stdout=open(WORK / "build.log", "w"),  # noqa: SIM115
                                 stderr=subprocess.STDOUT,
                                 env=dict(env, ET_DEADLINE=str(int(deadline - 75))))  # fmt: skip
    # While the runtime builds: the CUDA-only lowerings (their proof in composer's libtorch
    # host); once it is built, the xnnpack,cuda ones (their proof needs the runner: the pip
    # runtime's XNNPACK is built for torch 2.13). Each task list is one process.
    reserve = 40 + (args.measure_s if args.measure else 0)
    pytest = None
    if args.pytest and RUNNER.exists():  # beside the lowerings, before the timed part
        penv = dict(env, COMPOSER_ET_RUNNER=str(RUNNER))
        pytest = subprocess.Popen(me + ["pytest", "--tree", args.tree, "--timeout",
                                        str(int(left() - reserve))], cwd=REPO, env=penv,
                                  stdout=logf, stderr=subprocess.STDOUT)  # fmt: skip
    procs = []
    for tasks in [t for t in args.early.split(" ") if t]:
        procs.append((tasks, subprocess.Popen(me + ["lower", "--tasks", tasks], cwd=REPO, env=env,
                                              stdout=logf, stderr=subprocess.STDOUT)))  # fmt: skip
        time.sleep(1)
    if build is not None:
        try:
            build.wait(timeout=max(left() - 70, 5))
        except subprocess.TimeoutExpired:
            build.kill()
        emit({"kind": "build", "rc": build.returncode, "s": round(time.time() - start, 1),
              "pieces": [l for l in (WORK / "build.log").read_text().splitlines()
                         if l.startswith(("piece", "runner", "deadline"))]})  # fmt: skip
    if RUNNER.exists():
        renv = dict(env, COMPOSER_ET_RUNNER=str(RUNNER))
        for tasks in [t for t in args.late.split(" ") if t]:
            procs.append((tasks, subprocess.Popen(me + ["lower", "--tasks", tasks], cwd=REPO,
                                                  env=renv, stdout=logf,
                                                  stderr=subprocess.STDOUT)))  # fmt: skip
    for tasks, proc in procs + ([("pytest", pytest)] if pytest else []):
        try:
            proc.wait(timeout=max(left() - reserve, 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            emit({"kind": "lower" if tasks != "pytest" else "pytest", "tasks": tasks, "ok": False,
                  "error": f"stopped {reserve:.0f} s before the command's deadline"})  # fmt: skip
    if args.measure and RUNNER.exists() and left() > 60:
        try:
            subprocess.run(
                me + ["measure", "--runner", str(RUNNER)],
                cwd=REPO,
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                timeout=max(left() - 40, 10),
                check=False,
            )
        except subprocess.TimeoutExpired:
            emit({"kind": "measure", "ok": False, "error": "stopped at the command's deadline"})
    # What comes back, and what the next call carries (at most 8 files).
    logf.close()
    shutil.copy(RESULTS, out / "gpu_llama.jsonl")
    with tarfile.open(out / "programs.tar.xz", "w:xz") as tar:
        tar.add(PROGRAMS, arcname="programs")
    with tarfile.open(out / "logs.tar.xz", "w:xz") as tar:
        for p in WORK.glob("*.log"):
            tar.add(p, arcname=p.name)
        tar.add(LOG, arcname="log.txt")
    if RUNNER.exists():
        libs = subprocess.run(
            ["ldd", str(RUNNER)], capture_output=True, text=True, check=False
        ).stdout
        paths = [str(RUNNER)] + [p.split()[2] for p in libs.splitlines() if "=> /tmp/etb" in p]
        subprocess.run(
            f"tar -cf - {' '.join(paths)} | xz -T0 -6 > {out}/runner.tar.xz",
            shell=True,
            check=False,
        )
    elif (ET_ROOT / "build").exists():
        subprocess.run(
            ["bash", "bench/et_runtime/build.sh", "pack", str(out)], cwd=REPO, check=False
        )
    print(f"gpu_llama device: done, {int(left())} s of {args.limit} left", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("device")
    p.add_argument("--limit", type=float, default=560)
    p.add_argument("--pytest", action="store_true")
    p.add_argument("--measure", action="store_true")
    p.add_argument(
        "--early",
        default="plain:Coff:plain compose:Coff:cuda compose:B:cuda "
        "plain:B:plain plain:A;compose:A:cuda",
        help="task lists (space between processes, ';' within one) lowered at once",
    )
    p.add_argument(
        "--late",
        default="compose:Coff:xnnpack,cuda compose:B:xnnpack,cuda",
        help="task lists lowered once the runner is there (its proof needs it)",
    )
    p.add_argument("--measure-s", type=float, default=200)
    p.add_argument("--tree", default=str(REPO))
    p.add_argument("--commit", default="")
    p.add_argument("--programs-carry", default="")
    p = sub.add_parser("lower")
    p.add_argument("--tasks", required=True)
    p = sub.add_parser("measure")
    p.add_argument("--runner", default=str(RUNNER))
    p = sub.add_parser("pytest")
    p.add_argument("--tree", default=str(REPO))
    p.add_argument("--timeout", type=float, default=400)
    args = parser.parse_args()
    {"device": cmd_device, "lower": cmd_lower, "measure": cmd_measure, "pytest": cmd_pytest}[
        args.command
    ](args)


if __name__ == "__main__":
    main()
